"""Opening local files that a hostile or careless user may have planted.

Every local file feedline opens on its own initiative (a manifest, a shard, a cache entry)
goes through :func:`open_regular`: a FIFO, a device (``/dev/zero``), a socket or a directory
planted at the path is refused with a clear error instead of hanging the reader or feeding it
an endless stream. The file is opened with ``O_NONBLOCK`` (so opening a FIFO never blocks),
then checked with ``fstat`` on the descriptor actually opened (so a swap between the check and
the open cannot slip through). :func:`read_capped` reads at most ``limit`` bytes whatever the
file's reported size claims (``/proc`` files and devices report 0).

Examples
--------
>>> import tempfile, os
>>> folder = tempfile.mkdtemp()
>>> path = os.path.join(folder, "a.json")
>>> _ = open(path, "w").write("{}")
>>> read_capped(path, 1024, what="a manifest")
b'{}'
>>> os.mkfifo(os.path.join(folder, "fifo"))
>>> read_capped(os.path.join(folder, "fifo"), 1024, what="a manifest")
Traceback (most recent call last):
...
feedline.errors.FormatError: a manifest ... is a FIFO, not a regular file...
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from feedline.errors import FeedlineError, FormatError, StorageError

__all__ = [
    "NotRegularFileError",
    "file_kind",
    "open_regular",
    "open_regular_fd",
    "read_capped",
    "regular_size",
]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """Name the kind of file a ``st_mode`` describes (``"a regular file"``, ``"a FIFO"``, ...).

    Examples
    --------
    >>> import stat
    >>> file_kind(stat.S_IFIFO)
    'a FIFO'
    """
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _refusal(path: str, what: str, kind: str, error: type[FeedlineError]) -> FeedlineError:
    return error(
        f"{what} {path!r} is {kind}, not a regular file; feedline only opens regular files "
        "(a FIFO would block forever, a device would stream without end). "
        "Fix: remove it, or point feedline at the real file."
    )


def open_regular(
    path: str | os.PathLike[str],
    *,
    what: str = "the file",
    error: type[FeedlineError] = FormatError,
    flags: int = os.O_RDONLY,
) -> BinaryIO:
    """Open a local regular file for binary reading, refusing anything else.

    Parameters
    ----------
    path
        A local path (symbolic links are followed; a loop is refused).
    what
        How the error names the file (``"the manifest"``, ``"a node-cache file"``).
    error
        The :class:`~feedline.errors.FeedlineError` subclass raised for a file of the wrong
        kind (default :class:`~feedline.errors.FormatError`).
    flags
        ``os.open`` flags (``O_RDONLY`` by default; ``O_RDWR`` for a file mapped writable).

    Returns
    -------
    BinaryIO
        An unbuffered binary file object in blocking mode.

    Raises
    ------
    FeedlineError
        ``error`` when the path is a FIFO, device, socket or directory;
        :class:`FileNotFoundError` passes through when the file does not exist (callers decide
        what a missing file means); other ``OSError`` s become
        :class:`~feedline.errors.StorageError`.

    Examples
    --------
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"abc")
    >>> with open_regular(path, what="a shard") as f:
    ...     f.read()
    b'abc'
    """
    name = os.fspath(path)
    try:
        fd = open_regular_fd(name, flags)
    except NotRegularFileError as exc:
        raise _refusal(name, what, exc.kind, error) from None
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise _refusal(name, what, "a directory", error) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{what} {name!r} is a symbolic link loop. Fix: remove the link.") from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
            raise _refusal(name, what, "a socket or FIFO", error) from None
        raise StorageError(
            f"cannot open {what} {name!r}: {exc.strerror or exc}. "
            "Fix: check the path and its permissions."
        ) from exc
    return os.fdopen(fd, "r+b" if flags & os.O_RDWR else "rb", buffering=0)


class NotRegularFileError(OSError):
    """What :func:`open_regular_fd` found is not a regular file; ``kind`` names it."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"it is {kind}, not a regular file")
        self.kind = kind


def open_regular_fd(name: str, flags: int, create_mode: int = 0o644) -> int:
    """The descriptor of the regular file ``name``, opened with ``flags``, in blocking mode.

    The mechanism under :func:`open_regular` and the loader's lock files: the file is opened
    with ``O_NONBLOCK`` (so a FIFO never blocks the open), then ``fstat`` on that very
    descriptor must say regular file. ``OSError`` s of the open pass through for the caller
    to word; anything but a regular file raises :class:`NotRegularFileError`.

    Examples
    --------
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.mkfifo(os.path.join(folder, "fifo"))
    >>> open_regular_fd(os.path.join(folder, "fifo"), os.O_RDONLY)
    Traceback (most recent call last):
    ...
    feedline.io.storage.local_files.NotRegularFileError: it is a FIFO, not a regular file
    """
    fd = os.open(name, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), create_mode)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(file_kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def regular_size(
    path: str | os.PathLike[str],
    *,
    what: str = "the file",
    error: type[FeedlineError] = FormatError,
) -> int:
    """Return the size of a local regular file without opening it; refuse other kinds.

    Examples
    --------
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> _ = open(path, "wb").write(b"abcd")
    >>> regular_size(path)
    4
    """
    name = os.fspath(path)
    try:
        st = os.stat(name)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{what} {name!r} is a symbolic link loop. Fix: remove the link.") from None
        raise StorageError(
            f"cannot stat {what} {name!r}: {exc.strerror or exc}. "
            "Fix: check the path and its permissions."
        ) from exc
    if not stat.S_ISREG(st.st_mode):
        raise _refusal(name, what, file_kind(st.st_mode), error)
    return st.st_size


def read_capped(
    path: str | os.PathLike[str],
    limit: int,
    *,
    what: str = "the file",
    error: type[FeedlineError] = FormatError,
) -> bytes:
    """Read a whole local regular file, refusing it if it holds more than ``limit`` bytes.

    At most ``limit + 1`` bytes are ever read, whatever size the file reports.

    Examples
    --------
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "big.json")
    >>> _ = open(path, "wb").write(b"x" * 100)
    >>> read_capped(path, 10, what="a manifest")
    Traceback (most recent call last):
    ...
    feedline.errors.FormatError: a manifest ... holds more than 10 bytes...
    """
    with open_regular(path, what=what, error=error) as f:
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > limit:
        raise error(
            f"{what} {os.fspath(path)!r} holds more than {limit:,} bytes, the most feedline "
            "reads for it. Fix: check that the path is the right file."
        )
    return data
