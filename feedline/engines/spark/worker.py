"""What runs inside Spark's Python workers: one fused feedline stage per ``mapInArrow``.

A :class:`Stage` is a picklable callable given to ``DataFrame.mapInArrow``. It reads its
input (feedline read tasks, or rows of a Spark DataFrame), pushes the batches through the
same :class:`~feedline.engines.batch.fusion.BatchPipeline` the local engine runs, and ends in one
of three ways (``mode``): yield the rows (``"rows"``), yield one pickled partial aggregate
per block of the fixed merge tree (``"partial"``, see :mod:`feedline.engines.batch.partials`),
yield each batch as Arrow IPC bytes for the driver to stream (``"stream"``), or write
feedline shards and yield their descriptions (``"write"``).

Two things must reach the driver besides rows:

- **Counters and skipped records** (``report.record_skip``): every task adds its
  :class:`~feedline.io.source.ExecutionReport` to a Spark accumulator, which the driver
  folds into its own report after the job. Spark applies the updates of successful tasks
  only, so a retried task is not counted twice.
- **Errors**: a failure is re-raised as a ``RuntimeError`` whose message carries the
  feedline error (class, message, the user function's traceback) encoded between
  ``[feedline-error:`` and ``]``; :func:`feedline.engines.spark_jobs.reraise` finds it
  in Spark's exception text and raises the feedline error on the driver, without the
  JVM traceback.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline import errors
from feedline.engines.batch.fusion import BatchPipeline, InstancePool, construct
from feedline.engines.batch.partials import TreeMerger, fold
from feedline.engines.spark.types import from_spark_batch, to_spark_batch
from feedline.engines.write_resume import write_unit
from feedline.errors import FeedlineError
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location
from feedline.plan.plan import Operator, callable_name
from feedline.store.shards import ShardWriter, task_first_shard
from feedline.store.write_journal import UnitRecord

__all__ = ["ERROR_MARKER", "ReportParam", "Stage", "decode_error", "encode_error"]

ERROR_MARKER = "[feedline-error:"
#: rows of the task table: one per Spark partition, naming a contiguous range of read tasks
TASK_COLUMNS = "part long, first long, count long, payload binary"
SHARD_COLUMNS = (
    "part long, seq long, path string, rows long, bytes long, row_groups array<long>, "
    "checksum string, footer string"
)


# ----------------------------------------------------------------------------- counters


class ReportParam:
    """Spark ``AccumulatorParam`` merging :meth:`ExecutionReport.as_dict` dictionaries."""

    def zero(self, value: dict[str, Any]) -> dict[str, Any]:
        return {}

    def addInPlace(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return merge_reports(a, b)


def merge_reports(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Add the counters of ``b`` to ``a`` (in place); lists are concatenated, dicts summed.

    Examples
    --------
    >>> merge_reports({"rows_read": 1, "skipped": [1]}, {"rows_read": 2, "skipped": [2]})
    {'rows_read': 3, 'skipped': [1, 2]}
    """
    for key, value in b.items():
        if isinstance(value, list):
            a[key] = (a.get(key) or []) + value[: max(0, 10_000 - len(a.get(key) or []))]
        elif isinstance(value, dict):
            into = a.setdefault(key, {})
            for name, count in value.items():
                into[name] = into.get(name, 0) + count
        else:
            a[key] = a.get(key, 0) + value
    return a


def fold_report(report: ExecutionReport, counts: dict[str, Any]) -> None:
    """Add the accumulated ``counts`` of a Spark job to the driver's ``report``."""
    with report._lock:
        for key, value in counts.items():
            if key == "skipped":
                report.skipped.extend(value[: max(0, 10_000 - len(report.skipped))])
            elif key == "counters":
                for name, count in value.items():
                    report.counters[name] = report.counters.get(name, 0) + count
            elif hasattr(report, key):
                setattr(report, key, getattr(report, key) + value)


# ----------------------------------------------------------------------------- errors


