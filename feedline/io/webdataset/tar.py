"""Streaming the members of a WebDataset tar shard and grouping them into samples.

The tar format is read by the standard library's :mod:`tarfile` in stream mode (one pass,
no seeking, so any fsspec file works), with two additions:

- ``.tar.gz`` / ``.tgz`` shards are decompressed by :mod:`gzip` first, so byte offsets in
  messages are offsets in the uncompressed tar;
- damage is never taken for the end of the archive: :mod:`tarfile` silently stops at a bad
  or missing header after the first member, so a shard cut at a member boundary, or with a
  corrupt header, would lose its remaining samples without a word. Headers are parsed by
  :class:`_StrictTarInfo`, which raises :class:`TarDamage` unless the archive ends with a
  proper end-of-archive (zero) block.

Samples follow WebDataset's convention (``webdataset.tariterators``): only regular files
count; names like ``__meta__`` are skipped; the key is the member path up to the first dot
of its basename and the rest, lower-cased, is the field; consecutive members with the same
key form one sample, a new key (or the end of the shard) closes it.
"""

from __future__ import annotations

import gzip
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Member", "Sample", "TarDamage", "iter_members", "iter_samples", "split_name"]

_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
_GZIP_MAGIC = b"\x1f\x8b"


class TarDamage(Exception):  # an internal signal, turned into DataError or a skip
    """The shard cannot be read past ``offset`` (byte offset in the uncompressed tar)."""

    def __init__(self, reason: str, offset: int, member: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.offset, self.member = reason, offset, member


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


def _is_meta(name: str) -> bool:
    """True for WebDataset's metadata members (``__meta__``, ``__index__/...``)."""
    top = "/" not in name and name.startswith("__") and name.endswith("__")
    return top or _META.match(name) is not None


class _StrictTarInfo(tarfile.TarInfo):
    """A header parser that reports damage instead of ending the archive quietly."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tarfile_)
        # the three header errors below are tarfile's own, left out of typeshed's stubs
        except tarfile.EOFHeaderError:  # type: ignore[attr-defined]
            raise  # a zero block: the proper end of the archive
        except tarfile.EmptyHeaderError:  # type: ignore[attr-defined]
            raise TarDamage(
                "the shard ends without the tar end-of-archive block (it was cut short)",
                tarfile_.offset,
            ) from None
        except tarfile.TruncatedHeaderError:  # type: ignore[attr-defined]
            raise TarDamage(
                "the shard ends inside a tar header (cut short)", tarfile_.offset
            ) from None
        except tarfile.HeaderError as exc:
            raise TarDamage(f"a tar header is corrupt ({exc})", tarfile_.offset) from None


def _open_stream(raw: IO[bytes]) -> IO[bytes]:
    """``raw``, or its gzip-decompressed stream when it starts with the gzip magic bytes."""
    head = raw.read(2)
    raw.seek(0)
    if head == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def iter_members(
    raw: IO[bytes], wanted: Callable[[str], bool], *, skip_by_seeking: bool = False
) -> Iterator[Member]:
    """The regular files of the tar in ``raw``, with data read only for names ``wanted``.

    ``skip_by_seeking=True`` (for listing names) seeks over the data of members not wanted
    when the shard is not compressed, instead of reading through it. Raises
    :class:`TarDamage` (with the byte offset and the member being read) when the archive is
    corrupt or cut short; members yielded before it are intact.
    """
    offset, name = 0, None
    try:
        stream_in = _open_stream(raw)
        mode: Literal["r:", "r|"] = "r:" if skip_by_seeking and stream_in is raw else "r|"
        with tarfile.open(fileobj=stream_in, mode=mode, tarinfo=_StrictTarInfo,
                          encoding="utf-8", errors="replace") as stream:  # fmt: skip
            while (info := stream.next()) is not None:
                # a TarFile keeps every TarInfo otherwise (members: set in __init__, not in
                # typeshed)
                stream.members = []  # type: ignore[attr-defined]
                offset, name = info.offset, None
                if not info.isreg():
                    continue
                name = info.name
                data = None
                if wanted(name):
                    handle = stream.extractfile(info)
                    data = handle.read() if handle is not None else b""
                    if len(data) != info.size:
                        raise TarDamage(f"the member holds {len(data)} of its {info.size} bytes",
                                        offset, name)  # fmt: skip
                yield Member(name, offset, data)
    except TarDamage:
        raise
    except tarfile.ReadError as exc:
        where = "the shard is not a tar archive" if offset == 0 and name is None else "read error"
        raise TarDamage(f"{where} ({exc or 'unexpected end of data'})", offset, name) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TarDamage(f"the gzip stream is damaged or cut short ({exc})", offset, name) from None


def iter_samples(
    members: Iterator[Member], on_ignored: Callable[[Member], Any]
) -> Iterator[Sample]:
    """Group consecutive members by key into samples (WebDataset's ``group_by_keys``).

    ``on_ignored`` is called with each member that belongs to no sample (no extension);
    metadata members named like ``__meta__`` are skipped as WebDataset does.
    """
    current: Sample | None = None
    for member in members:
        name = member.name
        if _is_meta(name):
            continue
        parts = split_name(name)
        if parts is None:
            on_ignored(member)
            continue
        key, suffix = parts
        if current is None or key != current.key:
            if current is not None:
                yield current
            current = Sample(key)
        if suffix in current.fields:
            current.duplicate = current.duplicate or member
            continue
        current.fields[suffix] = member
    if current is not None:
        yield current
