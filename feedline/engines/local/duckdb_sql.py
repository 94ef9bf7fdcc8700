"""The SQL (DuckDB dialect) of each relational operator, over inputs named ``input_<i>``.

The semantics are the ones every engine implements (``/work`` design: issue 14, and
:mod:`feedline.plan.relational_schema` for the aggregates); the local engine runs this text with
DuckDB (:mod:`feedline.engines.local.relational`).

Examples
--------
>>> from feedline.plan.relational import Relational
>>> import pyarrow as pa
>>> s = pa.schema([("a", pa.int64())])
>>> relational_sql(Relational("sort", (("by", ("a",)), ("descending", (True,)),
...                                    ("nulls_last", True))), [s])
'SELECT * FROM input_0 ORDER BY "a" DESC NULLS LAST'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from feedline.plan.exact_aggregates import is_exact, partial_column
from feedline.plan.relational import split_bounds
from feedline.plan.rowhash import ROW_HASH_COLUMN

if TYPE_CHECKING:
    from feedline.plan.relational import Relational

__all__ = ["StratifiedSplit", "quote", "relational_sql", "stratified_split_sql"]


def quote(name: str) -> str:
    """``name`` as a quoted SQL identifier.

    Examples
    --------
    >>> quote('a"b')
    '"a""b"'
    """
    return '"' + name.replace('"', '""') + '"'


def relational_sql(relational: Relational, schemas: Sequence[pa.Schema]) -> str:
    """The query computing ``relational`` over tables ``input_0 ...`` of ``schemas``
    (``repartition`` is a plain scan: the engine cuts the batches)."""
    op, first = relational.op, schemas[0]
    if op == "sort":
        nulls = "LAST" if relational.param("nulls_last") else "FIRST"
        order = [
            f"{quote(c)} {'DESC' if d else 'ASC'} NULLS {nulls}"
            for c, d in zip(relational.param("by"), relational.param("descending"), strict=True)
        ]
        return f"SELECT * FROM input_0 ORDER BY {', '.join(order)}"
    if op == "aggregate":
        return _aggregate(relational, first)
    if op == "join":
        return _join(relational, first, schemas[1])
    if op == "union":
        columns = ", ".join(quote(c) for c in first.names)
        return " UNION ALL ".join(f"SELECT {columns} FROM input_{i}" for i in range(len(schemas)))
    if op == "unique":
        subset = relational.param("subset")
        if subset is None:
            return "SELECT DISTINCT * FROM input_0"
        return f"SELECT DISTINCT ON ({', '.join(quote(c) for c in subset)}) * FROM input_0"
    if op == "random_shuffle":
        key = quote(ROW_HASH_COLUMN)
        return f"SELECT * EXCLUDE ({key}) FROM input_0 ORDER BY {key}"
    if op == "split":
        return _split(relational)
    return "SELECT * FROM input_0"  # repartition


def _aggregate(relational: Relational, schema: pa.Schema) -> str:
    keys = [quote(k) for k in relational.param("keys")]
    parts = list(keys)
    for out, column, fn in relational.param("aggs"):
        parts.append(f"{_agg(fn, column, schema)} AS {quote(out)}")
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    return f"SELECT {', '.join(parts)} FROM input_0{group}"


def _agg(fn: str, column: str | None, schema: pa.Schema) -> str:
    if column is None:
        return "count(*)"
    col = quote(column)
    kind = schema.field(column).type
    helper = partial_column(column)
    if is_exact(fn, kind) and schema.get_field_index(helper) >= 0:
        # the exact partials of each group (feedline.plan.exact_aggregates), finished after
        return f"list({quote(helper)}) FILTER (WHERE {quote(helper)} IS NOT NULL)"
    if fn == "count":
        return f"count({col})"
    if fn == "sum":
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            return f"CAST(sum(CAST({col} AS HUGEINT)) AS BIGINT)"
        return f"sum({col})"
    if fn == "mean":
        return f"avg(CAST({col} AS DOUBLE))"
    if fn == "std":
        return f"stddev_samp(CAST({col} AS DOUBLE))"
    if fn == "n_unique":
        return f"count(DISTINCT {col})"
    if fn == "first":
        return f"any_value({col})"
    if fn == "list":
        return f"list({col})"
    return f"{fn}({col})"  # min, max


def _join(relational: Relational, left: pa.Schema, right: pa.Schema) -> str:
    on, how, suffix = relational.param("on"), relational.param("how"), relational.param("suffix")
    condition = " AND ".join(f"l.{quote(k)} = r.{quote(k)}" for k in on)
    if how in ("semi", "anti"):
        return f"SELECT l.* FROM input_0 AS l {how.upper()} JOIN input_1 AS r ON {condition}"
    columns = []
    for name in left.names:
        if name in on and how == "outer":
            columns.append(f"COALESCE(l.{quote(name)}, r.{quote(name)}) AS {quote(name)}")
        else:
            columns.append(f"l.{quote(name)} AS {quote(name)}")
    taken = set(left.names)
    for name in right.names:
        if name in on:
            continue
        out = name + suffix if name in taken else name
        taken.add(out)
        columns.append(f"r.{quote(name)} AS {quote(out)}")
    kind = {"inner": "INNER", "left": "LEFT", "outer": "FULL OUTER"}[how]
    return f"SELECT {', '.join(columns)} FROM input_0 AS l {kind} JOIN input_1 AS r ON {condition}"


def _split(relational: Relational) -> str:
    """An unstratified piece (a stratified one: :func:`stratified_split_sql`)."""
    lo, hi = split_bounds(relational.param("fractions"))[relational.param("index")]
    key = quote(ROW_HASH_COLUMN)
    ranked = (
        f"SELECT *, row_number() OVER (ORDER BY {key}) - 1 AS __feedline_rank, "
        "count(*) OVER () AS __feedline_count FROM input_0"
    )
    n = "CAST(__feedline_count AS DOUBLE)"
    return (
        f"SELECT * EXCLUDE ({key}, __feedline_rank, __feedline_count) FROM ({ranked}) "
        f"WHERE __feedline_rank >= floor(CAST({lo!r} AS DOUBLE) * {n}) "
        f"AND __feedline_rank < floor(CAST({hi!r} AS DOUBLE) * {n})"
    )


@dataclass(frozen=True)
class StratifiedSplit:
    """The three statements of a stratified ``split`` piece (:mod:`feedline.plan.split_sizes`).

    ``ranked`` creates ``table``: the input with each row's rank by row key in its stratum
    and the stratum's smallest row key; ``sizes`` lists ``(smallest key, rows)`` per stratum
    in key order (the engine computes the bounds from them); ``piece`` keeps the rows of a
    table ``bounds`` ``(__feedline_first, __feedline_lo, __feedline_hi)`` whose rank is
    between their stratum's bounds.

    Examples
    --------
    >>> from feedline.plan.relational import Relational
    >>> sql = stratified_split_sql("k", "t")
    >>> sql.sizes
    'SELECT __feedline_first, count(*) FROM t GROUP BY 1 ORDER BY 1'
    """

    ranked: str
    sizes: str
    piece: str


def stratified_split_sql(stratify: str, table: str, bounds: str = "bounds") -> StratifiedSplit:
    """The statements of a piece of ``split(..., stratify=stratify)`` (see
    :class:`StratifiedSplit`), over a temporary table named ``table``."""
    window = f"PARTITION BY {quote(stratify)}"
    key = quote(ROW_HASH_COLUMN)
    ranked = (
        f"CREATE TEMP TABLE {table} AS SELECT *, "
        f"row_number() OVER ({window} ORDER BY {key}) - 1 AS __feedline_rank, "
        f"min({key}) OVER ({window}) AS __feedline_first FROM input_0"
    )
    sizes = f"SELECT __feedline_first, count(*) FROM {table} GROUP BY 1 ORDER BY 1"
    piece = (
        f"SELECT * EXCLUDE ({key}, __feedline_rank, __feedline_first, __feedline_lo, "
        f"__feedline_hi) FROM {table} JOIN {bounds} USING (__feedline_first) "
        "WHERE __feedline_rank >= __feedline_lo AND __feedline_rank < __feedline_hi"
    )
    return StratifiedSplit(ranked, sizes, piece)
