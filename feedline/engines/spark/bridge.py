"""Bridges between feedline and Spark DataFrames: :func:`from_spark`, :func:`to_spark`.

``from_spark(df)`` is a feedline :class:`~feedline.dataset.dataset.Dataset` over a Spark DataFrame
(what Petastorm's ``make_spark_converter`` does, without pickled metadata). The first time
its rows are needed, the DataFrame is materialized once, by Spark, as a feedline dataset
in a cache folder named by the DataFrame's *plan fingerprint*; every later use (``write``,
``loader``, ``to_arrow``, fitting, on any engine) reads that folder, so writing the same
plan twice computes it once. The fingerprint combines ``semanticHash()`` of the logical
plan, the analyzed plan's text (with expression ids normalized) and the size and
modification time of its input files (``inputFiles()``), so a changed input file makes a
new entry. Not detected: sources Spark cannot list (JDBC, tables changed in place) and
non-deterministic plans; pass ``cache=False`` for those (the DataFrame is then read
natively by the Spark engine, and collected with ``toArrow()`` by the local engine).

The cache folder must be visible to the driver and the executors under the same URL. The
default is a folder of this Python process, ``<tmp>/feedline-spark-cache-<random>``, removed
with its entries when the process exits (right for ``local[*]`` and a one-host cluster;
pass ``cache_dir=`` shared storage on a cluster, or to keep the entries across processes).
:func:`clear_spark_cache` deletes entries; ``source.cleanup()`` deletes one.
"""

from __future__ import annotations

import atexit
import posixpath
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.engines.protocol import WriteOptions
from feedline.engines.spark.engine import SparkEngine
from feedline.engines.spark.plan import spark_errors
from feedline.engines.spark.types import from_spark_batch
from feedline.io.source import ExecutionReport, ReadTask, Source, fingerprint_of
from feedline.io.storage.paths import Location, resolve
from feedline.plan.plan import Plan
from feedline.store import dataset_files as fmt

__all__ = ["SparkFrameSource", "clear_spark_cache", "plan_fingerprint", "to_spark"]


#: this process's default cache folder (created on first use, removed at exit)
_SESSION_CACHE: str | None = None
_SESSION_LOCK = threading.Lock()


def default_cache_dir() -> str:
    """This process's own cache folder, ``<tmp>/feedline-spark-cache-<random>``: created on
    first use and removed with its entries when the Python process exits (``atexit``).

    Pass ``cache_dir=`` to keep materialized DataFrames across processes (and on a
    cluster: shared storage the executors can reach).

    Examples
    --------
    >>> import os
    >>> folder = default_cache_dir()
    >>> os.path.basename(folder).startswith("feedline-spark-cache-"), folder == default_cache_dir()
    (True, True)
    """
    global _SESSION_CACHE
    with _SESSION_LOCK:
        if _SESSION_CACHE is None:
            _SESSION_CACHE = tempfile.mkdtemp(prefix="feedline-spark-cache-")
            atexit.register(shutil.rmtree, _SESSION_CACHE, True)
        return _SESSION_CACHE


def plan_fingerprint(df: Any) -> str:
    """Identifies what a DataFrame computes (see the module docstring).

    Examples
    --------
    >>> a = spark.range(5).selectExpr("id * 2 AS x")  # doctest: +SKIP
    >>> b = spark.range(5).selectExpr("id * 2 AS x")  # doctest: +SKIP
    >>> plan_fingerprint(a) == plan_fingerprint(b)  # doctest: +SKIP
    True
    """
    analyzed = df._jdf.queryExecution().analyzed().toString()
    files = []
    for url in sorted(df.inputFiles()):
        try:
            loc = resolve(url)
            info = loc.fs.info(loc.path)
            files.append((url, info.get("size"), info.get("mtime") or info.get("LastModified")))
        except Exception:  # noqa: BLE001 - a URL fsspec cannot stat is fingerprinted by name
            files.append((url, None, None))
    return fingerprint_of(
        df.semanticHash(), re.sub(r"#\d+", "#", analyzed), df.schema.json(), *files
    )


