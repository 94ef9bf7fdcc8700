"""Writing feedline shards: right-sized Parquet files, hashed while they are written."""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from feedline.arrow.casts import overflowed
from feedline.arrow.column_names import check_unique
from feedline.arrow.pandas_metadata import valid_pandas_schema
from feedline.arrow.parquet_types import check_storable
from feedline.arrow.tensor_codec import TensorStorage
from feedline.errors import ConfigurationError, DataError, IntegrityError, SchemaError
from feedline.io.storage.paths import Location
from feedline.store.footers import footer_digest, read_footer_block
from feedline.store.manifest import ShardInfo
from feedline.store.stored_files import check_regular

__all__ = [
    "PARQUET_CODECS",
    "ShardWriter",
    "conform",
    "dictionary_columns",
    "file_checksum",
    "parquet_codec",
    "shard_name",
    "task_first_shard",
    "writable_schema",
]

#: shards one write task may write under :func:`task_first_shard` names before its indices
#: run into the next draw's
TASK_SHARDS = 10**4

_CHECKSUM_CHUNK = 8 << 20
#: bytes of a data page of a wide fixed-size column (pyarrow checks its 1 MiB page size only
#: every ``write_batch_size`` rows, 1,024 by default: 12.6 MB pages of uint8[3, 64, 64]). A
#: page is what a reader checks (CRC-32) before any of its rows may be used, so the loader
#: serves a batch of a filling cache once the few pages its rows lie in are read
#: (feedline/loader/data/page_tasks.py).
PAGE_BYTES = 1 << 20


def task_first_shard(task: int) -> int:
    """The index of the first shard that write task ``task`` (a Spark partition, a Ray write
    task; any attempt of it) names when it writes straight into the dataset folder, as
    engine writes do on object stores (where renaming a shard afterwards copies it): the task
    number, then a random draw, so two tasks, or two attempts of one task, never write the
    same name. The names keep the shape ``part-<digits>-<write id>.parquet``, so a failed
    attempt's shards are cleaned up like any interrupted write's.

    Examples
    --------
    >>> first = task_first_shard(7)
    >>> first // 10**12, first % TASK_SHARDS
    (7, 0)
    >>> shard_name(first, "0a1b2c3d4e5f").startswith("part-7")
    True
    """
    return (task * 10**8 + secrets.randbelow(10**8)) * TASK_SHARDS


def shard_name(index: int, write_id: str = "") -> str:
    """The file name of shard ``index`` of the write ``write_id``.

    Examples
    --------
    >>> shard_name(3, "0a1b2c3d4e5f")
    'part-00003-0a1b2c3d4e5f.parquet'
    >>> shard_name(3)
    'part-00003.parquet'
    """
    return f"part-{index:05d}{'-' + write_id if write_id else ''}.parquet"


class _HashingFile:
    """A write-only file wrapper that hashes and counts the bytes going through it.

    After :meth:`keep_tail` it also keeps the bytes written from then on (the footer).
    """

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self.size = 0
        self.closed = False
        self.tail: bytearray | None = None

    def keep_tail(self) -> bytearray:
        """Keep the bytes written from now on; returns the buffer they go to."""
        self.tail = bytearray()
        return self.tail

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._hash.update(view)
        if self.tail is not None:
            self.tail += view
        self._raw.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            self.closed = True

    @property
    def checksum(self) -> str:
        return "sha256:" + self._hash.hexdigest()


