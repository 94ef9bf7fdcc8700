"""Parquet footers of feedline shards: read once, hashed, checked against the manifest.

A Parquet file ends with its footer: the Thrift ``FileMetaData`` (row groups, where every
page is, the schema), its 4-byte length and the magic ``PAR1``. Page checksums (CRC-32,
written by every feedline writer and verified on every read) cover the pages but not the
footer, and a whole file swapped for another passes them too. So the writer records the
sha256 of the footer bytes in the manifest (``ShardInfo.footer``), and whenever feedline
reads a shard's footer it checks, before anything is allocated from it:

- the file's size against the manifest's ``bytes``;
- the footer's sha256 against ``footer`` (when recorded: older datasets have none);
- the footer's row count and row-group sizes against ``rows`` and ``row_groups``;
- (when asked) its Arrow schema against the manifest's, as the readers compare them.

A footer is a few KiB read with one ranged read; hashing and parsing it takes tens of
microseconds, so this runs on every open and every read (``bench/read_write.py`` measures
it). A check of the whole file's sha256 is :func:`feedline.store.dataset_files.verify`'s job.

Every read of a shard reads its footer block anyway (:func:`check_identity`, or the loader's
:meth:`~feedline.store.shard_source.ShardSource.iter_read`), so the full check (rows, row
groups, schema) can ride on that read instead of an extra one on open: the first read of a
shard in a process checks everything, and the footer blocks that passed are remembered by
digest (:func:`mark_checked`, :func:`was_checked`), so later reads only compare the digest.
A dataset of many shards is opened that way (``feedline.store.dataset_files.open_source``):
each rank pays for the footers of the shards it reads, when it reads them, not for all of
them on open.

A footer without a recorded digest (a plain Parquet file, an older dataset) has its column
chunks' compression codecs checked to be ones Parquet defines before pyarrow reads a chunk
(:func:`check_codecs`, in :func:`check_footer`, once per distinct footer): pyarrow (26 here)
aborts the whole process (``std::terminate``, "Unsupported compression codec value") when a
damaged footer's codec is read, which no ``try`` can catch. A recorded digest refuses any
damaged footer first; without one this check refuses it with a :class:`DataError`. It walks
the Thrift structure in Python: about 0.1 ms per column chunk (0.7 s for a footer of 1,000
row groups of 5 columns), once per footer and process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from feedline.arrow.parquet_types import same_stored_schema
from feedline.errors import DataError, IntegrityError, SchemaError
from feedline.io.storage.local_files import open_regular
from feedline.io.storage.paths import Location
from feedline.store.manifest import ShardInfo
from feedline.store.page_copy import read_struct

__all__ = [
    "FOOTER_PROBE",
    "Footer",
    "check_codecs",
    "check_footer",
    "check_identity",
    "footer_digest",
    "footer_of",
    "footer_of_handle",
    "mark_checked",
    "parse_footer",
    "read_footer_block",
    "shard_footer",
    "was_checked",
]

#: bytes read from the end of a file at first; a longer footer costs a second read
FOOTER_PROBE = 64 << 10
_MAGIC = b"PAR1"
_RESTORE = "Fix: restore the shard (fl.verify(path) checks every one) or re-run the write."
#: Parquet's CompressionCodec values (UNCOMPRESSED, SNAPPY, GZIP, LZO, BROTLI, LZ4, ZSTD,
#: LZ4_RAW)
_CODECS = range(8)
#: digests of footers whose codecs were checked (a few thousand: a set per process)
_CHECKED: set[str] = set()
_CHECKED_MAX = 4096
#: (manifest entry, schema or None, footer digest) of the footers fully checked in this
#: process (:func:`mark_checked`); cleared when it reaches :data:`_PASSED_MAX` entries
_PASSED: set[tuple[ShardInfo, pa.Schema | None, str]] = set()
_PASSED_MAX = 1 << 20


def mark_checked(shard: ShardInfo, schema: pa.Schema | None, digest: str) -> None:
    """Remember that the footer block of digest ``digest`` passed :func:`check_footer` against
    ``shard`` (and ``schema``): a later read of that same block needs no parse.

    Examples
    --------
    >>> shard = ShardInfo("p.parquet", 1, 20, (1,), "")
    >>> mark_checked(shard, None, "sha256:" + "0" * 64)
    >>> was_checked(shard, None, "sha256:" + "0" * 64), was_checked(shard, None, "other")
    (True, False)
    """
    if len(_PASSED) >= _PASSED_MAX:
        _PASSED.clear()
    _PASSED.add((shard, schema, digest))
    _PASSED.add((shard, None, digest))  # checked with a schema: checked without one too


def was_checked(shard: ShardInfo, schema: pa.Schema | None, digest: str) -> bool:
    """Whether a footer block of digest ``digest`` passed :func:`check_footer` against
    ``shard`` and ``schema`` in this process (see :func:`mark_checked`)."""
    return (shard, schema, digest) in _PASSED


def check_codecs(block: bytes, where: str, digest: str | None = None) -> None:
    """Refuse a footer block (see :func:`read_footer_block`) with a column chunk whose
    compression codec Parquet does not define (a damaged footer: pyarrow would abort the
    process reading it). Walks the Thrift ``FileMetaData`` (row groups -> column chunks ->
    ``meta_data.codec``); ``digest`` (the block's :func:`footer_digest`) skips a footer
    checked before.

    Examples
    --------
    >>> import io
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), sink)
    >>> data = sink.getvalue()
    >>> block = read_footer_block(lambda at, n: data[at : at + n], len(data), "x")
    >>> check_codecs(block, "x")  # snappy: fine
    >>> damaged = bytes([0x49, 0x1C, 0x19, 0x1C, 0x3C, 0x45, 0xC6, 0x01, 0, 0, 0, 0])
    >>> check_codecs(damaged + bytes(4) + b"PAR1", "x")  # row group 0, chunk 0: codec 99
    Traceback (most recent call last):
    ...
    feedline.errors.DataError: The Parquet footer of x is damaged: a column chunk's ...
    """
    if digest is not None and digest in _CHECKED:
        return
    try:
        meta, _ = read_struct(block[:-8], 0)
        groups = meta.get(4)
        for group in groups if isinstance(groups, list) else ():
            chunks = group.get(1) if isinstance(group, dict) else None
            for chunk in chunks if isinstance(chunks, list) else ():
                info = chunk.get(3) if isinstance(chunk, dict) else None
                codec = info.get(4) if isinstance(info, dict) else None
                if codec is not None and codec not in _CODECS:
                    raise DataError(
                        f"The Parquet footer of {where} is damaged: a column chunk's compression "
                        f"codec is {codec}, which Parquet does not define. {_RESTORE}"
                    )
    except (IndexError, ValueError, RecursionError) as exc:
        raise DataError(
            f"Cannot parse the Parquet footer of {where}: {exc!r}. It is damaged or not "
            f"Parquet. {_RESTORE}"
        ) from exc
    if digest is not None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED.add(digest)


def footer_digest(block: bytes) -> str:
    """``"sha256:<hex>"`` of a footer block (metadata, its length and ``PAR1``).

    Examples
    --------
    >>> footer_digest(b"")[:15]
    'sha256:e3b0c442'
    """
    return "sha256:" + hashlib.sha256(block).hexdigest()


def read_footer_block(read_at: Callable[[int, int], bytes], size: int, where: str) -> bytes:
    """The footer block of a file of ``size`` bytes; ``read_at(offset, n)`` reads its bytes.

    Raises :class:`DataError` naming ``where`` when the file is no Parquet file or its
    footer claims more bytes than the file has.

    Examples
    --------
    >>> data = b"PAR1" + b"meta" + (4).to_bytes(4, "little") + b"PAR1"
    >>> read_footer_block(lambda at, n: data[at : at + n], len(data), "x.parquet")
    b'meta\\x04\\x00\\x00\\x00PAR1'
    """
    if size < 12:
        raise DataError(
            f"{where} is {size} bytes, too short for a Parquet file. It is truncated or not "
            f"Parquet. {_RESTORE}"
        )
    probe = min(size, FOOTER_PROBE)
    tail = bytes(read_at(size - probe, probe))
    if len(tail) != probe or tail[-4:] != _MAGIC:
        raise DataError(
            f"{where} does not end with the Parquet magic bytes: it is truncated, damaged or "
            f"not Parquet. {_RESTORE}"
        )
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise DataError(
            f"The Parquet footer of {where} claims {length} bytes; the file has {size}. It is "
            f"damaged or truncated. {_RESTORE}"
        )
    need = length + 8
    if need > len(tail):
        tail = bytes(read_at(size - need, need))
        if len(tail) != need:
            raise DataError(f"{where} ended while its Parquet footer was read. {_RESTORE}")
    return tail[-need:]


@dataclass(frozen=True)
class Footer:
    """A parsed Parquet footer: the file's size, the footer's digest and its metadata."""

    size: int
    digest: str
    parsed: pq.ParquetFile
    #: the footer's bytes (for :func:`check_codecs`)
    block: bytes = field(default=b"", repr=False)

    @property
    def metadata(self) -> pq.FileMetaData:
        return self.parsed.metadata

    @cached_property
    def schema(self) -> pa.Schema:
        """The Arrow schema pyarrow reads from the file (``ARROW:schema`` applied)."""
        return self.parsed.schema_arrow

    @property
    def row_groups(self) -> tuple[int, ...]:
        meta = self.metadata
        return tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))


def parse_footer(block: bytes, size: int, where: str) -> Footer:
    """Parse a footer block (see :func:`read_footer_block`) of a file of ``size`` bytes.

    Examples
    --------
    >>> import io
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), sink)
    >>> data = sink.getvalue()
    >>> block = read_footer_block(lambda at, n: data[at : at + n], len(data), "x")
    >>> footer = parse_footer(block, len(data), "x")
    >>> footer.metadata.num_rows, footer.row_groups, footer.schema.names
    (3, (3,), ['x'])
    """
    digest = footer_digest(block)
    try:
        parsed = pq.ParquetFile(pa.BufferReader(_MAGIC + block))
        parsed.metadata.num_rows  # noqa: B018 - parsed here, so damage is reported here
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataError(
            f"Cannot parse the Parquet footer of {where}: {str(exc)[:300]}. It is damaged or "
            f"not Parquet. {_RESTORE}"
        ) from exc
    return Footer(size, digest, parsed, block)


def footer_of(location: Location, shard: ShardInfo | None = None) -> Footer:
    """The footer of a stored file, read through fsspec with one ranged read (two at most).

    With ``shard`` (its manifest entry), a file of another size raises
    :class:`IntegrityError` before its footer is read. ``FileNotFoundError`` passes
    through; other failures raise :class:`DataError`.
    """
    size, block = _footer_block_of(location, shard)
    return parse_footer(block, size, repr(location.url))


def _footer_block_of(location: Location, shard: ShardInfo | None) -> tuple[int, bytes]:
    where = repr(location.url)
    try:
        with _open_shard(location) as handle:
            handle.seek(0, 2)
            size = handle.tell()
            if shard is not None:
                _check_size(size, shard, where)

            def read_at(offset: int, n: int) -> bytes:
                handle.seek(offset)
                return handle.read(n)

            block = read_footer_block(read_at, size, where)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise DataError(f"Cannot read the Parquet footer of {where}: {exc}. {_RESTORE}") from exc
    return size, block


def _open_shard(location: Location) -> Any:
    """``location`` open for reading; on local disk only a regular file (a FIFO planted as a
    shard would block forever): anything else is an :class:`IntegrityError`."""
    if location.is_local:
        return open_regular(location.path, what="the shard", error=IntegrityError)
    return location.fs.open(location.path, "rb")


def footer_of_handle(handle: pa.NativeFile, where: str, shard: ShardInfo | None = None) -> Footer:
    """The footer of a file open as a pyarrow ``NativeFile`` (random access); ``shard`` as
    in :func:`footer_of`."""
    size = handle.size()
    if shard is not None:
        _check_size(size, shard, where)
    block = read_footer_block(lambda offset, n: handle.read_at(n, offset), size, where)
    return parse_footer(block, size, where)


def check_footer(
    footer: Footer, shard: ShardInfo, where: str, schema: pa.Schema | None = None
) -> None:
    """Raise unless ``footer`` is the one ``shard`` (a manifest entry) describes.

    :class:`IntegrityError` for another size, footer digest, row count or row-group layout;
    :class:`SchemaError` when ``schema`` is given and the file's differs from it;
    :class:`DataError` for an undefined codec in a footer without a recorded digest.
    """
    _check_size(footer.size, shard, where)
    if shard.footer and footer.digest != shard.footer:
        raise IntegrityError(f"{_swapped(where, footer.digest, shard.footer)} {_RESTORE}")
    if not shard.footer and footer.block:  # nothing recorded: pyarrow must not abort on it
        check_codecs(footer.block, where, footer.digest)
    groups = footer.row_groups
    if footer.metadata.num_rows != shard.rows or groups != tuple(shard.row_groups):
        raise IntegrityError(
            f"The shard {where} holds {footer.metadata.num_rows} rows in row groups of "
            f"{_sizes(groups)}; the manifest says {shard.rows} rows in "
            f"{_sizes(shard.row_groups)}. It was replaced or the manifest is damaged. {_RESTORE}"
        )
    if schema is not None and not same_stored_schema(footer.schema, schema):
        raise SchemaError(
            f"The shard {where} has the schema {_fields(footer.schema)}; the manifest says "
            f"{_fields(schema)}. The shard was replaced or the manifest is damaged. {_RESTORE}"
        )
    mark_checked(shard, schema, footer.digest)


def shard_footer(location: Location, shard: ShardInfo, schema: pa.Schema | None = None) -> Footer:
    """Read the footer of ``shard`` at ``location`` and :func:`check_footer` it.

    A missing shard raises :class:`IntegrityError`.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(5).write(out)
    >>> shard = fl.open(out).manifest.shards[0]
    >>> shard_footer(resolve(out).child(shard.path), shard).metadata.num_rows
    5
    """
    try:
        footer = footer_of(location, shard)
    except FileNotFoundError:
        raise IntegrityError(
            f"The shard {location.url!r} named by the manifest is missing. {_RESTORE}"
        ) from None
    check_footer(footer, shard, repr(location.url), schema)
    return footer


def check_identity(location: Location, shard: ShardInfo, schema: pa.Schema | None = None) -> None:
    """Check that the file at ``location`` is the one ``shard`` describes, before it is read:
    its size and footer digest (one ranged read). A footer block not yet checked in this
    process against ``shard`` (and ``schema``) is parsed and fully checked
    (:func:`check_footer`: rows, row groups, schema) from that same read, so a dataset opened
    without reading its footers gets the same checks as one that read them on open.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(5).write(out)
    >>> shard = fl.open(out).manifest.shards[0]
    >>> check_identity(resolve(out).child(shard.path), shard)
    """
    try:
        size, block = _footer_block_of(location, shard)
    except FileNotFoundError:
        raise IntegrityError(
            f"The shard {location.url!r} named by the manifest is missing. {_RESTORE}"
        ) from None
    where, digest = repr(location.url), footer_digest(block)
    if shard.footer and digest != shard.footer:
        raise IntegrityError(f"{_swapped(where, digest, shard.footer)} {_RESTORE}")
    if not was_checked(shard, schema, digest):
        check_footer(parse_footer(block, size, where), shard, where, schema)


def _swapped(where: str, digest: str, expected: str) -> str:
    return (
        f"The Parquet footer of the shard {where} is not the one the manifest recorded "
        f"(sha256 {digest[7:19]}..., expected {expected[7:19]}...): the shard was replaced "
        "by another file or its footer is damaged."
    )


def _check_size(size: int, shard: ShardInfo, where: str) -> None:
    if size != shard.bytes:
        raise IntegrityError(
            f"The shard {where} is {size} bytes; the manifest says {shard.bytes}. It was "
            f"truncated, extended or replaced. {_RESTORE}"
        )


def _sizes(groups: tuple[int, ...]) -> str:
    text = str(list(groups))
    return text if len(text) <= 80 else text[:77] + "...]"


def _fields(schema: pa.Schema) -> str:
    text = "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"
    return text if len(text) <= 300 else text[:297] + "...}"
