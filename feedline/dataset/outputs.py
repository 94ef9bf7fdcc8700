"""What leaves the plan: a feedline dataset, TFRecord files, and what a loader reads.

:meth:`feedline.Dataset.write`, ``write_tfrecord`` and ``shard_source`` run here, given the
engine and the plan (its preprocessors fitted); the ``Dataset`` methods only resolve those.
The hand-offs to other systems live with their engines (:mod:`feedline.engines.spark.bridge`,
:mod:`feedline.engines.ray.bridge`), the training loader in :mod:`feedline.loader`.

Examples
--------
>>> import feedline as fl
>>> source = shard_source(fl.range(10).plan, fl.range(10).schema(), lambda names: iter(()), "r")
>>> type(source).__name__, source.num_rows
('BatchStream', 10)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from feedline.arrow.sizes import parse_bytes
from feedline.engines.protocol import Engine, WriteInfo, WriteOptions
from feedline.io.parquet import ParquetSource
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import resolve
from feedline.io.tfrecord.writer import write_tfrecord as write_records
from feedline.plan.plan import Plan, Select, Transform
from feedline.store.commit import note_base
from feedline.store.shard_source import BatchStream, ShardSource
from feedline.ui.progress import also
from feedline.ui.progress import bar as progress_bar

__all__ = ["preprocessor_states", "shard_source", "write", "write_tfrecord"]


def preprocessor_states(plan: Plan) -> list[dict[str, Any]]:
    """The fitted preprocessors of ``plan`` as manifest entries (``name``, JSON ``state``).

    Examples
    --------
    >>> import feedline as fl
    >>> scaler = fl.StandardScaler("id").fit(fl.range(3))
    >>> [entry["name"] for entry in preprocessor_states(fl.range(3).transform(scaler).plan)]
    ['StandardScaler']
    """
    return [
        {"name": type(op.preprocessor).__name__, "state": op.preprocessor.state}
        for op in plan.ops
        if isinstance(op, Transform) and hasattr(op.preprocessor, "state")
    ]


def write(
    engine: Engine,
    fitted: Callable[[], Plan],
    path: str | os.PathLike[str],
    *,
    rows_per_shard: int | None = None,
    bytes_per_shard: int | str | None = "256MiB",
    row_group_rows: int | None = None,
    compression: str | None = "zstd",
    preserve_order: bool = True,
    storage_options: dict[str, Any] | None = None,
    on_rows: Callable[[int], None] | None = None,
    progress: bool | None = None,
) -> WriteInfo:
    """Write the plan ``fitted()`` as a feedline dataset at ``path`` on ``engine``.

    ``fitted`` is called inside the progress bar of the rows written, so the fits it
    triggers follow the same ``progress`` setting; the fitted preprocessors' states go into
    the manifest. The write commits only if no other writer committed at ``path`` since
    this call began (else :class:`~feedline.errors.ConcurrentWriteError`). See
    :meth:`feedline.Dataset.write` for the parameters.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.engines.protocol import get_engine
    >>> info = write(get_engine(), lambda: fl.range(10).plan, tempfile.mkdtemp() + "/out")
    >>> info.rows
    10
    """
    options = WriteOptions(
        rows_per_shard=rows_per_shard,
        bytes_per_shard=parse_bytes(bytes_per_shard) if bytes_per_shard else None,
        row_group_rows=row_group_rows,
        compression=compression,
    )
    target = resolve(path, storage_options)
    # the version this write starts from, noted before any work: a commit by another writer
    # from now on (during the fits, the schema inference, the shards) fails this write
    base = note_base(target)
    with progress_bar(f"write {os.fspath(path)}", progress=progress) as advance:
        plan = fitted()
        return engine.write(
            plan,
            target,
            options,
            preserve_order=preserve_order,
            on_rows=also(advance, on_rows),
            preprocessors=preprocessor_states(plan),
            base=base,
        )


def write_tfrecord(
    engine: Engine,
    fitted: Callable[[], Plan],
    path: str | os.PathLike[str],
    *,
    compression: str | None = None,
    records_per_file: int | None = None,
    bytes_per_file: int | str | None = "256MiB",
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> WriteInfo:
    """Stream the rows of the plan ``fitted()`` on ``engine`` into TFRecord files at ``path``.

    See :meth:`feedline.Dataset.write_tfrecord` for the parameters and
    :mod:`feedline.io.tfrecord.writer` for the encoding.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.engines.protocol import get_engine
    >>> write_tfrecord(get_engine(), lambda: fl.range(5).plan, tempfile.mkdtemp()).rows
    5
    """
    started = time.perf_counter()
    report = ExecutionReport()
    target = resolve(path, storage_options)
    rows, files, size = write_records(
        engine.execute(fitted(), preserve_order=True, report=report),
        target,
        compression=compression,
        records_per_file=records_per_file,
        bytes_per_file=parse_bytes(bytes_per_file) if bytes_per_file else None,
        overwrite=overwrite,
    )
    seconds = time.perf_counter() - started
    return WriteInfo(target.url, rows, len(files), size, seconds, engine.name, report.as_dict())


def shard_source(
    plan: Plan,
    schema: pa.Schema,
    batches: Callable[[Sequence[str] | None], Iterator[pa.RecordBatch]],
    name: str,
) -> ShardSource | BatchStream:
    """What a loader reads of ``plan`` (whose output schema is ``schema``).

    A written dataset or a Parquet folder read as it is (a plan of column selections at
    most) gives its :class:`~feedline.store.shard_source.ShardSource`; any other plan a
    :class:`~feedline.store.shard_source.BatchStream` of ``batches(columns)`` named ``name``
    (row count known when metadata tells).

    Examples
    --------
    >>> import feedline as fl
    >>> ds = fl.range(10).limit(4)
    >>> shard_source(ds.plan, ds.schema(), lambda names: ds.iter_batches(), "ds").num_rows
    4
    """
    as_stored = all(isinstance(op, Select) for op in plan.ops)
    if isinstance(plan.source, ParquetSource) and as_stored:
        return ShardSource.from_source(plan.source, schema.names)
    return BatchStream(schema, plan.known_rows(), batches, name)
