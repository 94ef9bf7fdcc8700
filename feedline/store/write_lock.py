"""The writer lock of a feedline dataset folder: one writer at a time, abandoned locks expire.

The lock is a small JSON file ``_feedline.lock`` in the dataset folder, created
exclusively (local disk: ``os.link`` of a complete temporary file, which fails when the
name exists; object stores: a PUT with ``If-None-Match: *``, which S3 refuses with 412
when the object exists; other fsspec backends: check, then create, which is not atomic).
It names the write id, host, pid and a heartbeat time that a daemon thread refreshes
every :data:`HEARTBEAT_S` seconds while the write runs.

On S3 every change of the lock after its creation is conditional on the ETag read just
before (``If-Match``): a heartbeat rewrites the lock only if it is still the one this write
read as its own, breaking a stale lock deletes only the stale lock that was judged, and a
release deletes only this write's lock. A heartbeat that finds the lock broken (or taken)
stops, and the write then fails at its commit with
:class:`~feedline.errors.ConcurrentWriteError`; it never overwrites another writer's lock.

A lock is *stale*, and the next writer deletes it and takes its place, when its holder
is a dead process on this host (SIGKILL, OOM) or its heartbeat is older than
:data:`LOCK_TIMEOUT_S` (a writer on another machine that died). Any other lock makes
the new write fail at once with :class:`~feedline.errors.ConcurrentWriteError`, whose
message names the holder. Elsewhere than on S3, two writers breaking the same stale lock at
once can both believe they hold it; the commit re-checks the lock (and the manifest) right
before committing (on S3 it commits with a conditional PUT), so only one of them commits.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from feedline.errors import ConcurrentWriteError
from feedline.io.storage.paths import Location
from feedline.io.storage.retrying_fs import RetryingFileSystem
from feedline.store.stored_files import read_small

__all__ = ["HEARTBEAT_S", "LOCK_NAME", "LOCK_TIMEOUT_S", "WriterLock"]

LOCK_NAME = "_feedline.lock"
#: seconds without a heartbeat after which a lock counts as abandoned
LOCK_TIMEOUT_S = 120.0
#: seconds between heartbeats of a running write
HEARTBEAT_S = 15.0
#: the largest lock file read (a lock feedline writes is about 150 bytes)
MAX_LOCK_BYTES = 64 << 10


def _lock_text(write_id: str, started: float) -> bytes:
    return json.dumps(
        {
            "write_id": write_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": started,
            "heartbeat": time.time(),
        }
    ).encode()


def conditional(location: Location) -> bool:
    """True when ``location``'s storage takes conditional writes and deletes (S3)."""
    return isinstance(location.fs, RetryingFileSystem) and location.fs.conditional


def _create_exclusive(location: Location, data: bytes) -> None:
    """Create ``location`` holding ``data``; FileExistsError if it exists (atomic where it can)."""
    if location.is_local:
        temporary = f"{location.path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(temporary, "wb") as handle:
            handle.write(data)
        try:
            os.link(temporary, location.path)  # fails if the lock exists; never half-written
        finally:
            os.remove(temporary)
    else:
        location.fs.pipe_file(location.path, data, mode="create")


def _read_lock(location: Location) -> tuple[dict[str, Any] | None, str | None]:
    """The lock's content (``{}`` when unreadable, ``None`` when there is no lock) and its
    version (the S3 ETag; ``None`` elsewhere), read together."""
    try:
        if conditional(location):
            if location.fs.size(location.path) > MAX_LOCK_BYTES:
                return {}, None  # not a lock feedline wrote: unreadable
            raw, version = location.fs.read_versioned(location.path)
        else:  # capped, and a FIFO or device planted as the lock is refused (never blocks)
            raw, version = read_small(location, MAX_LOCK_BYTES, what="the writer lock"), None
    except FileNotFoundError:
        return None, None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}, version
    return (doc if isinstance(doc, dict) else {}), version


def _stale(doc: dict[str, Any], location: Location) -> bool:
    beat = doc.get("heartbeat")
    if not isinstance(beat, int | float) or isinstance(beat, bool):
        with contextlib.suppress(Exception):
            beat = location.fs.modified(location.path).timestamp()
    if not isinstance(beat, int | float) or time.time() - beat > LOCK_TIMEOUT_S:
        return True
    pid = doc.get("pid")
    if doc.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True  # the writer died (SIGKILL, OOM) on this machine
        except OSError:
            return False
    return False


