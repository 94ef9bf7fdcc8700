"""Turning a feedline plan into a Spark DataFrame (driver side of the Spark engine).

The input of the first stage is a small DataFrame with one row per Spark partition, naming
a contiguous range of feedline's own read tasks; the fused stage (``mapInArrow``) runs
``task.read`` and the operators. A ``Limit`` ends a stage: the rows are numbered with
``monotonically_increasing_id`` (partition order, then row order), the first ``n`` are
taken in that order, and the next stage runs on them. A :class:`SparkFrameSource` (from
:func:`feedline.engines.spark.bridge.from_spark` without its cache) is read natively: its
DataFrame feeds the first stage directly.
"""

from __future__ import annotations

import contextlib
import io
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from feedline.engines.batch.fusion import split_at_limits
from feedline.engines.local.engine import plan_schema
from feedline.engines.spark.cluster import missing_module_error
from feedline.engines.spark.types import spark_arrow_schema, to_spark_schema
from feedline.engines.spark.worker import (
    SHARD_COLUMNS,
    TASK_COLUMNS,
    ReportParam,
    Stage,
    WriteSpec,
    decode_error,
    fold_report,
)
from feedline.engines.write_resume import unit_bounds
from feedline.io.source import ExecutionReport, ReadTask
from feedline.plan.plan import Limit, Plan, pushdown

__all__ = ["Job", "Units", "build_job", "dumps_tasks", "partition_bounds", "spark_errors"]

#: a task list pickled to at most this many bytes is broadcast once; a larger one (an
#: in-memory table) travels as one payload per partition, so no row is shipped twice
BROADCAST_BYTES = 32 << 20
_ORDER = "__feedline_order"


@contextlib.contextmanager
def spark_errors() -> Iterator[None]:
    """Re-raise a feedline error that failed a Spark job as itself (without the JVM trace)."""
    try:
        yield
    except Exception as exc:
        error = decode_error(str(exc)) or missing_module_error(str(exc))
        if error is None:
            raise
        raise error from None


@contextlib.contextmanager
def quiet_pandas_warning() -> Iterator[None]:
    """Silence PySpark's "pandas >= 3 not fully supported" warning: ``mapInArrow`` and
    ``toArrow`` never use pandas, so it does not apply to feedline's jobs."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", "PySpark does not yet fully support pandas", category=FutureWarning
        )
        yield


def dumps_tasks(tasks: Any) -> bytes:
    """Pickle read tasks with cloudpickle; Arrow tables and batches travel as Arrow IPC.

    IPC writes only a slice's own rows, where pickling a slice of a table would carry the
    whole parent buffers (every task of an in-memory table would hold all of it).

    Examples
    --------
    >>> table = pa.table({"x": range(100_000)})
    >>> len(dumps_tasks(table.slice(0, 10))) < 2_000
    True
    """
    from pyspark import cloudpickle

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, pa.Table | pa.RecordBatch):
                sink = io.BytesIO()
                with pa.ipc.new_stream(sink, obj.schema) as writer:
                    writer.write(obj)
                kind = "table" if isinstance(obj, pa.Table) else "batch"
                return _from_ipc, (sink.getvalue(), kind)
            return super().reducer_override(obj)

    with io.BytesIO() as buffer:
        _Pickler(buffer).dump(tasks)
        return buffer.getvalue()


def _from_ipc(data: bytes, kind: str) -> pa.Table | pa.RecordBatch:
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    if kind == "table":
        return table
    if table.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table.combine_chunks().to_batches()[0]


@dataclass
class Job:
    """A DataFrame ready to run, and what the driver does after it ran."""

    frame: Any
    schema: pa.Schema
    accumulator: Any
    broadcasts: list[Any] = field(default_factory=list)
    folded: bool = False

    def collect(self, report: ExecutionReport | None = None) -> pa.Table:
        """Run the job, collect its rows as Arrow (Spark's types), fold the counters."""
        try:
            with spark_errors(), quiet_pandas_warning():
                return self.frame.toArrow()
        finally:
            self.finish(report)

    def stream(self, report: ExecutionReport | None = None) -> Iterator[pa.RecordBatch]:
        """Run a ``"stream"`` job and yield its batches in partition order, one partition
        in driver memory at a time (plus one prefetched).

        All partitions are computed at once, in parallel, into the executors' storage
        (``MEMORY_AND_DISK``); the driver then fetches them one by one with
        ``toLocalIterator`` and the storage is released at the end.
        """
        from pyspark import StorageLevel

        with _coalescable_cache(self.frame.sparkSession):
            frame = self.frame.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with spark_errors(), quiet_pandas_warning():
                frame.count()  # computes every partition in parallel
            self.finish(report)
            with spark_errors():
                for row in frame.toLocalIterator(prefetchPartitions=True):
                    yield from pa.ipc.open_stream(pa.py_buffer(row[0]))
        finally:
            self.finish(report)
            with contextlib.suppress(Exception):
                frame.unpersist()

    def finish(self, report: ExecutionReport | None) -> None:
        """Fold the accumulated counters into ``report`` (once) and release the broadcasts."""
        if report is not None and not self.folded:
            self.folded = True
            fold_report(report, self.accumulator.value)
        for broadcast in self.broadcasts:
            with contextlib.suppress(Exception):
                broadcast.unpersist()
        self.broadcasts.clear()


#: lets adaptive execution coalesce the shuffle partitions of a plan being cached (Spark
#: keeps a cached plan's 200 ``spark.sql.shuffle.partitions`` otherwise: 200 fetch jobs)
_CACHED_COALESCE = "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"


@contextlib.contextmanager
def _coalescable_cache(spark: Any) -> Iterator[None]:
    """Within: a DataFrame persisted (planned) keeps adaptive partition coalescing, so a
    sort, aggregate or join streamed to the driver has few partitions, in order."""
    before = spark.conf.get(_CACHED_COALESCE, None)
    spark.conf.set(_CACHED_COALESCE, "true")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_CACHED_COALESCE)
        else:
            spark.conf.set(_CACHED_COALESCE, before)


