"""How staged rows travel from the node that read them to the node whose ranks read them.

Staging an epoch (:mod:`feedline.loader.data.staging.stager`) reads each row once across the
cluster: node ``n`` reads its share of the row groups and *sends* every row to the bucket of
each destination ``(rank, positions)`` it has in the epoch's order; each rank then
*receives* its buckets from every node and puts each bucket in order in memory as it is
served (:mod:`feedline.loader.data.staging.buckets`).

:class:`StorageExchange` does it through a folder every node can read and write
(``stage_dir=``: a shared file system for several nodes; a local folder for one node,
``<cache_dir>/staged/exchange`` by default): per sender and destination node, one file per
bucket (cut as the receiver published: its ``bucket_rows``, from its own memory budget), then
a completion marker listing each file's size and CRC-32, written last by an
atomic rename. A receiver reads a sender's files only once its marker is there, each file
whole in one sequential read, checked against the marker before any row of it is used.
Each receiver owns its inbox: an epoch's files and markers stay while a rank of the node
reads them (a shared lock) and until the node stages a later epoch (they are the finished
stage that a restart within the epoch reuses), then it deletes them. A sender sends to
every node whose inbox lacks its marker, also when its own node's inbox is complete (a
receiver restarted from an older checkpoint gets the rows again); a sender killed mid-way
leaves no marker and its next run rewrites its files. One read of the data per epoch across
the cluster, one write and one sequential read of it through the exchange.

Bucket files are written and read with ``O_DIRECT`` where the file system takes it (a local
disk; a file system that refuses it at open, such as tmpfs, gets buffered I/O, and one that
takes it at open but refuses a transfer has ``O_DIRECT`` cleared on that file and the
transfer retried): each open file's
bytes gather in a page-aligned buffer (together a quarter of ``memory_budget``, set by the
stager) that writer threads write out at its offset while the next rows are routed. The
node's share never sits in the page cache as dirty pages waiting for writeback, which in a
memory cgroup are charged to the job and cannot be dropped (they got the loader OOM-killed
at a 300 MiB limit), and reading a bucket back evicts nothing.

Why storage first: it needs no process group, no extra port and no Ray, works between
separately started jobs and restarts, and its traffic is large sequential files, which
shared file systems and object stores serve well. A ``torch.distributed`` (gloo/NCCL
all-to-all) or Ray object-store exchange fits the same interface (:class:`Exchange`:
``publish`` / ``layout`` / ``send`` / ``delivered`` / ``wait`` / ``complete`` / ``tables`` /
``held`` / ``release``); neither is written yet.

Examples
--------
>>> import tempfile
>>> ex = StorageExchange(tempfile.mkdtemp(), "k", node=0, nodes=1)
>>> keys = [("x", np.dtype("<f8"), ())]
>>> out = ex.send("order", 0, to_node=0)
>>> out.write(0, 0, pack_rows(np.array([1, 0]), {"x": np.array([2.5, 1.5])}))
>>> out.commit()
>>> ex.wait("order", 0, timeout=1)
>>> [table] = ex.tables("order", 0, 0, 0, keys)
>>> positions, rows = split_rows(table, keys)
>>> positions.tolist(), rows["x"].tolist()
([1, 0], [2.5, 1.5])
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from feedline.errors import IntegrityError, StorageError
from feedline.io.storage.local_files import open_regular_fd
from feedline.store.commit import fsync_dir

try:  # ISA-L's CRC-32 (the ``isal`` package): the same value, about 10x zlib's speed
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the same function, slower
    from zlib import crc32

__all__ = [
    "FORMAT",
    "IN_FLIGHT",
    "WAIT_TIMEOUT",
    "Exchange",
    "Outbox",
    "StorageExchange",
    "pack_rows",
    "row_layout",
    "split_rows",
]

#: seconds a receiver waits for the other nodes' markers before it gives up
WAIT_TIMEOUT = 3600.0
#: the bucket files' layout: rows of a fixed width, each its position and its arrays' bytes
#: (:func:`row_layout`); a marker of another format is an inbox to send again
FORMAT = 2
#: bytes buffered per open bucket file while sending (one file per bucket of every rank is
#: open: their buffers add up), a multiple of the page size
_BUFFER = 64 << 10
#: what ``O_DIRECT`` transfers are aligned to (offsets, lengths and memory)
_PAGE = 4096
#: threads writing bucket files (several writes at once keep the disk busier than one) ...
_WRITERS = 6
#: ... and buffers handed to them at most (waiting or being written), beside each open file's
#: own: with one rank, 6 and 12 against 3 and 6 ran 3-5% faster in each of 4 alternating
#: pairs on the bench's disk (staged_shuffle.py, 1 node), at the same cgroup peak
IN_FLIGHT = 12

#: a stored array's key, dtype and one row's shape
ArrayLayout = tuple[str, np.dtype, tuple[int, ...]]


class Outbox(Protocol):
    """One sender's rows for one destination node and epoch."""

    def write(self, rank: int, bucket: int, block: np.ndarray) -> None:
        """Send rows to ``rank``'s ``bucket``: ``block``, made by :func:`pack_rows` (copied
        before this returns: the caller may reuse its memory)."""

    def commit(self) -> None:
        """Everything is sent: the receiver may read it."""

    def abort(self) -> None:
        """Drop what was written (an error stopped the sender)."""


