"""A wrapping fsspec filesystem: every call under a :class:`~feedline.io.storage.retry.RetryPolicy`.

:func:`feedline.io.storage.paths.resolve` wraps every remote filesystem in it. One bound,
``policy.attempts``, holds for every request, because exactly one layer retries it:

- where feedline configured the backend to retry by itself (S3: ``inner`` is s3fs whose
  botocore client retries each request up to ``policy.attempts`` times, see
  :mod:`feedline.io.storage.s3`), metadata calls, listings, writes, copies and deletes go to
  ``inner`` once, and feedline only turns its failures into clear errors;
- what nothing below retries runs under feedline's own loop (:meth:`RetryPolicy.run`) on
  ``bare``, the same storage with the backend's retries off: whole-object reads
  (``cat_file``, ``get_file``), reads on open files, exclusive creates and conditional
  writes (whose retry must first check whether an earlier attempt took effect);
- on backends feedline cannot configure (``bare is inner``) feedline's loop runs every call.

How feedline's loop copes with calls that may have taken effect:

- ``rm``, ``mv`` and ``pipe_file(mode="create")`` are retried knowing that an earlier
  attempt may have taken effect (a missing source, or an object holding exactly the bytes
  being created, after a failed attempt means done);
- a file opened for reading re-opens the object and seeks back to its position when a read
  fails or ends early (a connection that drops mid-object), so nothing is lost or repeated;
- a file opened for writing is spooled to a local temporary file and uploaded whole on
  ``close``, so an upload that fails is retried from the start (idempotent) where the
  backend does not retry its requests; both file objects live in
  :mod:`feedline.io.storage.retrying_files`.

On S3 the commit and the writer lock use conditional requests (:meth:`read_versioned`,
:meth:`write_if`, :meth:`delete_if`): an ``If-Match`` on the ETag read before, so no
check-then-write race remains.

Permanent errors other than "not found" (permission denied, disk full) raise
:class:`~feedline.errors.StorageError` naming the object; ``FileNotFoundError`` passes through
unchanged because fsspec and pyarrow use it to answer "does this exist".
"""

from __future__ import annotations

import dataclasses
import errno
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, TypeVar

import fsspec

from feedline.errors import FeedlineError, StorageError
from feedline.io.storage import s3
from feedline.io.storage.faults import backend_attempts, precondition_failed, storage_error
from feedline.io.storage.retry import RetryPolicy
from feedline.io.storage.retrying_files import RetryingReadFile, SpooledUpload

__all__ = ["RetryingFileSystem"]

T = TypeVar("T")

#: errors that are answers ("no such object"), not failures of the storage
_PASS_THROUGH = (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError)
#: top-level modules of storage clients whose errors are storage failures
_CLIENT_MODULES = frozenset(
    {"botocore", "aiobotocore", "aiohttp", "google", "azure", "gcsfs", "adlfs"}
)