def build_job(
    spark: Any,
    plan: Plan,
    *,
    mode: str = "rows",
    preserve_order: bool = True,
    partitions: int | None = None,
    partial: Callable[[pa.RecordBatch], Any] | None = None,
    merge: Callable[[Any, Any], Any] | None = None,
    write: WriteSpec | None = None,
    units: Units | None = None,
) -> Job:
    """The DataFrame computing ``plan`` (``mode``: ``"rows"``, ``"stream"``, ``"partial"`` or
    ``"write"``, see :class:`~feedline.engines.spark.worker.Stage`); ``units``: the read
    tasks already listed, their split into partitions and the partitions to run (a
    resumable write)."""
    with quiet_pandas_warning():
        return _build_job(
            spark, plan, mode, preserve_order, partitions, partial, merge, write, units
        )


@dataclass(frozen=True)
class Units:
    """The read tasks of a write in units, their split (:func:`~feedline.engines.
    write_resume.unit_bounds`: one Spark partition per unit) and the units to run."""

    tasks: list[ReadTask]
    bounds: list[int]
    run: list[int]


def _build_job(
    spark: Any,
    plan: Plan,
    mode: str,
    preserve_order: bool,
    partitions: int | None,
    partial: Callable[[pa.RecordBatch], Any] | None,
    merge: Callable[[Any, Any], Any] | None,
    write: WriteSpec | None,
    units: Units | None,
) -> Job:

    pushed = pushdown(plan)
    segments = split_at_limits(pushed.remaining)
    offset = len(plan.ops) - len(pushed.remaining)
    limits = [offset + i for i, op in enumerate(pushed.remaining) if isinstance(op, Limit)]
    schemas = [plan_schema(Plan(plan.source, plan.ops[:end])) for end in limits]
    schemas.append(plan_schema(plan))
    context = spark.sparkContext
    job = Job(None, schemas[-1], context.accumulator({}, ReportParam()))
    timezone = spark.conf.get("spark.sql.session.timeZone", "UTC")
    common = {"accumulator": job.accumulator, "token": uuid.uuid4().hex}
    native = getattr(plan.source, "native_frame", lambda: None)()
    if native is not None:
        frame = (
            native
            if pushed.predicate is not None or pushed.columns is None
            else native.select(*pushed.columns)
        )
        frame_schema = plan.source.schema()
        if frame is not native and pushed.columns is not None:  # (frame is a selection)
            frame_schema = pa.schema([frame_schema.field(c) for c in pushed.columns])
        first = {
            "from_tasks": False,
            "in_schema": frame_schema,
            "predicate": pushed.predicate,
            "columns": pushed.columns if frame is native else None,
            "label": getattr(plan.source, "label", "the Spark DataFrame (partition {partition})"),
        }
    else:
        if units is None:
            tasks = plan.source.read_tasks(pushed.columns, pushed.predicate)
            frame, broadcast = _task_frame(spark, tasks, partitions)
        else:
            frame, broadcast = _task_frame(spark, units.tasks, None, units.bounds, units.run)
        job.broadcasts += [broadcast] if broadcast is not None else []
        first = {"tasks": broadcast}
    for index, (ops, limit) in enumerate(segments):
        last = index == len(segments) - 1
        if last and index > 0 and not ops and mode == "rows":
            break  # the limited rows already have the final schema
        stage_mode = mode if last else "rows"
        rows_out = stage_mode == "rows"
        stage = Stage(
            ops=ops,
            mode=stage_mode,
            out_schema=schemas[index],
            spark_out=spark_arrow_schema(schemas[index], timezone) if rows_out else None,
            partial=partial,
            merge=merge,
            write=write,
            **common,
            **first,
        )
        frame = frame.mapInArrow(stage, _output_type(stage_mode, schemas[index]))
        if limit is not None:
            frame = _limit(frame, limit, preserve_order)
            first = {
                "from_tasks": False,
                "in_schema": schemas[index],
                "label": "the limited stream",
                "partition_index": False,
            }
    job.frame = frame
    return job


