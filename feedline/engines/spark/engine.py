"""The Spark engine: feedline plans run as one fused ``mapInArrow`` stage per segment.

How a plan runs
---------------
**Reading.** The engine distributes feedline's *own* read tasks (one per file, row-group
range, image chunk or table slice) rather than translating each source to a Spark reader:
the task list is pickled with cloudpickle (broadcast once when small; otherwise each
partition's row carries its own tasks), a tiny DataFrame holds one row per partition
naming a contiguous range of tasks, and the fused stage calls ``task.read`` in the Python
worker. The rows are then exactly those of the local engine: the same CSV parsing and
``on_error`` handling, the same image labels, the same schema-drift checks and error
messages naming the file, the same per-task ``sample`` seeds, the same order. The price:
Spark's JVM readers (vectorized Parquet, splitting one huge file, locality-aware
scheduling) are not used; pyarrow reads in the Python worker instead, which is as fast for
Parquet/CSV and avoids a JVM → Arrow copy. Inputs must be reachable from the executors
under the same URL (shared storage or an fsspec URL). A DataFrame given to
:func:`from_spark` with ``cache=False`` is read natively (its rows feed the stage).

**Operators.** Consecutive filters, ``map_batches`` (classes built once per Python worker)
and fitted preprocessors run as one :class:`~feedline.engines.spark.worker.Stage` through
``DataFrame.mapInArrow``; its Spark schema comes from :func:`feedline.engines.schema.infer_schema`
(the functions run on 16 sample rows on the driver) converted as described in
:mod:`feedline.engines.spark.types` (tensor columns travel as arrays; the exact Arrow type
is restored on the way out). A ``limit`` takes the first rows in partition order
(``monotonically_increasing_id``) and later operators run on them in a further stage.

**Writing** (``writer="feedline"``, the default): the stage ends in feedline's own shard
writer, so every Spark task writes Parquet shards into its own folder inside the target's
staging folder, with exactly the local engine's file format (schema incl. tensor
extension types, row-group sizing, dictionary choice, sha256 computed while writing).
The driver collects the shard descriptions, renames them ``part-NNNNN.parquet`` in
partition order and commits the manifest last. ``writer="spark"`` uses Spark's own
Parquet writer instead (see :mod:`feedline.engines.spark.write`).

**Results and fitting.** ``execute`` (``iter_batches``, ``to_arrow``) computes every
partition in parallel into the executors' storage and streams them to the driver one at a
time as Arrow IPC (``toLocalIterator`` with prefetch): the driver never holds the whole
result. A plan ending at a relational operator skips the fused stage: Spark encodes the
rows to Arrow itself, collected at once when Spark estimates them small, else streamed
the same way (:mod:`feedline.engines.spark.collect`). ``aggregate`` (fitting,
``fl.stats``) folds each read task's batches in the executors and merges the tasks in
the fixed tree of :mod:`feedline.engines.batch.partials`, so
fitted state is bit-identical to the local engine's and the driver receives only
``O(log tasks)`` blocks per partition.

**Clusters** need no environment set by hand: the executors run this interpreter unless
``spark.pyspark.python`` says otherwise, and the first job on a cluster master checks
that they can import feedline, ships it and the user's own modules when needed, and
otherwise raises :class:`~feedline.errors.ConfigurationError` naming the fix (see
:mod:`feedline.engines.spark.cluster`).

**Counters and errors** travel through a Spark accumulator and an encoded exception
message (see :mod:`feedline.engines.spark.worker`), so ``on_error="skip"`` counts reach
the driver's report and a failing user function raises
:class:`~feedline.errors.UserFunctionError` naming the function and the input file.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.arrow.sizes import parse_bytes
from feedline.engines.batch.partials import TreeMerger
from feedline.engines.protocol import WriteInfo, WriteOptions
from feedline.engines.spark.cluster import (
    check_executors,
    python_for_executors,
    ship_user_modules,
)
from feedline.engines.spark.collect import DirectFrame, default_collect_bytes, direct_frame
from feedline.engines.spark.plan import build_job, quiet_pandas_warning
from feedline.engines.spark.relational import Prepared, prepare
from feedline.engines.spark.write import write_with_feedline, write_with_spark
from feedline.errors import ConfigurationError, MissingDependencyError
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location
from feedline.plan.plan import Plan
from feedline.store.commit import WriteBase

__all__ = ["SHUFFLE_SIZING", "SparkEngine", "size_shuffles", "spark_session"]

if TYPE_CHECKING:
    import pyspark.sql
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

_WRITERS = ("feedline", "spark")


def spark_session(
    master: str = "local[*]", app_name: str = "feedline", **conf: str | int | float | bool
) -> SparkSession:
    """Get or create a ``SparkSession`` set up for feedline.

    Arrow is enabled and the web UI is off. For a ``local`` master or a ``spark://`` master
    on the loopback address, ``SPARK_LOCAL_IP`` is set to ``127.0.0.1`` when unset, so the
    driver binds the loopback address. The executors run the interpreter named by
    ``spark.pyspark.python`` when given, else ``PYSPARK_PYTHON``, else this one
    (``sys.executable``): right whenever the workers share this machine or its filesystem.
    On other clusters pass ``**{"spark.pyspark.python": "/path/on/the/workers/python"}``;
    the first job checks that the executors can import feedline, ships it (and the
    user's modules) when they cannot, and otherwise fails with a ``ConfigurationError``
    naming the fix (see :mod:`feedline.engines.spark.cluster`).
    Keyword arguments are Spark settings with ``_`` for ``.``, or given as a dict under
    their real names: ``spark_session("local[2]", **{"spark.driver.memory": "2g"})``.

    Examples
    --------
    >>> spark = spark_session("local[2]")  # doctest: +SKIP
    >>> spark.range(3).count()  # doctest: +SKIP
    3
    """
    if importlib.util.find_spec("pyspark") is None:
        raise MissingDependencyError("pyspark", "spark", "spark_session()")
    with quiet_pandas_warning():
        return _session(master, app_name, conf)


def _session(master: str, app_name: str, conf: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    settings = {(k if "." in k else k.replace("_", ".")): v for k, v in conf.items()}
    if master.startswith("local") or _loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # PySpark gives the executors the driver's PYSPARK_PYTHON (``python3`` when unset)
    python = python_for_executors(settings)
    os.environ["PYSPARK_PYTHON"] = python
    settings["spark.pyspark.python"] = python
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for name, value in (SHUFFLE_SIZING | settings).items():
        builder = builder.config(name, str(value))
    logger.info("Getting or creating the Spark session (master=%s, app=%s)", master, app_name)
    return builder.getOrCreate()


#: Spark settings that size the shuffle partitions to the data: adaptive execution
#: coalesces the ``spark.sql.shuffle.partitions`` (200) partitions of every shuffle into
#: partitions of about ``spark.sql.adaptive.advisoryPartitionSizeInBytes`` (64 MB; at least
#: ``minPartitionSize``, 1 MB, while that keeps every core busy), also inside the inputs that
#: feedline persists (a sort's, shuffle's or split's input), which Spark otherwise leaves at
#: 200 partitions (``canChangeCachedPlanOutputPartitioning``): a groupby -> join -> split of
#: 100k rows on local[2] ran 1,436 tasks without it and 40 with it
SHUFFLE_SIZING = {
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
}


def size_shuffles(spark: Any) -> None:
    """Apply :data:`SHUFFLE_SIZING` to a session the user made, for each setting the user
    left unset (a setting they chose is kept).

    Examples
    --------
    >>> size_shuffles(spark)  # doctest: +SKIP
    >>> key = "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"
    >>> spark.conf.get(key)  # doctest: +SKIP
    'true'
    """
    conf = spark.conf
    for name, value in SHUFFLE_SIZING.items():
        try:
            if conf.get(name, None) is None:
                conf.set(name, value)
        except Exception:  # a session that refuses runtime settings: kept as it is
            logger.debug("Could not set %s on the Spark session", name, exc_info=True)


def _bytes(value: int | str) -> int:
    """``collect_bytes`` as bytes (``0``: always stream)."""

    return 0 if value == 0 else parse_bytes(value)


def _loopback(master: str) -> bool:
    """A ``spark://`` master on this machine's loopback address (a one-host cluster)."""
    host = master.split("://", 1)[-1].split(",")[0].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost", "::1", "[::1]")


class SparkEngine:
    """Runs feedline plans on Apache Spark (see the module docstring for how).

    Parameters
    ----------
    spark:
        A ``SparkSession`` to use; by default :func:`spark_session` with ``master`` is
        created (or the active one is reused) on first use.
    master:
        The Spark master when a session has to be created (``"local[*]"``: all cores).
    partitions:
        Spark partitions reading the input (each runs a contiguous range of read tasks
        and, when writing, writes its own shards). Default: 4 × Spark's default
        parallelism, at most one per read task.
    writer:
        ``"feedline"`` (default): executors write shards with feedline's writer (exact
        file format, any schema). ``"spark"``: Spark's Parquet writer (flat schemas only).
    collect_bytes:
        A plan ending at a relational operator (sort, groupby, join, ...) is fetched as
        Spark's own Arrow batches: with one collect when Spark estimates the result at
        most this size (``"256MB"``, bytes), else streamed partition by partition (see
        :mod:`feedline.engines.spark.collect`). Default: sized from the driver's memory
        (:func:`~feedline.engines.spark.collect.default_collect_bytes`).

    Examples
    --------
    >>> import feedline as fl, pyarrow.compute as pc
    >>> engine = SparkEngine(master="local[2]")
    >>> engine.writer
    'feedline'
    >>> ds = fl.range(10).filter(lambda b: pc.less(b["id"], 3))
    >>> ds.count(engine=engine)  # doctest: +SKIP
    3
    >>> ds.write("out/", engine=engine).engine  # doctest: +SKIP
    'spark'
    """

    name = "spark"

    def __init__(
        self,
        spark: SparkSession | None = None,
        master: str = "local[*]",
        *,
        partitions: int | None = None,
        writer: str = "feedline",
        collect_bytes: int | str | None = None,
    ) -> None:
        if writer not in _WRITERS:
            raise ConfigurationError(
                f"writer={writer!r} is not a Spark writer. Fix: use one of {_WRITERS}."
            )
        if partitions is not None and partitions < 1:
            raise ConfigurationError(
                f"partitions={partitions} must be >= 1. Fix: pass a positive count, or None "
                "to use one partition per read task."
            )
        self._spark = spark
        self.master = master
        self.partitions = partitions
        self.writer = writer
        self.collect_bytes = None if collect_bytes is None else _bytes(collect_bytes)
        self._default_bound: tuple[Any, int] | None = None
        self._sized: Any = None

    def __repr__(self) -> str:
        return f"SparkEngine(master={self.spark_master!r}, writer={self.writer!r})"

    @property
    def spark(self) -> Any:
        """The ``SparkSession`` (created on first use)."""
        if self._spark is None:
            self._spark = spark_session(self.master)
        return self._spark

    def ready(self, plan: Plan) -> SparkSession:
        """The session, its executors checked and the user modules of ``plan`` shipped
        (cluster masters only; see :mod:`feedline.engines.spark.cluster`)."""
        spark = self.spark
        if spark is not self._sized:
            size_shuffles(spark)
            self._sized = spark
        check_executors(spark)
        ship_user_modules(spark, plan.ops)
        return spark

    @property
    def spark_master(self) -> str:
        if self._spark is None:
            return self.master
        # pyspark types SparkContext.master Optional; a started context always has one
        return self._spark.sparkContext.master  # type: ignore[return-value]

    def dataframe(self, plan: Plan, *, preserve_order: bool = True) -> pyspark.sql.DataFrame:
        """The plan as a lazy Spark DataFrame (tensor columns as arrays; nothing runs yet)."""
        spark = self.ready(plan)
        plan = prepare(spark, plan, self.partitions, persist=False).plan
        job = build_job(spark, plan, preserve_order=preserve_order, partitions=self.partitions)
        return job.frame

    def execute(
        self, plan: Plan, *, preserve_order: bool = True, report: ExecutionReport | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The plan's output batches, streamed from Spark partition by partition.

        The job runs when the iterator is first advanced: every partition is computed in
        parallel into the executors' storage, then the driver fetches one partition at a
        time (``toLocalIterator`` with prefetch), so it never holds the whole result.
        Batches travel as Arrow IPC with feedline's exact types and come in partition order.
        A plan ending at a relational operator is fetched as Spark's own Arrow instead,
        collected at once when small (``collect_bytes``), and cast to the plan's schema.
        """
        report = report if report is not None else ExecutionReport()
        spark = self.ready(plan)
        prepared = prepare(spark, plan, self.partitions)
        direct = direct_frame(prepared.plan)
        if direct is not None:  # Spark's own Arrow, no fused stage (see spark_collect)
            return self._direct(direct, self._collect_bound(spark), report, prepared)
        job = build_job(
            spark,
            prepared.plan,
            mode="stream",
            preserve_order=preserve_order,
            partitions=self.partitions,
        )
        return self._stream(job, report, prepared)

    def _collect_bound(self, spark: Any) -> int:
        """``collect_bytes``, or its default for this session (computed once)."""
        if self.collect_bytes is not None:
            return self.collect_bytes
        if self._default_bound is None or self._default_bound[0] is not spark:
            self._default_bound = (spark, default_collect_bytes(spark))
        return self._default_bound[1]

    def _direct(
        self, direct: DirectFrame, bound: int, report: ExecutionReport, prepared: Prepared
    ) -> Iterator[pa.RecordBatch]:
        try:
            for batch in direct.batches(bound, report, lambda: prepared.finish(report)):
                if batch.num_rows:
                    report.add(rows_out=batch.num_rows, batches_out=1)
                    yield batch
        finally:
            prepared.finish(report)

    def _stream(
        self, job: Any, report: ExecutionReport, prepared: Prepared
    ) -> Iterator[pa.RecordBatch]:
        try:
            for batch in job.stream(report):
                if batch.num_rows:
                    report.add(rows_out=batch.num_rows, batches_out=1)
                    yield batch
        finally:
            prepared.finish(report)

    def aggregate(
        self,
        plan: Plan,
        partial: Callable[[pa.RecordBatch], Any],
        merge: Callable[[Any, Any], Any],
    ) -> Any:
        """``partial`` on every batch in the executors, merged in the fixed tree of
        :mod:`feedline.engines.batch.partials` (bit-identical to the local engine's result).

        Each partition folds every read task's batches in order and merges its tasks into
        the tree's blocks (at most ``2 log2(tasks)`` per partition); the driver merges the
        blocks, so it holds ``O(partitions · log tasks)`` partials, never one per task.
        Partials travel pickled with cloudpickle. Returns ``None`` when the plan yields
        no rows.
        """
        from pyspark import cloudpickle

        spark = self.ready(plan)
        prepared = prepare(spark, plan, self.partitions)
        job = build_job(
            spark,
            prepared.plan,
            mode="partial",
            partitions=self.partitions,
            partial=partial,
            merge=merge,
        )
        try:
            blocks = job.collect().to_pylist()
        finally:
            prepared.finish(None)
        blocks.sort(key=lambda b: b["position"] << b["level"])
        tree = TreeMerger(merge)
        for block in blocks:
            tree.push(block["level"], block["position"], cloudpickle.loads(block["partial"]))
            block["partial"] = None
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
        """Materialize the plan as a feedline dataset at ``target`` (manifest committed last,
        only if the dataset is still at ``base``, when given).

        ``rows_per_shard`` and ``bytes_per_shard`` apply within each Spark partition: every
        shard is exact except the last one of each partition. ``on_rows`` is called once
        per shard after the Spark job finished. With the feedline writer, a plan of read
        tasks without ``limit`` journals each partition's shards as they complete;
        ``resume=True`` continues an interrupted write of the same plan, input and options,
        each partition after its last verified shard
        (:mod:`feedline.engines.write_resume`).
        """

        report = report if report is not None else ExecutionReport()
        start = time.perf_counter()
        if resume and self.writer != "feedline":
            raise ConfigurationError(
                f"resume=True cannot resume the write to {target.url!r} with "
                "SparkEngine(writer='spark') (Spark's own Parquet writer keeps no journal). "
                "Fix: use SparkEngine(writer='feedline') (the default), or drop resume=True."
            )
        prepared = prepare(self.ready(plan), plan, self.partitions)
        writer: Any = write_with_feedline if self.writer == "feedline" else write_with_spark
        resuming = {"resume": True} if resume else {}
        try:
            manifest = writer(
                self,
                prepared.plan,
                target,
                options,
                preserve_order=preserve_order,
                report=report,
                preprocessors=preprocessors or [],
                base=base,
                source_plan=plan,  # the lineage names the inputs, not the computed frame
                **resuming,
            )
        finally:
            prepared.finish(report)
        if on_rows is not None:
            for shard in manifest.shards:
                on_rows(shard.rows)
        return WriteInfo.from_manifest(
            target.url, manifest, started=start, engine=self.name, report=report
        )
