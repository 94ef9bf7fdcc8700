"""TFRecord framing: records, their masked CRC32C checksums, and GZIP/ZLIB streams.

A TFRecord file is a sequence of records, each::

    uint64 length (little-endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

where ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32). The whole file
may be GZIP or ZLIB compressed. :func:`iter_blocks` reads a file in large chunks and yields
:class:`Block` s: one buffer plus the byte ranges of the verified records inside it, so the
Example decoder works on offsets into one ``bytes`` object without copying records.

A record's length is a claim of the file, checked before anything is allocated for it: it
may not exceed :data:`MAX_RECORD_BYTES` (protobuf's limit for one message: no
``tf.train.Example`` is larger) nor, in an uncompressed file, the bytes left in the file; a
record of a compressed stream is read a chunk at a time, so memory follows the bytes that
are really there, and compressed streams are inflated a bounded piece at a time. A length
that fails these checks is a bad record (raised, or skipped and counted), like a length whose
CRC does not match; the reader then scans for the next valid header (vectorized: the masked
CRC32C of every 8-byte window of a chunk at once, :func:`next_header`).

CRC32C comes from the ``crc32c`` package (hardware SSE4.2/ARMv8 CRC with a software
fallback, LGPL-2.1+, used unmodified as a dependency). It was chosen over ``google-crc32c``
(Apache-2.0) by measurement: both checksum ~20 GB/s on large buffers, but ``crc32c`` takes a
``memoryview`` slice of the read chunk, while ``google-crc32c`` needs ``bytes`` (a copy of
every record); in this module's framing loop that made ``crc32c`` 15% faster on 100k small
records (0.116 against 0.137 s CPU) and 13% on 12 KiB image records. Switching is a change
of :func:`_crc_function` (plus ``bytes(...)`` around its argument).

Examples
--------
>>> frame(b"abc")[:12].hex()
'0300000000000000b099490e'
>>> masked_crc(b"abc") == int.from_bytes(frame(b"abc")[-4:], "little")
True
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import numpy as np

from feedline.errors import ConfigurationError, DataError, MissingDependencyError
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location

__all__ = [
    "MAX_RECORD_BYTES",
    "Block",
    "Compression",
    "crc32c",
    "frame",
    "iter_blocks",
    "masked_crc",
    "next_header",
    "open_records",
]

Compression = Literal["GZIP", "ZLIB", "auto"] | None
#: the longest record read: protobuf's limit for one message (2 GiB - 1), so no
#: ``tf.train.Example`` is longer; a longer claimed length is a damaged or hostile header
MAX_RECORD_BYTES = 2**31 - 1
_CHUNK = 8 << 20
#: the most bytes one read (or one inflate step) asks of a stream
_PIECE = 8 << 20
#: header positions tested at once by :func:`next_header`
_SCAN_WINDOW = 1 << 20
_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


def _crc_function() -> Callable[[Any], int]:
    try:
        import crc32c as _crc32c
    except ImportError as exc:  # pragma: no cover - the extra is installed in dev
        raise MissingDependencyError("crc32c", "tfrecord", "Reading or writing TFRecords") from exc
    return _crc32c.crc32c


def crc32c(data: Any) -> int:
    """The CRC32C of a bytes-like object (``bytes``, ``memoryview``).

    Examples
    --------
    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    return _crc_function()(data)


def _masked(crcs: list[int]) -> np.ndarray:
    c = np.asarray(crcs, np.uint64)
    return (((c >> np.uint64(15)) | (c << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(
        0xFFFFFFFF
    )


def _u32_at(a: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return a[pos[:, None] + np.arange(4)].view("<u4").ravel().astype(np.uint64)


def _crc_table() -> np.ndarray:
    """The byte-at-a-time table of CRC32C (reflected Castagnoli polynomial 0x82F63B78)."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc_table()


def next_header(buf: bytes, start: int, end: int) -> int:
    """The first position ``>= start`` where a record header with a valid length CRC begins
    in ``buf[:end]``; ``max(start, end - 11)`` when there is none (those last 11 bytes may
    begin a header completed by the next chunk).

    The masked CRC32C of every 8-byte window is computed at once with NumPy (a table lookup
    per byte position), so scanning a damaged region costs a few NumPy passes, not a Python
    step per byte.

    Examples
    --------
    >>> data = b"garbage!" + frame(b"abc")
    >>> next_header(data, 0, len(data))
    8
    """
    a = np.frombuffer(buf, np.uint8, count=end)
    last = end - 12  # the last position a whole header fits at
    pos = start
    while pos <= last:
        n = min(_SCAN_WINDOW, last - pos + 1)
        crc = np.full(n, 0xFFFFFFFF, np.uint32)
        for k in range(8):
            crc = _TABLE[(crc ^ a[pos + k : pos + k + n]) & 0xFF] ^ (crc >> np.uint32(8))
        crc ^= np.uint32(0xFFFFFFFF)
        masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
        stored = a[pos + 8 : pos + 8 + n].astype(np.uint32)
        for k in (1, 2, 3):
            stored |= a[pos + 8 + k : pos + 8 + k + n].astype(np.uint32) << np.uint32(8 * k)
        hits = np.flatnonzero(masked == stored)
        if hits.size:
            return pos + int(hits[0])
        pos += n
    return max(start, end - 11)


def masked_crc(data: Any) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One framed record: length, masked CRC of the length, ``data``, masked CRC of ``data``."""
    length = struct.pack("<Q", len(data))
    return b"".join((length, _CRC.pack(masked_crc(length)), data, _CRC.pack(masked_crc(data))))


@dataclass(frozen=True)
class Block:
    """Verified records inside one buffer.

    Attributes
    ----------
    buffer:
        The bytes holding the records.
    starts, stops:
        Byte range of each record's data inside ``buffer``.
    numbers, offsets:
        Each record's number in its file (from 0) and the file offset of its header
        (in the decompressed stream when the file is compressed).
    """

    buffer: bytes
    starts: list[int]
    stops: list[int]
    numbers: list[int]
    offsets: list[int]


class _ZlibReader:
    """A ``read(n)`` view of a ZLIB-compressed stream, inflating at most ``n`` bytes a call
    (a small stream of zeros may inflate to gigabytes: never all at once)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._inflate = zlib.decompressobj()
        self._pending = b""

    def read(self, n: int) -> bytes:
        out = [self._pending[:n]]
        self._pending = self._pending[n:]
        size = len(out[0])
        while size < n and not self._inflate.eof:
            data = self._inflate.unconsumed_tail or self._raw.read(_PIECE)
            if data:
                piece = self._inflate.decompress(data, n - size)
            else:  # the input is used up: what zlib still holds, then the end marker
                piece = self._inflate.flush()
                self._pending = piece[n - size :]
                piece = piece[: n - size]
                if not piece and not self._inflate.eof:
                    raise EOFError("the ZLIB stream ended before its end marker")
            out.append(piece)
            size += len(piece)
        return b"".join(out)

    def close(self) -> None:
        """Nothing to release: the raw handle is closed by its owner."""


def _sniff(head: bytes) -> str | None:
    """The compression of a file starting with ``head`` (``None``: a plain TFRecord file)."""
    if len(head) >= 12:
        length = head[:8]
        if masked_crc(length) == _CRC.unpack_from(head, 8)[0]:
            return None
    if head[:2] == b"\x1f\x8b":
        return "GZIP"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "ZLIB"
    return None


def resolve_compression(loc: Location, compression: Compression) -> str | None:
    """``"GZIP"``, ``"ZLIB"`` or ``None`` for ``loc`` (``"auto"`` looks at the first bytes)."""
    if compression in (None, ""):  # "" too: an empty setting means none
        return None
    text = str(compression).upper()
    if text in ("GZIP", "ZLIB"):
        return text
    if text != "AUTO":
        raise ConfigurationError(
            f"compression={compression!r} is not valid for TFRecords. Fix: use None, 'GZIP', "
            "'ZLIB' or 'auto'."
        )
    with loc.fs.open(loc.path, "rb") as handle:
        return _sniff(handle.read(12))


def open_records(loc: Location, compression: str | None) -> tuple[Any, Any]:
    """``(raw handle, reader with read(n))`` for the decompressed stream of ``loc``."""
    raw = loc.fs.open(loc.path, "rb")
    if compression == "GZIP":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "ZLIB":
        return raw, _ZlibReader(raw)
    return raw, raw


def _file_size(loc: Location) -> int | None:
    """The size of the file at ``loc`` (``None`` when the filesystem cannot say)."""
    try:
        size = loc.fs.size(loc.path)
    except (OSError, ValueError, NotImplementedError):
        return None
    return int(size) if isinstance(size, int) else None


def _read_up_to(stream: Any, need: int) -> bytes:
    """Up to ``need`` bytes of ``stream``, asked for a bounded piece at a time, so a large
    ``need`` costs memory only for the bytes the stream really holds."""
    if need <= _PIECE:
        return stream.read(need)
    parts: list[bytes] = []
    got = 0
    while got < need:
        part = stream.read(min(need - got, _PIECE))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def iter_blocks(
    loc: Location,
    compression: str | None,
    on_error: str,
    report: ExecutionReport,
    chunk_bytes: int = _CHUNK,
) -> Iterator[Block]:
    """Blocks of verified records of the file at ``loc``.

    A record whose data CRC does not match raises :class:`DataError` naming the file, the
    byte offset and the record number, or with ``on_error="skip"`` is counted in ``report``
    and left out. A corrupt length (its CRC does not match), or a length longer than
    :data:`MAX_RECORD_BYTES` or than what is left of an uncompressed file, is skipped by
    scanning forward to the next valid header; a truncated last record or compressed stream
    is skipped or raised likewise. Nothing is allocated for a length before it is checked.
    """
    raw, stream = open_records(loc, compression)
    where = f"{loc.url!r}" + (f" ({compression}-compressed)" if compression else "")
    size = None if compression else _file_size(loc)

    def bad(offset: int, number: int, reason: str) -> None:
        if on_error == "raise":
            raise DataError(
                f"TFRecord file {where}: record {number} at byte offset {offset} {reason}. "
                "Fix: rewrite the file, or pass on_error='skip' to drop bad records (they are "
                "counted in the execution report)."
            )
        report.record_skip(f"{loc.url}@{offset} (record {number})", reason)

    crc = _crc_function()
    buf = b""
    base = 0  # file offset of buf[0]
    number = 0
    resync_from: int | None = None  # offset of a corrupt header while scanning for the next
    need = chunk_bytes
    eof = False
    try:
        while not eof:
            try:
                chunk = _read_up_to(stream, need)
            except (EOFError, OSError, zlib.error) as exc:
                chunk, eof = b"", True
                if resync_from is None:
                    bad(base + len(buf), number, f"lies in a damaged compressed stream ({exc})")
                    number += 1
                buf = b""
            if not chunk:
                eof = True
            buf += chunk
            report.add(bytes_read=len(chunk))
            view = memoryview(buf)
            pos, end = 0, len(buf)
            starts: list[int] = []
            stops: list[int] = []
            numbers: list[int] = []
            offsets: list[int] = []
            need = chunk_bytes
            if resync_from is None:  # fast path: walk the lengths, check all CRCs at once
                pos, number = _fast(buf, view, end, base, number, crc, bad,
                                    (starts, stops, numbers, offsets))  # fmt: skip
            while pos + 12 <= end:
                length, length_crc = _HEADER.unpack_from(buf, pos)
                wrong: str | None = "has a corrupt length (CRC mismatch)"
                if masked_crc(view[pos : pos + 8]) == length_crc:
                    wrong = _implausible(length, size, base + pos)
                if wrong is not None:
                    if resync_from is None:
                        resync_from = base + pos
                        bad(resync_from, number, wrong)
                        number += 1
                    pos = next_header(buf, pos + 1, end)
                    continue
                stop = pos + 12 + length
                if stop + 4 > end:
                    need = max(chunk_bytes, stop + 4 - end)
                    break
                if resync_from is not None:
                    resync_from = None
                if masked_crc(view[pos + 12 : stop]) != _CRC.unpack_from(buf, stop)[0]:
                    bad(base + pos, number, "has corrupt data (CRC mismatch)")
                else:
                    starts.append(pos + 12)
                    stops.append(stop)
                    numbers.append(number)
                    offsets.append(base + pos)
                number += 1
                pos = stop + 4
            view.release()
            if starts:
                yield Block(buf, starts, stops, numbers, offsets)
            base += pos
            buf = buf[pos:]
        if buf and resync_from is None:
            bad(base, number, f"is truncated ({len(buf)} bytes at the end of the file)")
    finally:
        if stream is not raw:
            stream.close()
        raw.close()


def _implausible(length: int, size: int | None, offset: int) -> str | None:
    """Why a record length (whose CRC is valid) cannot be true, or ``None``."""
    if length > MAX_RECORD_BYTES:
        return (
            f"has a record length of {length:,} bytes, more than the {MAX_RECORD_BYTES:,} a "
            "tf.train.Example can hold (its header is damaged or forged)"
        )
    if size is not None and offset + 16 + length > size:
        left = max(size - offset - 12, 0)
        return (
            f"is truncated: its record length claims {length:,} bytes, but only {left:,} "
            "bytes follow its header in the file"
        )
    return None


def _fast(buf: bytes, view: memoryview, end: int, base: int, number: int,
          crc: Callable[[Any], int], bad: Callable[[int, int, str], None],
          out: tuple[list[int], ...]) -> tuple[int, int]:  # fmt: skip
    """Walk the records of ``buf`` trusting their lengths, then check every CRC with NumPy.

    Stops before the first record whose length CRC fails (the careful loop takes over
    there) and returns ``(position, next record number)``."""
    heads: list[int] = []
    ends: list[int] = []
    head_crcs: list[int] = []
    data_crcs: list[int] = []
    unpack = _LENGTH.unpack_from
    pos = 0
    while pos + 12 <= end:
        stop = pos + 12 + unpack(buf, pos)[0]
        if stop + 4 > end:
            break
        heads.append(pos)
        ends.append(stop)
        head_crcs.append(crc(view[pos : pos + 8]))
        data_crcs.append(crc(view[pos + 12 : stop]))
        pos = stop + 4
    if not heads:
        return 0, number
    a = np.frombuffer(buf, np.uint8)
    at = np.asarray(heads, np.int64)
    stop_at = np.asarray(ends, np.int64)
    header_bad = np.flatnonzero(_masked(head_crcs) != _u32_at(a, at + 8))
    count = int(header_bad[0]) if header_bad.size else len(heads)
    good = _masked(data_crcs[:count]) == _u32_at(a, stop_at[:count])
    for i in np.flatnonzero(~good).tolist():
        bad(base + heads[i], number + i, "has corrupt data (CRC mismatch)")
    kept = np.flatnonzero(good)
    starts, stops, numbers, offsets = out
    starts.extend((at[kept] + 12).tolist())
    stops.extend(stop_at[kept].tolist())
    numbers.extend((kept + number).tolist())
    offsets.extend((at[kept] + base).tolist())
    return (heads[count] if count < len(heads) else pos), number + count
