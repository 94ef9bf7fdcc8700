"""A relational result fetched as Spark's own Arrow batches (no ``mapInArrow`` stage).

When a plan ends at a relational operator (sort, aggregate, join, ...: nothing but a
column selection or an expression filter after it), its rows are already a Spark
DataFrame. Running them through a fused ``mapInArrow`` stage only to re-encode them would
cost a Python worker pass, an Arrow IPC copy per batch and a pickled row per batch. Here
the JVM encodes them to Arrow itself and the driver casts each batch back to the plan's
exact schema (:func:`~feedline.engines.spark.types.from_spark_batch`, the cast the fused
stage would have run in the executors, so the rows and types are the same):

* **collected** when Spark's estimate of the result's size (the optimized plan's
  ``sizeInBytes``) is at most the engine's ``collect_bytes``: one Spark job
  (``_collect_as_arrow``), nothing persisted. If the result outgrows
  ``spark.driver.maxResultSize`` after all, Spark aborts the collect and the result is
  streamed instead;
* **streamed** otherwise (or when Spark cannot estimate it: a join's estimate is the
  product of its sides'): the shuffles run once, then the DataFrame's Arrow batch RDD is
  fetched a window of consecutive partitions at a time, each window one Spark job
  computing its partitions in parallel while the previous window is consumed. The first
  window has ``defaultParallelism`` partitions but at most :data:`FIRST_WINDOW` (their size
  is unknown: on a large cluster, one partition per core would put hundreds of them on the
  driver at once); later windows grow while the partitions fetched so far say that they
  fit the bound, so the driver never holds the whole result.

:func:`default_collect_bytes` sizes the bound from the driver's memory: a sixteenth of the
machine's (or cgroup's) memory, an eighth of the JVM driver heap, a quarter of
``spark.driver.maxResultSize``, whichever is smallest.

Examples
--------
>>> import feedline as fl
>>> direct_frame(fl.range(3).plan) is None  # not relational: the fused stage runs it
True
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import pyarrow as pa
import pyarrow.compute as pc

from feedline.engines.spark.plan import quiet_pandas_warning, spark_errors
from feedline.engines.spark.types import from_spark_batch
from feedline.host import memory_room
from feedline.io.source import ExecutionReport, Source
from feedline.plan.plan import Plan, pushdown

if TYPE_CHECKING:
    from feedline.engines.spark.relational import RelationalFrameSource

__all__ = [
    "FIRST_WINDOW",
    "DirectFrame",
    "arrow_batches_available",
    "default_collect_bytes",
    "direct_frame",
    "estimated_bytes",
    "first_window",
]

FIRST_WINDOW = 4
"""The most partitions fetched before any partition's size is known."""

_MAX_RESULT = "spark.driver.maxResultSize"

logger = logging.getLogger(__name__)


