"""A wrapping fsspec filesystem applying a :class:`~feedline.io.retry.RetryPolicy` to every call.

:func:`feedline.io.storage.resolve` wraps every remote filesystem in it, so metadata calls,
whole-object reads and writes, and reads on open files all share one policy:

- metadata and whole-object calls (``info``, ``ls``, ``find``, ``cat_file``, ``pipe_file``,
  ``makedirs`` …) are simply called again;
- ``rm``, ``mv`` and ``pipe_file(mode="create")`` are retried knowing that an earlier
  attempt may have taken effect (a missing source, or an object holding exactly the bytes
  being created, after a failed attempt means done);
- a file opened for reading re-opens the object and seeks back to its position when a read
  fails or ends early (a connection that drops mid-object), so nothing is lost or repeated;
- a file opened for writing is spooled to a local temporary file and uploaded whole on
  ``close``, so an upload that fails transiently is retried from the start (idempotent);
  both file objects live in :mod:`feedline.io.retry_files`.

Permanent errors other than "not found" (permission denied, disk full) raise
:class:`~feedline.errors.StorageError` naming the object; ``FileNotFoundError`` passes through
unchanged because fsspec and pyarrow use it to answer "does this exist".
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, TypeVar

import fsspec

from feedline.errors import FeedlineError
from feedline.io.retry import RetryPolicy, storage_error

__all__ = ["RetryingFileSystem"]

T = TypeVar("T")

#: errors that are answers ("no such object"), not failures of the storage
_PASS_THROUGH = (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError)
#: top-level modules of storage clients whose errors are storage failures
_CLIENT_MODULES = frozenset(
    {"botocore", "aiobotocore", "aiohttp", "google", "azure", "gcsfs", "adlfs"}
)


class RetryingFileSystem(fsspec.AbstractFileSystem):
    """``inner`` with every call retried by ``policy`` (see the module docstring).

    Paths, protocol and URLs are ``inner``'s, so messages and listings look the same.

    Examples
    --------
    >>> import fsspec
    >>> fs = RetryingFileSystem(fsspec.filesystem("memory"), RetryPolicy(attempts=3))
    >>> fs.pipe_file("/retry-doc/a.txt", b"hello")
    >>> fs.cat_file("/retry-doc/a.txt"), fs.protocol
    (b'hello', 'memory')
    >>> with fs.open("/retry-doc/a.txt") as handle:
    ...     _ = handle.seek(1)
    ...     handle.read()
    b'ello'
    """

    cachable = False

    def __init__(self, inner: fsspec.AbstractFileSystem, policy: RetryPolicy) -> None:
        super().__init__()
        self.inner = inner
        self.policy = policy
        protocol = inner.protocol
        self.protocol = protocol
        self.root_marker = inner.root_marker
        self.sep = inner.sep
        # path helpers are classmethods on fsspec filesystems: take the inner ones
        self._strip_protocol = inner._strip_protocol  # type: ignore[method-assign]
        self._parent = inner._parent  # type: ignore[method-assign]
        self.dircache = inner.dircache

    # ------------------------------------------------------------------ the retry loop

    def url(self, path: str) -> str:
        """``path`` as a URL with this filesystem's protocol (for messages)."""
        return self.inner.unstrip_protocol(path)

    def call(self, what: str, path: str, call: Callable[[int], T]) -> T:
        """Run ``call(attempt)`` under the policy; failures become clear errors."""
        try:
            return self.policy.run(call, what=what, url=self.url(path))
        except FeedlineError:
            raise
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            if not isinstance(exc, OSError) and not _from_storage_client(exc):
                raise  # a bug or a value error: not the storage's doing
            # permanent: denied, disk full, no credentials, …
            raise storage_error(what, self.url(path), exc) from exc

    def _simple(self, name: str, path: Any, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.inner, name)
        where = path if isinstance(path, str) else (path[0] if path else "")
        return self.call(name, where, lambda _attempt: method(path, *args, **kwargs))

    def info(self, path, **kwargs):
        return self._simple("info", path, **kwargs)

    def exists(self, path, **kwargs):
        return self._simple("exists", path, **kwargs)

    def isdir(self, path):
        return self._simple("isdir", path)

    def isfile(self, path):
        return self._simple("isfile", path)

    def ls(self, path, detail=True, **kwargs):
        return self._simple("ls", path, detail=detail, **kwargs)

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        return self._simple(
            "find", path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs
        )

    def glob(self, path, maxdepth=None, **kwargs):
        return self._simple("glob", path, maxdepth=maxdepth, **kwargs)

    def du(self, path, total=True, maxdepth=None, withdirs=False, **kwargs):
        return self._simple("du", path, total=total, maxdepth=maxdepth, withdirs=withdirs, **kwargs)

    def size(self, path):
        return self._simple("size", path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        return self._simple("cat_file", path, start=start, end=end, **kwargs)

    def checksum(self, path):
        return self._simple("checksum", path)

    def modified(self, path):
        return self._simple("modified", path)

    def created(self, path):
        return self._simple("created", path)

    def ukey(self, path):
        return self._simple("ukey", path)

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs):
        kwargs = {**kwargs, **({} if callback is None else {"callback": callback})}
        return self._simple("get_file", rpath, lpath, **kwargs)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        def call(attempt: int) -> Any:
            try:
                return self.inner.pipe_file(path, value, mode=mode, **kwargs)
            except FileExistsError:
                # mode="create" is not idempotent: a failed earlier attempt may have made it
                if attempt > 1 and mode == "create" and self.inner.cat_file(path) == value:
                    return None
                raise

        return self.call("pipe_file", path, call)

    def put_file(self, lpath, rpath, callback=None, mode="overwrite", **kwargs):
        kwargs = {**kwargs, **({} if callback is None else {"callback": callback})}
        method = self.inner.put_file
        return self.call("put_file", rpath, lambda _a: method(lpath, rpath, mode=mode, **kwargs))

    def makedirs(self, path, exist_ok=False):
        return self._simple("makedirs", path, exist_ok=exist_ok)

    def mkdir(self, path, create_parents=True, **kwargs):
        return self._simple("mkdir", path, create_parents=create_parents, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        return self.call("copy", path1, lambda _a: self.inner.cp_file(path1, path2, **kwargs))

    def copy(self, path1, path2, recursive=False, maxdepth=None, on_error=None, **kwargs):
        def call(_attempt: int) -> Any:
            return self.inner.copy(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

        return self.call("copy", path1 if isinstance(path1, str) else "", call)

    def invalidate_cache(self, path=None):
        self.inner.invalidate_cache(path)

    # ------------------------------------------------------------------ side effects

    def rm(self, path, recursive=False, maxdepth=None):
        def call(attempt: int) -> None:
            try:
                self.inner.rm(path, recursive=recursive, maxdepth=maxdepth)
            except FileNotFoundError:
                if attempt == 1:  # on a retry, an earlier attempt may have removed it
                    raise

        return self.call("rm", path if isinstance(path, str) else "", call)

    def rm_file(self, path):
        self.rm(path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        def call(attempt: int) -> None:
            if attempt > 1 and not self.inner.exists(path1) and self.inner.exists(path2):
                return  # the failed attempt moved it before failing (copy done, delete lost)
            self.inner.mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

        return self.call("mv", path1, call)

    # ------------------------------------------------------------------ files

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kw):
        options = dict(kw)
        if block_size is not None:
            options["block_size"] = block_size
        if cache_options is not None:
            options["cache_options"] = cache_options
        from feedline.io.retry_files import RetryingReadFile, SpooledUpload

        if "r" in mode:
            return RetryingReadFile(self, path, options)
        if mode in ("wb", "xb"):
            if mode == "xb" and self.exists(path):
                raise FileExistsError(errno.EEXIST, "the object already exists", self.url(path))
            return SpooledUpload(self, path, options)
        return self.call("open", path, lambda _a: self.inner.open(path, mode, **options))


def _from_storage_client(exc: BaseException) -> bool:
    """True for exceptions of the storage client libraries (botocore, google, azure, aiohttp)."""
    root = type(exc).__module__.split(".", 1)[0]
    return root in _CLIENT_MODULES
