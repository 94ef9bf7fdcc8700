"""What the training loader reads: shards and their row groups, or a stream of batches.

The loader never sees a :class:`~feedline.dataset.dataset.Dataset`, a reader or an engine
(DESIGN.md, "the seam"). A written dataset or a plain Parquet folder reaches it as a
:class:`ShardSource`: its files, the rows of every row group, each file's manifest entry
(size, sha256, footer digest; taken from the footers for plain Parquet, without checksums),
the schema and the dataset's fingerprint. Anything else (a computed plan) reaches it as a
:class:`BatchStream`: a schema, the row count when metadata tells it, and a factory of
record batches.

What hands the loader one or the other is any object with a public
``shard_source(columns=None)`` method (:class:`SupportsShardSource`, a structural protocol:
``Dataset.shard_source()`` is one); a path is opened with :func:`open_shard_source`.

Examples
--------
>>> import feedline as fl, tempfile
>>> out = tempfile.mkdtemp() + "/ds"
>>> _ = fl.range(10).write(out, rows_per_shard=6, row_group_rows=3)
>>> source = open_shard_source(out)
>>> source.row_group_sizes, source.num_rows, source.has_checksums
([3, 3, 3, 1], 10, True)
>>> source.read_table(["id"])["id"].to_pylist()[:4]
[0, 1, 2, 3]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from feedline.arrow.tensor_codec import decode_batch
from feedline.errors import DataError, IntegrityError
from feedline.io.parquet import ParquetSource
from feedline.io.source import check_columns
from feedline.io.storage.local_files import regular_size
from feedline.io.storage.paths import Location
from feedline.store.dataset_files import open_source, plain_parquet_shards
from feedline.store.footers import Footer, check_footer, footer_of_handle, was_checked
from feedline.store.manifest import ShardInfo
from feedline.store.stored_files import check_regular

__all__ = [
    "READ_BATCH_ROWS",
    "READ_BUFFER",
    "BatchStream",
    "ShardSource",
    "SupportsShardSource",
    "open_shard_source",
]

#: rows decoded at a time when the caller names no other
READ_BATCH_ROWS = 32 * 1024
#: bytes read from a file at a time (row groups are not pre-buffered whole)
READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class ShardSource:
    """Parquet shards and their row groups: the loader's unit of reading.

    Global row group ``g`` is the ``g``-th in file order; it holds rows ``starts[g] :
    starts[g] + sizes[g]`` of the dataset (see :meth:`locate`).

    Attributes
    ----------
    files:
        The shards, in dataset order.
    groups:
        Rows of each row group, per file.
    arrow_schema:
        The columns as the dataset defines them (tensor columns typed as written); also
        :meth:`schema`.
    shards:
        Per file: its manifest entry (size, sha256, footer digest, row groups), or for a plain
        Parquet folder the same read from its footer (no checksums: ``has_checksums`` is
        ``False``). Every read checks the file's footer against it.
    fingerprint:
        The dataset's fingerprint (from its shards' checksums), ``None`` without a manifest.
    storage_options:
        The options the files were opened with (``None``: the defaults).
    dataset, version:
        A feedline dataset's URL and the version these shards are (``None`` otherwise):
        what a loader's checkpoint records, and :meth:`at_version` reopens.
    stored_schema:
        A feedline dataset's schema as its manifest states it (every column, whatever
        :meth:`select` keeps): each shard's footer is checked against it before the shard's
        first read in the process (a dataset of many shards is opened without reading its
        footers: ``feedline.store.dataset_files.EAGER_FOOTER_SHARDS``).
    """

    files: tuple[Location, ...]
    groups: tuple[tuple[int, ...], ...]
    arrow_schema: pa.Schema
    shards: tuple[ShardInfo, ...] = ()
    fingerprint: str | None = None
    storage_options: dict[str, Any] | None = field(default=None, compare=False)
    has_checksums: bool = False
    description: str = ""
    dataset: str | None = field(default=None, compare=False)
    version: int | None = None
    stored_schema: pa.Schema | None = field(default=None, compare=False)

    @classmethod
    def from_source(
        cls, source: ParquetSource, columns: Sequence[str] | None = None
    ) -> ShardSource:
        """The shards of a feedline dataset's or a Parquet folder's ``source``.

        A feedline dataset's row groups, sizes and checksums come from its manifest; a plain
        Parquet folder's from the files' footers. ``columns`` narrows the schema.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.range(4).write(out, row_group_rows=3)
        >>> ShardSource.from_source(fl.open(out).plan.source).groups
        ((3, 1),)
        """
        files = tuple(source.files)
        manifest = getattr(source, "manifest", None)
        if manifest is not None:
            shards, fingerprint = tuple(manifest.shards), source.fingerprint()
        else:
            shards, fingerprint = tuple(plain_parquet_shards(files)), None
        target = getattr(source, "target", None)
        made = cls(
            files, tuple(tuple(s.row_groups) for s in shards), source.schema(), shards,
            fingerprint, has_checksums=manifest is not None, description=source.describe(),
            dataset=None if manifest is None or target is None else target.url,
            version=None if manifest is None else manifest.version_id,
            stored_schema=None if manifest is None else manifest.schema,
        )  # fmt: skip
        return made if columns is None else made.select(columns)

    def at_version(self, version: int) -> ShardSource:
        """The same dataset's shards at ``version`` (these columns), while it is retained;
        a vacuumed version raises :class:`~feedline.errors.ConfigurationError`.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.range(5).write(out)
        >>> _ = fl.range(2).write(out, mode="append")
        >>> source = open_shard_source(out)
        >>> source.version, source.num_rows, source.at_version(1).num_rows
        (2, 7, 5)
        """
        if self.dataset is None or version == self.version:
            return self
        source = open_source(self.dataset, storage_options=self.storage_options, version=version)
        made = replace(ShardSource.from_source(source), storage_options=self.storage_options)
        return made.select(self.arrow_schema.names)

    def schema(self) -> pa.Schema:
        """The dataset's schema (as ``Dataset.schema()``)."""
        return self.arrow_schema

    @property
    def row_group_sizes(self) -> list[int]:
        """Rows of every row group, file after file."""
        return [n for per_file in self.groups for n in per_file]

    @property
    def num_rows(self) -> int:
        """Rows of the whole dataset."""
        return int(sum(self.row_group_sizes))

    @property
    def sizes(self) -> tuple[int, ...]:
        """Bytes of every file (from the manifest, or from storage for plain Parquet)."""
        return tuple(s.bytes for s in self.shards)

    @property
    def checksums(self) -> tuple[str, ...]:
        """``sha256:<hex>`` of every file (``""`` for plain Parquet files)."""
        return tuple(s.checksum for s in self.shards)

    def select(self, columns: Sequence[str]) -> ShardSource:
        """The same shards with only ``columns`` in the schema.

        Examples
        --------
        >>> import feedline as fl, tempfile, pyarrow as pa
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.from_arrow(pa.table({"a": [1], "b": [2]})).write(out)
        >>> open_shard_source(out).select(["b"]).schema().names
        ['b']
        """
        schema = self.arrow_schema
        check_columns(schema, columns, f"the dataset {self.description or 'shards'}")
        fields = [schema.field(c) for c in columns]
        return replace(self, arrow_schema=pa.schema(fields, schema.metadata))

    def locate(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per global row group: its file index, its index inside the file, its first row."""
        file_of = np.repeat(np.arange(len(self.groups)), [len(g) for g in self.groups])
        local = np.concatenate([np.arange(len(g)) for g in self.groups] or [np.zeros(0, int)])
        sizes = np.asarray(self.row_group_sizes, dtype=np.int64)
        return file_of.astype(np.int64), local.astype(np.int64), np.cumsum(sizes) - sizes

    def iter_read(
        self,
        file: int,
        groups: Sequence[int],
        columns: Sequence[str],
        rows: int | None = None,
        *,
        path: str | None = None,
        opened: tuple[int, Footer] | None = None,
    ) -> Generator[pa.RecordBatch, None, None]:
        """Row groups ``groups`` (indices inside file ``file``) as batches of up to ``rows``.

        Read from a buffered stream, a piece at a time (the memory a read needs beyond its
        output stays small); the footer is checked against the file's entry in
        :attr:`shards` and page checksums are verified. Tensor columns stored as fixed-size
        binary come back typed as written (no copy). ``path`` reads a local copy of the file
        instead (a shard cache's). ``opened`` is that file already open, as ``(descriptor,
        footer)``, its footer checked against its entry by the caller (see
        :class:`feedline.loader.data.file_footers.FileFooters`): read through the descriptor, the
        footer is not read again. Raises :class:`DataError` naming the shard when the file is
        missing or unreadable.
        """
        loc = self.files[file]
        reopen = _reopen_path(opened[0]) if opened is not None else None
        try:
            with self._open(file, reopen or path) as handle:
                metadata = None
                if opened is not None and reopen is not None:  # the very file checked
                    metadata = opened[1].metadata
                elif self.shards:
                    where = f"{loc.url!r}"
                    shard = self.shards[file]
                    footer = footer_of_handle(handle, where, shard)
                    if not was_checked(shard, self.stored_schema, footer.digest):
                        check_footer(footer, shard, where, self.stored_schema)
                    metadata = footer.metadata
                parquet = pq.ParquetFile(
                    handle, metadata=metadata, pre_buffer=False, buffer_size=READ_BUFFER,
                    page_checksum_verification=True,
                )  # fmt: skip
                for batch in parquet.iter_batches(
                    batch_size=rows or READ_BATCH_ROWS, row_groups=list(groups),
                    columns=list(columns), use_threads=False,
                ):  # fmt: skip
                    yield decode_batch(batch, self.arrow_schema)
        except (OSError, pa.ArrowException) as exc:
            cached = " (its cached copy)" if path is not None else ""
            raise DataError(
                f"Cannot read row group(s) {list(groups)} of shard {loc.url!r}{cached}: {exc}. "
                "The shard was removed, truncated or replaced after the dataset was opened. Fix: "
                "restore it (fl.verify(path) checks every shard) or re-run the write."
            ) from exc

    def _open(self, file: int, path: str | None) -> Any:
        # a local file is checked to be a regular file before pyarrow opens it (a FIFO
        # planted as a shard, or as its cached copy, would block the reader forever)
        if path is not None:
            regular_size(path, what="the cached copy of a shard", error=IntegrityError)
            return pafs.LocalFileSystem().open_input_file(path)
        loc = self.files[file]
        check_regular(loc, what="the shard", error=IntegrityError)
        return loc.arrow_filesystem().open_input_file(loc.path)

    def read(self, file: int, groups: Sequence[int], columns: Sequence[str]) -> pa.Table:
        """Row groups ``groups`` of file ``file`` as one table."""
        batches = list(self.iter_read(file, groups, columns))
        if not batches:
            return self.arrow_schema.empty_table().select(list(columns))
        return pa.Table.from_batches(batches)

    def iter_batches(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Every row of ``columns`` (default: all), file after file.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.range(3).write(out)
        >>> sum(b.num_rows for b in open_shard_source(out).iter_batches())
        3
        """
        names = list(self.arrow_schema.names) if columns is None else list(columns)
        for f, per_file in enumerate(self.groups):
            if per_file:
                yield from self.iter_read(f, range(len(per_file)), names)

    def read_table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """``columns`` (default: all) of the whole dataset as one table."""
        names = list(self.arrow_schema.names) if columns is None else list(columns)
        batches = list(self.iter_batches(names))
        if not batches:
            return self.arrow_schema.empty_table().select(names)
        return pa.Table.from_batches(batches)

    def __repr__(self) -> str:
        return f"ShardSource({self.description or len(self.files)!r}, rows={self.num_rows})"


@dataclass(frozen=True)
class BatchStream:
    """Rows that only running a plan produces: a schema, a row count if known, batches.

    ``arrow_schema`` (also :meth:`schema`) describes the rows; ``batches(columns)`` returns
    a fresh iterator over the record batches of ``columns`` (``None``: all); ``num_rows`` is
    ``None`` when only running the plan tells.

    Examples
    --------
    >>> import pyarrow as pa
    >>> table = pa.table({"x": [1, 2, 3]})
    >>> stream = BatchStream(table.schema, 3, lambda cols: iter(table.select(cols or ["x"])
    ...                                                          .to_batches()))
    >>> stream.read_table(["x"])["x"].to_pylist(), stream.fingerprint
    ([1, 2, 3], None)
    """

    arrow_schema: pa.Schema
    num_rows: int | None
    batches: Callable[[Sequence[str] | None], Iterator[pa.RecordBatch]] = field(compare=False)
    description: str = "a computed dataset"
    fingerprint: str | None = None
    #: the pinned snapshot of the versioned table (Delta, Iceberg, Lance) the rows are read
    #: from, ``{"kind", "table", "snapshot"}`` (``Source.table_snapshot``); ``None`` otherwise
    snapshot: dict[str, str] | None = field(default=None, compare=False)

    @classmethod
    def from_table(cls, table: pa.Table, description: str = "an Arrow table") -> BatchStream:
        """The rows of an in-memory ``table`` (its row count known).

        Examples
        --------
        >>> stream = BatchStream.from_table(pa.table({"x": [1, 2], "y": [3, 4]}))
        >>> stream.num_rows, stream.read_table(["y"])["y"].to_pylist()
        (2, [3, 4])
        """

        def batches(columns: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
            return iter((table if columns is None else table.select(list(columns))).to_batches())

        return cls(table.schema, table.num_rows, batches, description)

    def schema(self) -> pa.Schema:
        """The rows' schema (as ``Dataset.schema()``)."""
        return self.arrow_schema

    def iter_batches(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """A fresh iterator over the batches of ``columns`` (default: all)."""
        return self.batches(None if columns is None else list(columns))

    def read_table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """``columns`` (default: all) of every row as one table."""
        names = list(self.arrow_schema.names) if columns is None else list(columns)
        batches = list(self.iter_batches(names))
        if not batches:
            return self.arrow_schema.empty_table().select(names)
        return pa.Table.from_batches(batches).select(names)

    def __repr__(self) -> str:
        return f"BatchStream({self.description}, rows={self.num_rows})"


@runtime_checkable
class SupportsShardSource(Protocol):
    """What the loader takes besides a path, a :class:`ShardSource` or a :class:`BatchStream`:
    anything with a ``shard_source(columns=None)`` method that gives one of those two.

    A structural protocol: an object needs the method, not a base class (``Dataset`` has it;
    so can a reader of another format). ``columns`` narrows the source to those columns
    (``None``: all). ``isinstance(obj, SupportsShardSource)`` checks that the method exists.

    Examples
    --------
    >>> import pyarrow as pa
    >>> class Table:
    ...     def __init__(self, table):
    ...         self.table = table
    ...     def shard_source(self, columns=None):
    ...         return BatchStream.from_table(self.table.select(columns or self.table.schema.names))
    >>> held = Table(pa.table({"x": [1, 2, 3]}))
    >>> isinstance(held, SupportsShardSource), held.shard_source().num_rows
    (True, 3)
    """

    def shard_source(self, columns: Sequence[str] | None = None) -> ShardSource | BatchStream:
        """The shards (or the stream of batches) of ``columns`` (``None``: every column)."""
        ...


def open_shard_source(
    path: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    *,
    verify: bool = False,
) -> ShardSource:
    """The shards at ``path``: a feedline dataset (manifest) or a plain Parquet folder.

    A feedline dataset's shard footers are checked against its manifest (``verify=True``:
    every shard's sha256 too), as ``fl.open`` does.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(5).write(out)
    >>> open_shard_source(out).num_rows
    5
    """
    source = open_source(path, verify=verify, storage_options=storage_options)
    return replace(ShardSource.from_source(source), storage_options=storage_options)


def _reopen_path(fd: int) -> str | None:
    """A path that opens the very file ``fd`` has open (``/dev/fd/N`` on Linux and macOS),
    even after its name was given to another file; ``None`` where there is none.

    Examples
    --------
    >>> import tempfile
    >>> fd, name = tempfile.mkstemp()
    >>> _reopen_path(fd) in (f"/dev/fd/{fd}", None)
    True
    >>> os.close(fd); os.remove(name)
    """
    path = f"/dev/fd/{fd}"
    return path if os.path.exists(path) else None