class Exchange(Protocol):
    """The rows' way between nodes (see the module docs)."""

    def send(self, plan: str, epoch: int, to_node: int, buffer: int = ...,
             aside: bool = False) -> Outbox: ...  # fmt: skip

    def publish(self, plan: str, epoch: int, layout: Mapping[str, Any]) -> None: ...

    def layout(
        self, plan: str, epoch: int, node: int, timeout: float | None = WAIT_TIMEOUT
    ) -> dict[str, Any] | None: ...

    def delivered(self, plan: str, epoch: int, to_node: int) -> bool: ...

    def wait(self, plan: str, epoch: int, timeout: float = WAIT_TIMEOUT) -> None: ...

    def complete(self, plan: str, epoch: int) -> bool: ...

    def tables(
        self, plan: str, epoch: int, rank: int, bucket: int, arrays: Sequence[ArrayLayout]
    ) -> Iterator[np.ndarray]: ...

    def held(self) -> list[tuple[str, int]]: ...

    def release(self, plan: str, epoch: int) -> None: ...


def row_layout(arrays: Sequence[ArrayLayout]) -> tuple[int, list[int]]:
    """The bytes of one row in a bucket file (:data:`FORMAT` 2), and where each array's
    part of it starts: the row's position (int64) first, then each array's bytes, each at a
    multiple of its item size, the row padded to a multiple of 8 (so every part of every
    row is aligned).

    Examples
    --------
    >>> row_layout([("a", np.dtype("<f4"), (3,)), ("b", np.dtype("u1"), ())])
    (24, [8, 20])
    """
    at, starts = 8, []
    for _key, dtype, shape in arrays:
        at = -(-at // dtype.itemsize) * dtype.itemsize
        starts.append(at)
        at += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return -(-at // 8) * 8, starts


def pack_rows(positions: np.ndarray, rows: Mapping[str, np.ndarray],
              picked: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Rows as a bucket file holds them (:func:`row_layout`): ``positions`` and the rows of
    ``rows`` (arrays keyed as the storage; with ``picked``, those rows of them), one row of
    bytes each; a slice of rows is what :meth:`Outbox.write` sends.

    Examples
    --------
    >>> block = pack_rows(np.array([7, 9]), {"x": np.array([[1.0], [2.0], [3.0]])},
    ...                   np.array([2, 0]))
    >>> block.shape
    (2, 16)
    >>> block[:, 8:].copy().view("<f8").ravel().tolist()
    [3.0, 1.0]
    """
    n = len(positions)
    arrays = [(k, a.dtype, a.shape[1:]) for k, a in rows.items()]
    width, starts = row_layout(arrays)
    block = np.zeros((n, width), np.uint8) if width > 8 + _parts(arrays) else np.empty(
        (n, width), np.uint8)  # fmt: skip
    block[:, :8] = np.asarray(positions).astype("<i8").view(np.uint8).reshape(n, 8)
    for a, at in zip(rows.values(), starts, strict=True):
        part = np.ascontiguousarray(a).reshape(len(a), -1).view(np.uint8)
        block[:, at : at + part.shape[1]] = part if picked is None else part[picked]
    return block


def _parts(arrays: Sequence[ArrayLayout]) -> int:
    """The bytes of one row's arrays together (without padding)."""
    return sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, dtype, shape in arrays)


class _FileOutbox:
    """``final``: the folder the files are moved to at commit (they are written aside, in
    ``folder``, by a sender that holds no lock while it writes)."""

    def __init__(self, folder: Path, marker: Path, buffer: int = _BUFFER,
                 final: Path | None = None) -> None:  # fmt: skip
        self.folder, self.marker, self.final = folder, marker, final
        self._files: dict[str, _BucketFile] = {}
        self._direct = hasattr(os, "O_DIRECT")  # until the folder's file system refuses it
        self._buffer = max(_PAGE, int(buffer) // _PAGE * _PAGE)
        shutil.rmtree(folder, ignore_errors=True)  # a killed sender's leftovers
        folder.mkdir(parents=True, exist_ok=True)
        self._writer = _Writer(self._buffer)

    def write(self, rank: int, bucket: int, block: np.ndarray) -> None:
        name = f"r{rank}.b{bucket}"
        handle = self._files.get(name)
        if handle is None:
            handle = self._files[name] = self._open(self.folder / name)
        handle.write(np.ascontiguousarray(block).reshape(-1).data)

    def _open(self, path: Path) -> _BucketFile:
        if self._direct:
            try:
                return _BucketFile(path, self._writer, direct=True)
            except OSError as exc:  # e.g. tmpfs: EINVAL
                if exc.errno != errno.EINVAL:
                    raise
                self._direct = False
        return _BucketFile(path, self._writer, direct=False)

    def flush(self) -> None:
        """Write out what every bucket file holds so far (its whole pages with ``O_DIRECT``)."""
        for handle in self._files.values():
            handle.flush()
        self._writer.drain()

    def commit(self) -> None:
        # no fsync: a file that lost bytes in a crash of the machine fails its marker's size
        # or CRC-32 check before any row of it is used (and is sent again), and forcing 2x the
        # node's share to the disk here would stall pass 1 on the writeback
        for handle in self._files.values():
            handle.finish()
        self._writer.finish()
        files = {}
        for name, handle in self._files.items():
            handle.close()
            files[name] = [handle.size, handle.crc]
        self._files = {}
        if self.final is not None:  # the files into place (a sender's partial ones dropped)
            shutil.rmtree(self.final, ignore_errors=True)
            os.replace(self.folder, self.final)
        tmp = self.marker.with_name(self.marker.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"files": files, "format": FORMAT}))
        os.replace(tmp, self.marker)
        fsync_dir(self.marker.parent)

    def abort(self) -> None:
        with contextlib.suppress(Exception):  # what was handed over first (same descriptors)
            self._writer.finish()
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close(cut=False)
        self._files = {}
        shutil.rmtree(self.folder, ignore_errors=True)


class _Writer:
    """Writes buffers to their files at their offsets (``pwrite``) in :data:`_WRITERS`
    threads of their own, so that routing the next rows overlaps the disk and the disk sees
    several writes at once; at most :data:`IN_FLIGHT` buffers wait or are being written
    (each ``size`` bytes, page-aligned: anonymous maps; the stager counts them in the write
    buffers' share of the budget)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[mmap.mmap] = []
        self._slots = threading.Semaphore(IN_FLIGHT)
        self._queue: queue.Queue[tuple[int, mmap.mmap, int, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []

    def buffer(self) -> mmap.mmap:
        """A free buffer (one written out before, or a new one)."""
        try:
            return self._free.pop()
        except IndexError:
            return mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE)

    def submit(self, fd: int, buffer: mmap.mmap, length: int, offset: int) -> None:
        """Write ``buffer[:length]`` to ``fd`` at ``offset``; the buffer is the writer's
        from now on."""
        self._check()
        self._slots.acquire()
        if not self._threads:
            for _ in range(_WRITERS):
                thread = threading.Thread(target=self._run, name="feedline-stage-write",
                                          daemon=True)  # fmt: skip
                thread.start()
                self._threads.append(thread)
        self._queue.put((fd, buffer, length, offset))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fd, buffer, length, offset = item
            try:
                if self._error is None:
                    view, done = memoryview(buffer), 0
                    while done < length:
                        try:
                            done += os.pwrite(fd, view[done:length], offset + done)
                        except OSError as exc:  # O_DIRECT taken at open, refused here
                            if exc.errno != errno.EINVAL or not _drop_direct(fd):
                                raise
            except BaseException as exc:  # noqa: BLE001 (raised in the sender)
                self._error = exc
            finally:
                self._free.append(buffer)
                self._slots.release()
                self._queue.task_done()
        self._queue.task_done()

    def drain(self) -> None:
        """Wait until every buffer handed over is written."""
        if self._threads:
            self._queue.join()
        self._check()

    def finish(self) -> None:
        """Write everything handed over, then stop the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._free = []
        self._check()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error


class _BucketFile:
    """One bucket file being written: its bytes gathered in a page-aligned buffer and
    handed to the outbox's :class:`_Writer` a whole buffer at a time, with ``O_DIRECT``
    where the file system takes it (``direct``): the rows go from the buffer to the disk
    without the page cache, so no dirty page of the node's share is charged to its memory
    (or its cgroup) waiting for writeback, and reading them back evicts nothing; the file
    is cut to its size at the end. Its size and CRC-32 are counted as it is written."""

    def __init__(self, path: Path, writer: _Writer, direct: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
        self.fd = os.open(path, flags, 0o644)
        self.direct, self.writer = direct, writer
        self.buffer = writer.buffer()
        self.filled = self.size = self.crc = self.offset = 0

    def write(self, data: memoryview) -> None:
        self.crc, self.size = crc32(data, self.crc), self.size + len(data)
        done, total, room = 0, len(data), self.writer.size
        source = np.frombuffer(data, np.uint8)
        while done < total:
            n = min(total - done, room - self.filled)
            # a NumPy copy: it lets go of the GIL (an mmap slice assignment holds it)
            np.frombuffer(self.buffer, np.uint8, n, self.filled)[:] = source[done : done + n]
            self.filled += n
            done += n
            if self.filled == room:
                self._hand_over(room)

    def _hand_over(self, length: int) -> None:
        """Hand ``buffer[:length]`` to the writer; keep the rest in a fresh buffer."""
        rest = self.filled - length
        fresh = self.writer.buffer()
        if rest:
            fresh[:rest] = self.buffer[length : self.filled]
        self.writer.submit(self.fd, self.buffer, length, self.offset)
        self.buffer, self.filled, self.offset = fresh, rest, self.offset + length

    def flush(self) -> None:
        """Hand over what the buffer holds (with ``O_DIRECT``, its whole pages: the rest
        stays)."""
        whole = self.filled // _PAGE * _PAGE if self.direct else self.filled
        if whole:
            self._hand_over(whole)

    def finish(self) -> None:
        """Hand over the rest (``O_DIRECT`` writes whole pages: the last one padded, cut
        off by :meth:`close`)."""
        end = -(-self.filled // _PAGE) * _PAGE if self.direct else self.filled
        if end:
            self.filled = end
            self._hand_over(end)

    def close(self, cut: bool = True) -> None:
        """Cut the file to its size (after the writer wrote it all) and close it."""
        try:
            if cut:
                os.ftruncate(self.fd, self.size)
        finally:
            os.close(self.fd)


class StorageExchange:
    """Buckets as files in ``folder`` (see the module docs); ``key`` names the dataset, the
    columns and the order, so runs with other data or another order never mix."""

    def __init__(self, folder: str | os.PathLike[str], key: str, *, node: int, nodes: int) -> None:
        self.root = Path(folder) / key
        self.node, self.nodes = int(node), int(nodes)
        self._markers: dict[tuple[str, int, int], dict[str, list[int]]] = {}

    def _epoch(self, plan: str, epoch: int) -> Path:
        return self.root / plan / f"e{epoch}"

    def _marker(self, plan: str, epoch: int, to_node: int, from_node: int) -> Path:
        return self._epoch(plan, epoch) / f"to{to_node}" / f"from{from_node}.done"

    def send(self, plan: str, epoch: int, to_node: int, buffer: int = _BUFFER,
             aside: bool = False) -> Outbox:  # fmt: skip
        """This node's outbox for ``to_node`` in epoch ``epoch`` of the order ``plan``
        (earlier partial files dropped), ``buffer`` bytes buffered per bucket file;
        ``aside``: its files are written in a folder of their own and moved into place by
        :meth:`Outbox.commit` (the sender holds the epoch's lock only to commit)."""
        inbox = self._epoch(plan, epoch) / f"to{to_node}"
        marker = self._marker(plan, epoch, to_node, self.node)
        final = inbox / f"from{self.node}"
        try:
            if aside:
                folder = inbox / f"from{self.node}.aside.{os.getpid()}.{uuid.uuid4().hex[:12]}"
                return _FileOutbox(folder, marker, buffer, final)
            return _FileOutbox(final, marker, buffer)
        except OSError as exc:
            raise StorageError(
                f"Cannot write the staging exchange folder {str(inbox)!r}: {exc}. Fix: pass a "
                "writable stage_dir= (a folder every node can reach) to the loader."
            ) from exc

    def publish(self, plan: str, epoch: int, layout: Mapping[str, Any]) -> None:
        """Say how this node takes its rows in ``epoch`` (its ``bucket_rows``): senders cut
        buckets as the receiver does, whatever each node's own memory budget."""
        path = self._epoch(plan, epoch) / f"to{self.node}" / "layout.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"layout.json.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dict(layout)))
            os.replace(tmp, path)
        except OSError as exc:
            raise StorageError(
                f"Cannot write the staging exchange folder {str(path.parent)!r}: {exc}. Fix: "
                "pass a writable stage_dir= (a folder every node can reach) to the loader."
            ) from exc

    def layout(
        self, plan: str, epoch: int, node: int, timeout: float | None = WAIT_TIMEOUT
    ) -> dict[str, Any] | None:
        """What ``node`` published for ``epoch`` (waiting up to ``timeout`` seconds for it;
        ``timeout=None``: ``None`` at once when it is not there)."""
        path = self._epoch(plan, epoch) / f"to{node}" / "layout.json"
        deadline, pause = time.monotonic() + (timeout or 0), 0.005
        while True:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return dict(json.loads(path.read_text()))
            if timeout is None:
                return None
            if time.monotonic() > deadline:
                raise StorageError(
                    f"Staging epoch {epoch}: node {node} did not start staging it within "
                    f"{timeout:.0f} s (no {str(path)!r}). Fix: check that every node's loader "
                    "runs with the same stage_dir= (a shared folder), world_size and "
                    "ranks_per_node, and that none failed."
                )
            time.sleep(pause)
            pause = min(0.5, pause * 2)

    def delivered(self, plan: str, epoch: int, to_node: int) -> bool:
        """Whether this node's rows for ``to_node`` in ``epoch`` were all sent."""
        return self._marker(plan, epoch, to_node, self.node).is_file()

    def wait(self, plan: str, epoch: int, timeout: float = WAIT_TIMEOUT) -> None:
        """Block until every node's rows for this node in ``epoch`` are sent."""
        deadline, pause = time.monotonic() + timeout, 0.005
        while True:
            missing = [n for n in range(self.nodes) if (plan, epoch, n) not in self._markers]
            for n in missing:
                path = self._marker(plan, epoch, self.node, n)
                with contextlib.suppress(FileNotFoundError, ValueError):
                    marker = json.loads(path.read_text())
                    if marker.get("format") != FORMAT:
                        raise IntegrityError(
                            f"The staging marker {str(path)!r} was written in another bucket "
                            f"file format ({marker.get('format', 1)}, this feedline reads "
                            f"{FORMAT}). Fix: run one feedline version on every node."
                        )
                    self._markers[plan, epoch, n] = marker["files"]
            missing = [n for n in range(self.nodes) if (plan, epoch, n) not in self._markers]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise StorageError(
                    f"Staging epoch {epoch}: nodes {missing} sent no rows to node {self.node} "
                    f"within {timeout:.0f} s (no marker under {str(self._epoch(plan, epoch))!r}). "
                    "Fix: check that every node's loader runs with the same stage_dir= (a "
                    "shared folder), world_size and ranks_per_node, and that none failed."
                )
            time.sleep(pause)
            pause = min(0.5, pause * 2)

    def complete(self, plan: str, epoch: int) -> bool:
        """Whether every node's rows for this node in ``epoch`` are here (an earlier run's
        inbox, or another rank's of the node): then :meth:`tables` may be read. A sender's
        rows whose files are not the size its marker says are dropped, marker and all, so
        that sender sends them again; so are rows in another :data:`FORMAT` (an earlier
        feedline's)."""
        whole = True
        for n in range(self.nodes):
            path = self._marker(plan, epoch, self.node, n)
            try:
                marker = json.loads(path.read_text())
                files: dict[str, list[int]] = marker["files"]
                current = marker.get("format") == FORMAT
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                whole = False
                continue
            folder = path.parent / f"from{n}"
            if current and all(_sized(folder / name, size) for name, (size, _) in files.items()):
                self._markers[plan, epoch, n] = files
                continue
            path.unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
            self._markers.pop((plan, epoch, n), None)
            whole = False
        return whole

    def tables(
        self, plan: str, epoch: int, rank: int, bucket: int, arrays: Sequence[ArrayLayout]
    ) -> Iterator[np.ndarray]:
        """The rows each sender sent for ``rank``'s ``bucket`` (after :meth:`wait`), a table
        of bytes per sender (:func:`split_rows`), checked against its marker as it is read."""
        name = f"r{rank}.b{bucket}"
        for n in range(self.nodes):
            expected = self._markers[plan, epoch, n].get(name)
            if expected is None:
                continue
            path = self._epoch(plan, epoch) / f"to{self.node}" / f"from{n}" / name
            yield _read_table(path, arrays, int(expected[0]), int(expected[1]))

    def held(self) -> list[tuple[str, int]]:
        """The ``(plan, epoch)`` pairs this node's inbox holds rows or markers of."""
        found = []
        for old in self.root.glob(f"*/e*/to{self.node}"):
            with contextlib.suppress(ValueError):
                found.append((old.parent.parent.name, int(old.parent.name[1:])))
        return found

    def release(self, plan: str, epoch: int) -> None:
        """Drop the rows and markers addressed to this node in ``epoch`` of ``plan`` (the
        caller holds that epoch's lock: no process of the node is staging it). Its layout goes
        first: a sender sends only to a node whose layout is there and whose marker from it is
        not, so none starts sending (reading its share again for nothing) while the markers
        are being deleted."""
        folder = self._epoch(plan, epoch)
        with contextlib.suppress(OSError):
            (folder / f"to{self.node}" / "layout.json").unlink()
        shutil.rmtree(folder / f"to{self.node}", ignore_errors=True)
        for empty in (folder, folder.parent):
            with contextlib.suppress(OSError):
                empty.rmdir()
        self._markers = {k: v for k, v in self._markers.items() if k[:2] != (plan, epoch)}


def _sized(path: Path, size: int) -> bool:
    """Whether ``path`` is there and ``size`` bytes long."""
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _drop_direct(fd: int) -> bool:
    """Clear ``O_DIRECT`` on ``fd`` (a file system that took it at open but refuses its
    transfers, e.g. some network or FUSE ones): the transfer is then retried through the
    page cache. ``False`` when ``fd`` had no ``O_DIRECT`` (the error is another's).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     _drop_direct(f.fileno())
    False
    """
    direct = getattr(os, "O_DIRECT", 0)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if not direct or not flags & direct:
        return False
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~direct)
    return True