class ShardWriter:
    """Writes a stream of batches as right-sized Parquet shards into a folder.

    A shard ends when it holds ``rows_per_shard`` rows (exactly) or when its file reaches
    ``bytes_per_shard`` bytes (checked at row-group boundaries). Row groups hold
    ``row_group_rows`` rows, or about ``row_group_bytes`` of uncompressed data. Files are
    named :func:`shard_name` ``(index, write_id)``. The schema (``schema``, else the first
    batch's) goes through :func:`writable_schema` first.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> writer = ShardWriter(resolve(tempfile.mkdtemp()), rows_per_shard=2, write_id="ab12")
    >>> writer.write(pa.record_batch({"x": [1, 2, 3]}))
    >>> [(s.path, s.rows) for s in writer.close()]
    [('part-00000-ab12.parquet', 2), ('part-00001-ab12.parquet', 1)]
    """

    def __init__(
        self,
        folder: Location,
        *,
        schema: pa.Schema | None = None,
        rows_per_shard: int | None = None,
        bytes_per_shard: int | None = 256 << 20,
        row_group_rows: int | None = None,
        row_group_bytes: int = 32 << 20,
        compression: str | None = "zstd",
        first_shard: int = 0,
        write_id: str = "",
        on_rows: Callable[[int], None] | None = None,
    ) -> None:
        for name, value in (("rows_per_shard", rows_per_shard), ("row_group_rows", row_group_rows)):
            if value is not None and value < 1:
                raise ConfigurationError(
                    f"{name}={value} must be >= 1. Fix: pass a positive count."
                )
        self._folder = folder
        self._schema = writable_schema(schema) if schema is not None else None
        self._rows_per_shard = rows_per_shard
        self._bytes_per_shard = bytes_per_shard
        self._row_group_rows = row_group_rows
        self._row_group_bytes = min(row_group_bytes, bytes_per_shard or row_group_bytes)
        self._compression = parquet_codec(compression)
        self._next_index = first_shard
        self._write_id = write_id
        self._on_rows = on_rows
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._storage: TensorStorage | None = None
        self._file: _HashingFile | None = None
        #: settings decided on the first rows, as :meth:`settings` returned them (a resumed
        #: write restores the interrupted write's: :mod:`feedline.store.write_journal`)
        self._restored: dict[str, Any] = {}
        self._path = ""
        self._groups: list[int] = []
        self.shards: list[ShardInfo] = []

    @property
    def schema(self) -> pa.Schema | None:
        return self._schema

    def settings(self) -> dict[str, Any]:
        """What this writer decided on its first rows (JSON-safe): the row-group size and
        the tensor columns' compression. Empty before the first row group."""
        if self._storage is None or self._row_group_rows is None:
            return {}
        return {"row_group_rows": self._row_group_rows, "compression": self._storage.compression}

    def restore(self, settings: dict[str, Any]) -> None:
        """Decide as another writer did (its :meth:`settings`), so the shards written from
        here are the bytes that writer wrote after the same rows."""
        self._restored = dict(settings)
        if "row_group_rows" in settings:
            self._row_group_rows = int(settings["row_group_rows"])

    def write(self, batch: pa.RecordBatch) -> None:
        """Add one batch (its schema must match the first batch's)."""
        if self._schema is None:
            self._schema = writable_schema(batch.schema)
        if not batch.schema.equals(self._schema, check_metadata=False):
            batch = conform(batch, self._schema, "the first batch's schema")
        if batch.num_rows == 0:
            return
        if self._row_group_rows is None:
            per_row = max(1, batch.nbytes // max(1, batch.num_rows))
            self._row_group_rows = max(1, self._row_group_bytes // per_row)
        while batch.num_rows:
            room = self._room()
            part, batch = batch.slice(0, room), batch.slice(room)
            self._pending.append(part)
            self._pending_rows += part.num_rows
            if self._pending_rows >= self._row_group_rows or self._room() == 0:
                self._flush_group()

    def _room(self) -> int:
        """Rows that still fit in the current row group and shard."""
        group_rows = self._row_group_rows
        assert group_rows is not None  # write() sets it before placing any row
        room = group_rows - self._pending_rows
        if self._rows_per_shard is not None:
            room = min(room, self._rows_per_shard - sum(self._groups) - self._pending_rows)
        return max(room, 0)

    def _flush_group(self) -> None:
        if not self._pending_rows:
            return
        table = pa.Table.from_batches(self._pending, schema=self._schema)
        self._pending, self._pending_rows = [], 0
        storage = self._storage
        if storage is None:  # tensor columns as fixed-size binary (io/tensor_codec.py)
            storage = TensorStorage.plan(self._schema, self._compression, table)
            if "compression" in self._restored:
                storage = dataclasses.replace(storage, compression=self._restored["compression"])
            self._storage = storage
        writer = self._writer if self._writer is not None else self._open_shard(storage)
        writer.write_table(storage.encode(table), row_group_size=table.num_rows)
        self._groups.append(table.num_rows)
        if self._on_rows is not None:
            self._on_rows(table.num_rows)
        full_rows = self._rows_per_shard is not None and sum(self._groups) >= self._rows_per_shard
        full_bytes = (
            self._bytes_per_shard is not None and self._stream.tell() >= self._bytes_per_shard
        )
        if full_rows or full_bytes:
            self._close_shard()

    def _open_shard(self, storage: TensorStorage) -> pq.ParquetWriter:
        name = shard_name(self._next_index, self._write_id)
        self._next_index += 1
        self._path = name
        self._folder.fs.makedirs(self._folder.path, exist_ok=True)
        self._file = _HashingFile(self._folder.fs.open(self._folder.join(name), "wb"))
        # Parquet emits many small writes (page headers); buffer them before Python sees them.
        self._stream = pa.BufferedOutputStream(pa.PythonFile(self._file, mode="w"), 4 << 20)
        self._writer = writer = pq.ParquetWriter(
            self._stream,
            storage.schema,
            compression=storage.compression,
            write_statistics=storage.statistics,
            use_dictionary=storage.dictionary(dictionary_columns(self._schema)),
            column_encoding=storage.encoding,
            write_page_checksum=True,  # CRC-32 per page, verified on every read
            write_batch_size=_page_rows(storage.schema),
        )
        self._groups = []
        return writer

    def _close_shard(self) -> None:
        file, writer = self._file, self._writer
        assert file is not None and writer is not None  # a shard is open
        self._stream.flush()  # the row groups reach the file; what close() adds is the footer
        tail = file.keep_tail()
        writer.close()
        self._stream.close()
        file.close()
        self.shards.append(
            ShardInfo(
                self._path,
                sum(self._groups),
                file.size,
                tuple(self._groups),
                file.checksum,
                footer=_footer_digest(bytes(tail), self._path),
                page_checksums=True,
            )
        )
        self._writer = self._file = None
        self._groups = []

    def close(self) -> list[ShardInfo]:
        """Flush and close; returns every shard written."""
        self._flush_group()
        if self._writer is not None:
            self._close_shard()
        return self.shards

    def abort(self) -> None:
        """Close open files without recording the shard (after an error)."""
        if self._writer is not None:
            try:
                self._writer.close()
                self._stream.close()
                if self._file is not None:  # open with the writer
                    self._file.close()
            except Exception:  # noqa: BLE001 - already failing; keep the first error
                pass
            self._writer = self._file = None


#: the codecs pyarrow's Parquet writer knows (its own spelling; any case is accepted)
PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "lz4_raw", "zstd")


def parquet_codec(compression: str | None) -> str:
    """The Parquet codec name for ``compression`` (``None`` → ``"none"``), checked up front.

    An unknown name, or a codec this pyarrow was built without, is a
    :class:`~feedline.errors.ConfigurationError` before any file is written.

    Examples
    --------
    >>> parquet_codec("ZSTD"), parquet_codec(None)
    ('zstd', 'none')
    >>> parquet_codec("lz77")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: compression='lz77' is not a Parquet codec. Fix: ...
    """
    if compression is None:
        return "none"
    name = compression.lower() if isinstance(compression, str) else None
    if name not in PARQUET_CODECS:
        raise ConfigurationError(
            f"compression={compression!r} is not a Parquet codec. Fix: pass one of "
            f"{list(PARQUET_CODECS)} (or None); 'zstd' is the default."
        )
    if name not in ("none", "lz4_raw") and not pa.Codec.is_available(name):
        raise ConfigurationError(
            f"compression={compression!r}: this pyarrow build has no {name} codec. Fix: use "
            "'zstd' or 'snappy', or install a pyarrow built with it."
        )
    return name


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth Parquet dictionary encoding: everything but floating-point data.

    Floats (and tensors of floats) almost never repeat, so trying a dictionary first costs
    write time (up to 2x here) and, when it sticks, halves read speed. Strings, integers
    and booleans keep pyarrow's default (a dictionary, dropped when it grows too large).

    Examples
    --------
    >>> dictionary_columns(pa.schema({"x": pa.float32(), "label": pa.int64(), "s": pa.string()}))
    ['label', 's']
    """

    def floating(kind: pa.DataType) -> bool:
        if isinstance(kind, pa.ExtensionType):
            kind = kind.storage_type
        while (
            pa.types.is_list(kind)
            or pa.types.is_fixed_size_list(kind)
            or (pa.types.is_large_list(kind))
        ):
            kind = kind.value_type
        return pa.types.is_floating(kind)

    return [field.name for field in schema if not floating(field.type)]


def writable_schema(schema: pa.Schema, where: str = "the dataset") -> pa.Schema:
    """The schema a writer stores for ``schema``: its ``pandas`` metadata pruned to what is
    still true (:func:`~feedline.arrow.pandas_metadata.valid_pandas_schema`), after checking that
    Parquet can store every column (:func:`~feedline.arrow.parquet_types.check_storable`).

    The types are kept as they are: where Parquet stores another (``timestamp[s]`` as
    ``timestamp[ms]``…), the manifest records the type written and readers cast back.

    Examples
    --------
    >>> writable_schema(pa.schema({"t": pa.timestamp("s")})).types
    [TimestampType(timestamp[s])]
    """
    check_unique(
        schema.names,
        f"The schema of {where}",
        "rename or drop the repeated columns before writing (ds.rename, ds.drop, ds.select).",
    )
    check_storable(schema, where)
    return valid_pandas_schema(schema)


def conform(
    batch: pa.RecordBatch, schema: pa.Schema, reference: str = "the plan's schema"
) -> pa.RecordBatch:
    """Cast ``batch`` to ``schema`` (same column names) or raise :class:`SchemaError`.

    ``reference`` names where ``schema`` came from, for the message. The result carries
    ``schema``'s metadata (writers pass a :func:`writable_schema`).

    Examples
    --------
    >>> b = pa.record_batch({"x": pa.array([1], pa.int32())})
    >>> conform(b, pa.schema({"x": pa.int64()})).schema.types
    [DataType(int64)]
    """
    if batch.schema.names != schema.names:
        raise SchemaError(
            f"Batches with different columns reached the writer: {batch.schema.names}, while "
            f"{reference} has {schema.names}. Fix: make every map_batches call return the same "
            "columns."
        )
    if batch.schema.equals(schema, check_metadata=False):
        return batch.replace_schema_metadata(schema.metadata)
    try:
        cast = batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaError(
            f"A batch with schema {batch.schema} cannot be written with {reference} "
            f"{schema}: {exc}. Fix: return consistent types from map_batches."
        ) from exc
    for name, before, after in zip(schema.names, batch.columns, cast.columns, strict=True):
        value = overflowed(before, after)
        if value is not None:
            raise DataError(
                f"A batch reached the writer with the column {name!r} of type "
                f"{before.type} holding {value!r}, which {reference}'s type {after.type} "
                "cannot hold (it would become an infinity). Fix: return consistent types from "
                "map_batches (or cast to a wider type first)."
            )
    return cast


def _footer_digest(tail: bytes, name: str) -> str:
    """The footer digest of a shard from the bytes its writer's ``close()`` wrote."""
    data = b"PAR1" + tail  # as if the file held nothing but its footer
    block = read_footer_block(lambda at, n: data[at : at + n], len(data), name)
    return footer_digest(block)


def file_checksum(location: Location) -> tuple[int, str]:
    """Size and ``"sha256:<hex>"`` checksum of a stored file, read in 8 MiB chunks.

    The same checksum the shard writer computes while writing, for files written by others
    (Spark's and Ray's writers) and for verification.
    """
    digest = hashlib.sha256()
    size = 0
    check_regular(location, what="the shard", error=IntegrityError)  # never a FIFO or device
    with location.fs.open(location.path, "rb") as handle:
        while chunk := handle.read(_CHECKSUM_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, "sha256:" + digest.hexdigest()


def _page_rows(schema: pa.Schema) -> int:
    """Rows per page check of the Parquet writer: pages of about :data:`PAGE_BYTES` for the
    widest fixed-size binary column (a stored tensor), pyarrow's 1,024 for narrow ones.

    Examples
    --------
    >>> _page_rows(pa.schema({"x": pa.binary(12288), "y": pa.int64()}))
    86
    >>> _page_rows(pa.schema({"y": pa.int64()}))
    1024
    """
    widths = [f.type.byte_width for f in schema if pa.types.is_fixed_size_binary(f.type)]
    return max(1, min(1024, -(-PAGE_BYTES // max(widths, default=1))))
