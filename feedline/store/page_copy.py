"""Fixed-width Parquet column chunks copied straight into an array, page checksums checked.

A fixed-shape tensor column written by feedline is stored as ``fixed_size_binary``, PLAIN
encoded; when compression does not pay it is also uncompressed (random-looking pixels, say).
Then every data page is a header, the definition levels and the rows' bytes, exactly as the
loader's cache holds them. Decoding such a column through pyarrow costs two copies (file into
Arrow buffers, Arrow buffers into the cache) and pyarrow's page CRC-32. Here the rows' bytes
are read with ``preadv`` straight into their place in the destination array and the CRC-32
of every page is computed over the bytes where they landed (ISA-L's ``crc32`` from the
``isal`` package when installed, about 30 GB/s here; else ``zlib.crc32``, 3.5 GB/s; both
release the GIL, so reader threads run them in parallel): one copy, every byte checked where
it lies.

Only the plain case takes this path (:func:`chunk_copy` says whether a column chunk is one):
a flat column (no repetition levels) of a fixed width (``FIXED_LEN_BYTE_ARRAY``, ``INT32``,
``INT64``, ``FLOAT``, ``DOUBLE``), uncompressed, without a dictionary page. Every page must
be a data page (v1 or v2) in PLAIN encoding with a CRC-32, hold no null, and the pages must
add up to exactly the chunk's bytes and rows as the footer gives them; :func:`copy_chunk`
returns ``False`` at the first page that is not so (the caller then reads the chunk through
pyarrow, which raises if the file is damaged). A page whose CRC-32 does not match raises
:class:`~feedline.errors.DataError` naming the page. Page headers are decoded with a small
reader of Thrift's compact protocol (:func:`read_struct`), the only encoding Parquet uses.

Examples
--------
>>> import numpy as np, pyarrow as pa, pyarrow.parquet as pq, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.parquet")
>>> pq.write_table(pa.table({"x": np.arange(5.0)}), path, compression="none",
...                use_dictionary=False, write_page_checksum=True)
>>> chunk = chunk_copy(pq.ParquetFile(path).metadata, 0, "x", 8)
>>> out = np.empty(5)
>>> fd = os.open(path, os.O_RDONLY)
>>> copy_chunk(fd, chunk, memoryview(out).cast("B"), "x.parquet"), out.tolist()
(True, [0.0, 1.0, 2.0, 3.0, 4.0])
>>> os.close(fd)
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from feedline.errors import DataError

try:  # ISA-L's CRC-32 (the ``isal`` package): about 30 GB/s here against zlib's 3.5
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the same function, slower
    from zlib import crc32

__all__ = [
    "ChunkCopy",
    "PageCopy",
    "chunk_copy",
    "chunk_pages",
    "copy_chunk",
    "copy_page",
    "read_struct",
]

#: bytes of a column chunk read (and checksummed) at a time
PIECE = 4 << 20
#: bytes read first for a page header (a longer one is read again, up to :data:`MAX_HEADER`)
HEADER_PROBE = 256
MAX_HEADER = 1 << 20
_WIDTHS = {"INT32": 4, "INT64": 8, "FLOAT": 4, "DOUBLE": 8}
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
_PLAIN, _RLE = 0, 3


@dataclass(frozen=True)
class ChunkCopy:
    """A column chunk that :func:`copy_chunk` can copy: where its pages lie and their rows."""

    #: file offset of the first page and bytes of all pages (headers included)
    offset: int
    size: int
    rows: int
    #: bytes per value
    width: int
    #: 1 for an optional column (definition levels present, all must be 1), else 0
    max_def: int
    #: the column and row group, for error messages
    column: str
    group: int


def chunk_copy(metadata: pq.FileMetaData, group: int, column: str, width: int) -> ChunkCopy | None:
    """How to copy top-level column ``column`` of row group ``group``, values of ``width``
    bytes; ``None`` unless the chunk is flat, fixed-width, PLAIN and uncompressed.

    Examples
    --------
    >>> import pyarrow as pa, pyarrow.parquet as pq, io
    >>> buf = io.BytesIO()
    >>> pq.write_table(pa.table({"x": [1.0, 2.0]}), buf)  # snappy, dictionary: not a copy
    >>> chunk_copy(pq.ParquetFile(buf).metadata, 0, "x", 8) is None
    True
    """
    schema = metadata.schema
    for j in range(metadata.num_columns):
        desc = schema.column(j)
        if desc.path == column:
            break
    else:
        return None
    stored = desc.length if desc.physical_type == "FIXED_LEN_BYTE_ARRAY" else None
    stored = _WIDTHS.get(desc.physical_type, stored)
    if stored != width or desc.max_repetition_level != 0 or desc.max_definition_level > 1:
        return None
    chunk = metadata.row_group(group).column(j)
    if chunk.compression != "UNCOMPRESSED" or chunk.has_dictionary_page:
        return None
    rows = metadata.row_group(group).num_rows
    return ChunkCopy(
        int(chunk.data_page_offset), int(chunk.total_compressed_size), int(rows), int(width),
        int(desc.max_definition_level), column, group,
    )  # fmt: skip


def copy_chunk(fd: int, chunk: ChunkCopy, dest: memoryview, where: str) -> bool:
    """Copy ``chunk``'s values from the open file ``fd`` into ``dest`` (``rows * width``
    contiguous bytes), checking every page's CRC-32 over the bytes in ``dest``.

    Returns ``False`` (``dest`` partly written) when a page is not one this path copies;
    raises :class:`DataError` when a page's checksum does not match.
    """
    if dest.nbytes != chunk.rows * chunk.width:
        return False
    pages = chunk_pages(fd, chunk)
    if pages is None:
        return False
    return all(copy_page(fd, chunk, page, dest, where) for page in pages)


@dataclass(frozen=True)
class PageCopy:
    """One data page of a :class:`ChunkCopy`: where its values lie, its rows, its CRC-32."""

    #: the page's number in its column chunk, for error messages
    index: int
    #: file offset of the page's first value byte
    offset: int
    #: first row (of the column chunk) and rows
    row: int
    rows: int
    #: the CRC-32 from the page header, and the bytes it covers before the values (levels)
    crc: int
    levels: bytes


def chunk_pages(fd: int, chunk: ChunkCopy) -> list[PageCopy] | None:
    """The pages of ``chunk`` (their headers read from ``fd``), or ``None`` unless every page
    is one :func:`copy_page` copies and together they hold exactly the chunk's rows."""
    pos, end, row = chunk.offset, chunk.offset + chunk.size, 0
    pages: list[PageCopy] = []
    while pos < end:
        parsed = _page(fd, pos, end)
        if parsed is None:
            return None
        body, size, crc, values, levels = parsed
        region = _levels(fd, body, size, levels, values, chunk.max_def)
        if region is None or size - len(region) != values * chunk.width:
            return None
        if row + values > chunk.rows:
            return None
        pages.append(PageCopy(len(pages), body + len(region), row, values, crc & 0xFFFFFFFF,
                              region))  # fmt: skip
        pos, row = body + size, row + values
    return pages if pos == end and row == chunk.rows else None


