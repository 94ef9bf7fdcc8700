"""Relational operators on the Ray engine, with Ray Data's own operators.

A plan whose source is a :class:`~feedline.plan.relational.RelationalSource` runs as:

1. every input plan (``RelationalSource.engine_inputs()``) becomes a lazy
   ``ray.data.Dataset`` through :meth:`RayEngine.dataset` (feedline's read tasks and fused
   batch operators in Ray tasks and actor pools; a nested relational source recurses; a
   ``limit`` inside an input is Ray's ``Dataset.limit`` with order preserved);
2. the operator is Ray Data's own: ``sort``, ``groupby(...).aggregate`` (``Count``,
   ``Sum``, ``Mean``, ``Min``, ``Max``, ``Std(ddof=1)``, ``CountDistinct``, ``AsList`` and
   a small ``AggregateFnV2`` for ``first``), ``join`` (``inner``, ``left_outer``,
   ``full_outer``, ``left_semi``, ``left_anti``), ``union``, ``groupby().map_groups`` (one
   row per key for ``unique(subset)``), ``repartition(n)``, and for ``random_shuffle`` /
   ``split`` a ``sort`` by the row-hash key that the input's batch stage computed with
   :mod:`feedline.plan.rowhash` (the same code as every engine), then
   ``split_at_indices`` at the exact ranks of :func:`~feedline.plan.relational.split_bounds`
   (per stratum: :func:`~feedline.plan.split_sizes.stratum_bounds`);
3. a ``map_batches`` drops the helper columns and casts to ``RelationalSource.schema()``
   (Ray's joins return ``large_string``, its aggregations null-typed columns for empty
   blocks), then the plan's own operators run as usual (:meth:`RayEngine.dataset` over the
   result, so a class in a ``map_batches`` still gets its actor pool).

Nothing is collected on the driver but row counts (``split``: one per stratum, with the
stratum's smallest row key) and a global
aggregate's single row. A join's inputs and a split's sorted rows are materialized in Ray's
object store (which spills to disk) when the plan starts: Ray's join fails on an input
without blocks, so an empty one is replaced by a typed empty table.

Semantics matched to the local engine where Ray's differ:

- ``sort``: Ray puts nulls and NaN last whatever the direction; feedline sorts NaN above
  every number and puts nulls last, or first with ``nulls_last=False``. Each key is sorted
  after two int8 helper columns (null rank, NaN rank) that encode that order.
- ``std`` of fewer than two values is null (Ray: NaN); ``mean``, ``min``, ``max``, ``sum`` of
  a group without values are null: helper non-null counts decide.
- Ray's ``groupby`` uses 200 hash partitions by default; joins and aggregations here use one
  per CPU of the cluster. The shuffle strategy is the one of the caller's
  ``ray.data.DataContext`` (``shuffle_strategy``), so users choose Ray's own trade-offs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.engines.batch.fusion import split_at_limits
from feedline.engines.local.engine import plan_schema
from feedline.engines.ray.errors import surface_errors
from feedline.engines.ray.groupby import ARROW_BATCHES, HIDDEN, aggregate, hash_partitions
from feedline.engines.ray.source import RaySource
from feedline.errors import ConfigurationError
from feedline.plan.plan import Limit, Plan, Pushdown, pushdown
from feedline.plan.relational import RelationalSource, split_bounds
from feedline.plan.rowhash import ROW_HASH_COLUMN, column_hash
from feedline.plan.split_sizes import stratum_bounds
from feedline.store.shards import conform

if TYPE_CHECKING:
    from feedline.engines.ray.engine import RayEngine

__all__ = ["relational_dataset"]

#: Ray's join types for feedline's ``how``
JOIN_TYPES = {
    "inner": "inner",
    "left": "left_outer",
    "outer": "full_outer",
    "semi": "left_semi",
    "anti": "left_anti",
}


class ComputedSource(RaySource):
    """A Ray dataset computed inside a plan (a relational result, a limited input), fed to
    :meth:`RayEngine.dataset` as the source of the operators that follow; its label names
    the operator, and nothing runs to learn its schema."""

    kind = "ray-relational"

    def __init__(self, dataset: Any, label: str, schema: pa.Schema | None = None) -> None:
        super().__init__(dataset, label)
        self._schema = schema

    def describe(self) -> str:
        return self._name


def relational_dataset(
    engine: RayEngine,
    plan: Plan,
    pushed: Pushdown,
    ops: tuple[Any, ...],
    *,
    preserve_order: bool,
    **stage: Any,
) -> Any:
    """The lazy ``ray.data.Dataset`` of ``plan`` (whose source is a ``RelationalSource``)
    followed by ``ops``; ``stage`` are the other arguments of :meth:`RayEngine.dataset`,
    which calls this for such plans.

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.engines.ray.engine import RayEngine
    >>> from feedline.plan.plan import pushdown
    >>> plan = fl.range(5).sort("id", descending=True).plan
    >>> engine = RayEngine(num_cpus=2)  # doctest: +SKIP
    >>> pushed = pushdown(plan)
    >>> rds = relational_dataset(engine, plan, pushed, (), preserve_order=True)  # doctest: +SKIP
    >>> rds.take_batch(5, batch_format="pyarrow")["id"].to_pylist()  # doctest: +SKIP
    [4, 3, 2, 1, 0]
    """
    source = plan.source
    assert isinstance(source, RelationalSource)  # RayEngine.dataset sends only such plans
    report: dict[str, Any] = {k: stage[k] for k in ("collector", "run_id") if k in stage}
    with surface_errors():  # a join's inputs, a split and a global aggregate run here
        rds = _operator(engine, source, report)
    ordered = preserve_order or _has_limit(source)
    label = source.describe()
    wrapped = Plan(ComputedSource(rds, label, source.schema()), plan.ops)
    return engine.dataset(wrapped, pushed, ops, preserve_order=ordered, **stage)


def _has_limit(source: RelationalSource) -> bool:
    """True when an input (at any depth) has a ``limit``: its first rows need Ray to keep
    the order of blocks."""
    for plan in source.inputs:
        if any(isinstance(op, Limit) for op in plan.ops):
            return True
        if isinstance(plan.source, RelationalSource) and _has_limit(plan.source):
            return True
    return False


def _input(engine: RayEngine, plan: Plan, report: dict[str, Any]) -> Any:
    """One input plan as a lazy Ray dataset (an empty one when it has no read tasks)."""
    import ray.data

    pushed = pushdown(plan)
    segments = split_at_limits(pushed.remaining)
    rds = engine.dataset(plan, pushed, segments[0][0], preserve_order=True, **report)
    if rds is None:
        rds = ray.data.from_arrow(plan_schema(plan).empty_table())
    limit = segments[0][1]
    for ops, next_limit in segments[1:]:
        if limit is not None:
            rds = rds.limit(limit)
        rest = Plan(ComputedSource(rds, "the limited input"), ops)
        rds = engine.dataset(rest, Pushdown(None, None, ops), ops, preserve_order=True, **report)
        limit = next_limit
    return rds.limit(limit) if limit is not None else rds


def _typed(rds: Any, plan: Plan) -> Any:
    """A join input, materialized (in Ray's object store); an empty one is replaced by a
    typed empty table: Ray's join fails on a side without blocks whose schema its plan does
    not know (a read stage whose rows were all filtered out)."""
    import ray.data

    done = rds.materialize()
    if done.count() == 0:
        return ray.data.from_arrow(plan_schema(plan).empty_table())
    return done


def _operator(engine: RayEngine, source: RelationalSource, report: dict[str, Any]) -> Any:
    """The operator's result, cast to ``source.schema()`` (a lazy Ray dataset)."""
    relational, schema = source.relational, source.schema()
    inputs = [_input(engine, plan, report) for plan in source.engine_inputs()]
    op, first = relational.op, inputs[0]
    if op == "sort":
        rds = _sort(first, source)
    elif op == "aggregate":
        rds = aggregate(first, source)
    elif op == "join":
        left, right = (_typed(d, p) for d, p in zip(inputs, source.engine_inputs(), strict=True))
        rds = left.join(
            right,
            JOIN_TYPES[relational.param("how")],
            hash_partitions(),
            on=tuple(relational.param("on")),
            right_suffix=relational.param("suffix"),
        )
    elif op == "union":
        names = schema.names
        rest = [d.map_batches(_select, fn_args=(names,), **ARROW_BATCHES) for d in inputs[1:]]
        rds = first.union(*rest) if rest else first
    elif op == "unique":
        rds = _unique(first, relational.param("subset"), schema)
    elif op == "random_shuffle":
        rds = first.sort(ROW_HASH_COLUMN)
    elif op == "repartition":
        rds = first.repartition(int(relational.param("n")))
    elif op == "split":
        rds = _split(first, relational)
    else:  # pragma: no cover - RelationalSource refuses unknown operators
        raise ConfigurationError(
            f"The Ray engine has no implementation of the relational operator {op!r}. "
            "Fix: run this plan on engine='local'."
        )
    return rds.map_batches(_finish, fn_args=(schema, op == "repartition"), **ARROW_BATCHES)


def _select(table: pa.Table, names: Sequence[str]) -> pa.Table:
    return table.select(list(names))


def _finish(table: pa.Table, schema: pa.Schema, whole: bool = False) -> pa.Table:
    """Drop helper columns, order and cast the columns as ``schema`` says; ``whole``: one
    chunk per block (a repartitioned block comes back as one batch)."""
    table = table.select(schema.names)
    if whole:
        table = table.combine_chunks()
    return pa.Table.from_batches(
        [conform(b, schema, "the relational operator's schema") for b in table.to_batches()],
        schema=schema,
    )


# ---------------------------------------------------------------------------- sort


def _sort(rds: Any, source: RelationalSource) -> Any:
    """Ray's sort over helper rank columns that give feedline's null and NaN order."""
    relational = source.relational
    by, descending = relational.param("by"), relational.param("descending")
    nulls_last = bool(relational.param("nulls_last", True))
    schema = source.schema()  # a sort keeps its input's columns
    keys: list[str] = []
    flags: list[bool] = []
    for number, (name, desc) in enumerate(zip(by, descending, strict=True)):
        keys.append(f"{HIDDEN}null_{number}")
        flags.append(False)
        if pa.types.is_floating(schema.field(name).type):
            keys.append(f"{HIDDEN}nan_{number}")
            flags.append(False)
        keys.append(name)
        flags.append(bool(desc))
    ranked = rds.map_batches(
        _sort_ranks, fn_args=(tuple(by), tuple(descending), nulls_last), **ARROW_BATCHES
    )
    return ranked.sort(keys, descending=flags)


def _sort_ranks(
    table: pa.Table, by: Sequence[str], descending: Sequence[bool], nulls_last: bool
) -> pa.Table:
    """Append, per sort key, an int8 null rank (nulls after or before the values) and, for
    floats, an int8 NaN rank (NaN after the numbers ascending, before them descending)."""
    for number, (name, desc) in enumerate(zip(by, descending, strict=True)):
        column = table.column(name)
        null = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=np.int8)
        table = table.append_column(
            f"{HIDDEN}null_{number}", pa.array(null if nulls_last else 1 - null)
        )
        if pa.types.is_floating(column.type):
            nan = pc.fill_null(pc.is_nan(column), False).to_numpy(zero_copy_only=False)
            nan = np.asarray(nan, dtype=np.int8)
            table = table.append_column(f"{HIDDEN}nan_{number}", pa.array(1 - nan if desc else nan))
    return table