class WriterLock:
    """The writer lock of one dataset folder, with a heartbeat thread while held.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> folder = resolve(tempfile.mkdtemp())
    >>> first, second = WriterLock(folder, "aaaa"), WriterLock(folder, "bbbb")
    >>> first.acquire()
    >>> second.acquire()
    Traceback (most recent call last):
    ...
    feedline.errors.ConcurrentWriteError: Another write to this dataset is in progress: ...
    >>> first.release(); second.acquire(); second.held()
    True
    >>> second.release()
    """

    def __init__(self, target: Location, write_id: str) -> None:
        self.location = target.child(LOCK_NAME)
        self.write_id = write_id
        self._started = time.time()
        self._stop = threading.Event()
        self._lost = threading.Event()  # a heartbeat found the lock broken or taken
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock, breaking a stale one; ConcurrentWriteError when it is held."""
        holder: dict[str, Any] | None = {}
        for _ in range(3):
            try:
                _create_exclusive(self.location, _lock_text(self.write_id, self._started))
                holder = None
                break
            except FileExistsError:
                found, version = _read_lock(self.location)
                holder = found or {}
                stale = _stale(holder, self.location)
                if holder.get("write_id") == self.write_id and not stale:
                    holder = None  # a retried create whose first attempt took effect
                    break
                if not stale:  # (a stale lock of this write id: a resumed write's crash)
                    break
                self._break(version)
        if holder is not None:
            raise ConcurrentWriteError(
                f"Another write to this dataset is in progress: {self._holder(holder)}. Fix: "
                "wait for that write to finish or write to another path; if no writer is "
                f"running, the lock expires {LOCK_TIMEOUT_S:.0f} s after its last heartbeat, "
                f"or delete {self.location.url}."
            )
        self._thread = threading.Thread(
            target=self._beat, name=f"feedline-lock-{self.write_id}", daemon=True
        )
        self._thread.start()

    def _holder(self, holder: dict[str, Any]) -> str:
        beat = holder.get("heartbeat")
        age = f"{time.time() - beat:.0f} s ago" if isinstance(beat, int | float) else "unknown"
        return (
            f"{self.location.url} is held by write {holder.get('write_id', '?')!s:.40} (pid "
            f"{holder.get('pid', '?')!s:.20} on host {holder.get('host', '?')!s:.80}, last "
            f"heartbeat {age})"
        )

    def _break(self, version: str | None) -> None:
        """Delete the stale lock just read (on S3: only if it is still that very lock)."""
        with contextlib.suppress(FileNotFoundError):
            if version is not None and conditional(self.location):
                self.location.fs.delete_if(self.location.path, version)
            else:
                self.location.fs.rm_file(self.location.path)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if not self.refresh():
                    return  # broken or taken: stop; the commit's check fails cleanly
            except Exception:  # noqa: BLE001 - a missed beat only shortens the lease
                continue

    def refresh(self) -> bool:
        """Rewrite the heartbeat if the lock is still this write's; False (and the lock counts
        as lost from then on) when it is not. On S3 the rewrite is conditional on the lock
        read, so a lock broken or taken in between is never overwritten."""
        doc, version = _read_lock(self.location)
        if doc is None or doc.get("write_id") != self.write_id:
            self._lost.set()
            return False
        text = _lock_text(self.write_id, self._started)
        if version is not None and conditional(self.location):
            if self.location.fs.write_if(self.location.path, text, version) is None:
                self._lost.set()
                return False
        else:
            self.location.fs.pipe_file(self.location.path, text)
        return True

    def held(self) -> bool:
        """True while the lock file is this write's (and no heartbeat found it lost)."""
        if self._lost.is_set():
            return False
        doc, _ = _read_lock(self.location)
        return (doc or {}).get("write_id") == self.write_id

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with contextlib.suppress(Exception):  # an abandoned lock expires by itself
            doc, version = _read_lock(self.location)
            if (doc or {}).get("write_id") != self.write_id:
                return
            if version is not None and conditional(self.location):
                self.location.fs.delete_if(self.location.path, version)  # only this lock
            else:
                self.location.fs.rm_file(self.location.path)