def copy_page(fd: int, chunk: ChunkCopy, page: PageCopy, dest: memoryview, where: str) -> bool:
    """Copy ``page`` (of ``chunk``) into its rows of ``dest`` (the chunk's ``rows * width``
    bytes) and check its CRC-32 over the bytes where they landed.

    Returns ``False`` when the file ends first; raises :class:`DataError` when the checksum
    does not match.
    """
    width = chunk.width
    out = dest[page.row * width : (page.row + page.rows) * width]
    check = _read_into(fd, out, page.offset, crc32(page.levels))
    if check is None:
        return False
    if check != page.crc:
        raise DataError(
            f"Page {page.index} of column {chunk.column!r} in row group {chunk.group} of shard "
            f"{where} fails its CRC-32 check (rows {page.row}..{page.row + page.rows - 1} of "
            "that row group): the file is damaged. Fix: restore the shard (fl.verify(path) "
            "checks every shard) or re-run the write."
        )
    return True


def _page(fd: int, pos: int, end: int) -> tuple[int, int, int, int, Any] | None:
    """``(body offset, body size, crc, values, levels)`` of the page at ``pos``, or ``None``.

    ``levels`` is ``None`` for a v1 page (length-prefixed levels), else the v2 page's
    definition levels' byte length.
    """
    probe = HEADER_PROBE
    while True:
        head = os.pread(fd, min(probe, end - pos), pos)
        try:
            header, used = read_struct(head, 0)
            break
        except IndexError:  # the header is longer than the bytes read
            if len(head) < probe or probe >= MAX_HEADER:
                return None
            probe *= 16
        except (ValueError, RecursionError):
            return None
    kind, size, crc = header.get(1), header.get(3), header.get(4)
    if crc is None or not isinstance(size, int) or size < 0 or header.get(2) != size:
        return None
    if pos + used + size > end:
        return None
    if kind == _DATA_PAGE and isinstance(header.get(5), dict):
        info = header[5]
        if info.get(2) != _PLAIN or info.get(3, _RLE) != _RLE:
            return None
        return pos + used, size, crc, info.get(1, -1), None
    if kind == _DATA_PAGE_V2 and isinstance(header.get(8), dict):
        info = header[8]
        if info.get(4) != _PLAIN or info.get(2) != 0 or info.get(6, 0) != 0:
            return None
        return pos + used, size, crc, info.get(1, -1), info.get(5, 0)
    return None


