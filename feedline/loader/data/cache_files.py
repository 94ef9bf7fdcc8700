"""The files of the loader's cache folders: lock files, and entries planted where a cache file goes.

The node cache (``<cache_dir>/node``) and the shard cache (``<cache_dir>``) keep their files
in folders feedline owns, shared by every process of a node. Something else at one of their
paths (a FIFO, a device, a symbolic link, a directory) must neither hang a loader nor surface
as a raw ``OSError``:

- :func:`open_lock` opens (creating it if needed) a lock file with ``O_NONBLOCK`` and
  checks it is a regular file; a directory, a FIFO, a symbolic link loop, a read-only or
  unwritable folder at the lock path is a :class:`~feedline.errors.ConfigurationError`
  naming the path and the fix. A bad lock file is never removed: a process may hold a lock
  on it, and removing it would let two processes in at once.
- :func:`remove_entry` removes what sits at a cache file's path (called under that file's
  lock): anything but a directory is unlinked (a symbolic link goes, never its target); an
  empty directory is removed; a directory with files in it is refused, as feedline deletes
  no directory it did not make.

Examples
--------
>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> os.mkdir(os.path.join(folder, "x.lock"))
>>> open_lock(os.path.join(folder, "x.lock"), what="the node cache lock")
Traceback (most recent call last):
...
feedline.errors.ConfigurationError: Cannot use the node cache lock ... it is a directory...
"""

from __future__ import annotations

import errno
import os
import stat

from feedline.errors import ConfigurationError
from feedline.io.storage.local_files import NotRegularFileError, file_kind, open_regular_fd

__all__ = ["open_lock", "remove_entry"]

_REASONS = {
    errno.EISDIR: "it is a directory",
    errno.ELOOP: "it is a symbolic link loop",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENXIO: "it is a socket",
    errno.ENOTDIR: "a folder on its path is not a directory",
}


def open_lock(path: str | os.PathLike[str], *, what: str) -> int:
    """Open (create) the lock file ``path`` for ``flock``; return its descriptor.

    Never blocks (a FIFO is opened with ``O_NONBLOCK``, then refused); anything but a regular
    file, or a folder where it cannot be created, is a :class:`ConfigurationError`.

    Examples
    --------
    >>> import os, tempfile
    >>> fd = open_lock(os.path.join(tempfile.mkdtemp(), "a.lock"), what="a lock")
    >>> os.close(fd)
    """
    name = os.fspath(path)
    try:
        return open_regular_fd(name, os.O_RDWR | os.O_CREAT)
    except NotRegularFileError as exc:
        raise _lock_error(name, what, str(exc)) from None
    except OSError as exc:
        reason = _REASONS.get(exc.errno or 0, exc.strerror or str(exc))
        raise _lock_error(name, what, reason) from None


def _lock_error(path: str, what: str, reason: str) -> ConfigurationError:
    return ConfigurationError(
        f"Cannot use {what} {path!r}: {reason}. Feedline needs a regular lock file there to "
        "coordinate the processes sharing the cache. Fix: remove whatever is at that path (it "
        "is recreated), or pass a writable local cache_dir= to the loader, or use "
        "cache='memory' (shards: cache_dir=False)."
    )


def remove_entry(path: str | os.PathLike[str], *, what: str) -> str | None:
    """Remove what sits at the cache file path ``path`` (the caller holds the file's lock).

    Returns the kind of entry removed (``"a FIFO"``...), ``None`` when there was none. A
    symbolic link is removed, never its target; an empty directory is removed; a directory
    holding files is refused with a :class:`ConfigurationError` naming ``what``.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.flcache")
    >>> os.mkfifo(path)
    >>> remove_entry(path, what="a node cache file"), os.path.lexists(path)
    ('a FIFO', False)
    """
    name = os.fspath(path)
    try:
        mode = os.lstat(name).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _entry_error(name, what, exc.strerror or str(exc)) from exc
    try:
        if stat.S_ISDIR(mode):
            os.rmdir(name)
        else:
            os.unlink(name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if stat.S_ISDIR(mode) and exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise ConfigurationError(
                f"{what.capitalize()} {name!r} is a directory with files in it, not a cache "
                "file; feedline does not delete directories it did not make. Fix: move or "
                "remove that directory (it is rebuilt as a file), or pass another cache_dir=."
            ) from None
        raise _entry_error(name, what, exc.strerror or str(exc)) from exc
    return file_kind(mode)


def _entry_error(path: str, what: str, reason: str) -> ConfigurationError:
    return ConfigurationError(
        f"Cannot remove the bad {what} {path!r}: {reason}. Fix: remove it by hand, or pass a "
        "writable local cache_dir= to the loader."
    )
