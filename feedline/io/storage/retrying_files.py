"""The file objects of :class:`~feedline.io.storage.retrying_fs.RetryingFileSystem`.

:class:`RetryingReadFile` re-opens and seeks back after a failed or short read (on the
filesystem's ``bare`` backend: feedline's retries are the only ones there);
:class:`SpooledUpload` spools a written file locally and uploads it whole on ``close``: the
backend retries each request of the upload where it can (S3), else feedline retries the
whole upload from the start.
"""

from __future__ import annotations

import contextlib
import errno
import io
import tempfile
import threading
from typing import TYPE_CHECKING, Any

from feedline.io.storage.faults import storage_error

if TYPE_CHECKING:
    from feedline.io.storage.retrying_fs import RetryingFileSystem

__all__ = ["LINE_BLOCK", "SPOOL_BYTES", "UPLOAD_CHUNK", "RetryingReadFile", "SpooledUpload"]

#: bytes kept in memory before a spooled upload moves to a temporary file
SPOOL_BYTES = 16 << 20
#: bytes read at a time while looking for the end of a line
LINE_BLOCK = 64 << 10
#: bytes copied at a time when uploading a spooled file
UPLOAD_CHUNK = 8 << 20


class RetryingReadFile(io.RawIOBase):
    """A read-only file over ``fs.bare`` that re-opens and seeks back after a failed read.

    A read that returns fewer bytes than the object still holds (a dropped connection)
    counts as a transient failure too, so a truncated transfer is never taken for the end.
    Each attempt reads into its own buffer and only a successful one moves the position, so
    an attempt abandoned after a timeout cannot leave bytes behind twice.
    """

    def __init__(self, fs: RetryingFileSystem, path: str, options: dict[str, Any]) -> None:
        super().__init__()
        self.fs, self.path, self._options = fs, path, options
        self._pos = 0
        self._raw: Any = fs.call("open", path, lambda _a: self._open_at(0), own=True)
        size = getattr(self._raw, "size", None)
        self.size = size if isinstance(size, int) else fs.size(path)

    def _open_at(self, position: int) -> Any:
        raw = self.fs.bare.open(self.path, "rb", **self._options)
        if position:
            raw.seek(position)
        return raw

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        position = base + offset
        if position < 0:
            raise OSError(errno.EINVAL, f"negative seek position {position}", self.path)
        if position != self._pos and self._raw is not None:
            try:
                self._raw.seek(position)
            except Exception:  # noqa: BLE001 - the next read re-opens at the position
                self._drop()
        self._pos = position
        return position

    def read(self, size: int | None = -1) -> bytes:
        start = self._pos
        remaining = max(0, self.size - start)
        wanted = remaining if size is None or size < 0 else min(size, remaining)
        if wanted == 0:
            return b""

        def attempt(number: int) -> tuple[Any, bytes]:
            fresh = number > 1 or self._raw is None
            raw = self._open_at(start) if fresh else self._raw
            try:
                chunks, got = [], 0
                while got < wanted:
                    chunk = raw.read(wanted - got)
                    if not chunk:
                        raise ConnectionResetError(
                            errno.ECONNRESET,
                            f"the read ended at byte {start + got} of {self.size} "
                            "(connection dropped)",
                        )
                    chunks.append(chunk)
                    got += len(chunk)
            except BaseException:
                if fresh:
                    _close_quietly(raw)
                raise
            return raw, b"".join(chunks)

        raw, data = self.fs.call("read", self.path, attempt, own=True)
        if raw is not self._raw:
            self._drop()
            self._raw = raw
        self._pos = start + len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def readline(self, size: int | None = -1) -> bytes:
        """One line, read a block at a time (``RawIOBase`` would read it byte by byte)."""
        limit = -1 if size is None else size
        line = bytearray()
        while limit < 0 or len(line) < limit:
            chunk = self.read(LINE_BLOCK if limit < 0 else min(LINE_BLOCK, limit - len(line)))
            if not chunk:
                break
            end = chunk.find(b"\n")
            if end >= 0:
                line += chunk[: end + 1]
                self.seek(self._pos - (len(chunk) - end - 1))  # give back what follows
                break
            line += chunk
        return bytes(line)

    def _drop(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            _close_quietly(raw)

    def close(self) -> None:
        self._drop()
        super().close()


def _abandon(handle: Any) -> None:
    """Give up a file being written without committing what it holds (best effort)."""
    with contextlib.suppress(Exception):  # the first error is the one reported
        discard = getattr(handle, "discard", None)
        if discard is None:
            handle.close()
            return
        discard()  # s3fs: aborts the multipart upload; the file is unusable after it
        handle.closed = True  # so that its __del__ does not try to flush it


def _close_quietly(handle: Any) -> None:
    with contextlib.suppress(Exception):  # a broken handle is dropped either way
        handle.close()


class SpooledUpload(io.RawIOBase):
    """A write-only file spooled locally and uploaded whole on ``close``.

    Only ``close()`` (or leaving a ``with`` block normally) uploads: a file left by an error
    in its ``with`` block, or garbage-collected unclosed, uploads nothing, so a writer that
    crashes half-way never publishes half an object.
    """

    def __init__(self, fs: RetryingFileSystem, path: str, options: dict[str, Any]) -> None:
        super().__init__()
        self.fs, self.path, self._options = fs, path, options
        # closed by close() / discard()
        self._spool = tempfile.SpooledTemporaryFile(  # noqa: SIM115
            max_size=SPOOL_BYTES, prefix="feedline-up-"
        )
        self._lock = threading.Lock()
        self._size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._size

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            with self._lock:
                self._spool.write(view)
        except OSError as exc:
            raise storage_error("write (local spool)", self.fs.url(self.path), exc) from exc
        self._size += view.nbytes
        return view.nbytes

    def discard(self) -> None:
        """Drop what was written without uploading anything."""
        self._spool.close()
        super().close()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.fs.call("upload", self.path, lambda _attempt: self._upload())
        finally:
            self._spool.close()
            super().close()

    def _upload(self) -> None:
        target = self.fs.inner.open(self.path, "wb", **self._options)
        offset = 0
        try:
            while offset < self._size:
                with self._lock:  # an attempt abandoned after a timeout may still be reading
                    self._spool.seek(offset)
                    chunk = self._spool.read(UPLOAD_CHUNK)
                target.write(chunk)
                offset += len(chunk)
            target.close()
        except BaseException:
            _abandon(target)
            raise

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is not None:  # an error while writing: upload nothing
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:
        # a file dropped without close() was abandoned: never commit it by accident
        if not self.closed:
            with contextlib.suppress(Exception):
                self.discard()
