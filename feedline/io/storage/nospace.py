"""A write that runs out of space (disk full, quota, file size limit) as a ``StorageError``.

The commit protocol (:func:`feedline.store.commit.writing`) wraps every write in
:func:`out_of_space_as_storage_error`, so the raw ``OSError: [Errno 28]`` of a full disk,
whether it hits a shard, the writer lock or the manifest, reaches the caller as a
:class:`~feedline.errors.StorageError` naming the dataset, after the write's own partial
files were removed (the committed version, if any, is untouched).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from feedline.errors import StorageError

__all__ = ["NO_SPACE_ERRNOS", "no_space_error", "out_of_space_as_storage_error"]

#: errno values of a write that found no room: disk full, quota exceeded, file too large
NO_SPACE_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG") if hasattr(errno, name)
)


def no_space_error(url: str, exc: OSError) -> StorageError:
    """The :class:`StorageError` for ``exc`` (one of :data:`NO_SPACE_ERRNOS`) while writing ``url``.

    Examples
    --------
    >>> error = no_space_error("out/ds", OSError(errno.ENOSPC, "No space left on device", "x"))
    >>> print(error)  # doctest: +ELLIPSIS
    Writing the dataset 'out/ds' ran out of space ([Errno 28] No space left on device: 'x')...
    >>> error.url, isinstance(error.last_error, OSError)
    ('out/ds', True)
    """
    if exc.errno == errno.EFBIG:
        fix = (
            "a file outgrew the size limit of the filesystem or of the process (ulimit -f); "
            "pass a smaller bytes_per_shard= (or rows_per_shard=), or raise the limit."
        )
    else:
        fix = (
            f"free space (or raise the quota) on the storage holding {url!r}, or write the "
            "dataset somewhere else, then run the write again."
        )
    error = StorageError(
        f"Writing the dataset {url!r} ran out of space ({exc}). Nothing was committed: this "
        "write's partial files were removed and a dataset already at that path keeps its "
        f"previous version. Fix: {fix}"
    )
    error.url, error.attempts, error.last_error = url, 1, exc
    return error


@contextlib.contextmanager
def out_of_space_as_storage_error(url: str) -> Iterator[None]:
    """Re-raise an ``OSError`` with an errno in :data:`NO_SPACE_ERRNOS` as :func:`no_space_error`.

    Examples
    --------
    >>> with out_of_space_as_storage_error("out/ds"):
    ...     raise OSError(errno.EDQUOT, "Disk quota exceeded")
    Traceback (most recent call last):
    ...
    feedline.errors.StorageError: Writing the dataset 'out/ds' ran out of space ...
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_SPACE_ERRNOS:
            raise
        raise no_space_error(url, exc) from exc
