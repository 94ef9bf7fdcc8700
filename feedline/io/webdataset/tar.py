"""Streaming the members of a WebDataset tar shard and grouping them into samples.

The tar is walked one 512-byte header at a time over a forward stream (any fsspec file;
``.tar.gz`` / ``.tgz`` shards are decompressed by :mod:`gzip` on the way, so byte offsets in
messages are offsets in the uncompressed tar). Each header is parsed by the standard
library's :meth:`tarfile.TarInfo.fromtarfile` (checksum, ustar/pax/GNU extensions) through a
small cursor, so feedline decides what is read, and how much:

- a member's data is read only when its field is wanted, after its claimed size was checked
  against ``max_member_bytes`` and, in an uncompressed shard, against the bytes the file still
  holds; extended (pax, GNU long-name) headers are read only up to 1 MiB. A claim never
  chooses an allocation;
- damage is never taken for the end of the archive (:mod:`tarfile`, and so WebDataset,
  stops quietly at a bad header, losing the rest of the shard), and never ends the reading
  either: after a corrupt header the walk **resynchronises** on the next 512-byte block that
  is a valid ustar header (in a seekable shard it first tries the block the damaged header's
  own size points at), and reports the damage as a :class:`Damage` event in the member stream;
- a zero block followed by data (a zeroed header, or archives joined end to end) is damage,
  not the end; a shard that ends without its end-of-archive block was cut short; a gzip
  stream is read to its end so that its CRC is checked.

:func:`iter_samples` groups members into samples as WebDataset does (``tariterators``): only
regular files count; names like ``__meta__`` are skipped; the key is the member path up to
the first dot of its basename and the rest, lower-cased, is the field; consecutive members
with the same key form one sample. Damage marks the samples it may have cut as ``lost`` and
nothing else: the damaged member's own sample when its key is known for sure; otherwise the
sample in progress and the first sample after the damage (either may miss a member).

Tar has no checksum over member data: a flipped byte inside a member's data reads as that
byte (as with any tar reader). A member whose data is itself a tar archive could, after a
corrupt header just before it, be mistaken for members during the resynchronisation scan.
"""

from __future__ import annotations

import gzip
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = [
    "MAX_MEMBER_BYTES",
    "Damage",
    "Member",
    "Sample",
    "check_gzip",
    "iter_members",
    "iter_samples",
    "split_name",
]

#: the default bound on one member's bytes (``max_member_bytes=`` of ``fl.read_webdataset``)
MAX_MEMBER_BYTES = 1 << 30
#: the most an extended header (pax records, a GNU long name) may hold
_MAX_HEADER_BYTES = 1 << 20
_BLOCK = tarfile.BLOCKSIZE
_CHUNK = 1 << 20  # a multiple of _BLOCK
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
_GZIP_MAGIC = b"\x1f\x8b"
_USTAR = b"ustar"
# tarfile's field parsers (module functions its own TarInfo uses; absent from typeshed)
_nti: Callable[[bytes], int] = tarfile.nti  # type: ignore[attr-defined]
_nts: Callable[[bytes, str, str], str] = tarfile.nts  # type: ignore[attr-defined]
_chksums: Callable[[bytes], tuple[int, int]] = tarfile.calc_chksums  # type: ignore[attr-defined]
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)
# what tarfile's header parsing raises on damaged bytes (its HeaderError family, and plain
# exceptions from pax and GNU sparse records it parses without checks)
_HEADER_ERRORS = (
    tarfile.HeaderError,
    ValueError,
    IndexError,
    KeyError,
    OverflowError,
    RecursionError,
)


@dataclass(frozen=True)
class Damage:
    """A damaged stretch of the shard, as the member stream reports it.

    ``offset``: where it was found (byte offset in the uncompressed tar); ``resumed``: where
    reading went on (``None``: nothing after it could be read); ``key``: the sample the
    damaged member belongs to when that is known for sure (its header is intact, or the
    damaged header's name could be trusted), else ``None``; ``member``: that member's name
    when known; ``fix``: a specific fix for the message (else the generic one).
    """

    reason: str
    offset: int
    resumed: int | None = None
    key: str | None = None
    member: str | None = None
    fix: str | None = None


@dataclass(frozen=True)
class Member:
    """A regular file of the shard: its name, header offset and bytes (``None`` if unread)."""

    name: str
    offset: int
    data: bytes | None


@dataclass
class Sample:
    """Consecutive members sharing a key: ``fields`` maps field name → member."""

    key: str
    fields: dict[str, Member] = field(default_factory=dict)
    #: the first duplicated field, if a field appeared twice (WebDataset refuses those)
    duplicate: Member | None = None
    #: the damage that may have cut this sample (it is dropped, never returned)
    lost: Damage | None = None


