"""The Ray engine: the same fused operator chain through ``ray.data`` ``map_batches``.

Design
------
**Reading.** Ray does not read the files with its own readers: the feedline read tasks of
the plan's source (a file, a group of row groups, a byte range of a CSV file, 64 images)
are distributed instead: ``ray.data.from_items`` of the task indices, one block per task,
and a ``map_batches`` stage that runs ``task.read`` and the fused operators. So a plan
gives the same rows, the same schema, the same errors (naming the file) and the same
counters as on the local engine: one schema inference (CSV, JSON lines), one schema-drift
check, one ``on_error`` policy for malformed CSV rows, image labels from folder names,
row-group pruning with the pushed-down predicate. What this gives up: Ray's readers split
big files into blocks and prefetch file metadata in parallel on their own, and they
schedule reads next to the data on clusters with local disks; here a read task is the
unit of parallelism (big CSV files are still cut into byte ranges, Parquet reads per file).

**Operators.** The first segment of the plan (up to the first ``limit``) runs in Ray:
reads and stateless operators in Ray tasks; a ``map_batches`` with a class (a model) or
a ``transform`` with a tokenizer starts a stage in an actor pool (``concurrency=`` of the
operator, else autoscaling from 1 to the cluster's CPUs), where the class is constructed
once per actor, when the actor starts (see :mod:`feedline.engines.ray.stages`); a model
with ``device="cuda..."`` asks for one GPU per actor when the cluster has GPUs. Ray's
optimizer may fuse the read stage into the first actor stage (the reads then run in the
actors too); with fewer read tasks than the ``concurrency`` of the first actor stage, each
task is read in shares, one per actor, so every actor gets work;
:mod:`feedline.engines.ray.dataset` builds these stages. Operators after a ``limit`` run
on the driver over the limited stream, as on the local engine. ``preserve_order`` is set
on the dataset's own copy of Ray's ``DataContext`` (with ``raise_original_map_exception``,
and progress output off unless ``fl.config.verbosity`` asks for it:
:mod:`feedline.engines.ray.logs`); the process-wide context is never changed.

**Writes**: Ray tasks write feedline shards (the local engine's writer) into the staging
folder and send back only their descriptions (rows, row groups, sha256 checksum, footer
digest); the driver renames them in parallel and commits the manifest last (see
``feedline.engines.ray.write``). The output schema is learned first: user functions run
on 16 rows unless a ``map_batches`` gives ``output_schema=``; on the driver, except where a
model class must run, which happens in a Ray task (the model is never built in the
driver's process).

**Fitting** (``aggregate``): one partial per read task, merged in Ray tasks in the fixed
tree of :mod:`feedline.engines.batch.partials` (see ``feedline.engines.ray.merge``): the driver
holds block references and ``O(log n)`` partials, and fitted state is bit-identical to
the local engine's.

**Clusters**: on first use of a Ray job every node is probed; feedline ships itself with
``runtime_env={"py_modules": [...]}`` where a node cannot import it, and the user's own
modules travel by value where a node cannot import them (see
``feedline.engines.ray.runtime``).

**Counters.** Records skipped inside workers (``DecodeImages(on_error="skip")``, CSV rows
with ``on_error="skip"``) and read counters are sent per block to a collector actor
(``num_cpus=0``, one per Ray job) and merged into the driver's report when the run ends.

**Errors.** A ``FeedlineError`` raised in a worker (a user function failing becomes a
:class:`~feedline.errors.UserFunctionError` naming the function and the input file) is
re-raised on the driver as itself, with the worker's traceback chained as text, instead
of Ray's ``RayTaskError`` wrapping.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from feedline.engines.batch.fusion import BatchPipeline, InstancePool, apply_limit, split_at_limits
from feedline.engines.batch.partials import fold
from feedline.engines.protocol import WriteInfo, WriteOptions
from feedline.engines.ray.dataset import build_dataset
from feedline.engines.ray.errors import (
    release_failed_executions,
    surface_errors,
)
from feedline.engines.ray.logs import quiet_ray, ray_log_level
from feedline.engines.ray.merge import merge_in_tasks
from feedline.engines.ray.resumable_write import check_units, write_in_units
from feedline.engines.ray.runtime import check_workers, feedline_runtime_env
from feedline.engines.ray.stages import ReportCollector, merge_report
from feedline.engines.ray.write import output_schema, write_plan
from feedline.errors import ConfigurationError, MissingDependencyError
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location
from feedline.plan.plan import Operator, Plan, pushdown
from feedline.store.commit import WriteBase
from feedline.store.shards import writable_schema

__all__ = ["RayEngine"]

logger = logging.getLogger(__name__)

_COLLECTOR_NAME = "feedline-report-collector"
#: ((job id, node id), collector actor handle) of the current Ray job
_COLLECTOR: tuple[tuple[str, str], Any] | None = None
#: the Ray job a RayEngine connected itself (it may reconnect it to ship feedline)
_OWNED_JOB: str | None = None


class RayEngine:
    """Runs plans on Ray (``ray.data``), locally or on a cluster.

    Parameters
    ----------
    address:
        A Ray cluster to connect to (``"auto"`` for the one ``ray start`` runs on this
        machine, ``"ray://host:10001"``, a GCS address). ``None``: the cluster named by the
        ``RAY_ADDRESS`` environment variable when it is set (Ray's convention, e.g. in a
        Ray job), else a private local Ray started for this process (``address="local"``),
        even when another Ray instance runs on the machine: feedline never joins a
        cluster it was not asked to join. A Ray already initialized in this process is
        always used as is.
    num_cpus:
        CPUs of the private local Ray (default: all). Ignored, with a warning, when
        ``RAY_ADDRESS`` names a cluster to join (its resources are the cluster's).
    init_kwargs:
        More arguments for ``ray.init`` (they override feedline's defaults
        ``include_dashboard=False, log_to_driver=False``, ``logging_level=WARNING`` unless
        ``fl.config.verbosity`` is ``"info"``/``"debug"``), e.g. a ``runtime_env`` with the
        ``working_dir`` the workers need; feedline adds itself to its ``py_modules`` when a
        node cannot import it.

    Examples
    --------
    >>> import feedline as fl
    >>> engine = RayEngine(num_cpus=2)  # doctest: +SKIP
    >>> engine  # doctest: +SKIP
    RayEngine(address=None, num_cpus=2)
    >>> fl.range(10).map_batches(lambda b: b).count(engine=engine)  # doctest: +SKIP
    10
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if importlib.util.find_spec("ray") is None:
            raise MissingDependencyError("ray", "ray", "RayEngine")
        if num_cpus is not None and (not isinstance(num_cpus, int) or num_cpus < 1):
            raise ConfigurationError(
                f"num_cpus={num_cpus!r} must be a positive int. Fix: pass e.g. num_cpus=4."
            )
        if address not in (None, "local") and num_cpus is not None:
            raise ConfigurationError(
                "num_cpus only applies to a Ray started here, not to the cluster at "
                f"{address!r}. Fix: drop num_cpus, or the address to start a private local "
                "Ray."
            )
        self.address = address
        self.num_cpus = num_cpus
        self.init_kwargs = dict(init_kwargs or {})

    def __repr__(self) -> str:
        return f"RayEngine(address={self.address!r}, num_cpus={self.num_cpus})"

    # ------------------------------------------------------------------ Ray plumbing

    def ensure_ray(self) -> None:
        """Start (or connect to) Ray unless it is already initialized, then check once per
        Ray job that every node can import feedline (shipping it with ``runtime_env``
        ``py_modules`` when this engine started the connection; see
        :mod:`feedline.engines.ray.runtime`)."""
        global _OWNED_JOB
        import ray

        if ray.is_initialized():
            release_failed_executions()
            owned = ray.get_runtime_context().get_job_id() == _OWNED_JOB
            check_workers(self._reconnect if owned else None)
            return
        kwargs = self._init_args()
        logger.info("Starting Ray (address=%s)", kwargs["address"])
        _init(kwargs)
        _OWNED_JOB = ray.get_runtime_context().get_job_id()
        check_workers(self._reconnect)

    def _init_args(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "ignore_reinit_error": True,
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": ray_log_level(),
        }
        joined = self.address or os.environ.get("RAY_ADDRESS") or None
        if joined == "local":
            joined = None
        kwargs["address"] = joined or "local"
        if self.num_cpus is not None:
            if joined is None:
                kwargs["num_cpus"] = self.num_cpus
            else:  # only RAY_ADDRESS gets here: __init__ refuses address= with num_cpus=
                warnings.warn(
                    f"RayEngine(num_cpus={self.num_cpus}) is ignored: RAY_ADDRESS={joined!r} "
                    "names a Ray cluster to join, and a cluster's resources are its own. "
                    "Fix: unset RAY_ADDRESS (or pass address='local') for a private local "
                    "Ray with these CPUs, or drop num_cpus.",
                    stacklevel=4,
                )
        return kwargs | self.init_kwargs

    def _reconnect(self) -> None:
        """Reconnect with feedline shipped to the workers (``runtime_env`` ``py_modules``)."""
        global _OWNED_JOB
        import ray

        kwargs = self._init_args()
        kwargs["runtime_env"] = feedline_runtime_env(kwargs.get("runtime_env"))
        logger.info("Restarting Ray with feedline shipped to the workers (runtime_env)")
        ray.shutdown()
        _init(kwargs)
        _OWNED_JOB = ray.get_runtime_context().get_job_id()

    def _collector(self) -> Any:
        """The job's counter collector actor, created on first use. Its handle is kept here
        for the whole Ray job: Ray ends an actor, named or not, with its last handle."""
        global _COLLECTOR
        import ray

        context = ray.get_runtime_context()
        job = (context.get_job_id(), context.get_node_id())
        if _COLLECTOR is None or _COLLECTOR[0] != job:
            actor = ray.remote(num_cpus=0)(ReportCollector)
            handle = actor.options(name=_COLLECTOR_NAME, get_if_exists=True).remote()
            _COLLECTOR = (job, handle)
        return _COLLECTOR[1]

    def _collect(self, collector: Any, run_id: str, report: ExecutionReport | None) -> None:
        """Merge the workers' counters of run ``run_id`` into ``report`` (and forget them)."""
        import ray

        if not ray.is_initialized():  # a stream closed after ray.shutdown()
            return
        delta = ray.get(collector.pop.remote(run_id))
        if report is not None:
            merge_report(report, delta)

    #: the lazy ``ray.data.Dataset`` of a plan's first segment: ``engine.dataset(plan, ...)``
    #: is :func:`feedline.engines.ray.dataset.build_dataset` (``engine`` being this engine)
    dataset = build_dataset

    # ------------------------------------------------------------------ the Engine protocol

    def execute(
        self, plan: Plan, *, preserve_order: bool = True, report: ExecutionReport | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream the plan's output batches to the driver (see :class:`RayEngine`)."""
        report = report if report is not None else ExecutionReport()
        pushed = pushdown(plan)
        segments = split_at_limits(pushed.remaining)
        with quiet_ray():  # a relational input may run here (a split's counts)
            self.ensure_ray()
            collector, run_id = self._collector(), uuid.uuid4().hex
            rds = self.dataset(
                plan,
                pushed,
                segments[0][0],
                preserve_order=preserve_order,
                collector=collector,
                run_id=run_id,
            )
        return self._stream(rds, segments, report, collector, run_id)

    def _stream(
        self,
        rds: Any,
        segments: list[tuple[tuple[Operator, ...], int | None]],
        report: ExecutionReport,
        collector: Any,
        run_id: str,
    ) -> Iterator[pa.RecordBatch]:
        instances = InstancePool()
        first_limit = segments[0][1]
        try:
            with quiet_ray():
                stream = _blocks(rds, first_limit)
                if first_limit is not None:
                    stream = apply_limit(stream, first_limit)
                for ops, limit in segments[1:]:
                    stream = BatchPipeline(ops, report, instances)(stream, "the limited stream")
                    if limit is not None:
                        stream = apply_limit(stream, limit)
                for batch in stream:
                    if batch.num_rows:
                        report.add(rows_out=batch.num_rows, batches_out=1)
                        yield batch
        finally:
            self._collect(collector, run_id, report)

    def aggregate(
        self,
        plan: Plan,
        partial: Callable[[pa.RecordBatch], Any],
        merge: Callable[[Any, Any], Any],
    ) -> Any:
        """Compute ``partial`` per read task in the workers (a pickled binary column) and
        ``merge`` the tasks' partials in Ray tasks, in the fixed tree of
        :mod:`feedline.engines.batch.partials` (see :mod:`feedline.engines.ray.merge`): the
        driver holds ``O(log n)`` partials, and the result is bit-identical to the local
        engine's.

        Returns ``None`` when the plan yields no rows. ``merge`` must be associative and
        commutative (the same contract as the local engine).
        """

        with quiet_ray():
            return self._aggregate(plan, partial, merge)

    def _aggregate(
        self,
        plan: Plan,
        partial: Callable[[pa.RecordBatch], Any],
        merge: Callable[[Any, Any], Any],
    ) -> Any:
        pushed = pushdown(plan)
        segments = split_at_limits(pushed.remaining)
        if len(segments) > 1:  # a limit needs the merged stream: fold it in order
            batches = self.execute(plan, preserve_order=True)
            return fold((partial(b) for b in batches if b.num_rows), merge)
        self.ensure_ray()
        collector, run_id = self._collector(), uuid.uuid4().hex
        rds = self.dataset(
            plan,
            pushed,
            segments[0][0],
            preserve_order=True,  # chunks of consecutive blocks are ranges of read tasks
            collector=collector,
            run_id=run_id,
            partial=partial,
            merge=merge,
        )
        if rds is None:
            return None
        try:
            with surface_errors():
                return merge_in_tasks(rds.iter_internal_ref_bundles(), merge)
        finally:
            self._collect(collector, run_id, None)

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
        """Materialize the plan; Ray tasks write the shards (``feedline.engines.ray.write``),
        committed only if the dataset is still at ``base``, when given.

        ``resume=True`` writes in journaled units of read tasks, one Ray task each
        (:mod:`feedline.engines.ray.resumable_write`), and continues the interrupted
        ``resume=True`` write of the same plan, input and options, each unit after its last
        verified shard."""

        report = report if report is not None else ExecutionReport()
        if resume:
            start = time.perf_counter()
            check_units(plan, target)  # before Ray starts
            with quiet_ray():
                self.ensure_ray()
                schema = writable_schema(output_schema(plan), "the plan")
                manifest = write_in_units(
                    self,
                    plan,
                    schema,
                    target,
                    options,
                    on_rows=on_rows,
                    report=report,
                    preprocessors=preprocessors,
                    base=base,
                )
            return WriteInfo.from_manifest(
                target.url, manifest, started=start, engine=self.name, report=report
            )
        with quiet_ray():
            return write_plan(
                self,
                plan,
                target,
                options,
                preserve_order=preserve_order,
                on_rows=on_rows,
                report=report,
                preprocessors=preprocessors,
                base=base,
            )


def _init(kwargs: dict[str, Any]) -> None:
    """``ray.init(**kwargs)``; Ray's own errors (a cluster that cannot be reached, arguments
    it refuses) become a :class:`~feedline.errors.ConfigurationError` naming the fix."""
    import ray

    try:
        ray.init(**kwargs)
    except (ValueError, TypeError, ConnectionError, RuntimeError, TimeoutError) as exc:
        address = kwargs.get("address")
        where = "a private local Ray" if address == "local" else f"the Ray at {address!r}"
        raise ConfigurationError(
            f"feedline could not start or connect to {where}: {type(exc).__name__}: {exc}. "
            "Fix: check the address (RayEngine(address=...) or RAY_ADDRESS) and that the "
            "cluster runs; for a private local Ray pass RayEngine(num_cpus=...) without an "
            "address; arguments given in init_kwargs must be ones ray.init accepts."
        ) from exc


def _tables(rds: Any) -> Iterator[pa.Table]:
    """The blocks of a Ray dataset as Arrow tables, with worker errors surfaced."""
    if rds is None:
        return
    iterator = iter(rds.iter_batches(batch_size=None, batch_format="pyarrow"))
    try:
        with surface_errors():
            yield from iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _blocks(rds: Any, limit: int | None) -> Iterator[pa.RecordBatch]:
    if rds is not None and limit is not None:
        rds = rds.limit(limit)
    for table in _tables(rds):
        yield from table.to_batches()
