"""The worker side of the Ray engine: the fused operator chain as ``ray.data`` stages.

A plan's first segment (everything before the first ``Limit``) becomes a chain of
``map_batches(batch_format="pyarrow")`` stages:

- the **read stage** (Ray tasks) gets blocks of read-task indices, runs each feedline read
  task (the exact code the local engine runs) and pushes its batches through the fused
  operators up to the first operator that holds per-worker state;
- each **actor stage** starts at a ``map_batches`` with a class (a model) or a ``transform``
  whose preprocessor holds heavy state (a tokenizer), and runs in an actor pool, so the
  class is constructed once per actor.

Between stages every row carries its read-task index in a hidden column
(:data:`TASK_COLUMN`), so error messages still name the input file and ``sample`` is seeded
per read task exactly as on the local engine. In an actor stage, batches are re-cut
(``batch_size``) within each block Ray hands over: a block usually holds all the rows of
a read task, so the batches are the local engine's; where Ray splits a task's output into
several blocks (over its ``target_max_block_size``), a short batch ends each block and a
``sample`` after the class restarts its random stream there.

Counters (rows read, records skipped and why) are collected per block and sent to a small
collector actor (:class:`ReportCollector`): Ray's writer consumes the data itself, so
counters cannot travel with it.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.engines.batch.fusion import BatchPipeline, InstancePool
from feedline.engines.ray.source import source_batch
from feedline.errors import FeedlineError
from feedline.io.source import ExecutionReport, ReadTask
from feedline.plan.plan import MapBatches, Operator, Transform
from feedline.preprocess.text.tokenize import Tokenize
from feedline.store.shards import conform

__all__ = [
    "PARTS_COLUMN",
    "PART_COLUMN",
    "TASK_COLUMN",
    "ReportCollector",
    "StageSpec",
    "merge_report",
    "needs_actor",
    "split_stages",
]

#: hidden column carrying each row's read-task index between stages
TASK_COLUMN = "__feedline_task__"
#: column of a read stage's input item that shares a read task among actors: its share
PART_COLUMN = "part"
#: column of a read stage's input item that shares a read task among actors: the shares
PARTS_COLUMN = "parts"
#: attribute set on a FeedlineError raised in a worker: its formatted traceback
REMOTE_TRACEBACK = "feedline_remote_traceback"
#: attribute set on a FeedlineError raised in a worker: its message as raised
REMOTE_MESSAGE = "feedline_remote_message"


def needs_actor(op: Operator) -> bool:
    """True for operators that run in an actor pool: classes and heavy preprocessors.

    Examples
    --------
    >>> needs_actor(MapBatches(len)), needs_actor(MapBatches(dict))
    (False, True)
    """
    if isinstance(op, MapBatches):
        return op.is_class
    if isinstance(op, Transform):
        return _holds_worker_state(op.preprocessor)
    return False


def _holds_worker_state(preprocessor: Any) -> bool:
    steps = getattr(preprocessor, "steps", None)
    if steps:
        return any(_holds_worker_state(step) for step in steps)
    if getattr(preprocessor, "worker_state", False):
        return True

    return isinstance(preprocessor, Tokenize)


def split_stages(ops: Sequence[Operator]) -> list[tuple[int, tuple[Operator, ...]]]:
    """Cut a segment's operators before each operator that needs an actor pool.

    Returns ``(position of the first operator, operators)`` per stage; the first stage
    (the read stage) is always there, possibly without operators.

    Examples
    --------
    >>> [(start, len(ops)) for start, ops in split_stages([MapBatches(len), MapBatches(dict)])]
    [(0, 1), (1, 1)]
    """
    stages: list[tuple[int, list[Operator]]] = [(0, [])]
    for position, op in enumerate(ops):
        if needs_actor(op):  # reads stay in tasks even when the first operator is a class
            stages.append((position, [op]))
        else:
            stages[-1][1].append(op)
    return [(start, tuple(group)) for start, group in stages]


@dataclass(frozen=True)
class StageSpec:
    """Everything one stage needs on a worker (pickled once per stage by Ray).

    Attributes
    ----------
    ops, offset:
        The fused operators and the position of the first in the plan's segment.
    labels:
        The label (input file) of every read task, by task index.
    read_tasks:
        The feedline read tasks (read stage of a file source only).
    source_blocks:
        ``(columns, predicate)`` when the input blocks come from a ``ray.data.Dataset``
        source (``fl.from_ray``); ``None`` otherwise.
    tag_output:
        Add :data:`TASK_COLUMN` to the output (another stage follows).
    conform:
        Cast every output batch to this schema (writes: all shards share one schema).
    partial, merge:
        Aggregation: emit one pickled partial per read task instead of rows.
    collector, run_id:
        Where to send this stage's counters; ``None`` outside feedline's terminal calls.
    count_output:
        Count ``rows_out``/``batches_out`` here (writes, where the driver sees no rows).
    """

    ops: tuple[Operator, ...]
    offset: int
    labels: tuple[str, ...]
    read_tasks: tuple[ReadTask, ...] | None = None
    source_blocks: tuple[Sequence[str] | None, pc.Expression | None] | None = None
    tag_output: bool = False
    conform: pa.Schema | None = None
    partial: Callable[[pa.RecordBatch], Any] | None = None
    merge: Callable[[Any, Any], Any] | None = None
    collector: Any = None
    run_id: str = ""
    count_output: bool = False


class _OffsetPipeline(BatchPipeline):
    """A :class:`BatchPipeline` whose operators sit at ``offset`` in the plan's segment, so
    ``Sample`` seeds are the same as when the segment runs as one pipeline."""

    def __init__(
        self,
        ops: Sequence[Operator],
        report: ExecutionReport | None,
        instances: InstancePool | None,
        offset: int,
    ) -> None:
        super().__init__(ops, report, instances)
        self.offset = offset

    def __call__(
        self, batches: Iterable[pa.RecordBatch], label: str, task_index: int = 0
    ) -> Iterator[pa.RecordBatch]:
        stream = iter(batches)
        for position, op in enumerate(self.ops, start=self.offset):
            stream = self._stage(op, stream, label, task_index, position)
        return stream


class StageRunner:
    """The function ``map_batches`` calls with one block (a ``pa.Table``); yields tables.

    Used as is in Ray tasks; :class:`ActorStage` builds one per actor, so the classes in its
    operators are constructed once per actor.
    """

    def __init__(self, spec: StageSpec) -> None:
        self.spec = spec
        self.instances = InstancePool()

    def __reduce__(self) -> tuple[Any, ...]:  # the instance pool stays behind
        return (type(self), (self.spec,))

    def __call__(self, block: pa.Table) -> Iterator[pa.Table]:
        report = ExecutionReport()
        pipeline = _OffsetPipeline(self.spec.ops, report, self.instances, self.spec.offset)
        try:
            if self.spec.partial is not None:
                yield from self._partials(pipeline, block)
            else:
                for index, batch in self._outputs(pipeline, block, report):
                    yield self._finish(batch, index, report)
        except FeedlineError as exc:
            setattr(exc, REMOTE_TRACEBACK, "".join(traceback.format_exception(exc)))
            setattr(exc, REMOTE_MESSAGE, str(exc))  # Ray appends retry advice to args
            raise
        finally:
            self._send(report)

    def _inputs(
        self, block: pa.Table, report: ExecutionReport
    ) -> Iterator[tuple[int, str, Iterable[pa.RecordBatch]]]:
        """``(task index, label, batches)`` for each read task found in ``block``."""
        spec = self.spec
        if spec.read_tasks is not None:
            for index in block.column("task").to_pylist():
                task = spec.read_tasks[index]
                yield index, task.label, task.read(report)
        elif spec.source_blocks is not None:
            columns, predicate = spec.source_blocks
            batches = [source_batch(b, columns, predicate) for b in block.to_batches()]
            report.add(rows_read=block.num_rows)
            yield 0, spec.labels[0], batches
        else:
            tasks = block.column(TASK_COLUMN).to_numpy()
            rows = block.drop_columns([TASK_COLUMN])
            cuts = np.flatnonzero(np.diff(tasks)) + 1
            for start, stop in zip([0, *cuts], [*cuts, len(tasks)], strict=True):
                index = int(tasks[start])
                yield index, spec.labels[index], rows.slice(start, stop - start).to_batches()

    def _outputs(
        self, pipeline: BatchPipeline, block: pa.Table, report: ExecutionReport
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        if self.spec.read_tasks is not None and PART_COLUMN in block.column_names:
            yield from self._share(block, report)
            return
        for index, label, batches in self._inputs(block, report):
            for batch in pipeline(batches, label, index):
                if batch.num_rows:
                    yield index, batch

    def _share(
        self, block: pa.Table, report: ExecutionReport
    ) -> Iterator[tuple[int, pa.RecordBatch]]:
        """Share ``part`` of ``parts`` of a read task's output (items of
        :func:`feedline.engines.ray.dataset.build_dataset` when there are fewer read tasks
        than actors): the whole task runs through the stage's operators, exactly as
        unshared, and rows ``[floor(part·n/parts), floor((part+1)·n/parts))`` of its ``n``
        output rows are kept, so the shares in order are the task's output. Only share 0
        counts what it reads (the others read the same rows again)."""
        spec = self.spec
        assert spec.read_tasks is not None  # only read stages get shared items
        columns = (block.column(c).to_pylist() for c in ("task", PART_COLUMN, PARTS_COLUMN))
        for index, part, parts in zip(*columns, strict=True):
            task = spec.read_tasks[index]
            counted = report if part == 0 else ExecutionReport()
            pipeline = _OffsetPipeline(spec.ops, counted, self.instances, spec.offset)
            outputs = [b for b in pipeline(task.read(counted), task.label, index) if b.num_rows]
            whole = pa.Table.from_batches(outputs) if outputs else None
            if whole is None:
                continue
            start, stop = whole.num_rows * part // parts, whole.num_rows * (part + 1) // parts
            for batch in whole.slice(start, stop - start).to_batches():
                if batch.num_rows:
                    yield index, batch

    def _partials(self, pipeline: BatchPipeline, block: pa.Table) -> Iterator[pa.Table]:
        import ray.cloudpickle as cloudpickle

        spec = self.spec
        partial, merge = spec.partial, spec.merge
        assert partial is not None and merge is not None  # a partial stage has both
        for index, label, batches in self._inputs(block, pipeline.report):
            result = None
            for batch in pipeline(batches, label, index):
                if batch.num_rows:
                    part = partial(batch)
                    result = part if result is None else merge(result, part)
            if result is not None:
                yield pa.table(
                    {
                        "task": pa.array([index], pa.int64()),
                        "partial": pa.array([cloudpickle.dumps(result)], pa.binary()),
                    }
                )

    def _finish(self, batch: pa.RecordBatch, index: int, report: ExecutionReport) -> pa.Table:
        spec = self.spec
        if spec.conform is not None and not batch.schema.equals(spec.conform):
            batch = conform(batch, spec.conform)
        if spec.count_output:
            report.add(rows_out=batch.num_rows, batches_out=1)
        table = pa.Table.from_batches([batch])
        if spec.tag_output:
            table = table.append_column(
                TASK_COLUMN, pa.array(np.full(batch.num_rows, index, np.int64))
            )
        return table

    def _send(self, report: ExecutionReport) -> None:
        delta = report.as_dict()
        if not any(delta.values()):
            return
        if self.spec.collector is None:
            if report.records_skipped:
                warnings.warn(
                    f"feedline skipped {report.records_skipped} record(s) in a Ray worker, e.g. "
                    f"{report.skipped[:1]}. Run the plan with Dataset.write or iter_batches "
                    "(engine='ray') to get them in the execution report.",
                    stacklevel=2,
                )
            return
        import ray

        try:
            ray.get(self.spec.collector.add.remote(self.spec.run_id, delta))
        except ray.exceptions.RayError as exc:  # the rows are fine; say what is not counted
            warnings.warn(
                f"feedline could not send a worker's counters to the driver ({exc!r}); the "
                f"execution report misses {report.records_skipped} skipped record(s) "
                f"{report.skipped[:3]} and {report.rows_read} rows read.",
                stacklevel=2,
            )


class ActorStage(StageRunner):
    """:class:`StageRunner` as a callable class: Ray builds one per actor of the pool.

    The model classes of the stage are constructed when the actor starts (once per actor),
    not on its first block, so a pool of ``concurrency`` actors holds exactly that many. A
    constructor that fails is reported by the first call: Ray's ``ActorDiedError`` for a
    failed ``__init__`` does not keep the original exception, a failed task does.
    """

    def __init__(self, spec: StageSpec) -> None:
        super().__init__(spec)
        self.failed: FeedlineError | None = None
        try:
            for op in spec.ops:
                if isinstance(op, MapBatches) and op.is_class:
                    self.instances.get(op.fn, op.fn_constructor_kwargs, op.device)
        except FeedlineError as exc:
            self.failed = exc

    def __call__(self, block: pa.Table) -> Iterator[pa.Table]:
        if self.failed is not None:
            exc = self.failed
            setattr(exc, REMOTE_TRACEBACK, "".join(traceback.format_exception(exc)))
            setattr(exc, REMOTE_MESSAGE, str(exc))
            raise exc
        yield from super().__call__(block)


class ReportCollector:
    """Counters of running plans, by run id (runs as a Ray actor with ``num_cpus=0``)."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}

    def add(self, run_id: str, delta: dict[str, Any]) -> None:
        total = self.runs.setdefault(run_id, {"skipped": [], "counters": {}})
        for name, value in delta.items():
            if name == "skipped":
                room = 10_000 - len(total["skipped"])
                total["skipped"].extend(value[: max(room, 0)])
            elif name == "counters":
                for key, count in value.items():
                    total["counters"][key] = total["counters"].get(key, 0) + count
            else:
                total[name] = total.get(name, 0) + value

    def pop(self, run_id: str) -> dict[str, Any] | None:
        return self.runs.pop(run_id, None)


def merge_report(report: ExecutionReport, delta: dict[str, Any] | None) -> None:
    """Add the counters collected from the workers (``ReportCollector.pop``) to ``report``."""
    if not delta:
        return
    skipped = delta.get("skipped", [])
    numbers = {
        k: v for k, v in delta.items() if k not in ("skipped", "counters", "records_skipped")
    }
    report.add(**numbers)
    for entry in skipped:
        report.record_skip(entry["where"], entry["reason"])
    rest = delta.get("records_skipped", 0) - len(skipped)
    if rest > 0:
        report.add(records_skipped=rest)
    for name, value in delta.get("counters", {}).items():
        report.count(name, value)