@dataclass
class DirectFrame:
    """A relational DataFrame whose rows are the plan's result once cast to ``schema``,
    filtered by ``predicate`` and cut to ``columns`` (on the driver, after the cast, in the
    fused stage's order)."""

    frame: Any
    schema: pa.Schema
    predicate: pc.Expression | None
    columns: tuple[str, ...] | None
    label: str

    def batches(
        self,
        bound: int,
        report: ExecutionReport,
        on_computed: Callable[[], None] = lambda: None,
    ) -> Iterator[pa.RecordBatch]:
        """The result's batches in order, with the plan's exact types: collected at once
        when Spark estimates the result at most ``bound`` bytes, else streamed partition by
        partition. ``on_computed()`` is called once every partition has been computed (the
        inputs' counters are final then)."""
        size = estimated_bytes(self.frame)
        raw: Iterable[pa.RecordBatch] | None
        raw = self.collect(on_computed) if size is not None and size <= bound else None
        if raw is None:
            logger.debug("Streaming a Spark result (estimate %s, bound %d bytes)", size, bound)
            raw = self.stream(bound, on_computed)
        else:
            logger.debug("Collected a Spark result (estimate %s, bound %d bytes)", size, bound)
        for batch in raw:
            report.add(rows_read=batch.num_rows)
            yield self.restore(batch)

    def restore(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch in Spark's Arrow dialect cast to the plan's schema, then filtered."""
        batch = from_spark_batch(batch, self.schema, self.label)
        if self.predicate is not None:
            batch = batch.filter(self.predicate)
        return batch.select(list(self.columns)) if self.columns is not None else batch

    def collect(
        self, on_computed: Callable[[], None] = lambda: None
    ) -> list[pa.RecordBatch] | None:
        """Every batch (Spark's types) from one Arrow collect, in order; ``None`` when the
        result outgrew ``spark.driver.maxResultSize`` (Spark aborted the collect)."""
        try:
            with spark_errors(), quiet_pandas_warning():
                batches = self.frame._collect_as_arrow()
        except Exception as exc:
            if _MAX_RESULT in str(exc):
                logger.info("The Spark result outgrew %s: streaming it instead", _MAX_RESULT)
                return None
            raise
        on_computed()
        return batches

    def stream(
        self, window_bytes: int = 0, on_computed: Callable[[], None] = lambda: None
    ) -> Iterator[pa.RecordBatch]:
        """The batches (Spark's types) in order, a window of partitions at a time.

        Each window is one Spark job over consecutive partitions of the DataFrame's Arrow
        batch RDD, computed in parallel (at least ``first_window()`` partitions, more
        while the partitions fetched so far say that they fit ``window_bytes``); the next
        window is computed while this one is consumed. The driver holds two windows at
        most, never the whole result. Shuffles are computed once, before the first window.
        """
        from concurrent.futures import ThreadPoolExecutor

        from pyspark.util import inheritable_thread_target

        spark = self.frame.sparkSession
        context = spark.sparkContext
        schema = _spark_arrow_schema(self.frame)
        with spark_errors():
            rdd = self.frame._jdf.toArrowBatchRdd().toJavaRDD()  # runs the shuffle stages
        total = int(rdd.getNumPartitions())
        least = first_window(context)
        limit = _max_result_bytes(context)
        if limit is not None:  # a window is one job: it must pass maxResultSize
            window_bytes = min(window_bytes, limit // 2)
        if total <= least:  # one window holds everything: Spark's Arrow collect, which
            # hands over each partition as it completes (the shuffles above are reused)
            with spark_errors(), quiet_pandas_warning():
                batches = self.frame._collect_as_arrow()
            logger.debug("Fetched partitions 0-%d of %d in one collect", total - 1, total)
            on_computed()
            yield from batches
            return
        group = f"feedline-result-{uuid.uuid4().hex}"

        def fetch(first: int, count: int) -> list[bytes]:
            from pyspark.serializers import NoOpSerializer
            from pyspark.util import _load_from_socket

            context.setJobGroup(group, "feedline: fetch a relational result", False)
            served = context._jvm.PythonRDD.runJob(
                context._jsc.sc(), rdd, list(range(first, first + count))
            )
            with _load_from_socket(served, NoOpSerializer()) as messages:
                return list(messages)

        fetch = inheritable_thread_target(spark)(fetch)  # the caller's local properties
        pool = ThreadPoolExecutor(1, thread_name_prefix="feedline-spark-result")
        pending = None
        try:
            done = fetched = 0
            width = min(least, total)
            pending = pool.submit(fetch, 0, width) if total else None
            while pending is not None:
                with spark_errors():
                    messages = pending.result()
                size = sum(len(m) for m in messages)
                logger.debug(
                    "Fetched partitions %d-%d of %d (%d bytes)", done, done + width - 1, total, size
                )
                done += width
                fetched += size
                pending = None
                if done < total:
                    each = max(1, fetched // done)
                    width = min(total - done, max(least, window_bytes // each))
                    pending = pool.submit(fetch, done, width)
                else:
                    on_computed()
                for message in messages:
                    yield pa.ipc.read_record_batch(pa.py_buffer(message), schema)
                del messages
            if not total:
                on_computed()
        finally:
            if pending is not None and not pending.done():
                context.cancelJobGroup(group)
            pool.shutdown(wait=True)


def first_window(context: Any) -> int:
    """Partitions in the first (and least) window: the cores, at most :data:`FIRST_WINDOW`.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> first_window(SimpleNamespace(defaultParallelism=2)), first_window(
    ...     SimpleNamespace(defaultParallelism=256))
    (2, 4)
    """
    return max(1, min(int(context.defaultParallelism), FIRST_WINDOW))


def _spark_arrow_schema(frame: Any) -> pa.Schema:
    """The Arrow schema of the batches in ``frame``'s Arrow batch RDD (Spark's dialect)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    conf = frame.sparkSession.conf
    large = str(conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false"))
    return to_arrow_schema(
        frame.schema,
        timezone=conf.get("spark.sql.session.timeZone", "UTC"),
        error_on_duplicated_field_names_in_struct=True,
        prefers_large_types=large.lower() == "true",
    )


def direct_frame(plan: Plan) -> DirectFrame | None:
    """The plan as a :class:`DirectFrame` when its source is a computed relational
    DataFrame (:class:`~feedline.engines.spark.relational.RelationalFrameSource`) and at
    most a column selection and an expression filter follow it; else ``None``."""
    source = plan.source
    native = getattr(source, "native_frame", lambda: None)()
    if native is None or not _is_relational_frame(source):
        return None
    if not arrow_batches_available(native):
        return None
    pushed = pushdown(plan)
    if pushed.remaining:
        return None
    schema, columns = source.schema(), pushed.columns
    if columns is not None and pushed.predicate is None:  # Spark drops the other columns
        from pyspark.sql import functions as F

        native = native.select(*[F.col("`" + c.replace("`", "``") + "`") for c in columns])
        schema, columns = pa.schema([schema.field(c) for c in columns]), None
    # else the filter may read columns that the selection drops: the driver selects last
    label = source.label.format(partition="collected")
    return DirectFrame(native, schema, pushed.predicate, columns, label)


def _is_relational_frame(source: Source) -> TypeGuard[RelationalFrameSource]:
    """Whether ``source`` is a :class:`~feedline.engines.spark.relational.RelationalFrameSource`
    (told by its ``kind``: that module imports this one)."""
    return getattr(source, "kind", None) == "spark-relational"


def arrow_batches_available(frame: Any) -> bool:
    """Whether ``frame`` (and this PySpark) offers the calls this module uses, some of them
    PySpark internals (``_collect_as_arrow``, ``_jdf``, ``pyspark.util._load_from_socket``):
    checked on PySpark 4.0–4.3 with a classic session. A Spark Connect DataFrame, or a
    PySpark without them, gets ``False`` and the fused ``mapInArrow`` stage runs the plan.

    Examples
    --------
    >>> arrow_batches_available(object())
    False
    """
    try:
        from pyspark.util import _load_from_socket, inheritable_thread_target  # noqa: F401
    except ImportError:
        return False
    return hasattr(frame, "_jdf") and callable(getattr(frame, "_collect_as_arrow", None))


def estimated_bytes(frame: Any) -> int | None:
    """Spark's estimate of the DataFrame's size in bytes (its optimized plan's statistics),
    or ``None`` when Spark has none (a leaf it cannot size reports ``Long.MAX_VALUE``, a
    join the product of its sides')."""
    try:
        size = int(frame._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
    except Exception:  # noqa: BLE001 - no statistics: treated as large
        return None
    return size if size < (1 << 63) - 1 else None


def default_collect_bytes(spark: Any) -> int:
    """The largest result (Spark's estimate) fetched with one collect: the smallest of a
    sixteenth of this machine's memory room, an eighth of the JVM driver's heap and a
    quarter of ``spark.driver.maxResultSize`` (when set; ``0`` means unlimited).

    Examples
    --------
    >>> default_collect_bytes(spark) > 0  # doctest: +SKIP
    True
    """

    bounds = [memory_room() // 16]
    context = spark.sparkContext
    with contextlib.suppress(Exception):
        bounds.append(int(context._jvm.java.lang.Runtime.getRuntime().maxMemory()) // 8)
    limit = _max_result_bytes(context)
    if limit is not None:
        bounds.append(limit // 4)
    return max(0, min(bounds))


def _max_result_bytes(context: Any) -> int | None:
    """``spark.driver.maxResultSize`` in bytes (Spark's default 1g), ``None``: unlimited."""
    try:
        limit = int(context._jsc.sc().conf().getSizeAsBytes(_MAX_RESULT, "1g"))
    except Exception:  # noqa: BLE001 - unreadable: Spark's default
        limit = 1 << 30
    return limit if limit > 0 else None