# ---------------------------------------------------------------------------- unique


def _unique(rds: Any, subset: Sequence[str] | None, schema: pa.Schema) -> Any:
    """Distinct rows: Ray's groupby on every column (``subset=None``), else one row per
    key through ``groupby(subset).map_groups``."""
    from ray.data.aggregate import Count

    if subset is None:
        grouped = rds.groupby(schema.names, num_partitions=hash_partitions())
        return grouped.aggregate(Count(alias_name=f"{HIDDEN}rows"))
    grouped = rds.groupby(list(subset), num_partitions=hash_partitions())
    return grouped.map_groups(_first_row, batch_format="pyarrow")


def _first_row(table: pa.Table) -> pa.Table:
    return table.slice(0, 1)


# ---------------------------------------------------------------------------- split


def _split(rds: Any, relational: Any) -> Any:
    """Piece ``index`` of ``split``: rows ranked by row key within their stratum, cut at
    ``floor(bound * n)`` (``split_bounds``), or per stratum at the bounds that
    :func:`~feedline.plan.split_sizes.stratum_bounds` allocates, with Ray's sort and
    ``split_at_indices``; only the strata's row counts and smallest keys reach the driver."""
    from ray.data.aggregate import Count, Min

    lo, hi = split_bounds(relational.param("fractions"))[int(relational.param("index"))]
    stratify = relational.param("stratify")
    if stratify is None:
        ranked = rds.sort(ROW_HASH_COLUMN).materialize()
        n = ranked.count()
        pieces = ranked.split_at_indices([math.floor(lo * n), math.floor(hi * n)])
        return pieces[1]
    code = f"{HIDDEN}stratum"
    coded = rds.map_batches(_stratum_code, fn_args=(stratify, code), **ARROW_BATCHES)
    ranked = coded.sort([code, ROW_HASH_COLUMN]).materialize()
    counts = ranked.groupby(code, num_partitions=hash_partitions()).aggregate(
        Count(alias_name="rows"), Min(ROW_HASH_COLUMN, alias_name="first")
    )
    empty = pa.array([], pa.int64())
    table = pa.concat_tables(
        [t for t in counts.iter_batches(batch_size=None, batch_format="pyarrow")]
        or [pa.table({code: empty, "rows": empty, "first": empty})]
    )
    order = np.argsort(table.column(code).to_numpy(), kind="stable")  # the rows' order
    sizes = table.column("rows").to_numpy()[order].astype(np.int64)
    by_key = np.argsort(table.column("first").to_numpy()[order], kind="stable")
    allocated = np.empty((len(sizes), len(relational.param("fractions")) + 1), np.int64)
    allocated[by_key] = stratum_bounds(sizes[by_key], relational.param("fractions"))
    index = int(relational.param("index"))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    ranges = [
        (int(s) + int(a), int(s) + int(b))
        for s, a, b in zip(starts, allocated[:, index], allocated[:, index + 1], strict=True)
    ]
    bounds = sorted({i for pair in ranges for i in pair})
    pieces = ranked.split_at_indices(bounds)
    at = {b: i + 1 for i, b in enumerate(bounds)}  # piece i+1 starts at bounds[i]
    chosen = [pieces[at[a]] for a, b in ranges if b > a]
    if not chosen:
        return pieces[0].limit(0)
    return chosen[0].union(*chosen[1:]) if len(chosen) > 1 else chosen[0]


def _stratum_code(table: pa.Table, column: str, code: str) -> pa.Table:
    """Append the stratum's int64 code: the row hash of the value (null is a stratum)."""
    hashed = column_hash(table.column(column), column)
    return table.append_column(code, pa.array(hashed.view(np.int64), pa.int64()))
