"""Relational operators on the Spark engine: a plan's ``RelationalSource`` as Spark DataFrame ops.

A relational operator (sort, aggregate, join, union, unique, random_shuffle, split,
repartition) is the *source* of a plan (see :mod:`feedline.plan.relational`). The Spark engine
runs it with Spark's own operators, never with a shuffle of its own:

1. every input plan becomes a DataFrame through the engine's usual path
   (:func:`~feedline.engines.spark.plan.build_job`: feedline's read tasks and batch
   operators run in the executors through ``mapInArrow``); an input whose source is itself
   relational recurses; an input that is a plain read of local Parquet files with flat
   types (:func:`feedline.plan.direct_inputs.plain_parquet`) is Spark's own Parquet scan
   instead (column pruning, and the size statistics that let Spark broadcast a small
   join side);
2. the operator becomes DataFrame operations: ``orderBy`` (``asc``/``desc``, nulls first or
   last), ``groupBy().agg``, ``join`` (``USING`` the keys, so an outer join coalesces
   them), ``unionByName``, ``dropDuplicates``, ``repartition``; ``random_shuffle`` and
   ``split`` order rows by the key of :func:`feedline.plan.rowhash.row_hash`,
   computed on feedline's own batches in the input stage (so the keys are byte-identical
   to the local engine's); ``split`` ranks them per stratum in parallel (see
   :func:`_split`). The input of a sort, shuffle or split is persisted while the job
   runs, since Spark reads it twice (``orderBy`` samples its range bounds first): read
   tasks and user functions then run once;
3. the columns are put in the order of the source's schema, and the DataFrame feeds the
   plan's first fused stage as a *native frame* (:class:`RelationalFrameSource`): the
   plan's remaining operators, the streaming of results to the driver and the
   executor-side writer are the engine's usual ones. Spark's types are cast back to the
   source's exact Arrow schema on the way in
   (:func:`~feedline.engines.spark.types.from_spark_batch`). A plan that ends at the
   operator (at most a selection or an expression filter after it) skips the fused stage:
   Spark encodes the rows to Arrow itself and the driver casts them
   (:mod:`feedline.engines.spark.collect`).

Semantics that Spark leaves open are pinned down to the local engine's: a ``list``
aggregate keeps nulls (``collect_list`` drops them, so values travel wrapped in a struct);
``first`` (any non-null value) and the order inside ``list`` are unspecified, as on the
local engine (Spark gives no order after a shuffle), so tests compare ``first`` by
membership and lists as multisets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.engines.spark.cluster import ship_user_modules
from feedline.engines.spark.collect import DirectFrame
from feedline.engines.spark.inputs import native_parquet
from feedline.engines.spark.plan import build_job
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport, ReadTask, Source
from feedline.plan.exact_aggregates import exact_outputs, finish, partial_column
from feedline.plan.plan import Plan
from feedline.plan.relational import RelationalSource, split_bounds
from feedline.plan.rowhash import ROW_HASH_COLUMN
from feedline.plan.split_sizes import stratum_bounds

__all__ = ["Prepared", "RelationalFrameSource", "is_relational", "prepare", "relational_frame"]

#: operators whose input Spark reads twice (the range sampling of ``orderBy``; the bucket
#: counts of ``split``): the input is persisted so that read tasks and user functions run
#: once (and count once in the report)
_TWO_PASS = ("sort", "random_shuffle", "split")
_RANK = "__feedline_rank"
_COUNT = "__feedline_count"
_BUCKET = "__feedline_bucket"
_BUCKET2 = "__feedline_bucket_of_counts"
_STRATUM = "__feedline_stratum"
_OFFSET = "__feedline_offset"
_SIZE = "__feedline_bucket_size"
_FIRST = "__feedline_first"
_FIRST2 = "__feedline_first_of_bounds"
_LO = "__feedline_lo"
_HI = "__feedline_hi"
_JOIN_HOW = {
    "inner": "inner",
    "left": "left",
    "outer": "full",
    "full": "full",
    "semi": "left_semi",
    "anti": "left_anti",
}


class RelationalFrameSource(Source):
    """A relational source already computed as a lazy Spark DataFrame (Spark's types).

    The Spark engine reads it as a *native frame*: its partitions feed the plan's first
    fused stage, which casts them to :meth:`schema`. Its :meth:`read_tasks` (used only when
    a plan's schema must be learnt by running a user function on a few rows) streams the
    DataFrame's partitions to the driver a few at a time, as Spark's own Arrow.
    """

    kind = "spark-relational"

    def __init__(self, source: Source, frame: Any) -> None:
        self.source = source
        self.frame = frame
        self.label = f"the Spark result of {source.describe()} (partition {{partition}})"

    def native_frame(self) -> Any:
        return self.frame

    def schema(self) -> pa.Schema:
        return self.source.schema()

    def describe(self) -> str:
        return self.source.describe()

    def fingerprint(self) -> str:
        return self.source.fingerprint()

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:

            label = self.label.format(partition="streamed")
            direct = DirectFrame(self.frame, self.schema(), None, None, label)
            # streamed a window of partitions at a time: a reader that stops early (a
            # schema learnt on a few rows) leaves the other partitions uncomputed
            for batch in direct.batches(0, report):
                if predicate is not None:
                    batch = batch.filter(predicate)
                yield batch.select(list(columns)) if columns is not None else batch

        return [ReadTask(self.source.describe(), read)]


@dataclass
class Prepared:
    """A plan whose relational source became a :class:`RelationalFrameSource`, and the jobs
    of its inputs (their counters and broadcasts are released by :meth:`finish`)."""

    plan: Plan
    jobs: list[Any] = field(default_factory=list)

    def finish(self, report: ExecutionReport | None) -> None:
        """Fold the inputs' counters into ``report`` (once) and release their broadcasts."""
        for job in self.jobs:
            job.finish(report)


def is_relational(plan: Plan) -> bool:
    """Whether the plan's source is a relational operator.

    Examples
    --------
    >>> import feedline as fl
    >>> is_relational(fl.range(3).plan), is_relational(fl.range(3).sort("id").plan)
    (False, True)
    """

    return isinstance(plan.source, RelationalSource)


def prepare(
    spark: Any, plan: Plan, partitions: int | None = None, *, persist: bool = True
) -> Prepared:
    """``plan`` with its relational source (if any) computed as a Spark DataFrame.

    Nothing runs yet, except what Spark runs to plan the DataFrame. Call
    :meth:`Prepared.finish` once the job computing the plan has run. ``persist=False``
    (a DataFrame handed to the user, never finished) keeps no input in the executors.

    Examples
    --------
    >>> import feedline as fl
    >>> plan = fl.range(3).plan
    >>> prepare(None, plan).plan is plan  # not relational: unchanged, no Spark needed
    True
    >>> prepared = prepare(spark, fl.range(3).sort("id").plan)  # doctest: +SKIP
    >>> type(prepared.plan.source).__name__  # doctest: +SKIP
    'RelationalFrameSource'
    """
    if not is_relational(plan):
        return Prepared(plan)
    jobs: list[Any] = []
    frame = relational_frame(spark, plan.source, partitions, jobs, persist=persist)
    return Prepared(Plan(RelationalFrameSource(plan.source, frame), plan.ops), jobs)


def relational_frame(
    spark: Any, source: Any, partitions: int | None, jobs: list[Any], *, persist: bool = True
) -> Any:
    """The lazy DataFrame computing a ``RelationalSource`` (its columns in schema order).

    The jobs building its inputs are appended to ``jobs``.
    """
    relational = source.relational
    op = relational.op
    builder = _OPS.get(op)
    if builder is None:
        raise ConfigurationError(
            f"The relational operator {op!r} has no Spark implementation. Fix: run this plan "
            "with engine='local', or use one of " + ", ".join(sorted(_OPS)) + "."
        )
    inputs = source.engine_inputs()

    frames = []
    for plan in inputs:
        native = native_parquet(spark, plan, jobs)
        if native is not None:  # Spark reads it again cheaply: no need to persist it
            frames.append(native)
            continue
        frame = _input_frame(spark, plan, partitions, jobs, persist)
        frames.append(_persisted(frame, jobs) if persist and op in _TWO_PASS else frame)
    frame = builder(frames, relational, source)
    names = source.schema().names
    if frame.columns == names:  # already in order: no projection to add
        return frame
    return frame.select(*[_col(name) for name in names])


def _input_frame(
    spark: Any, plan: Plan, partitions: int | None, jobs: list[Any], persist: bool
) -> Any:
    """One input plan as a DataFrame: the engine's read tasks and fused batch stage (with
    the row-key column for ``random_shuffle``/``split``, see ``engine_inputs``)."""

    ship_user_modules(spark, plan.ops)
    prepared = prepare(spark, plan, partitions, persist=persist)
    jobs.extend(prepared.jobs)
    job = build_job(spark, prepared.plan, mode="rows", partitions=partitions)
    jobs.append(job)
    return job.frame


class _Unpersist:
    """Releases a persisted input when the plan's job is finished (see :class:`Prepared`)."""

    def __init__(self, frame: Any) -> None:
        self.frame = frame

    def finish(self, report: ExecutionReport | None) -> None:
        with contextlib.suppress(Exception):
            self.frame.unpersist()


def _persisted(frame: Any, jobs: list[Any]) -> Any:
    """``frame`` kept by the executors (memory, then disk) until the job is finished."""
    from pyspark import StorageLevel

    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    jobs.append(_Unpersist(frame))
    return frame


def _col(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


# ----------------------------------------------------------------------------- operators


def _sort(frames: list[Any], relational: Any, source: Any) -> Any:
    by = tuple(relational.param("by"))
    descending = relational.param("descending", (False,) * len(by))
    if isinstance(descending, bool):
        descending = (descending,) * len(by)
    nulls_last = relational.param("nulls_last", True)
    order = []
    for name, desc in zip(by, descending, strict=True):
        column = _col(name)
        if desc:
            order.append(column.desc_nulls_last() if nulls_last else column.desc_nulls_first())
        else:
            order.append(column.asc_nulls_last() if nulls_last else column.asc_nulls_first())
    return frames[0].orderBy(*order)


def _aggregate(frames: list[Any], relational: Any, source: Any) -> Any:
    """``groupBy().agg``; exact aggregates (a float ``sum``, ``mean``, ``std``) collect their
    partials (``collect_list`` of the column the input's batch stage added) and a Python UDF
    finishes them per group (:mod:`feedline.plan.exact_aggregates`): the same bits as on the
    local engine, whatever the partitioning."""
    from pyspark.sql import functions as F

    keys = [_col(k) for k in relational.param("keys", ())]
    frame = frames[0]
    aggs = relational.param("aggs")
    exact = {out: fn for out, _, fn in exact_outputs(aggs, source.input_schemas()[0])}
    exprs = [
        F.collect_list(_col(partial_column(column))).alias(out)
        if out in exact
        else _agg_expr(out, column, fn, frame).alias(out)
        for out, column, fn in aggs
    ]
    grouped = frame.groupBy(*keys).agg(*exprs)
    if not exact:
        return grouped
    return grouped.select(
        *[
            _finisher(exact[name])(_col(name)).alias(name) if name in exact else _col(name)
            for name in grouped.columns
        ]
    )


def _finisher(fn: str) -> Any:
    """A Python UDF: a group's list of exact partials -> its ``fn`` value (double)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    def finish_group(partials: Any) -> float | None:
        return finish(partials, fn)

    return F.udf(finish_group, DoubleType(), useArrow=True)


def _agg_expr(out: str, column: str | None, fn: str, frame: Any) -> Any:
    from pyspark.sql import functions as F

    if fn in ("count", "len") and column in (None, "*"):
        return F.count(F.lit(1))
    if column in (None, "*"):
        raise ConfigurationError(
            f"The aggregate {out!r} = {fn}() needs a column. Fix: name one, e.g. "
            f"{out}=('x', {fn!r}); only 'count' accepts '*'."
        )
    value = _col(column)
    if fn in ("sum", "mean", "std") and frame.schema[column].dataType.typeName() == "boolean":
        value = value.cast("long")  # Spark sums no booleans; feedline counts the trues
    simple = {
        "count": F.count,
        "sum": F.sum,
        "mean": F.avg,
        "min": F.min,
        "max": F.max,
        "std": F.stddev_samp,
        "n_unique": F.count_distinct,
    }
    if fn in simple:
        return simple[fn](value)
    if fn == "first":
        return F.first(value, ignorenulls=True)
    if fn == "list":
        # collect_list drops nulls: collect one-field structs (never null), then unwrap
        wrapped = F.collect_list(F.struct(value.alias("v")))
        return F.transform(wrapped, lambda item: item["v"])
    raise ConfigurationError(
        f"The aggregate function {fn!r} (for {out!r}) is not known. Fix: use one of count, "
        "sum, mean, min, max, std, n_unique, first, list."
    )


def _join(frames: list[Any], relational: Any, source: Any) -> Any:
    left, right = frames
    on = list(relational.param("on"))
    how = relational.param("how", "inner")
    suffix = relational.param("suffix", "_right")
    if how not in _JOIN_HOW:
        raise ConfigurationError(
            f"join(how={how!r}) is not a join kind. Fix: use one of inner, left, outer, semi, anti."
        )
    left_names = set(left.columns)
    clashes = [c for c in right.columns if c not in on and c in left_names]
    if clashes:
        right = right.select(
            *[_col(c).alias(c + suffix) if c in clashes else _col(c) for c in right.columns]
        )
    return left.join(right, on=on, how=_JOIN_HOW[how])


def _union(frames: list[Any], relational: Any, source: Any) -> Any:
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return frame


def _unique(frames: list[Any], relational: Any, source: Any) -> Any:
    subset = relational.param("subset")
    return frames[0].dropDuplicates(list(subset) if subset is not None else None)


def _repartition(frames: list[Any], relational: Any, source: Any) -> Any:
    return frames[0].repartition(int(relational.param("n")))


def _random_shuffle(frames: list[Any], relational: Any, source: Any) -> Any:

    return frames[0].orderBy(_col(ROW_HASH_COLUMN).asc())


def _split(frames: list[Any], relational: Any, source: Any) -> Any:
    """Rows ranked by row key within their stratum, cut at ``split_bounds`` (one stratum) or
    at the per-stratum bounds of :func:`~feedline.plan.split_sizes.stratum_bounds`.

    A window over a whole stratum (or the whole input) would run in one task, so the rank
    is computed in two levels, all in parallel: rows are bucketed by the top 8 bits of
    their key (keys are uniform, and bucket order is key order), ranked within
    ``(stratum, bucket)``, and shifted by the row count of the stratum's lower buckets
    (a small ``groupBy`` of at most 256 rows per stratum, broadcast back).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    index = int(relational.param("index"))
    stratify = relational.param("stratify")
    lower, upper = split_bounds(relational.param("fractions"))[index]
    key = _col(ROW_HASH_COLUMN)
    parts = ([_col(stratify)] if stratify is not None else []) + [F.col(_BUCKET)]
    bucket = Window.partitionBy(*parts)
    ranked = (
        frames[0]
        .withColumn(_BUCKET, F.shiftright(key, 56))
        .select(
            "*",
            (F.row_number().over(bucket.orderBy(key)) - 1).alias(_RANK),
            F.count(F.lit(1)).over(bucket).alias(_SIZE),
        )
    )
    # one row per (stratum, bucket), taken from the ranked rows themselves so that Spark
    # reuses their shuffle instead of computing the input twice
    stratum = Window.partitionBy(*parts[:-1])
    below = stratum.orderBy(_BUCKET).rowsBetween(Window.unboundedPreceding, -1)
    counts = ranked.where(F.col(_RANK) == 0).select(
        *([_col(stratify).alias(_STRATUM)] if stratify is not None else []),
        F.col(_BUCKET).alias(_BUCKET2),
        F.coalesce(F.sum(_SIZE).over(below), F.lit(0)).alias(_OFFSET),
        F.sum(_SIZE).over(stratum).cast("double").alias(_COUNT),
        F.min(key).over(stratum).alias(_FIRST),
    )
    match = F.col(_BUCKET) == F.col(_BUCKET2)
    if stratify is not None:
        match = match & _col(stratify).eqNullSafe(F.col(_STRATUM))
    joined = ranked.join(F.broadcast(counts), match, "inner")
    rank, count = F.col(_OFFSET) + F.col(_RANK), F.col(_COUNT)
    if stratify is None:
        # the same IEEE double products as split_bounds: floor(lo * n) <= r < floor(hi * n)
        keep = (rank >= F.floor(F.lit(lower) * count)) & (rank < F.floor(F.lit(upper) * count))
        return joined.where(keep)
    # the strata's sizes, in the order of their smallest row key, allocated to the pieces on
    # the driver (feedline.plan.split_sizes, as on the local engine and Ray), broadcast back
    strata = counts.select(_FIRST, _COUNT).distinct().collect()
    firsts = np.array([row[0] for row in strata], dtype=np.int64)
    order = np.argsort(firsts, kind="stable")
    sizes = np.array([int(row[1]) for row in strata], dtype=np.int64)[order]
    bounds = stratum_bounds(sizes, relational.param("fractions"))
    rows = np.column_stack([firsts[order], bounds[:, index], bounds[:, index + 1]]).tolist()
    table = frames[0].sparkSession.createDataFrame(
        rows, schema=f"{_FIRST2} long, {_LO} long, {_HI} long"
    )
    cut = joined.join(F.broadcast(table), F.col(_FIRST) == F.col(_FIRST2), "inner")
    return cut.where((rank >= F.col(_LO)) & (rank < F.col(_HI)))


_OPS = {
    "sort": _sort,
    "aggregate": _aggregate,
    "join": _join,
    "union": _union,
    "unique": _unique,
    "repartition": _repartition,
    "random_shuffle": _random_shuffle,
    "split": _split,
}
