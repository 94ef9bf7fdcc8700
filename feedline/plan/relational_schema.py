"""The output schema of each relational operator, from its inputs' schemas (nothing runs).

Aggregate functions of ``groupby(keys).agg(out=(column, fn))`` (SQL semantics; nulls are
skipped by every function but ``list`` and ``count("*")``):

========== ============================================ ===================================
fn         value                                        type
========== ============================================ ===================================
count      rows (column ``"*"``) or non-null values     int64
sum        sum of non-null values; null when none       int64 (integers, bools), float64
                                                        (floats), decimal128(38, s)
mean       arithmetic mean; null when none              float64
min, max   smallest / largest value (NaN is the         the column's type
           largest, as in sort); null when none
std        sample standard deviation (ddof=1); null     float64
           with fewer than two values
n_unique   distinct non-null values                     int64
first      one non-null value of the group (which one   the column's type
           is unspecified); null when none
list       every value of the group, nulls included,    list<the column's type>
           in unspecified order
========== ============================================ ===================================

Examples
--------
>>> from feedline.plan.relational import Relational
>>> s = pa.schema([("k", pa.string()), ("x", pa.int32())])
>>> r = Relational("aggregate", (("keys", ("k",)), ("aggs", (("n", None, "count"),
...                                                           ("m", "x", "mean")))))
>>> output_schema(r, [s])
k: string
n: int64 not null
m: double
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from feedline.errors import ConfigurationError, SchemaError
from feedline.io.source import check_columns

if TYPE_CHECKING:
    from feedline.plan.relational import Relational

__all__ = ["agg_type", "output_schema"]


def output_schema(relational: Relational, schemas: Sequence[pa.Schema]) -> pa.Schema:
    """The schema of ``relational`` over inputs of ``schemas``; raises ``SchemaError`` for
    unknown columns and mismatched inputs."""
    op, first = relational.op, schemas[0]
    where = f"the input of {op}()"
    if op == "sort":
        check_columns(first, relational.param("by"), where)
    elif op == "unique":
        check_columns(first, relational.param("subset") or (), where)
    elif op == "split":
        stratify = relational.param("stratify")
        check_columns(first, [stratify] if stratify else [], where)
    elif op == "union":
        for number, other in enumerate(schemas[1:], start=1):
            _check_union(first, other, number)
    elif op == "join":
        return _join_schema(relational, first, schemas[1])
    elif op == "aggregate":
        return _aggregate_schema(relational, first)
    return first


def agg_type(fn: str, kind: pa.DataType | None) -> pa.DataType:
    """The result type of aggregate ``fn`` on a column of type ``kind`` (``None``: ``"*"``).

    Examples
    --------
    >>> agg_type("sum", pa.int8()), agg_type("list", pa.string())
    (DataType(int64), ListType(list<item: string>))
    """
    if fn in ("count", "n_unique"):
        return pa.int64()
    assert kind is not None
    if fn in ("mean", "std"):
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_decimal(kind) or pa.types.is_boolean(kind)):  # fmt: skip
            raise _not_numeric(fn, kind)
        return pa.float64()
    if fn == "sum":
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            return pa.int64()
        if pa.types.is_floating(kind):
            return pa.float64()
        if pa.types.is_decimal(kind):
            return pa.decimal128(38, kind.scale)
        raise _not_numeric(fn, kind)
    if fn == "list":
        return pa.list_(kind)
    return kind  # min, max, first


def _not_numeric(fn: str, kind: pa.DataType) -> SchemaError:
    return SchemaError(
        f"Aggregate {fn!r} needs a numeric column, got type {kind}. Fix: cast the column to a "
        "number (ds.cast({...})) or use min/max/first/count/n_unique/list."
    )


def _aggregate_schema(relational: Relational, schema: pa.Schema) -> pa.Schema:
    keys = relational.param("keys")
    aggs = relational.param("aggs")
    check_columns(schema, keys, "the input of groupby()")
    check_columns(schema, [c for _, c, _ in aggs if c is not None], "the input of agg()")
    fields = [schema.field(k) for k in keys]
    for out, column, fn in aggs:
        kind = schema.field(column).type if column is not None else None
        fields.append(pa.field(out, agg_type(fn, kind), nullable=fn not in ("count", "n_unique")))
    names = [f.name for f in fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigurationError(
            f"groupby().agg() would produce the column(s) {duplicates} twice. Fix: give each "
            "aggregate an output name that is not a key or another output."
        )
    return pa.schema(fields)


def _join_schema(relational: Relational, left: pa.Schema, right: pa.Schema) -> pa.Schema:
    on, how, suffix = relational.param("on"), relational.param("how"), relational.param("suffix")
    check_columns(left, on, "the left input of join()")
    check_columns(right, on, "the right input of join()")
    for key in on:
        if left.field(key).type != right.field(key).type:
            raise SchemaError(
                f"join(): key {key!r} has type {left.field(key).type} on the left and "
                f"{right.field(key).type} on the right. Fix: cast one side first, e.g. "
                f"other.cast({{{key!r}: '{left.field(key).type}'}})."
            )
    if how in ("semi", "anti"):
        return left
    fields = []
    for f in left:
        nullable = f.nullable or (how == "outer")
        fields.append(f.with_nullable(nullable))
    taken = set(left.names)
    for f in right:
        if f.name in on:
            continue
        name = f.name + suffix if f.name in taken else f.name
        if name in taken:
            raise SchemaError(
                f"join(): the right column {f.name!r} renamed to {name!r} still collides with a "
                "left column. Fix: pass another suffix= or rename the columns first."
            )
        taken.add(name)
        fields.append(pa.field(name, f.type, f.nullable or how in ("left", "outer")))
    return pa.schema(fields)


def _check_union(first: pa.Schema, other: pa.Schema, number: int) -> None:
    same_names = sorted(first.names) == sorted(other.names)
    if same_names and all(other.field(f.name).type == f.type for f in first):
        return
    mismatched = [
        f"{f.name}: {f.type} vs {other.field(f.name).type}"
        for f in first
        if other.get_field_index(f.name) >= 0 and other.field(f.name).type != f.type
    ]
    raise SchemaError(
        f"union(): dataset {number} has columns {other.names}, the first {first.names}"
        + (f"; types differ: {mismatched}" if mismatched else "")
        + ". Fix: select, rename or cast the inputs to the same columns and types "
        "(the order of the columns may differ)."
    )