def _levels(
    fd: int, body: int, size: int, levels: int | None, values: int, max_def: int
) -> bytes | None:
    """The page's definition-level bytes (v1: with their length), or ``None`` unless every
    value is present."""
    if values < 0:
        return None
    if max_def == 0:
        return b"" if not levels else None
    if levels is None:  # v1: a 4-byte length, then the levels
        if size < 4:
            return None
        (length,) = struct.unpack("<I", os.pread(fd, 4, body))
        region = os.pread(fd, 4 + length, body) if 4 + length <= size else b""
        encoded = region[4:]
    else:
        region = encoded = os.pread(fd, levels, body) if levels <= size else b""
    try:
        present = len(region) > 0 and all_present(encoded, values)
    except (IndexError, ValueError):  # levels cut short or malformed
        return None
    return region if present else None


def all_present(levels: bytes, count: int) -> bool:
    """Whether RLE/bit-packed definition levels of bit width 1 hold ``count`` ones.

    Examples
    --------
    >>> all_present(bytes([10, 1]), 5), all_present(bytes([10, 0]), 5)  # a run of 5
    (True, False)
    >>> all_present(bytes([3, 0b00011111]), 5), all_present(bytes([3, 0b00011011]), 5)
    (True, False)
    """
    i = seen = 0
    while seen < count:
        header, i = _varint(levels, i)
        if header & 1:  # bit-packed groups of 8 values, one byte each at bit width 1
            groups = header >> 1
            n = min(groups * 8, count - seen)
            if groups == 0 or i + groups > len(levels):
                return False
            bits = np.unpackbits(np.frombuffer(levels, np.uint8, groups, i), bitorder="little")
            if not bits[:n].all():
                return False
            i, seen = i + groups, seen + n
        else:  # a run of one value, in one byte at bit width 1
            run = header >> 1
            if run == 0 or i >= len(levels) or levels[i] != 1:
                return False
            i, seen = i + 1, seen + run
    return seen == count


def _read_into(fd: int, out: memoryview, offset: int, check: int) -> int | None:
    """Read ``out.nbytes`` bytes at ``offset`` into ``out``; their CRC-32 continuing
    ``check``, or ``None`` when the file ends first."""
    done, total = 0, out.nbytes
    while done < total:
        piece = out[done : min(total, done + PIECE)]
        got = os.preadv(fd, [piece], offset + done)
        if got <= 0:
            return None
        check = crc32(piece[:got], check)
        done += got
    return check


# ------------------------------------------------------------------ Thrift compact protocol


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def read_struct(data: bytes, i: int) -> tuple[dict[int, Any], int]:
    """A Thrift compact-protocol struct at ``data[i:]``: ``({field id: value}, next index)``.

    Integers come back as ints, binaries as bytes, structs as dicts, lists as lists; maps and
    doubles are skipped. Raises ``IndexError`` when ``data`` ends inside the struct.

    Examples
    --------
    >>> read_struct(bytes([0x15, 0x04, 0x18, 0x02, 0x61, 0x62, 0x00]), 0)  # {1: 2, 2: b"ab"}
    ({1: 2, 2: b'ab'}, 7)
    """
    out: dict[int, Any] = {}
    field = 0
    while True:
        head = data[i]
        i += 1
        if head == 0:
            return out, i
        kind, delta = head & 0x0F, head >> 4
        if delta:
            field += delta
        else:
            raw, i = _varint(data, i)
            field = _zigzag(raw)
        out[field], i = _value(data, i, kind)


def _value(data: bytes, i: int, kind: int) -> tuple[Any, int]:
    if kind in (1, 2):  # booleans live in the field header
        return kind == 1, i
    if kind == 3:
        return data[i], i + 1
    if kind in (4, 5, 6):
        raw, i = _varint(data, i)
        return _zigzag(raw), i
    if kind == 7:
        if i + 8 > len(data):
            raise IndexError("double cut off")
        return None, i + 8
    if kind == 8:
        n, i = _varint(data, i)
        if i + n > len(data):
            raise IndexError("binary cut off")
        return bytes(data[i : i + n]), i + n
    if kind in (9, 10):
        head = data[i]
        i += 1
        n, element = head >> 4, head & 0x0F
        if n == 15:
            n, i = _varint(data, i)
        items = []
        for _ in range(n):
            if element in (1, 2):  # a boolean element is one byte
                items.append(data[i] == 1)
                i += 1
            else:
                item, i = _value(data, i, element)
                items.append(item)
        return items, i
    if kind == 11:
        n, i = _varint(data, i)
        if n:
            types = data[i]
            i += 1
            for _ in range(n):
                _, i = _value(data, i, types >> 4)
                _, i = _value(data, i, types & 0x0F)
        return None, i
    if kind == 12:
        return read_struct(data, i)
    raise ValueError(f"unknown Thrift compact type {kind}")
