"""Ray's ``groupby().aggregate`` for feedline's ``groupby(keys).agg(...)`` (the Ray engine).

The functions map to Ray Data's aggregations: ``count`` -> ``Count``, ``sum`` of integers
and decimals -> ``Sum``, ``min``/``max`` -> ``Min``/``Max``, ``n_unique`` ->
``CountDistinct`` (exact), ``list`` -> ``AsList``, and ``first`` -> a small ``AggregateFnV2``
(Ray has none). ``mean``, ``std`` and ``sum`` of floats are exact
(:mod:`feedline.plan.exact_aggregates`): an ``AggregateFnV2`` adds the partials the input's
batch stage computed, so they have the local engine's bits. Where Ray's answers differ
from SQL's (the local engine's, see :mod:`feedline.plan.relational_schema`), helper
aggregations fix them in a ``map_batches`` after the groupby: Ray's ``Max`` skips NaN like
a null, while NaN wins in SQL (``min`` is NaN only when every value is); a group without
values gets null. ``n_unique`` of a float column counts the values'
row hashes (one NaN, ``-0.0 == 0.0``). A global aggregate (no keys) is Ray's
``Dataset.aggregate``: one row, computed when the plan starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.plan.exact_aggregates import Partial, exact_outputs, partial_column
from feedline.plan.relational import RelationalSource
from feedline.plan.rowhash import column_hash

__all__ = ["ARROW_BATCHES", "HIDDEN", "aggregate", "hash_partitions"]

#: prefix of the helper columns the Ray engine adds and drops
HIDDEN = "__feedline_ray_"
#: ``map_batches`` arguments for whole Arrow blocks
ARROW_BATCHES = {"batch_format": "pyarrow", "batch_size": None, "zero_copy_batch": True}


def hash_partitions() -> int:
    """Hash partitions of a join or an aggregation: the caller's
    ``DataContext.default_hash_shuffle_parallelism``, at most one per CPU of the cluster
    (Ray's default, 200, costs seconds of scheduling on a small cluster).

    Examples
    --------
    >>> hash_partitions()  # doctest: +SKIP
    2
    """
    import ray
    import ray.data

    wanted = ray.data.DataContext.get_current().default_hash_shuffle_parallelism
    return max(1, min(int(wanted), int(ray.cluster_resources().get("CPU", 1))))


def _helper(kind: str, column: str) -> str:
    return f"{HIDDEN}{kind}_{column}"


#: functions that need a group's non-null count (null without values) and NaN count (the
#: exact ones, float ``sum``, ``mean`` and ``std``, need neither)
_COUNTED = ("sum", "min", "max", "first")
_NAN_AWARE = ("min", "max")


def aggregate(rds: Any, source: RelationalSource) -> Any:
    """``groupby(keys).aggregate`` with Ray's aggregations plus helper counts (non-null
    values; NaN, which Ray's ``Max`` skips like a null) and the exact aggregates; a global
    aggregate (no keys) is Ray's ``Dataset.aggregate``: one row, on the driver.
    ``n_unique`` of a float column counts the values' row hashes (one NaN, ``-0.0 == 0.0``,
    as SQL). The result has helper columns (prefix :data:`HIDDEN`) for the caller to drop.

    Examples
    --------
    >>> import feedline as fl, ray.data  # doctest: +SKIP
    >>> source = fl.range(4).groupby([]).agg(n=("*", "count")).plan.source  # doctest: +SKIP
    >>> aggregate(ray.data.range(4), source).take_all()[0]["n"]  # doctest: +SKIP
    4
    """
    import ray.data
    from ray.data.aggregate import AsList, Count, CountDistinct, Max, Min, Sum

    relational = source.relational
    keys, aggs = tuple(relational.param("keys")), relational.param("aggs")
    schema = _input_schema(source)
    exact = {out for out, _, _ in exact_outputs(aggs, schema)}
    floats = {
        c
        for out, c, _ in aggs
        if c is not None and out not in exact and pa.types.is_floating(schema.field(c).type)
    }
    fns: list[Any] = []
    helpers: list[str] = []
    for out, column, fn in aggs:
        if out in exact:  # summed exactly from the input stage's partials: nothing to fix
            fns.append(_exact_value(partial_column(column), out, fn))
            continue
        if fn == "count":
            fns.append(Count(column, ignore_nulls=True, alias_name=out))
        elif fn == "sum":  # integers and decimals (exact already)
            fns.append(Sum(column, alias_name=out))
        elif fn == "min":
            fns.append(Min(column, alias_name=out))
        elif fn == "max":
            fns.append(Max(column, alias_name=out))
        elif fn == "n_unique":
            on = _helper("hash", column) if column in floats else column
            fns.append(CountDistinct(on, ignore_nulls=True, alias_name=out))
        elif fn == "first":
            fns.append(_first_value(column, out))
        elif fn == "list":
            fns.append(AsList(column, alias_name=out, ignore_nulls=False))
        if fn in _COUNTED and _helper("count", column) not in helpers:
            helpers.append(_helper("count", column))
            fns.append(Count(column, ignore_nulls=True, alias_name=_helper("count", column)))
        if fn in _NAN_AWARE and column in floats and _helper("nans", column) not in helpers:
            helpers.append(_helper("nans", column))
            fns.append(Sum(_helper("nan", column), alias_name=_helper("nans", column)))
    used = tuple(sorted(floats))
    if used:
        rds = rds.map_batches(_float_helpers, fn_args=(used,), **ARROW_BATCHES)
    target = source.schema()
    specs = tuple(
        (out, column, fn, column in floats, target.field(out).type)
        for out, column, fn in aggs
        if out not in exact
    )
    if keys:
        result = rds.groupby(list(keys), num_partitions=hash_partitions()).aggregate(*fns)
    else:
        result = ray.data.from_arrow(_global_row(rds, fns, aggs))
    return result.map_batches(_fix_groups, fn_args=(specs,), **ARROW_BATCHES)


def _global_row(rds: Any, fns: list[Any], aggs: Sequence[tuple[str, str | None, str]]) -> pa.Table:
    """The one row of a global aggregate (Ray's ``Dataset.aggregate``); over no rows, SQL's
    answer: counts 0, every other function null."""
    from ray.data.aggregate import Count

    rows = f"{HIDDEN}rows"
    found = rds.aggregate(*fns, Count(alias_name=rows)) or {}
    if not found.get(rows):
        empty = {out: 0 if fn in ("count", "n_unique") else None for out, _, fn in aggs}
        return pa.Table.from_pylist([empty])
    row = {
        name: value.to_pylist() if isinstance(value, pa.Array | pa.ChunkedArray) else value
        for name, value in found.items()
    }
    return pa.Table.from_pylist([row])


def _input_schema(source: RelationalSource) -> pa.Schema:

    return source.input_schemas()[0]


def _float_helpers(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Per float column: a NaN indicator (int64) and the values' row hashes (nulls kept)."""
    for column in columns:
        values = table.column(column)
        nan = pc.fill_null(pc.is_nan(values), False).cast(pa.int64())
        hashed = pa.array(column_hash(values, column).view(np.int64), pa.int64())
        mask = values.is_null().to_numpy(zero_copy_only=False)
        hashed = pc.if_else(pa.array(mask), pa.scalar(None, pa.int64()), hashed)
        table = table.append_column(_helper("nan", column), nan)
        table = table.append_column(_helper("hash", column), hashed)
    return table


def _fix_groups(table: pa.Table, specs: Sequence[tuple[Any, ...]]) -> pa.Table:
    """SQL's answers where Ray's differ: NaN wins in ``max`` (and in ``min`` when every
    value is NaN); null without values."""
    for out, column, fn, is_float, kind in specs:
        if fn not in _COUNTED or _helper("count", column) not in table.column_names:
            continue  # a global aggregate over no rows is already SQL's row
        values = table.column(out)
        if pa.types.is_null(values.type):  # Ray found no value in this block
            values = values.cast(kind)
        count = pc.fill_null(table.column(_helper("count", column)), 0)
        if is_float and fn in _NAN_AWARE:
            nans = pc.fill_null(table.column(_helper("nans", column)), 0)
            has_nan = pc.equal(nans, count) if fn == "min" else pc.greater(nans, 0)
            has_nan = pc.and_(has_nan, pc.greater(count, 0))
            values = pc.if_else(has_nan, pa.scalar(float("nan"), values.type), values)
        enough = pc.greater_equal(count, 2 if fn == "std" else 1)
        values = pc.if_else(enough, values, pa.scalar(None, values.type))
        table = table.set_column(table.schema.get_field_index(out), out, values)
    return table


def _first_value(column: str, name: str) -> Any:
    """A Ray ``AggregateFnV2``: one non-null value of ``column`` per group (the first one a
    block offers), null when there is none."""
    from ray.data.aggregate import AggregateFnV2
    from ray.data.block import BlockAccessor

    class First(AggregateFnV2):
        """The accumulator is ``[value]`` (Ray would take a bare NaN for a null)."""

        def __init__(self) -> None:
            super().__init__(name, zero_factory=lambda: None, on=column, ignore_nulls=True)

        def aggregate_block(self, block: Any) -> Any:
            values = BlockAccessor.for_block(block).to_arrow().column(column).drop_null()
            return [values[0].as_py()] if len(values) else None

        def combine(self, current: Any, new: Any) -> Any:
            return current if current is not None else new

        # Ray's AggregateFn declares finalize an attribute, AggregateFnV2 a method (as here)
        def finalize(self, accumulator: Any) -> Any:  # type: ignore[override]
            return accumulator[0]

    return First()


def _exact_value(helper: str, name: str, fn: str) -> Any:
    """A Ray ``AggregateFnV2`` adding a group's exact partials (the binary column ``helper``
    of the input stage, :mod:`feedline.plan.exact_aggregates`) and finishing ``fn``: the
    accumulator is an encoded :class:`~feedline.plan.exact_aggregates.Partial`, so any order
    of combining gives the same bits."""
    from ray.data.aggregate import AggregateFnV2
    from ray.data.block import BlockAccessor

    class Exact(AggregateFnV2):
        def __init__(self) -> None:
            super().__init__(name, zero_factory=lambda: None, on=helper, ignore_nulls=True)

        def aggregate_block(self, block: Any) -> Any:
            values = BlockAccessor.for_block(block).to_arrow().column(helper).drop_null()
            total = None
            for data in values.to_pylist():
                part = Partial.decode(data)
                total = part if total is None else total.merge(part)
            return None if total is None else total.encode()

        def combine(self, current: Any, new: Any) -> Any:
            if current is None or new is None:
                return new if current is None else current
            return Partial.decode(current).merge(Partial.decode(new)).encode()

        # Ray's AggregateFn declares finalize an attribute, AggregateFnV2 a method (as here)
        def finalize(self, accumulator: Any) -> Any:  # type: ignore[override]
            return None if accumulator is None else Partial.decode(accumulator).value(fn)

    return Exact()
