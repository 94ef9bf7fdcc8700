"""The stager's file locks: one per epoch (who stages it) and one per epoch's readers.

Examples
--------
>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "e0.lock"
>>> with locked(path) as got, locked(path, wait=False) as again:
...     got, again
(True, False)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from feedline.loader.data.cache_files import open_lock

__all__ = ["hold_shared", "locked"]


@contextlib.contextmanager
def locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold the lock file ``path`` alone; ``wait=False``: yield ``False`` at once when another
    process (or another descriptor of this one) holds it, shared or not."""
    fd = open_lock(path, what="the staging lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))  # dies with us too
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def hold_shared(path: Path) -> int:
    """Take a shared hold on the lock file ``path`` (readers of an epoch's inbox: the inbox
    is not deleted while one holds it); the descriptor, to be closed to let go.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "e0.read"
    >>> fd = hold_shared(path)
    >>> with locked(path, wait=False) as got:
    ...     got
    False
    >>> os.close(fd)
    """
    fd = open_lock(path, what="the staging readers' lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd
