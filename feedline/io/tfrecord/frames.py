"""TFRecord framing: records, their masked CRC32C checksums, and GZIP/ZLIB streams.

A TFRecord file is a sequence of records, each::

    uint64 length (little-endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

where ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32). The whole file
may be GZIP or ZLIB compressed. :func:`iter_blocks` reads a file in large chunks and yields
:class:`Block` s: one buffer plus the byte ranges of the verified records inside it, so the
Example decoder works on offsets into one ``bytes`` object without copying records.

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
    "Block",
    "Compression",
    "crc32c",
    "frame",
    "iter_blocks",
    "masked_crc",
    "open_records",
]

Compression = Literal["GZIP", "ZLIB", "auto"] | None
_CHUNK = 8 << 20
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
    """A ``read(n)`` view of a ZLIB-compressed stream."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._inflate = zlib.decompressobj()
        self._pending = b""

    def read(self, n: int) -> bytes:
        out = [self._pending]
        size = len(self._pending)
        while size < n and not self._inflate.eof:
            data = self._raw.read(_CHUNK)
            piece = self._inflate.decompress(data) if data else self._inflate.flush()
            if not data and not piece and not self._inflate.eof:
                raise EOFError("the ZLIB stream ended before its end marker")
            out.append(piece)
            size += len(piece)
        joined = b"".join(out)
        self._pending = joined[n:]
        return joined[:n]

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
    and left out. A corrupt length (its CRC does not match) is skipped by scanning forward
    to the next valid header; a truncated last record or compressed stream is skipped or
    raised likewise.
    """
    raw, stream = open_records(loc, compression)
    where = f"{loc.url!r}" + (f" ({compression}-compressed)" if compression else "")

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
                chunk = stream.read(need)
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
                if masked_crc(view[pos : pos + 8]) != length_crc:
                    if resync_from is None:
                        resync_from = base + pos
                        bad(resync_from, number, "has a corrupt length (CRC mismatch)")
                        number += 1
                    pos += 1
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
