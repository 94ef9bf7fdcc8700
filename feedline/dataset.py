"""The lazy :class:`Dataset`: an immutable plan with a fluent API and terminal calls."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from feedline.conveniences import ConvenienceMethods
from feedline.engines.base import Engine, WriteInfo, WriteOptions, get_engine
from feedline.engines.fusion import rebatch
from feedline.engines.schema import infer_schema
from feedline.errors import ConfigurationError
from feedline.io.pandas_metadata import valid_pandas_schema
from feedline.io.source import ExecutionReport, Source
from feedline.io.storage import resolve
from feedline.plan import Filter, Limit, MapBatches, Plan, Sample, Select, Transform
from feedline.progress import also
from feedline.progress import bar as progress_bar
from feedline.relational.methods import RelationalMethods
from feedline.relational.ops import RelationalSource, plan_lines

if TYPE_CHECKING:
    import pandas
    import pyspark.sql
    import ray.data
    from pyspark.sql import SparkSession

    from feedline.io.format import Manifest
    from feedline.io.shard_source import BatchStream, ShardSource
    from feedline.loader import Loader, Windows
    from feedline.preprocess.base import Preprocessor

__all__ = ["Dataset", "infer_schema"]

T = TypeVar("T")



class Dataset(RelationalMethods, ConvenienceMethods):
    """A lazy, immutable pipeline. Every method returns a new ``Dataset``; nothing runs
    until a terminal call (``iter_batches``, ``to_arrow``, ``take``, ``count``, ``write``).

    Examples
    --------
    >>> import feedline as fl, pyarrow.compute as pc
    >>> ds = fl.range(100).filter(pc.field("id") >= 5).limit(3)
    >>> ds.to_arrow()["id"].to_pylist()
    [5, 6, 7]
    """

    def __init__(self, plan: Plan, _fits: _FitCache | None = None) -> None:
        self._plan = plan
        # Fitted preprocessors, shared with every dataset derived from this one (their
        # plans extend this plan, so a preprocessor at the same position saw the same data).
        self._fits = _fits if _fits is not None else _FitCache()

    @classmethod
    def from_source(cls, source: Source) -> Dataset:
        """A dataset reading ``source``."""
        return cls(Plan(source))

    @property
    def plan(self) -> Plan:
        """The logical plan (read-only)."""
        return self._plan

    @property
    def manifest(self) -> Manifest | None:
        """The manifest when this dataset reads a committed feedline dataset, else ``None``."""
        return getattr(self._plan.source, "manifest", None)

    @property
    def preprocessor(self) -> Preprocessor | None:
        """The fitted preprocessing stored with a written dataset, ready for serving.

        Rebuilt (with :func:`feedline.preprocess.from_state`, which runs no foreign code)
        from the manifest of the committed dataset this one reads: the preprocessor that
        ``ds.transform(p)`` fitted when the write ran, or a :class:`~feedline.Chain` of them
        when the pipeline had several. ``None`` when the dataset was never written (a lazy
        plan: write it, then ``fl.open(path).preprocessor``) or its pipeline had none. Each
        access rebuilds it: keep the result.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa, tempfile
        >>> path = tempfile.mkdtemp() + "/ds"
        >>> ds = fl.from_arrow(pa.table({"x": [1.0, 3.0]})).transform(fl.StandardScaler("x"))
        >>> _ = ds.write(path)
        >>> fl.open(path).preprocessor.transform_record({"x": 3.0})
        {'x': 1.0}
        >>> fl.range(3).preprocessor is None
        True
        """
        manifest = self.manifest
        if manifest is None or not manifest.preprocessors:
            return None
        from feedline.preprocess.base import from_state

        steps = [from_state(entry.get("state")) for entry in manifest.preprocessors]
        if len(steps) == 1:
            return steps[0]
        from feedline.preprocess.chain import Chain

        return Chain(steps)

    def __repr__(self) -> str:
        from feedline.display import describe

        return describe(self._plan)

    def _then(self, op: Any) -> Dataset:
        return Dataset(self._plan.then(op), self._fits)

    # ------------------------------------------------------------------ transformations

    def select(self, columns: str | Sequence[str]) -> Dataset:
        """Keep ``columns`` in the given order (pushed into the reader where possible).

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> fl.from_arrow(pa.table({"a": [1], "b": [2]})).select("b").schema().names
        ['b']
        """
        names = (columns,) if isinstance(columns, str) else tuple(columns)
        if not names or not all(isinstance(c, str) for c in names):
            raise ConfigurationError(
                f"select() needs one or more column names, got {columns!r}. Fix: pass a list of "
                "strings."
            )
        return self._then(Select(names))

    def filter(self, predicate: pc.Expression | Callable[[pa.RecordBatch], Any]) -> Dataset:
        """Keep rows where ``predicate`` holds.

        ``predicate`` is a pyarrow expression (``pc.field("x") > 0``; pushed down to the
        Parquet reader, which then skips row groups whose statistics rule it out) or a
        function ``batch -> boolean mask``.

        Examples
        --------
        >>> import feedline as fl, pyarrow.compute as pc
        >>> fl.range(10).filter(pc.field("id") >= 8).count()
        2
        >>> fl.range(10).filter(lambda b: pc.less(b["id"], 3)).count()
        3
        """
        if not isinstance(predicate, pc.Expression) and not callable(predicate):
            raise ConfigurationError(
                "filter() takes a pyarrow expression or a function, got "
                f"{type(predicate).__name__}. Fix: e.g. ds.filter(pc.field('price') > 0)."
            )
        return self._then(Filter(predicate))

    def map_batches(
        self,
        fn: Callable[..., Any],
        *,
        batch_size: int | None = None,
        fn_kwargs: Mapping[str, Any] | None = None,
        fn_constructor_kwargs: Mapping[str, Any] | None = None,
        output_schema: pa.Schema | None = None,
        concurrency: int | None = None,
        device: str | None = None,
        passthrough: Sequence[str] | None = None,
    ) -> Dataset:
        """Apply ``fn`` to batches of at most ``batch_size`` rows.

        ``fn(batch: pa.RecordBatch, **fn_kwargs)`` returns a ``RecordBatch``, ``Table``, a
        dict of column → array (NumPy arrays with more dimensions become fixed-shape tensor
        columns; torch tensors are converted on the CPU) or a pandas/polars DataFrame.
        Batches of a function are formed within each read task (file); pass
        ``output_schema`` to let ``schema()`` answer without running ``fn``.

        ``fn`` may be a class (batch inference, see :mod:`feedline.inference`): it is
        constructed once per worker with ``fn_constructor_kwargs`` (plus ``device=device``
        when ``device`` is given: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``) and
        called per batch. On the local engine it runs in a stage of ``concurrency`` threads
        (default 1) overlapping with the reads, on batches of exactly ``batch_size`` rows;
        on Ray in a pool of ``concurrency`` actors; on Spark once per Python worker.
        ``passthrough`` names input columns (ids, labels) put before ``fn``'s outputs,
        which then must have one row per input row.

        Examples
        --------
        >>> import feedline as fl, pyarrow.compute as pc
        >>> ds = fl.range(4).map_batches(lambda b: {"twice": pc.multiply(b["id"], 2)})
        >>> ds.to_arrow()["twice"].to_pylist()
        [0, 2, 4, 6]
        """
        from feedline.inference import check_model_options

        if not callable(fn):
            raise ConfigurationError(
                f"map_batches() needs a function or class, got {fn!r}. Fix: pass a callable "
                "taking a pa.RecordBatch, or a class whose instances are callable."
            )
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError(
                f"batch_size={batch_size} must be >= 1. Fix: pass a positive int or None."
            )
        if fn_constructor_kwargs and not isinstance(fn, type):
            raise ConfigurationError(
                "fn_constructor_kwargs only applies when fn is a class. Fix: drop it or pass a "
                "class."
            )
        device = check_model_options(fn, device, fn_constructor_kwargs, concurrency)
        if isinstance(passthrough, str):
            passthrough = [passthrough]
        return self._then(
            MapBatches(
                fn,
                batch_size,
                tuple(sorted((fn_kwargs or {}).items())),
                tuple(sorted((fn_constructor_kwargs or {}).items())),
                output_schema,
                concurrency,
                device,
                tuple(passthrough or ()),
            )
        )

    def transform(self, preprocessor: Preprocessor) -> Dataset:
        """Apply a preprocessor; an unfitted one is fitted when the plan first executes."""
        if not hasattr(preprocessor, "transform_batch"):
            raise ConfigurationError(
                f"transform() needs a feedline preprocessor, got {type(preprocessor).__name__}. "
                "Fix: use e.g. fl.StandardScaler(...) or map_batches for plain functions."
            )
        return self._then(Transform(preprocessor))

    def limit(self, n: int) -> Dataset:
        """Keep the first ``n`` rows (in stored order when order is preserved)."""
        if not isinstance(n, int) or n < 0:
            raise ConfigurationError(
                f"limit() needs a non-negative int, got {n!r}. Fix: pass e.g. ds.limit(100)."
            )
        return self._then(Limit(n))

    def sample(
        self, fraction: float | None = None, seed: int = 0, *, n: int | None = None
    ) -> Dataset:
        """Keep each row with probability ``fraction``, or exactly ``n`` rows (all when fewer);
        the same rows for the same ``seed``.

        ``n=`` takes the first ``n`` rows of ``random_shuffle(seed)``: rows keyed by a seeded
        hash of their content, so every engine and file layout picks the same ones.

        Examples
        --------
        >>> import feedline as fl
        >>> 800 < fl.range(10_000).sample(0.1, seed=1).count() < 1200
        True
        >>> fl.range(10_000).sample(n=7, seed=1).count()
        7
        """
        if n is not None:
            if fraction is not None or not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ConfigurationError(
                    f"sample() takes either fraction= or a non-negative int n=, got "
                    f"fraction={fraction!r}, n={n!r}. Fix: pass one, e.g. ds.sample(n=1000)."
                )
            return self.random_shuffle(seed).limit(n)
        if fraction is None or not 0.0 <= fraction <= 1.0:
            raise ConfigurationError(
                f"sample() needs 0 <= fraction <= 1, got {fraction}. Fix: pass e.g. 0.1 for 10%."
            )
        return self._then(Sample(float(fraction), int(seed)))

    # ------------------------------------------------------------------ inspection

    def schema(self) -> pa.Schema:
        """The output schema; user functions run on at most 16 rows only when needed.

        Its ``pandas`` metadata keeps only what is still true of the columns.
        """
        return valid_pandas_schema(infer_schema(self._resolved_plan()))

    def explain(self, analyze: bool = False, engine: str | Engine | None = None) -> str:
        """The plan, one operator per line, with what is pushed into the reader.

        With ``analyze=True`` the plan runs (output discarded) and the counters are shown.
        """
        from feedline.plan import pushdown

        lines = ["Logical plan:"]
        lines += [f"  {line}" for line in plan_lines(self._plan)]
        pushed = pushdown(self._plan)
        lines.append("Pushed into the reader:")
        lines.append(f"  columns: {list(pushed.columns) if pushed.columns else 'all'}")
        lines.append(f"  predicate: {pushed.predicate if pushed.predicate is not None else 'none'}")
        if analyze:
            report = self.analyze(engine=engine)
            lines.append("Execution:")
            lines += [f"  {k}: {v}" for k, v in report.as_dict().items() if k != "skipped"]
        return "\n".join(lines)

    def analyze(self, engine: str | Engine | None = None) -> ExecutionReport:
        """Run the plan, discard the rows, and return the execution counters."""
        report = ExecutionReport()
        for _ in self._execute(engine, preserve_order=False, report=report):
            pass
        return report

    def count(self, engine: str | Engine | None = None) -> int:
        """The number of rows (from metadata alone when the plan allows it)."""
        if all(isinstance(op, Select | Limit) for op in self._plan.ops):
            # a relational source types itself from its inputs: fit their preprocessors first
            relational = isinstance(self._plan.source, RelationalSource)
            plan = self._resolved_plan(engine) if relational else self._plan
            infer_schema(plan)  # validates selected columns without reading data
            total = plan.known_rows()
            if total is not None:
                return total
        return sum(b.num_rows for b in self._execute(engine, preserve_order=False))

    def aggregate(
        self,
        partial: Callable[[pa.RecordBatch], T],
        merge: Callable[[T, T], T],
        engine: str | Engine | None = None,
    ) -> T | None:
        """Merge ``partial(batch)`` over every batch of the dataset, on ``engine``.

        ``partial`` turns one batch into a partial result and ``merge`` combines two of them;
        engines merge in a fixed order, so the result is the same on every engine.
        ``None`` when the dataset has no batches. Preprocessors fit and ``fl.stats`` compute
        through this call, so they never touch an engine themselves.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(10).aggregate(lambda b: b.num_rows, lambda a, b: a + b)
        10
        """
        return get_engine(engine).aggregate(self._resolved_plan(engine), partial, merge)

    # ------------------------------------------------------------------ execution

    def _resolved_plan(self, engine: str | Engine | None = None) -> Plan:
        """The plan with unfitted preprocessors fitted on the data before them.

        Each preprocessor is fitted once for a dataset and all datasets derived from it.
        """
        ops: list[Any] = []
        for position, op in enumerate(self._plan.ops):
            if isinstance(op, Transform) and not getattr(op.preprocessor, "is_fitted", True):
                upstream = Dataset(Plan(self._plan.source, tuple(ops)), self._fits)
                op = self._fits.get(position, op, lambda o=op, u=upstream: _fit(o, u, engine))
            ops.append(op)
        source = self._plan.source
        if isinstance(source, RelationalSource):  # fit the inputs' preprocessors too
            source = source.with_inputs(
                [
                    Dataset(plan, self._fits.child(number))._resolved_plan(engine)
                    for number, plan in enumerate(source.inputs)
                ]
            )
        return Plan(source, tuple(ops))

    def _execute(
        self,
        engine: str | Engine | None,
        *,
        preserve_order: bool,
        report: ExecutionReport | None = None,
    ) -> Iterator[pa.RecordBatch]:
        return get_engine(engine).execute(
            self._resolved_plan(engine), preserve_order=preserve_order, report=report
        )

    def iter_batches(
        self,
        batch_size: int | None = None,
        *,
        preserve_order: bool = True,
        engine: str | Engine | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream the output as record batches of exactly ``batch_size`` rows (last may be
        short), or as produced when ``batch_size`` is ``None``.

        Examples
        --------
        >>> import feedline as fl
        >>> [b.num_rows for b in fl.range(10).iter_batches(4)]
        [4, 4, 2]
        """
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError(
                f"batch_size={batch_size} must be >= 1. Fix: pass a positive int or None."
            )
        stream = self._execute(engine, preserve_order=preserve_order)
        return rebatch(stream, batch_size) if batch_size else stream

    def to_arrow(
        self, engine: str | Engine | None = None, *, progress: bool | None = None
    ) -> pa.Table:
        """Run the plan and collect the result as a ``pyarrow.Table``.

        Its ``pandas`` schema metadata (from ``fl.from_pandas``) keeps only what is still
        true of the result's columns (:mod:`feedline.io.pandas_metadata`). ``progress``: a
        bar of the rows collected (``None``: ``fl.config.progress``).
        """
        batches: list[pa.RecordBatch] = []
        with progress_bar("collect rows", progress=progress) as advance:
            for batch in self._execute(engine, preserve_order=True):
                batches.append(batch)
                advance(batch.num_rows)
        table = pa.Table.from_batches(batches) if batches else self.schema().empty_table()
        return table.replace_schema_metadata(valid_pandas_schema(table.schema).metadata)

    def to_pandas(
        self, engine: str | Engine | None = None, *, progress: bool | None = None
    ) -> pandas.DataFrame:
        """Run the plan and collect the result as a pandas DataFrame (``progress``: as in
        :meth:`to_arrow`)."""
        return self.to_arrow(engine, progress=progress).to_pandas()

    def take(self, n: int = 20, engine: str | Engine | None = None) -> list[dict[str, Any]]:
        """The first ``n`` rows as a list of dicts (reads only what it needs)."""
        return self.limit(n).to_arrow(engine).to_pylist()

    def write(
        self,
        path: str | os.PathLike[str],
        *,
        engine: str | Engine | None = None,
        rows_per_shard: int | None = None,
        bytes_per_shard: int | str | None = "256MiB",
        row_group_rows: int | None = None,
        compression: str | None = "zstd",
        preserve_order: bool = True,
        storage_options: dict[str, Any] | None = None,
        on_rows: Callable[[int], None] | None = None,
        stats: bool = False,
        progress: bool | None = None,
    ) -> WriteInfo:
        """Materialize the dataset as a feedline dataset (shards + manifest) at ``path``.

        Many small inputs become few right-sized shards: a shard closes after
        ``rows_per_shard`` rows or about ``bytes_per_shard`` bytes. The manifest is
        committed last, so an interrupted write never leaves a dataset that opens.
        ``stats=True`` then stores ``fl.stats`` of the committed data in the manifest's
        ``statistics`` (a second, parallel read of the shards on the same engine, and an
        atomic manifest replacement; see :func:`feedline.preprocess.stats.store_stats`).
        ``progress`` shows a bar of the rows written (``None``: ``fl.config.progress``, by
        default only on a terminal or in a notebook; see :mod:`feedline.progress`).

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> info = fl.range(1000).write(tempfile.mkdtemp() + "/out", rows_per_shard=400)
        >>> info.rows, info.shards
        (1000, 3)
        """
        from feedline.io.sizes import parse_bytes

        options = WriteOptions(
            rows_per_shard=rows_per_shard,
            bytes_per_shard=parse_bytes(bytes_per_shard) if bytes_per_shard else None,
            row_group_rows=row_group_rows,
            compression=compression,
        )
        with progress_bar(f"write {os.fspath(path)}", progress=progress) as advance:
            plan = self._resolved_plan(engine)
            states = [
                {"name": type(op.preprocessor).__name__, "state": op.preprocessor.state}
                for op in plan.ops
                if isinstance(op, Transform) and hasattr(op.preprocessor, "state")
            ]
            info = get_engine(engine).write(
                plan,
                resolve(path, storage_options),
                options,
                preserve_order=preserve_order,
                on_rows=also(advance, on_rows),
                preprocessors=states,
            )
        if stats:
            from feedline.io.format import open_source
            from feedline.preprocess.stats import store_stats

            written = Dataset.from_source(open_source(path, storage_options=storage_options))
            store_stats(written, engine=engine)
        return info

    def write_tfrecord(
        self,
        path: str | os.PathLike[str],
        *,
        engine: str | Engine | None = None,
        compression: str | None = None,
        records_per_file: int | None = None,
        bytes_per_file: int | str | None = "256MiB",
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> WriteInfo:
        """Write the rows as TFRecord files of ``tf.train.Example`` records (for tf.data).

        The plan runs on ``engine`` and its batches stream into ``part-00000.tfrecord``,
        ``part-00001.tfrecord`` … in the folder ``path`` (a new file after
        ``records_per_file`` records or about ``bytes_per_file`` bytes), ``compression``
        ``None``, ``"GZIP"`` or ``"ZLIB"``. Integers and booleans become ``int64_list``,
        floats ``float_list`` (float32), binary and strings ``bytes_list``; lists and
        tensors are flattened. See :mod:`feedline.io.tfrecord_write`.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> info = fl.range(10).write_tfrecord(tempfile.mkdtemp(), records_per_file=4)
        >>> info.rows, info.shards
        (10, 3)
        """
        import time

        from feedline.io.sizes import parse_bytes
        from feedline.io.tfrecord_write import write_tfrecord

        started = time.perf_counter()
        report = ExecutionReport()
        resolved = get_engine(engine)
        target = resolve(path, storage_options)
        rows, files, size = write_tfrecord(
            self._execute(resolved, preserve_order=True, report=report),
            target,
            compression=compression,
            records_per_file=records_per_file,
            bytes_per_file=parse_bytes(bytes_per_file) if bytes_per_file else None,
            overwrite=overwrite,
        )
        seconds = time.perf_counter() - started
        return WriteInfo(
            target.url, rows, len(files), size, seconds, resolved.name, report.as_dict()
        )

    def to_spark(self, spark: SparkSession | None = None) -> pyspark.sql.DataFrame:
        """This dataset as a lazy Spark DataFrame (see :func:`feedline.engines.spark.to_spark`)."""
        from feedline.engines.spark import to_spark

        return to_spark(self, spark)

    def to_ray(self, engine: str | Engine | None = None) -> ray.data.Dataset:
        """This dataset as a lazy ``ray.data.Dataset`` (see
        :func:`feedline.engines.ray_bridge.to_ray`)."""
        from feedline.engines.ray_bridge import to_ray

        return to_ray(self, engine)

    def streaming_split(
        self, n: int, *, equal: bool = True, engine: str | Engine | None = None
    ) -> list[ray.data.DataIterator]:
        """``n`` disjoint streams of this dataset for ``n`` Ray consumers (Ray Train workers),
        computed on Ray as they are read, nothing written first (see
        :func:`feedline.engines.ray_bridge.streaming_split`)."""
        from feedline.engines.ray_bridge import streaming_split

        return streaming_split(self, n, equal=equal, engine=engine)

    def loader(
        self,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool | None = None,
        columns: Sequence[str] | None = None,
        cache: str = "auto",
        prefetch: int = 2,
        format: str = "torch",  # noqa: A002 - the documented public name
        pin_memory: bool = False,
        shuffle_window: int | None = None,
        memory_budget: int | str = "2GB",
        windows: Windows | None = None,
        *,
        strings: str = "raise",
        return_padding_mask: bool = False,
        track: bool | str = False,
        cache_dir: str | os.PathLike[str] | bool | None = None,
        cache_limit: int | str = "20GB",
        stack: Mapping[str, Sequence[str]] | None = None,
        dtype: Any = None,
        pad_last: bool = False,
        transform: Callable[..., Any] | None = None,
        batched: bool = False,
        num_workers: int = 0,
        worker_type: str = "thread",
        device: Any = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        ragged: str | Mapping[str, str] = "raise",
        pad_value: float = 0,
    ) -> Loader:
        """A training loader over this dataset: :class:`feedline.loader.Loader`, whose
        docstring describes every parameter (the same, in the same order).

        Training: ``ds.loader(batch_size=256, seed=0)`` (shuffled, remainder dropped);
        evaluation: ``ds.loader(batch_size=256, shuffle=False)`` (every sample once, a short
        last batch).

        Examples
        --------
        >>> import feedline as fl
        >>> [b["id"].tolist() for b in fl.range(5).loader(batch_size=2, shuffle=False)]
        [[0, 1], [2, 3], [4]]
        """
        from feedline.loader import Loader

        return Loader(
            self, batch_size, shuffle, seed, rank, world_size, drop_last, columns, cache,
            prefetch, format, pin_memory, shuffle_window, memory_budget, windows,
            strings=strings, return_padding_mask=return_padding_mask, track=track,
            cache_dir=cache_dir, cache_limit=cache_limit, stack=stack, dtype=dtype,
            pad_last=pad_last, transform=transform, batched=batched, num_workers=num_workers,
            worker_type=worker_type, device=device, shapes=shapes, ragged=ragged,
            pad_value=pad_value,
        )  # fmt: skip

    def _loader_source(self, columns: Sequence[str] | None = None) -> ShardSource | BatchStream:
        """What a loader reads (the seam: the loader never sees a Dataset).

        A written dataset or a Parquet folder read as it is (a plan of column selections at
        most) gives its :class:`~feedline.io.shard_source.ShardSource`; any other plan a
        :class:`~feedline.io.shard_source.BatchStream` of its batches (row count known when
        metadata tells). ``columns`` selects columns first.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(10).limit(4)._loader_source().num_rows
        4
        """
        from feedline.io.parquet import ParquetSource
        from feedline.io.shard_source import BatchStream, ShardSource

        if columns is not None:
            return self.select(list(columns))._loader_source()
        plan, schema = self._plan, self.schema()
        as_stored = all(isinstance(op, Select) for op in plan.ops)
        if isinstance(plan.source, ParquetSource) and as_stored:
            return ShardSource.from_source(plan.source, schema.names)
        rows = None
        if all(isinstance(op, Select | Limit) for op in plan.ops):
            rows = plan.source.count_rows()
            for op in plan.ops:
                if rows is not None and isinstance(op, Limit):
                    rows = min(rows, op.n)

        def batches(names: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
            same = names is None or list(names) == schema.names
            return (self if same else self.select(list(names))).iter_batches()

        return BatchStream(schema, rows, batches, repr(self).splitlines()[0])


def _fit(op: Transform, upstream: Dataset, engine: str | Engine | None) -> Any:
    """Fit ``op``'s preprocessor on ``upstream`` with the engine that runs the plan."""
    if engine is None:
        return op.preprocessor.fit(upstream)
    return op.preprocessor.fit(upstream, engine=engine)


class _FitCache:
    """Fitted ``Transform`` operators by (position in the plan, operator identity)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._fitted: dict[tuple[int, int], tuple[Transform, Transform]] = {}
        self._children: dict[int, _FitCache] = {}

    def child(self, number: int) -> _FitCache:
        """The cache of a relational operator's input ``number`` (kept with this one)."""
        with self._lock:
            return self._children.setdefault(number, _FitCache())

    def get(self, position: int, op: Transform, fit: Callable[[], Any]) -> Transform:
        key = (position, id(op))
        with self._lock:
            if key not in self._fitted:
                # the original op is kept in the value so its id cannot be reused
                self._fitted[key] = (op, Transform(fit()))
            return self._fitted[key][1]