def encode_error(exc: BaseException) -> str:
    """The text of a worker-side failure, readable again by :func:`decode_error`."""

    cause = exc.__cause__ if isinstance(exc, FeedlineError) and exc.__cause__ else None
    detail = {
        "type": type(exc).__name__ if isinstance(exc, FeedlineError) else "FeedlineError",
        "message": str(exc)
        if isinstance(exc, FeedlineError)
        else f"A Spark task failed with {type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(cause or exc)[-12:]),
    }
    encoded = base64.b64encode(json.dumps(detail).encode()).decode("ascii")
    return f"{ERROR_MARKER}{encoded}]"


def decode_error(text: str) -> BaseException | None:
    """The feedline error encoded in ``text`` (a Spark exception's message), or ``None``."""
    import re

    match = re.search(re.escape(ERROR_MARKER) + r"([A-Za-z0-9+/=]+)\]", text)
    if match is None:
        return None
    detail = json.loads(base64.b64decode(match.group(1)))
    kind = getattr(errors, detail["type"], errors.FeedlineError)
    if not (isinstance(kind, type) and issubclass(kind, errors.FeedlineError)):
        kind = errors.FeedlineError
    message = detail["message"].replace(
        "The original traceback is chained above.",
        "The original traceback (on the Spark worker) is in the note below.",
    )
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    # an attribute only errors raised again from a Spark worker have (tests read it)
    error.worker_traceback = detail["traceback"]  # type: ignore[attr-defined]
    if hasattr(error, "add_note"):
        error.add_note("Traceback on the Spark worker:\n" + detail["traceback"].rstrip())
    return error


# ----------------------------------------------------------------------------- per-worker state

#: models kept by a Python worker across tasks and jobs: (class, kwargs digest, device) -> it
_MODELS: OrderedDict[tuple[Callable[..., Any], Any, str | None], Any] = OrderedDict()
#: models a worker keeps at most (the least recently used one is dropped first)
MAX_MODELS = 4
#: per job (token): the first class object seen under each (name, kwargs) pair
_CLASSES: OrderedDict[str, dict[tuple[str, Any], Callable[..., Any]]] = OrderedDict()


class _WorkerPool(InstancePool):
    """The Python worker's model registry, shared by every task this worker runs.

    Spark reuses a Python worker for many tasks (``spark.python.worker.reuse``, on by
    default), so a class is built once per worker and kept for later tasks, partitions and
    jobs (at most :data:`MAX_MODELS` models). Keys are the class object, its constructor
    arguments and device: a class pickled by value unpickles to the same class object in a
    worker while it is alive, and a class redefined on the driver is a new key, so a stale
    model is never reused. Within one job (``token``) classes are also matched by name, in
    case a task unpickles a fresh class object.
    """

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def get(
        self,
        cls: Callable[..., Any],
        kwargs: tuple[tuple[str, Any], ...],
        device: str | None = None,
    ) -> Any:
        classes = _CLASSES.setdefault(self.token, {})
        _CLASSES.move_to_end(self.token)
        while len(_CLASSES) > 8:
            _CLASSES.popitem(last=False)
        digest = _digest(kwargs)
        canonical = classes.setdefault((callable_name(cls), digest), cls)
        key = (canonical, digest, device)
        if key not in _MODELS:
            _MODELS[key] = construct(canonical, kwargs, device)
            while len(_MODELS) > MAX_MODELS:
                _MODELS.popitem(last=False)
        _MODELS.move_to_end(key)
        return _MODELS[key]


def _digest(kwargs: tuple[tuple[str, Any], ...]) -> str:
    """Constructor arguments as a key: each task unpickles fresh copies of them."""
    import hashlib

    from pyspark import cloudpickle

    return hashlib.sha256(cloudpickle.dumps(kwargs)).hexdigest()


def _pool(token: str) -> InstancePool:
    return _WorkerPool(token)


def _broadcast_tasks(broadcast: Any) -> list[Any]:
    """The broadcast task list, unpickled once per Python worker (kept on the broadcast)."""
    from pyspark import cloudpickle

    tasks = getattr(broadcast, "_feedline_tasks", None)
    if tasks is None:
        tasks = broadcast._feedline_tasks = cloudpickle.loads(broadcast.value)
    return tasks


# ----------------------------------------------------------------------------- the stage