class RetryingFileSystem(fsspec.AbstractFileSystem):
    """``inner`` with every request tried at most ``policy.attempts`` times (see the module
    docstring); ``bare`` is ``inner`` with the backend's own retries off (default: ``inner``,
    a backend that feedline retries entirely).

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

    def __init__(
        self,
        inner: fsspec.AbstractFileSystem,
        policy: RetryPolicy,
        bare: fsspec.AbstractFileSystem | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.bare = inner if bare is None else bare
        self.policy = policy
        protocol = inner.protocol
        self.protocol = protocol
        self.root_marker = inner.root_marker
        self.sep = inner.sep
        # path helpers are classmethods on fsspec filesystems: take the inner ones
        self._strip_protocol = inner._strip_protocol
        self._parent = inner._parent
        self.dircache = inner.dircache

    # ------------------------------------------------------------------ the retry loop

    def url(self, path: str) -> str:
        """``path`` as a URL with this filesystem's protocol (for messages)."""
        return self.inner.unstrip_protocol(path)

    @property
    def backend_retries(self) -> bool:
        """True when ``inner`` retries its requests itself (under the policy's bound)."""
        return self.bare is not self.inner

    def call(self, what: str, path: str, call: Callable[[int], T], own: bool = False) -> T:
        """Run ``call(attempt)``; failures become clear errors.

        With ``own`` (a call on :attr:`bare`) or on a backend that does not retry by itself,
        feedline's loop retries it under the policy; otherwise it runs once, and the backend
        retries its requests.
        """
        url = self.url(path)
        mine = own or not self.backend_retries
        policy = self.policy if mine else dataclasses.replace(self.policy, attempts=1)
        try:
            return policy.run(call, what=what, url=url)
        except StorageError as error:
            last = error.last_error
            if mine or error.__cause__ is not last or last is None:
                raise
            # transient, and the backend's own retries ran out: say how many it made
            raise storage_error(what, url, last, attempts=backend_attempts(last) or 1) from last
        except FeedlineError:
            raise
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            if not isinstance(exc, OSError) and not _from_storage_client(exc):
                raise  # a bug or a value error: not the storage's doing
            # permanent: denied, disk full, no credentials, …
            raise storage_error(what, url, exc) from exc

    def _simple(self, name: str, path: Any, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.inner, name)
        where = path if isinstance(path, str) else (path[0] if path else "")
        return self.call(name, where, lambda _attempt: method(path, *args, **kwargs))

    def _own(self, name: str, path: str, *args: Any, **kwargs: Any) -> Any:
        """``bare.<name>(path, ...)`` under feedline's own retries (nothing below retries)."""
        method = getattr(self.bare, name)
        return self.call(name, path, lambda _attempt: method(path, *args, **kwargs), own=True)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._simple("info", path, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        return self._simple("exists", path, **kwargs)

    def isdir(self, path: str) -> bool:
        return self._simple("isdir", path)

    def isfile(self, path: str) -> bool:
        return self._simple("isfile", path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        return self._simple("ls", path, detail=detail, **kwargs)

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        return self._simple(
            "find", path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs
        )

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        return self._simple("glob", path, maxdepth=maxdepth, **kwargs)

    def du(
        self,
        path: str,
        total: bool = True,
        maxdepth: int | None = None,
        withdirs: bool = False,
        **kwargs: Any,
    ) -> Any:
        return self._simple("du", path, total=total, maxdepth=maxdepth, withdirs=withdirs, **kwargs)

    def size(self, path: str) -> Any:
        return self._simple("size", path)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        # a body that breaks off mid-read is retried by no layer below
        return self._own("cat_file", path, start=start, end=end, **kwargs)

    def checksum(self, path: str) -> int:
        return self._simple("checksum", path)

    def modified(self, path: str) -> Any:
        return self._simple("modified", path)

    def created(self, path: str) -> Any:
        return self._simple("created", path)

    def ukey(self, path: str) -> str:
        return self._simple("ukey", path)

    def get_file(
        self, rpath: str, lpath: str, callback: Any = None, outfile: Any = None, **kwargs: Any
    ) -> Any:
        kwargs = {**kwargs, **({} if callback is None else {"callback": callback})}
        return self._own("get_file", rpath, lpath, **kwargs)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> Any:
        if mode != "create":
            return self._simple("pipe_file", path, value, mode=mode, **kwargs)

        def call(attempt: int) -> Any:
            try:
                return self.bare.pipe_file(path, value, mode=mode, **kwargs)
            except FileExistsError:
                # mode="create" is not idempotent: a failed earlier attempt may have made it
                if attempt > 1 and self.bare.cat_file(path) == value:
                    return None
                raise

        result = self.call("pipe_file", path, call, own=True)
        self.inner.invalidate_cache(path)
        return result

    def put_file(
        self,
        lpath: str,
        rpath: str,
        callback: Any = None,
        mode: str = "overwrite",
        **kwargs: Any,
    ) -> Any:
        kwargs = {**kwargs, **({} if callback is None else {"callback": callback})}
        method = self.inner.put_file
        return self.call("put_file", rpath, lambda _a: method(lpath, rpath, mode=mode, **kwargs))

    def makedirs(self, path: str, exist_ok: bool = False) -> Any:
        return self._simple("makedirs", path, exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> Any:
        return self._simple("mkdir", path, create_parents=create_parents, **kwargs)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> Any:
        return self.call("copy", path1, lambda _a: self.inner.cp_file(path1, path2, **kwargs))

    def copy(
        self,
        path1: str | list[str],
        path2: str | list[str],
        recursive: bool = False,
        maxdepth: int | None = None,
        on_error: str | None = None,
        **kwargs: Any,
    ) -> Any:
        def call(_attempt: int) -> Any:
            return self.inner.copy(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

        return self.call("copy", path1 if isinstance(path1, str) else "", call)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.inner.invalidate_cache(path)

    # ------------------------------------------------------------------ side effects

    def rm(
        self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None
    ) -> None:
        def call(attempt: int) -> None:
            try:
                self.inner.rm(path, recursive=recursive, maxdepth=maxdepth)
            except FileNotFoundError:
                if attempt == 1:  # on a retry, an earlier attempt may have removed it
                    raise

        return self.call("rm", path if isinstance(path, str) else "", call)

    def rm_file(self, path: str) -> None:
        self.rm(path)

    def mv(
        self,
        path1: str,
        path2: str,
        recursive: bool = False,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        def call(attempt: int) -> None:
            if attempt > 1 and not self.inner.exists(path1) and self.inner.exists(path2):
                return  # the failed attempt moved it before failing (copy done, delete lost)
            self.inner.mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

        return self.call("mv", path1, call)

    # ------------------------------------------------------------------ conditional requests

    def _s3(self) -> ModuleType | None:
        """:mod:`feedline.io.storage.s3` when this storage takes conditional requests, else
        ``None``."""
        if not self.backend_retries or "s3fs" not in sys.modules:
            return None

        return s3 if s3.is_s3(self.bare) else None

    @property
    def conditional(self) -> bool:
        """True when writes and deletes can be made conditional on an ETag (S3)."""
        return self._s3() is not None

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        """The object's bytes and its version (the ETag; ``None`` where not :attr:`conditional`),
        read in one request. ``FileNotFoundError`` when there is none."""
        s3 = self._s3()
        if s3 is None:
            return self.cat_file(path), None
        return self.call("read", path, lambda _a: s3.get_versioned(self.bare, path), own=True)

    def write_if(self, path: str, data: bytes, version: str | None) -> str | None:
        """Write ``data`` only if the object is still at ``version`` (``None``: only if there is
        none), in one conditional request; the new version, or ``None`` when the condition
        failed (someone else changed or removed the object). Needs :attr:`conditional`.

        A retry whose condition fails reads the object back: holding exactly ``data``, it was
        written by an earlier attempt whose response was lost.
        """
        s3 = self._s3()
        if s3 is None:
            raise TypeError(f"{type(self.inner).__name__} takes no conditional writes")
        match = {"mode": "create"} if version is None else {"IfMatch": version}

        def call(attempt: int) -> str | None:
            try:
                out = self.bare.pipe_file(path, data, **match)
            except OSError as exc:  # FileExistsError / FileNotFoundError: the condition too
                taken = isinstance(exc, FileExistsError | FileNotFoundError)
                if not taken and not precondition_failed(exc):
                    raise
                if attempt > 1:
                    try:
                        current, etag = s3.get_versioned(self.bare, path)
                    except FileNotFoundError:
                        return None
                    if current == data:
                        return etag
                return None
            etag = out.get("ETag") if isinstance(out, Mapping) else None
            return str(etag) if etag else str(self.bare.info(path)["ETag"])

        try:
            return self.call("conditional write", path, call, own=True)
        finally:
            self.inner.invalidate_cache(path)

    def delete_if(self, path: str, version: str) -> bool:
        """Delete the object only if it is still at ``version``; False when it was not (it
        changed, or is gone). Needs :attr:`conditional`."""
        s3 = self._s3()
        if s3 is None:
            raise TypeError(f"{type(self.inner).__name__} takes no conditional deletes")

        def call(attempt: int) -> bool:
            try:
                s3.delete_if(self.bare, path, version)
            except FileNotFoundError:
                return attempt > 1  # on a retry, the lost first attempt may have deleted it
            except OSError as exc:
                if precondition_failed(exc):
                    return False
                raise
            return True

        try:
            return self.call("conditional delete", path, call, own=True)
        finally:
            self.inner.invalidate_cache(path)

    # ------------------------------------------------------------------ files

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Any:
        options = dict(kw)
        if block_size is not None:
            options["block_size"] = block_size
        if cache_options is not None:
            options["cache_options"] = cache_options

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