class SparkFrameSource(Source):
    """A Spark DataFrame as a feedline source (see the module docstring).

    Parameters
    ----------
    df:
        The DataFrame.
    cache:
        Materialize it once into ``cache_dir`` and read that (default); ``False``: read the
        DataFrame itself every time.
    cache_dir:
        Folder (or fsspec URL) of the cache, shared by driver and executors.
    """

    kind = "spark"

    def __init__(self, df: Any, *, cache: bool = True, cache_dir: str | None = None) -> None:
        self._df = df
        self._cache = cache
        self._cache_dir = str(cache_dir or default_cache_dir())
        self._lock = threading.Lock()
        self._fingerprint: str | None = None
        self._schema: pa.Schema | None = None
        self.label = "the Spark DataFrame (partition {partition})"

    @property
    def dataframe(self) -> Any:
        """The Spark DataFrame."""
        return self._df

    def native_frame(self) -> Any:
        """The DataFrame for the Spark engine to read directly, or ``None`` when cached."""
        return None if self._cache else self._df

    def schema(self) -> pa.Schema:
        if self._schema is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            timezone = self._df.sparkSession.conf.get("spark.sql.session.timeZone", "UTC")
            self._schema = to_arrow_schema(self._df.schema, timezone=timezone)
        return self._schema

    def describe(self) -> str:
        return f"spark DataFrame [{', '.join(self._df.columns)}] (plan {self.fingerprint()})"

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = plan_fingerprint(self._df)
        return self._fingerprint

    @property
    def cache_location(self) -> Location:
        """Where this DataFrame's materialization lives."""
        return resolve(self._cache_dir).child(self.fingerprint())

    def count_rows(self) -> int | None:

        loc = self.cache_location
        if self._cache and loc.fs.exists(loc.path):
            manifest = fmt.read_manifest(loc)
            return manifest.rows if manifest is not None else None
        return None

    def materialize(self) -> Any:
        """The cached feedline dataset's source, writing it with Spark if it is missing."""

        with self._lock:
            loc = self.cache_location
            manifest = fmt.read_manifest(loc) if loc.fs.isdir(loc.path) else None
            if manifest is None:
                native = SparkFrameSource(self._df, cache=False, cache_dir=self._cache_dir)
                native._schema, native._fingerprint = self._schema, self._fingerprint
                SparkEngine(self._df.sparkSession).write(Plan(native), loc, WriteOptions())
                manifest = fmt.read_manifest(loc)
                assert manifest is not None  # the write above committed one
            return fmt.FeedlineSource(loc, manifest)

    def cleanup(self) -> bool:
        """Delete this DataFrame's cache entry; ``True`` when there was one."""
        loc = self.cache_location
        if not loc.fs.exists(loc.path):
            return False
        loc.fs.rm(loc.path, recursive=True)
        return True

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        if self._cache:
            return self.materialize().read_tasks(columns, predicate)
        schema = self.schema()
        df = self._df

        def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:

            with spark_errors():
                table = df.toArrow()
            for batch in table.to_batches():
                batch = from_spark_batch(batch, schema, "the Spark DataFrame")
                report.add(rows_read=batch.num_rows)
                if predicate is not None:
                    batch = batch.filter(predicate)
                yield batch.select(list(columns)) if columns is not None else batch

        return [ReadTask("the Spark DataFrame", read)]


def to_spark(ds: Any, spark: Any = None) -> Any:
    """A lazy Spark DataFrame computing the dataset ``ds`` (the engine's fused stages).

    Tensor columns become ``ArrayType`` columns of their values (row-major); unsigned
    integers are widened (see :mod:`feedline.engines.spark.types`). A dataset made by
    :func:`from_spark` without further operators gives back its own DataFrame.

    Examples
    --------
    >>> import feedline as fl
    >>> to_spark(fl.range(3), spark).count()  # doctest: +SKIP
    3
    """

    plan = ds.plan
    if isinstance(plan.source, SparkFrameSource) and not plan.ops:
        return plan.source.dataframe
    engine = SparkEngine(spark)
    return engine.dataframe(ds.fitted_plan())


def clear_spark_cache(cache_dir: str | None = None) -> int:
    """Delete every DataFrame materialized by :func:`from_spark` under ``cache_dir``.

    Returns the number of entries removed.
    """
    root = resolve(cache_dir or default_cache_dir())
    if not root.fs.exists(root.path):
        return 0
    removed = 0
    for path in root.fs.ls(root.path, detail=False):
        if re.fullmatch(r"[0-9a-f]{16}", posixpath.basename(path.rstrip("/"))):
            root.fs.rm(path, recursive=True)
            removed += 1
    return removed
