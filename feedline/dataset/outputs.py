"""The terminal calls of :class:`feedline.Dataset` that leave the plan (a mixin).

``write`` (a feedline dataset), ``write_tfrecord``, ``to_spark`` / ``to_ray`` /
``streaming_split`` (hand-offs to another system) and ``loader`` (training), plus the seam the
loader reads through (``_loader_source``: the loader never sees a ``Dataset``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.arrow.sizes import parse_bytes
from feedline.engines.base import Engine, WriteInfo, WriteOptions, get_engine
from feedline.engines.ray.bridge import streaming_split, to_ray
from feedline.engines.spark.bridge import to_spark
from feedline.io.parquet import ParquetSource
from feedline.io.source import ExecutionReport, Source
from feedline.io.storage.paths import resolve
from feedline.io.tfrecord.writer import write_tfrecord
from feedline.loader.loader import Loader
from feedline.plan.plan import Plan, Select, Transform
from feedline.statistics.compute import store_stats
from feedline.store.dataset_files import open_source
from feedline.store.shard_source import BatchStream, ShardSource
from feedline.ui.progress import also
from feedline.ui.progress import bar as progress_bar

if TYPE_CHECKING:
    import pyspark.sql
    import ray.data
    from pyspark.sql import SparkSession

    from feedline.dataset.dataset import Dataset
    from feedline.loader.data.windows import Windows
    from feedline.loader.loader import Loader
    from feedline.store.shard_source import BatchStream, ShardSource

__all__ = ["OutputMethods"]


class OutputMethods:
    """Mixed into :class:`feedline.Dataset`; see each method."""

    _plan: Plan

    if TYPE_CHECKING:  # provided by Dataset

        @classmethod
        def from_source(cls, source: Source) -> Dataset: ...

        def schema(self) -> pa.Schema: ...

        def select(self, columns: str | Sequence[str]) -> Dataset: ...

        def iter_batches(self) -> Iterator[pa.RecordBatch]: ...

        def _resolved_plan(self, engine: str | Engine | None = None) -> Plan: ...

        def _execute(
            self,
            engine: str | Engine | None,
            *,
            preserve_order: bool,
            report: ExecutionReport | None = None,
        ) -> Iterator[pa.RecordBatch]: ...

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
        atomic manifest replacement; see :func:`feedline.statistics.compute.store_stats`).
        ``progress`` shows a bar of the rows written (``None``: ``fl.config.progress``, by
        default only on a terminal or in a notebook; see :mod:`feedline.ui.progress`).

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> info = fl.range(1000).write(tempfile.mkdtemp() + "/out", rows_per_shard=400)
        >>> info.rows, info.shards
        (1000, 3)
        """

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
            written = type(self).from_source(open_source(path, storage_options=storage_options))
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
        tensors are flattened. See :mod:`feedline.io.tfrecord.writer`.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> info = fl.range(10).write_tfrecord(tempfile.mkdtemp(), records_per_file=4)
        >>> info.rows, info.shards
        (10, 3)
        """
        import time

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
        """This dataset as a lazy Spark DataFrame (see :func:`feedline.engines.spark.engine.to_spark`)."""

        return to_spark(self, spark)

    def to_ray(self, engine: str | Engine | None = None) -> ray.data.Dataset:
        """This dataset as a lazy ``ray.data.Dataset`` (see
        :func:`feedline.engines.ray.bridge.to_ray`)."""

        return to_ray(self._resolved_plan(), engine)

    def streaming_split(
        self, n: int, *, equal: bool = True, engine: str | Engine | None = None
    ) -> list[ray.data.DataIterator]:
        """``n`` disjoint streams of this dataset for ``n`` Ray consumers (Ray Train workers),
        computed on Ray as they are read, nothing written first (see
        :func:`feedline.engines.ray.bridge.streaming_split`)."""

        return streaming_split(self._resolved_plan(), n, equal=equal, engine=engine)

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
        most) gives its :class:`~feedline.store.shard_source.ShardSource`; any other plan a
        :class:`~feedline.store.shard_source.BatchStream` of its batches (row count known when
        metadata tells). ``columns`` selects columns first.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(10).limit(4)._loader_source().num_rows
        4
        """

        if columns is not None:
            return self.select(list(columns))._loader_source()
        plan, schema = self._plan, self.schema()
        as_stored = all(isinstance(op, Select) for op in plan.ops)
        if isinstance(plan.source, ParquetSource) and as_stored:
            return ShardSource.from_source(plan.source, schema.names)
        rows = plan.known_rows()

        def batches(names: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
            same = names is None or list(names) == schema.names
            return (self if same else self.select(list(names))).iter_batches()

        return BatchStream(schema, rows, batches, repr(self).splitlines()[0])
