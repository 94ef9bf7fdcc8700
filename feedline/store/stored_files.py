"""Opening the files of a dataset folder: never more bytes than allowed, never a FIFO.

A dataset folder may come from anyone, and a file in it may be planted: ``_feedline.json``
symlinked to ``/dev/zero`` (whose reported size is 0, so a size check alone never fires), a
FIFO in place of the manifest, the lock or a shard (opening it blocks forever). On local
disk every file is checked to be a regular file before it is opened
(:mod:`feedline.io.storage.local_files`); small files (the manifest, the writer lock) are read
with a hard cap whatever their size claims, on every filesystem.

Examples
--------
>>> import os, tempfile
>>> from feedline.io.storage.paths import resolve
>>> folder = resolve(tempfile.mkdtemp())
>>> _ = open(folder.join("m.json"), "w").write("{}")
>>> read_small(folder.child("m.json"), 1024, what="the manifest")
b'{}'
>>> os.mkfifo(folder.join("fifo"))
>>> check_regular(folder.child("fifo"), what="the shard")
Traceback (most recent call last):
...
feedline.errors.FormatError: the shard ... is a FIFO, not a regular file...
"""

from __future__ import annotations

from feedline.errors import FeedlineError, FormatError
from feedline.io.storage.local_files import read_capped, regular_size
from feedline.io.storage.paths import Location

__all__ = ["check_regular", "read_small"]


def read_small(
    location: Location,
    limit: int,
    *,
    what: str,
    error: type[FeedlineError] = FormatError,
) -> bytes:
    """The bytes of the small file at ``location``, at most ``limit`` of them.

    A local file must be a regular file (a FIFO, device, socket or directory raises
    ``error``); a file whose size is over ``limit`` raises ``error`` unread; at most
    ``limit + 1`` bytes are read on any filesystem (the size may lie), and a file holding more
    than ``limit`` raises ``error``. ``FileNotFoundError`` passes through.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> folder = resolve(tempfile.mkdtemp())
    >>> _ = open(folder.join("big"), "wb").write(b"x" * 100)
    >>> read_small(folder.child("big"), 10, what="the lock")
    Traceback (most recent call last):
    ...
    feedline.errors.FormatError: the lock ... is 100 bytes, over the 10-byte limit...
    """
    size = (
        regular_size(location.path, what=what, error=error)
        if location.is_local
        else location.fs.size(location.path)
    )
    if isinstance(size, int) and size > limit:  # refused without reading it
        raise error(
            f"{what} {location.url!r} is {size:,} bytes, over the {limit:,}-byte limit. "
            "Fix: check that the path is the right file."
        )
    if location.is_local:  # capped: the size may lie (a device or /proc file says 0)
        return read_capped(location.path, limit, what=what, error=error)
    # one ranged request (retried as a whole), never more than limit + 1 bytes
    data = location.fs.cat_file(location.path, start=0, end=limit + 1)
    if len(data) > limit:
        raise error(
            f"{what} {location.url!r} holds more than {limit:,} bytes, the most feedline reads "
            "for it. Fix: check that the path is the right file."
        )
    return bytes(data)


def check_regular(
    location: Location, *, what: str, error: type[FeedlineError] = FormatError
) -> None:
    """Raise ``error`` when the local file at ``location`` is not a regular file (a FIFO
    would block its reader forever, a device would stream without end); a no-op on other
    filesystems, which hold only regular files. ``FileNotFoundError`` passes through.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> check_regular(resolve(tempfile.mkdtemp()), what="the shard")
    Traceback (most recent call last):
    ...
    feedline.errors.FormatError: the shard ... is a directory, not a regular file...
    """
    if location.is_local:
        regular_size(location.path, what=what, error=error)