def _open_read(path: Path) -> int:
    """A descriptor of the regular file ``path`` for reading, with ``O_DIRECT`` where its
    file system takes it (the bytes go from the disk to the reader's buffer: no page cache
    to fill and evict)."""
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        with contextlib.suppress(OSError):
            return open_regular_fd(str(path), os.O_RDONLY | direct)
    return open_regular_fd(str(path), os.O_RDONLY)


def _read_table(path: Path, arrays: Sequence[ArrayLayout], size: int, crc: int) -> np.ndarray:
    """The rows of one bucket file, a ``(rows, width)`` table of bytes (:func:`row_layout`):
    the file read whole in one sequential read (past the page cache, or its pages dropped
    from it after), its size and CRC-32 compared with the sender's marker before it is
    returned."""
    where = f"the staging exchange file {str(path)!r}"
    mismatch = IntegrityError(
        f"{where} is shorter or longer than its sender's marker says ({size} bytes). Fix: "
        "delete the stage_dir folder of this epoch and restart."
    )
    try:
        fd = _open_read(path)
    except (OSError, IntegrityError) as exc:
        raise IntegrityError(
            f"Cannot read {where}: {exc}. Fix: check that stage_dir= is shared by every node "
            "and that nothing deletes files in it while the loaders run."
        ) from exc
    width, _ = row_layout(arrays)
    try:
        if size < 0 or os.fstat(fd).st_size != size:  # checked before the buffer is made
            raise mismatch
        if size % width:
            raise IntegrityError(
                f"{where} holds a damaged row: {size} bytes are not whole rows of {width}. "
                "Fix: delete the stage_dir folder of this epoch and restart."
            )
        padded = -(-max(1, size) // _PAGE) * _PAGE  # O_DIRECT reads whole pages
        data = np.frombuffer(mmap.mmap(-1, padded, flags=mmap.MAP_PRIVATE), np.uint8, padded)
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        view, done = memoryview(data.data), 0
        while done < padded:
            try:
                n = os.readv(fd, [view[done:]])
            except OSError as exc:  # O_DIRECT taken at open, refused here
                if exc.errno != errno.EINVAL or not _drop_direct(fd):
                    raise
                continue
            if not n:
                break
            done += n
        longer = os.fstat(fd).st_size != size
        with contextlib.suppress(OSError, AttributeError):  # read once: leave the room
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    view = view[:size]
    if done != size or longer:  # changed while it was read
        raise mismatch
    if crc32(view) != crc:
        raise IntegrityError(
            f"{where} does not match its sender's marker (CRC-32 or size). Fix: delete the "
            "stage_dir folder of this epoch and restart."
        )
    count = size // width
    return data[: count * width].reshape(count, width)


def split_rows(
    table: np.ndarray, arrays: Sequence[ArrayLayout]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A table of rows (:func:`pack_rows`, or a bucket file's) as its positions and arrays:
    strided views of it.

    Examples
    --------
    >>> table = pack_rows(np.array([4, 2]), {"x": np.array([[1.5], [2.5]])})
    >>> positions, rows = split_rows(table, [("x", np.dtype("<f8"), (1,))])
    >>> positions.tolist(), rows["x"].ravel().tolist()
    ([4, 2], [1.5, 2.5])
    """
    _width, starts = row_layout(arrays)
    count = len(table)
    positions = table[:, :8].view("<i8").reshape(count)
    rows: dict[str, Any] = {}
    for (key, dtype, shape), at in zip(arrays, starts, strict=True):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        rows[key] = table[:, at : at + nbytes].view(dtype).reshape(count, *shape)
    return positions, rows