def _output_type(mode: str, schema: pa.Schema) -> Any:
    if mode == "rows":
        return to_spark_schema(schema)
    if mode == "stream":
        return "ipc binary"
    return "level long, position long, partial binary" if mode == "partial" else SHARD_COLUMNS


def _limit(frame: Any, n: int, preserve_order: bool) -> Any:
    """The first ``n`` rows in partition order (any ``n`` rows when order is not needed)."""
    if not preserve_order:
        return frame.limit(n)
    from pyspark.sql import functions as F

    numbered = frame.withColumn(_ORDER, F.monotonically_increasing_id())
    return numbered.orderBy(_ORDER).limit(n).drop(_ORDER)


def _task_frame(
    spark: Any,
    tasks: list[ReadTask],
    partitions: int | None,
    bounds: list[int] | None = None,
    run: list[int] | None = None,
) -> tuple[Any, Any]:
    """One row per Spark partition: ``(part, first task, task count, payload)``.

    The tasks are pickled together and broadcast when that is small; otherwise each
    partition's row carries its own tasks. ``bounds`` (else :func:`partition_bounds`) and
    ``run`` (the parts to run; default all) come from a resumable write.
    """
    context = spark.sparkContext
    if bounds is None:
        bounds = partition_bounds(spark, len(tasks), partitions)
    parts = len(bounds) - 1
    wanted = set(range(parts) if run is None else run)
    whole = dumps_tasks(tasks)
    broadcast = context.broadcast(whole) if len(whole) <= BROADCAST_BYTES else None
    rows = [
        (
            part,
            bounds[part],
            bounds[part + 1] - bounds[part],
            None if broadcast is not None else dumps_tasks(tasks[bounds[part] : bounds[part + 1]]),
        )
        for part in range(parts)
        if bounds[part + 1] > bounds[part] and part in wanted
    ]
    rdd = context.parallelize(rows, max(1, len(rows)))
    return spark.createDataFrame(rdd, TASK_COLUMNS), broadcast


def partition_bounds(spark: Any, tasks: int, partitions: int | None) -> list[int]:
    """The first read task of each Spark partition, then ``tasks``: ``partitions`` (else
    four per core of the default parallelism) contiguous ranges of nearly equal size."""
    return unit_bounds(tasks, partitions or 4 * spark.sparkContext.defaultParallelism)
