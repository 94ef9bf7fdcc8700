"""The embedded local engine: a streaming executor over a thread pool.

Read tasks (files, row-group ranges, slices) run in parallel worker threads, each pushing
its batches through the fused operator pipeline into a queue bounded in bytes. Arrow,
NumPy and the Parquet codecs release the GIL, so threads scale for the heavy parts.

A ``map_batches`` with a class (a model) starts a stage of its own: ``concurrency`` worker
threads (default 1), each building the class once, fed batches of exactly ``batch_size``
rows re-cut across read tasks, while the read tasks keep running (see
:func:`feedline.engines.local.executor.run_stage` and :mod:`feedline.plan.inference`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from feedline._version import __version__
from feedline.arrow.sizes import parse_bytes
from feedline.engines.batch.fusion import (
    BatchPipeline,
    InstancePool,
    apply_limit,
    rebatch,
    split_at_limits,
    split_at_models,
)
from feedline.engines.batch.partials import TreeMerger, fold
from feedline.engines.local.executor import run_stage, run_tasks
from feedline.engines.local.relational import relational_tasks
from feedline.engines.local.resumable_write import write_resumable
from feedline.engines.protocol import WriteInfo, WriteOptions
from feedline.engines.schema import infer_schema
from feedline.engines.write_resume import write_identity
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport, ReadTask, Source
from feedline.io.storage.paths import Location
from feedline.plan.plan import MapBatches, Operator, Plan, Pushdown, callable_name, pushdown
from feedline.plan.relational import RelationalSource, plan_lines
from feedline.store import dataset_files as fmt
from feedline.store.commit import WriteBase

__all__ = ["LocalEngine", "lineage_of", "plan_schema"]

logger = logging.getLogger(__name__)


class LocalEngine:
    """Runs plans in this process with a bounded thread pool.

    Parameters
    ----------
    parallelism:
        Worker threads (read tasks running at once). Default: the number of CPUs, at least 2.
    memory_budget:
        Upper bound on bytes of batches queued between stages (``"1GB"``, ``512 << 20``).
        Peak memory is about this budget plus a few working batches per worker
        and the writer's row-group buffer (measured: 2 GiB streamed with a 256 MB budget
        and 8 workers peaked at 654 MiB RSS).
    relational_memory:
        Memory limit of the embedded query engine (DuckDB) running sort, groupby, join,
        union, unique, random_shuffle, repartition and split; over it, they spill to
        ``spill_directory``. Default: ``memory_budget``. DuckDB gets one thread per 64 MB
        of it, up to ``parallelism`` (with less per thread a sort can fail to spill).
    spill_directory:
        Where they spill. Default: a fresh temporary directory, removed afterwards. A
        spill that fills its disk raises ``StorageError`` naming the directory.

    Examples
    --------
    >>> import feedline as fl
    >>> engine = LocalEngine(parallelism=2, memory_budget="256MB")
    >>> fl.range(10).count(engine=engine)
    10
    """

    name = "local"

    def __init__(
        self,
        parallelism: int | None = None,
        memory_budget: int | str = "1GB",
        relational_memory: int | str | None = None,
        spill_directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if parallelism is not None and parallelism < 1:
            raise ConfigurationError(
                f"parallelism={parallelism} must be >= 1. Fix: pass a positive int or None."
            )
        self.parallelism = parallelism or max(2, os.cpu_count() or 2)
        self.memory_budget = parse_bytes(memory_budget)
        self.relational_memory = parse_bytes(relational_memory or memory_budget)
        self.spill_directory = spill_directory

    def __repr__(self) -> str:
        return f"LocalEngine(parallelism={self.parallelism}, memory_budget={self.memory_budget})"

    @staticmethod
    def first_rows(plan: Plan) -> pa.RecordBatch | None:
        """The first batch ``plan`` yields (``None`` for no rows): the sampler that
        :func:`~feedline.engines.schema.infer_schema` runs, on a one-thread engine with a
        small budget (a Spark or Ray driver should not read a row group per core for it).

        Examples
        --------
        >>> from feedline.io.memory import RangeSource
        >>> LocalEngine.first_rows(Plan(RangeSource(3))).num_rows
        3
        """
        sampler = LocalEngine(parallelism=1, memory_budget="64MB")
        stream = sampler.execute(plan)
        try:
            return next(stream, None)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    def execute(
        self, plan: Plan, *, preserve_order: bool = True, report: ExecutionReport | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream the plan's output batches (see :class:`LocalEngine`)."""
        report = report if report is not None else ExecutionReport()
        pushed = pushdown(plan)
        segments = split_at_limits(pushed.remaining)
        instances = InstancePool()
        first_ops, first_limit = segments[0]
        head, *models = split_at_models(first_ops)
        pipeline = BatchPipeline(head, report, instances)
        read_tasks = self._read_tasks(plan, pushed)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Local engine: %d read task(s) on %d thread(s) for %s",
                len(read_tasks), self.parallelism, plan.source.describe()[:200],
            )  # fmt: skip
        # the read tasks' queues and every model stage's queue share the memory budget
        stages = 1 + sum(len(split_at_models(ops)) - 1 for ops, _ in segments)
        budget = max(1, self.memory_budget // stages)

        def make_task(index: int) -> Callable[[], Iterator[pa.RecordBatch]]:
            task = read_tasks[index]

            def run() -> Iterator[pa.RecordBatch]:
                return pipeline(task.read(report), task.label, index)

            return run

        stream: Iterator[pa.RecordBatch] = run_tasks(
            [make_task(i) for i in range(len(read_tasks))],
            parallelism=self.parallelism,
            memory_budget=budget,
            preserve_order=preserve_order,
        )
        for ops in models:
            stream = self._model_stage(ops, stream, report, preserve_order, budget)
        if first_limit is not None:
            stream = apply_limit(stream, first_limit)
        for ops, limit in segments[1:]:
            head, *models = split_at_models(ops)
            stream = BatchPipeline(head, report, instances)(stream, "the limited stream")
            for model_ops in models:
                stream = self._model_stage(model_ops, stream, report, preserve_order, budget)
            if limit is not None:
                stream = apply_limit(stream, limit)
        return _counted(stream, report)

    def _read_tasks(self, plan: Plan, pushed: Pushdown) -> list[ReadTask]:
        """The source's read tasks; a relational source's come from DuckDB."""
        if isinstance(plan.source, RelationalSource):
            return relational_tasks(self, plan.source, pushed.columns, pushed.predicate)
        return plan.source.read_tasks(pushed.columns, pushed.predicate)

    def _model_stage(
        self,
        ops: tuple[Operator, ...],
        stream: Iterator[pa.RecordBatch],
        report: ExecutionReport,
        preserve_order: bool,
        budget: int,
    ) -> Iterator[pa.RecordBatch]:
        """Run ``ops`` (a class ``map_batches`` first) in worker threads of their own."""
        model = ops[0]
        assert isinstance(model, MapBatches) and model.is_class
        instances = InstancePool()  # one instance per worker thread
        pipeline = BatchPipeline(ops, report, instances)
        name = callable_name(model.fn)

        def setup() -> None:
            instances.get(model.fn, model.fn_constructor_kwargs, model.device)

        def process(seq: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
            return list(pipeline([batch], f"batch {seq} of the input of {name}", seq))

        if model.batch_size:
            stream = rebatch(stream, model.batch_size)
        return run_stage(
            stream,
            process,
            workers=model.concurrency or 1,
            memory_budget=budget,
            preserve_order=preserve_order,
            setup=setup,
            name=f"feedline-{name.rsplit('.', 1)[-1]}",
        )

    def aggregate(
        self,
        plan: Plan,
        partial: Callable[[pa.RecordBatch], Any],
        merge: Callable[[Any, Any], Any],
    ) -> Any:
        """Compute ``partial`` on every output batch in the workers and ``merge`` the results.

        Returns ``None`` when the plan yields no rows. Used to fit preprocessors and to
        compute statistics; ``merge`` must be associative and commutative. Each read
        task's batches are folded in order and the tasks' partials merged in the fixed
        tree of :mod:`feedline.engines.batch.partials`, as on Spark and Ray, so the result is
        bit-identical across engines (a plan with a ``limit`` or a class ``map_batches``
        folds its output stream in order instead).
        """
        pushed = pushdown(plan)
        segments = split_at_limits(pushed.remaining)
        if len(segments) > 1 or len(split_at_models(segments[0][0])) > 1:
            # a limit needs the merged stream, a model its own stage: aggregate the output
            result = None
            for batch in self.execute(plan, preserve_order=True):
                if batch.num_rows:
                    part = partial(batch)
                    result = part if result is None else merge(result, part)
            return result
        report = ExecutionReport()
        pipeline = BatchPipeline(segments[0][0], report, InstancePool())
        read_tasks = self._read_tasks(plan, pushed)

        def make_task(index: int) -> Callable[[], Iterator[Any]]:
            task = read_tasks[index]

            def run() -> Iterator[Any]:
                batches = pipeline(task.read(report), task.label, index)
                yield _Partial(index, fold((partial(b) for b in batches if b.num_rows), merge))

            return run

        tree = TreeMerger(merge)
        for item in run_tasks(
            [make_task(i) for i in range(len(read_tasks))],
            parallelism=self.parallelism,
            memory_budget=self.memory_budget,
            preserve_order=True,
        ):
            tree.push(0, item.index, item.value)
        return tree.result()

    def write(
        self,
        plan: Plan,
        target: Location,
        options: WriteOptions,
        *,
        preserve_order: bool = True,
        on_rows: Callable[[int], None] | None = None,
        report: ExecutionReport | None = None,
        preprocessors: list[dict[str, Any]] | None = None,
        base: WriteBase | None = None,
        resume: bool = False,
    ) -> WriteInfo:
        """Materialize the plan as a feedline dataset at ``target`` (committed only if it
        is still at ``base``, when given).

        On local disk, a plan whose read tasks stream in order through one pipeline (no
        ``limit``, no class ``map_batches``) journals its shards as it writes; ``resume=True``
        continues an interrupted write of the same plan, input and options, redoing only
        the read tasks whose output is not in a verified shard
        (:mod:`feedline.store.write_journal`).
        """

        report = report if report is not None else ExecutionReport()
        start = time.perf_counter()
        pushed = pushdown(plan)
        segments = split_at_limits(pushed.remaining)
        ops, limit = segments[0]
        journaled = (
            target.is_local
            and preserve_order
            and len(segments) == 1
            and limit is None
            and len(split_at_models(ops)) == 1
        )
        if resume and not journaled:
            raise ConfigurationError(
                f"resume=True cannot resume the write to {target.url!r}: only a write to local "
                "disk of a plan without limit() or a class map_batches, with "
                "preserve_order=True, keeps the journal a resume needs (this one "
                f"{'writes to remote storage' if not target.is_local else 'does not'}). "
                "Fix: drop resume=True (the write starts over)."
            )
        if journaled:
            tasks = self._read_tasks(plan, pushed)
            options_kwargs = options.writer_kwargs()
            manifest = write_resumable(
                target,
                tasks,
                ops,
                identity=write_identity(plan, len(tasks), options_kwargs, preprocessors, base),
                resume=resume,
                parallelism=self.parallelism,
                memory_budget=self.memory_budget,
                writer_options=options_kwargs,
                schema_hint=lambda: infer_schema(plan, LocalEngine.first_rows),
                lineage=lineage_of(plan, self.name),
                write_info={"options": options_kwargs},
                on_rows=on_rows,
                preprocessors=preprocessors,
                report=report,
                base=base,
            )
            return WriteInfo.from_manifest(
                target.url, manifest, started=start, engine=self.name, report=report
            )
        batches = self.execute(plan, preserve_order=preserve_order, report=report)
        manifest = fmt.write_batches(
            target,
            batches,
            schema_hint=lambda: infer_schema(plan, LocalEngine.first_rows),
            lineage=lineage_of(plan, self.name),
            writer_options=options.writer_kwargs(),
            write_info={"options": options.writer_kwargs()},
            on_rows=on_rows,
            preprocessors=preprocessors,
            report=report,
            base=base,
        )
        return WriteInfo.from_manifest(
            target.url, manifest, started=start, engine=self.name, report=report
        )


class _Partial:
    """A partial aggregate travelling through the executor's queues (counted as 0 bytes)."""

    nbytes = 0

    def __init__(self, index: int, value: Any) -> None:
        self.index = index
        self.value = value


def lineage_of(plan: Plan, engine: str) -> dict[str, Any]:
    """The lineage block of a manifest: where the data came from and what was done to it.

    ``source`` names the inputs the rows were read from: for a plan whose source is a
    relational operator (a split, a join...) those are its input plans' sources, found
    through every nested operator (several joined by ``" + "``), never the operator itself;
    ``plan`` lists the operators (a relational one with its input plans, as ``explain()``).

    Examples
    --------
    >>> import feedline as fl
    >>> train, _ = fl.range(10).train_test_split(0.2)
    >>> lineage = lineage_of(train.plan, "local")
    >>> lineage["source"], lineage["plan"][1]
    ('range: 10 rows', '  input 0: Read(range: 10 rows)')
    """

    return {
        "source": " + ".join(dict.fromkeys(s.describe() for s in _read_sources(plan))),
        "source_fingerprint": plan.source.fingerprint(),
        "plan": plan_lines(plan) if isinstance(plan.source, RelationalSource) else plan.describe(),
        "plan_fingerprint": plan.fingerprint(),
        "engine": engine,
        "feedline_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _read_sources(plan: Plan) -> list[Source]:
    """The sources a plan reads, through its relational operators' input plans."""
    if not isinstance(plan.source, RelationalSource):
        return [plan.source]
    return [found for child in plan.source.inputs for found in _read_sources(child)]


def _counted(stream: Iterator[pa.RecordBatch], report: ExecutionReport) -> Iterator[pa.RecordBatch]:
    started = time.perf_counter()
    try:
        for batch in stream:
            if batch.num_rows:
                report.add(rows_out=batch.num_rows, batches_out=1)
                yield batch
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Plan executed on the local engine in %.2f s: %s",
                time.perf_counter() - started, report.as_dict(),
            )  # fmt: skip


def plan_schema(plan: Plan) -> pa.Schema:
    """The output schema of ``plan``, learnt from metadata or, where a user function must run,
    from a sample run on the local engine (what every driver uses, whatever the engine).

    Examples
    --------
    >>> from feedline.io.memory import RangeSource
    >>> plan_schema(Plan(RangeSource(3))).names
    ['id']
    """
    return infer_schema(plan, LocalEngine.first_rows)