@dataclass(frozen=True)
class WriteSpec:
    """Where and how a ``"write"`` stage writes its shards; with ``units``, each partition
    (a unit of read tasks) records its shards as they complete
    (:class:`~feedline.store.write_journal.UnitRecord`), for a resume."""

    staging: Location
    writer_kwargs: dict[str, Any]
    units: bool = False
    #: where units of an interrupted write continue: their records cut after their last
    #: verified shard
    resume: dict[int, UnitRecord] = field(default_factory=dict)
    #: where the tasks write their shards under final names instead of ``staging`` (object
    #: stores, where renaming them at the commit copies every byte), and the write's id
    into: Location | None = None
    write_id: str = ""


@dataclass(frozen=True)
class Stage:
    """One fused feedline stage, the function given to ``mapInArrow``.

    Attributes
    ----------
    ops:
        The batch operators fused in this stage (no ``Limit``).
    mode:
        ``"rows"``, ``"partial"`` or ``"write"`` (see the module docstring).
    out_schema, spark_out:
        The feedline schema of the rows leaving the operators, and Spark's Arrow form of it.
    tasks:
        Read-task input: a Spark broadcast of the pickled task list, or ``None`` when each
        partition's tasks travel in its input row. ``None`` for DataFrame input.
    in_schema:
        DataFrame input: the feedline schema of the incoming rows.
    """

    ops: tuple[Operator, ...]
    mode: str
    out_schema: pa.Schema
    spark_out: pa.Schema | None
    accumulator: Any
    token: str
    tasks: Any = None
    from_tasks: bool = True
    in_schema: pa.Schema | None = None
    columns: tuple[str, ...] | None = None
    predicate: pc.Expression | None = None
    label: str = "the Spark DataFrame"
    partition_index: bool = True
    partial: Callable[[pa.RecordBatch], Any] | None = None
    merge: Callable[[Any, Any], Any] | None = None
    write: WriteSpec | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        report = ExecutionReport()
        try:
            unit = None
            if self.mode == "write" and self.from_tasks:  # the partition's task rows (small)
                batches, unit = _unit_of(list(batches))
            pipeline = BatchPipeline(self.ops, report, _pool(self.token))
            leaves = self._leaves(batches, pipeline, report)
            outputs = (batch for _, stream in leaves for batch in stream)
            if self.mode == "rows":
                for batch in outputs:
                    if batch.num_rows:
                        yield to_spark_batch(batch, self.spark_out, "the fused stage")
            elif self.mode == "stream":
                for batch in outputs:
                    if batch.num_rows:
                        yield pa.record_batch({"ipc": pa.array([_ipc(batch)], pa.binary())})
            elif self.mode == "partial":
                yield from self._partials(leaves)
            else:
                yield from self._write(leaves, report, unit)
        except Exception as exc:  # every failure is re-raised, encoded
            raise RuntimeError(encode_error(exc)) from exc
        self.accumulator.add(report.as_dict())

    def _leaves(
        self, batches: Iterator[pa.RecordBatch], pipeline: BatchPipeline, report: ExecutionReport
    ) -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
        """``(leaf index, its output batches)``: one per read task (the task's index), or
        the whole partition (its index) for DataFrame input."""
        if self.from_tasks:
            for rows in batches:
                for _part, first, count, payload in zip(*rows.to_pydict().values(), strict=True):
                    tasks = (
                        _broadcast_tasks(self.tasks)[first : first + count]
                        if payload is None
                        else _loads(payload)
                    )
                    for offset, task in enumerate(tasks):
                        index = first + offset
                        yield index, pipeline(task.read(report), task.label, index)
            return
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        index = partition if self.partition_index else 0
        label = self.label.format(partition=index)
        yield partition, pipeline(self._frame_batches(batches, label, report), label, index)

    def _frame_batches(
        self, batches: Iterator[pa.RecordBatch], label: str, report: ExecutionReport
    ) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            report.add(rows_read=batch.num_rows)
            batch = from_spark_batch(batch, self.in_schema, label)
            if self.predicate is not None:
                batch = batch.filter(self.predicate)
            if self.columns is not None:
                batch = batch.select(list(self.columns))
            yield batch

    def _partials(
        self, leaves: Iterator[tuple[int, Iterator[pa.RecordBatch]]]
    ) -> Iterator[pa.RecordBatch]:
        """This partition's blocks of the fixed merge tree
        (:mod:`feedline.engines.batch.partials`)."""
        from pyspark import cloudpickle

        partial, merge = self.partial, self.merge
        assert partial is not None and merge is not None  # set for the mode "partial"
        tree = TreeMerger(merge)
        for index, stream in leaves:
            tree.push(0, index, fold((partial(b) for b in stream if b.num_rows), merge))
        blocks = [b for b in tree.blocks() if b[2] is not None]
        if blocks:
            yield pa.record_batch(
                {
                    "level": pa.array([b[0] for b in blocks], pa.int64()),
                    "position": pa.array([b[1] for b in blocks], pa.int64()),
                    "partial": pa.array([cloudpickle.dumps(b[2]) for b in blocks], pa.binary()),
                }
            )

    def _write(
        self,
        leaves: Iterator[tuple[int, Iterator[pa.RecordBatch]]],
        report: ExecutionReport,
        unit: tuple[int, int, int] | None,
    ) -> Iterator[pa.RecordBatch]:
        """Write the partition's rows as shards; ``unit``: ``(unit, first task, task
        count)`` of a partition of read tasks (the unit, not Spark's partition id, numbers
        the shards: a resume runs only some of the units), whose shards are recorded as
        they complete when the write journals (:func:`~feedline.engines.write_resume.
        write_unit`, continuing after the kept shards of ``spec.resume[unit]``)."""
        from pyspark import TaskContext

        spec = self.write
        assert spec is not None  # set for the mode "write"
        context = TaskContext.get()
        part = unit[0] if unit is not None else context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        name = f"task-{part:05d}-{attempt}-{uuid.uuid4().hex[:8]}"
        if spec.units and unit is not None:
            shards = write_unit(
                spec.staging,
                name,
                unit,
                leaves,
                spec.writer_kwargs,
                self.out_schema,
                report,
                spec.resume.get(unit[0]),
            )
        else:
            if spec.into is not None:  # final names, straight into the dataset folder
                writer = ShardWriter(
                    spec.into, schema=self.out_schema, write_id=spec.write_id,
                    first_shard=task_first_shard(part), **spec.writer_kwargs,
                )  # fmt: skip
            else:
                writer = ShardWriter(
                    spec.staging.child(name), schema=self.out_schema, **spec.writer_kwargs
                )
            try:
                for batch in (batch for _, stream in leaves for batch in stream):
                    if batch.num_rows:
                        report.add(rows_out=batch.num_rows, batches_out=1)
                        writer.write(batch)
                shards = writer.close()
            except BaseException:
                writer.abort()
                raise
            if spec.into is None:  # staged: the path within the staging folder
                shards = [dataclasses.replace(s, path=f"{name}/{s.path}") for s in shards]
        yield pa.record_batch(
            {
                "part": pa.array([part] * len(shards), pa.int64()),
                "seq": pa.array(range(len(shards)), pa.int64()),
                "path": pa.array([s.path for s in shards], pa.string()),
                "rows": pa.array([s.rows for s in shards], pa.int64()),
                "bytes": pa.array([s.bytes for s in shards], pa.int64()),
                "row_groups": pa.array([list(s.row_groups) for s in shards], pa.list_(pa.int64())),
                "checksum": pa.array([s.checksum for s in shards], pa.string()),
                "footer": pa.array([s.footer for s in shards], pa.string()),
            }
        )


def _unit_of(
    rows: list[pa.RecordBatch],
) -> tuple[Iterator[pa.RecordBatch], tuple[int, int, int] | None]:
    """The task rows of a write partition, and ``(unit, first task, task count)`` when the
    partition is one unit (a row of :data:`TASK_COLUMNS`), as the write's task frame has."""
    found = [
        (int(part), int(first), int(count))
        for batch in rows
        for part, first, count in zip(
            *(batch.column(c).to_pylist() for c in ("part", "first", "count")), strict=True
        )
    ]
    return iter(rows), found[0] if len(found) == 1 else None


def _ipc(batch: pa.RecordBatch) -> bytes:
    """One batch as an Arrow IPC stream (feedline's exact types, extension types included)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _loads(payload: bytes) -> list[Any]:
    from pyspark import cloudpickle

    return cloudpickle.loads(payload)