def split_name(name: str) -> tuple[str, str] | None:
    """(key, field) of a member name, or ``None`` when the basename has no extension.

    Examples
    --------
    >>> split_name("a/b.c/000123.Seg.PNG")
    ('a/b.c/000123', 'seg.png')
    >>> split_name("README") is None
    True
    """
    match = _KEY_EXT.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def _key(name: str) -> str | None:
    parts = split_name(name)
    return parts[0] if parts is not None else None


def _is_meta(name: str) -> bool:
    """True for WebDataset's metadata members (``__meta__``, ``__index__/...``)."""
    top = "/" not in name and name.startswith("__") and name.endswith("__")
    return top or _META.match(name) is not None


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


# ---------------------------------------------------------------------------- the byte stream


class _TarStream:
    """The uncompressed tar bytes, read forward, with the position and a pushback buffer.

    An uncompressed shard whose size is known can also seek (to skip data, or to go back to
    the block after a damaged header); a gzip stream is only read forward.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        head = raw.read(2)
        raw.seek(0)
        self.compressed = head == _GZIP_MAGIC
        self.size: int | None = None
        self._file: IO[bytes]
        if self.compressed:
            self._file = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        else:
            self._file = raw
            try:
                self.size = raw.seek(0, os.SEEK_END)
                raw.seek(0)
            except (OSError, ValueError):
                self.size = None
        self.pos = 0
        self._pending = b""

    def left(self) -> int | None:
        """Bytes left in an uncompressed shard (``None`` when not known)."""
        return None if self.size is None else self.size - self.pos

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end), read in bounded chunks."""
        if n <= 0:
            return b""
        parts = []
        if self._pending:
            parts.append(self._pending[:n])
            self._pending = self._pending[n:]
        got = len(parts[0]) if parts else 0
        while got < n:
            chunk = self._file.read(min(n - got, _CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.pos += len(data)
        return data

    def unread(self, data: bytes) -> None:
        """Push ``data`` (just read) back: the next read returns it first."""
        self._pending = data + self._pending
        self.pos -= len(data)

    def skip(self, n: int) -> int:
        """Move ``n`` bytes forward (seeking when possible); returns how far it got."""
        if n <= 0:
            return 0
        if self.size is None:
            moved = 0
            while moved < n:
                step = len(self.read(min(n - moved, _CHUNK)))
                if not step:
                    break
                moved += step
            return moved
        target = min(self.pos + n, self.size)
        moved = target - self.pos
        self.seek(target)
        return moved

    def seek(self, pos: int) -> None:
        """Go to ``pos`` (an uncompressed shard of known size only)."""
        self._file.seek(pos)
        self._pending, self.pos = b"", pos


class _HeaderReads:
    """The file object :meth:`tarfile.TarInfo.fromtarfile` reads headers through (capped)."""

    def __init__(self, stream: _TarStream) -> None:
        self.stream = stream

    def read(self, n: int) -> bytes:
        if n > _MAX_HEADER_BYTES:
            raise tarfile.HeaderError(f"an extended header claims {n:,} bytes")
        return self.stream.read(n)

    def tell(self) -> int:
        return self.stream.pos


class _Cursor:
    """The four attributes of a ``TarFile`` that ``TarInfo.fromtarfile`` uses."""

    def __init__(self, stream: _TarStream) -> None:
        self.fileobj = _HeaderReads(stream)
        self.offset = 0
        self.pax_headers: dict[str, str] = {}
        self.encoding = "utf-8"
        self.errors = "replace"


def _valid_header(block: bytes) -> bool:
    """True when ``block`` is a ustar header with a correct checksum (resync candidates)."""
    if len(block) != _BLOCK or block[257:262] != _USTAR:
        return False
    try:
        stored = _nti(block[148:156])
    except tarfile.HeaderError:
        return False
    return stored in _chksums(block)


def _scan(stream: _TarStream) -> int | None:
    """Find the next valid header at or after the stream's position; leave the stream there."""
    while True:
        base = stream.pos
        chunk = stream.read(_CHUNK)
        for at in range(0, len(chunk) - _BLOCK + 1, _BLOCK):
            if chunk[at + 257 : at + 262] == _USTAR and _valid_header(chunk[at : at + _BLOCK]):
                stream.unread(chunk[at:])
                return base + at
        if len(chunk) < _CHUNK:
            return None


def _resync(stream: _TarStream, start: int, block: bytes) -> int | None:
    """Resume after the damaged header at ``start``: where reading goes on, or ``None``."""
    if stream.size is not None:
        try:
            size = _nti(block[124:136])
        except tarfile.HeaderError:
            size = -1
        target = start + _BLOCK + _padded(size) if size >= 0 else -1
        if start < target <= stream.size - _BLOCK:  # first: where its own size points
            stream.seek(target)
            candidate = stream.read(_BLOCK)
            if _valid_header(candidate):
                stream.unread(candidate)
                return target
        stream.seek(start + _BLOCK)
    return _scan(stream)


def _trusted_key(block: bytes, start: int, resumed: int | None) -> str | None:
    """The key a damaged header names, when that name can be trusted.

    Only when its checksum field itself is what is damaged (it does not parse as a number:
    a single damaged byte there leaves the name intact), it is a ustar regular-file header,
    and its size points exactly at the header where reading resumed (so it is the one member
    lost). Otherwise ``None``: the member's sample is unknown.
    """
    if resumed is None or len(block) != _BLOCK or block[257:262] != _USTAR:
        return None
    if block[156:157] not in (b"0", b"\0"):
        return None
    try:
        _nti(block[148:156])
        return None  # a readable checksum that does not match: any byte may be the bad one
    except tarfile.HeaderError:
        pass
    try:
        size = _nti(block[124:136])
        name = _nts(block[0:100], "utf-8", "strict")
        prefix = _nts(block[345:500], "utf-8", "strict")
    except (tarfile.HeaderError, UnicodeDecodeError):
        return None
    if size < 0 or start + _BLOCK + _padded(size) != resumed:
        return None
    return _key(f"{prefix}/{name}" if prefix else name)


def check_gzip(raw: IO[bytes]) -> str | None:
    """Read a gzip shard to its end: ``None`` when its CRC checks (or it is not gzip), else why.

    Under ``on_error="skip"`` a ``.tar.gz`` shard is checked whole before any of its samples
    is returned: gzip cannot say where damage starts, so values read before a CRC failure
    could be wrong. ``raw`` is left at its start.

    Examples
    --------
    >>> import gzip, io
    >>> check_gzip(io.BytesIO(gzip.compress(b"tar bytes"))) is None
    True
    >>> check_gzip(io.BytesIO(gzip.compress(b"tar bytes")[:-6]))
    'the gzip stream is damaged or cut short (...)'
    """
    head = raw.read(2)
    raw.seek(0)
    if head != _GZIP_MAGIC:
        return None
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            while stream.read(_CHUNK):
                pass
    except _GZIP_ERRORS as exc:
        return f"the gzip stream is damaged or cut short ({exc or type(exc).__name__})"
    finally:
        raw.seek(0)
    return None


# ---------------------------------------------------------------------------- members


def iter_members(
    raw: IO[bytes],
    wanted: Callable[[str], bool],
    *,
    max_member_bytes: int = MAX_MEMBER_BYTES,
) -> Iterator[Member | Damage]:
    """The regular files of the tar in ``raw`` (data read only for names ``wanted``), with a
    :class:`Damage` event wherever the shard is damaged (reading goes on after it when it can).

    A wanted member claiming more than ``max_member_bytes`` is reported as damage (its key is
    known; its data is skipped, never read).
    """
    stream = _TarStream(raw)
    cursor = _Cursor(stream)
    seen = False  # any valid header yet (else damage at byte 0 means "not a tar")
    start, reading = 0, None  # the header being read; the member whose data is being read
    try:
        while True:
            start, reading = stream.pos, None
            block = stream.read(_BLOCK)
            stream.unread(block)
            try:
                info = tarfile.TarInfo.fromtarfile(cursor)  # type: ignore[arg-type]
                if info.size < 0 or cursor.offset <= start:
                    raise tarfile.HeaderError("a negative size or offset")
            except tarfile.EOFHeaderError:  # type: ignore[attr-defined]
                damage = _after_zero_block(stream, start)
                if damage is None:
                    return
                yield damage
                if damage.resumed is None:
                    return
                continue
            except tarfile.EmptyHeaderError:  # type: ignore[attr-defined]
                yield Damage(
                    "the shard ends without the tar end-of-archive block (it was cut short)", start
                )
                return
            except tarfile.TruncatedHeaderError:  # type: ignore[attr-defined]
                yield Damage("the shard ends inside a tar header (cut short)", start)
                return
            except _HEADER_ERRORS as exc:
                resumed = _resync(stream, start, block)
                what = "a tar header is corrupt" if seen or start else "the shard is not a tar"
                reason = f"{what} ({exc or type(exc).__name__})"
                yield Damage(reason, start, resumed, _trusted_key(block, start, resumed))
                if resumed is None:
                    return
                continue
            seen = True
            name, size, next_header = info.name, info.size, cursor.offset
            key, reading = _key(name), name
            cut = Damage("the shard ends inside the member (cut short)", start, None, key, name)
            if not info.isreg() or info.sparse is not None:
                if info.sparse is not None:
                    yield Damage(
                        "a sparse member, which WebDataset never writes",
                        start,
                        next_header,
                        key,
                        name,
                    )
                if stream.skip(next_header - stream.pos) < next_header - stream.pos:
                    yield cut
                    return
                continue
            left = stream.left()
            if left is not None and size > left:
                yield Damage(
                    f"the member claims {size:,} bytes but the shard holds only "
                    f"{left:,} more (it was cut short)",
                    start,
                    None,
                    key,
                    name,
                )
                return
            data, refused = None, False
            if wanted(name):
                if size > max_member_bytes:
                    refused = True
                    yield Damage(
                        f"the member claims {size:,} bytes, more than max_member_bytes="
                        f"{max_member_bytes:,}",
                        start,
                        next_header,
                        key,
                        name,
                        "Fix: pass a larger max_member_bytes= if the member is genuine, or "
                        "on_error='skip' to drop its sample (counted).",
                    )
                else:
                    data = stream.read(size)
                    if len(data) != size:
                        yield Damage(
                            f"the member holds {len(data):,} of its {size:,} bytes "
                            "(the shard was cut short)",
                            start,
                            None,
                            key,
                            name,
                        )
                        return
            gap = next_header - stream.pos
            if stream.skip(gap) < gap and data is None:
                yield cut
                return
            # (when only the padding after a whole member is cut, the next header reports it)
            if not refused:
                yield Member(name, start, data)
    except _GZIP_ERRORS as exc:
        yield Damage(
            f"the gzip stream is damaged or cut short ({exc or type(exc).__name__})",
            start,
            None,
            _key(reading) if reading else None,
            reading,
        )


def _after_zero_block(stream: _TarStream, start: int) -> Damage | None:
    """After a zero block at ``start``: ``None`` when only zeros follow (the proper end; a gzip
    stream is read to its end, so its CRC is checked), else the damage and the stream left at
    the next valid header."""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            return None
        stripped = chunk.lstrip(b"\0")
        if stripped:
            at = (len(chunk) - len(stripped)) // _BLOCK * _BLOCK
            stream.unread(chunk[at:])
            resumed = _scan(stream)
            return Damage(
                f"data follows the zero (end-of-archive) block at byte {start} (a zeroed "
                "header, or archives joined end to end)",
                start,
                resumed,
            )


# ---------------------------------------------------------------------------- samples


def iter_samples(
    events: Iterator[Member | Damage], on_ignored: Callable[[Member], Any]
) -> Iterator[Sample | Damage]:
    """Group consecutive members by key into samples (WebDataset's ``group_by_keys``).

    Damage marks samples ``lost`` (they are yielded, to be counted, never returned): the
    damaged member's own sample when its key is known; else the sample in progress and the
    first sample after the damage, unless the first member after it has the key of the
    sample in progress (the damage was inside it). A damage that marks no sample is yielded
    itself. ``on_ignored`` is called with each member that belongs to no sample (no
    extension); metadata members named like ``__meta__`` are skipped as WebDataset does.
    """
    current: Sample | None = None
    suspect: Damage | None = None  # the next new sample may miss members
    marked: dict[int, Damage] = {}  # the damages that marked a sample (kept: ids stay unique)
    for event in events:
        if isinstance(event, Damage):
            if event.key is not None:
                if current is None or current.key != event.key:
                    if current is not None:
                        yield current
                    current = Sample(event.key)
                current.lost = current.lost or event
                marked[id(event)] = event
                if suspect is not None and id(suspect) not in marked:
                    yield suspect
                suspect = None
                continue
            if current is not None:
                current.lost = current.lost or event
                marked[id(event)] = event
            if event.resumed is not None:
                if suspect is not None and id(suspect) not in marked:
                    yield suspect
                suspect = event
            elif id(event) not in marked:
                yield event
            continue
        name = event.name
        if _is_meta(name):
            continue
        parts = split_name(name)
        if parts is None:
            on_ignored(event)
            continue
        key, suffix = parts
        if current is None or key != current.key:
            if current is not None:
                yield current
            current = Sample(key, lost=suspect)
            if suspect is not None:
                marked[id(suspect)] = suspect
        suspect = None
        if current.lost is not None:
            continue
        if suffix in current.fields:
            current.duplicate = current.duplicate or event
            continue
        current.fields[suffix] = event
    if current is not None:
        yield current
    if suspect is not None and id(suspect) not in marked:
        yield suspect
