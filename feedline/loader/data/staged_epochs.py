"""``cache="staged"``: each epoch written ahead, in each rank's read order, then read sequentially.

The exact shuffle of ``cache="memory"`` needs the whole dataset in memory (or, with
``cache="node"``, paged at random from a node-wide file: a few 4 KiB faults per row). But the
order of every epoch is a pure function known in advance (:func:`~feedline.loader.order.
stage_routes.stage_plan`), so the rows can be *staged*: put, before the epoch, into one file
per rank in the order the rank reads them. The rank then reads its file front to back.

Staging an epoch is a two-pass external shuffle that holds a bounded amount of memory:

1. each node reads its share of the row groups, sequentially (all of them for one node;
   :func:`~feedline.loader.order.stage_routes.node_row_groups` for several), and sends each
   row to the bucket of each of its destinations ``(rank, position)``: buckets of
   ``bucket_rows`` consecutive positions of one rank, a quarter of ``memory_budget`` each,
   written as files through the exchange (:mod:`feedline.loader.data.stage_exchange`);
2. each node takes its ranks' buckets one by one from every sender, puts each in order in
   memory and appends it to the rank's staged file.

Across the cluster each row is read from the dataset once per epoch. A *node* is a group of
``ranks_per_node`` consecutive ranks (torchrun's ``LOCAL_WORLD_SIZE``; by default all ranks
are on one node); one process of the node (whichever takes the epoch's lock first) stages
the files of all its ranks, the others wait for them.

Pipelining: the first epoch is staged before its first batch (this rank's file first, and
its first bucket is served as soon as it is written); every later epoch is staged by a
background thread while the one before it trains. ``Loader.stats()["staged_epochs"]`` and
``Loader.metrics()`` report each epoch's staging time and whether it was hidden (the loop
waited for it less than 5% of it).

Safety: a staged file is written under a temporary name, then its header (sizes, the
rank's row indices' CRC-32, the plan's key), then renamed into place after an ``fsync``: a
stager killed mid-way leaves a temporary file (removed by the next stager), never a file
at the final name. Opening one checks its size, header and row indices against the plan;
anything else is re-staged. Every batch is also checked against the plan: the rows served
for row indices ``i`` are the rows the file holds for ``i``, so the batches, their order and
``state_dict()`` are exactly those of ``cache="memory"``.

Disk: a node holds its ranks' files of two epochs and the buckets of one, about three
times its share of the data (in ``<cache_dir>/staged``; delete it to reclaim old runs').

Examples
--------
>>> import feedline as fl, tempfile
>>> ds = fl.open(fl.range(100).write(tempfile.mkdtemp() + "/ds", row_group_rows=10).path)
>>> staged = ds.loader(batch_size=8, cache="staged", format="numpy", seed=3,
...                    cache_dir=tempfile.mkdtemp())
>>> memory = ds.loader(batch_size=8, cache="memory", format="numpy", seed=3)
>>> all((a["id"] == b["id"]).all() for a, b in zip(staged, memory))
True
>>> staged.stats()["cache"]
'staged'
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import struct
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, FeedlineError, IntegrityError, StorageError
from feedline.io.storage.local_files import open_regular
from feedline.loader.data.cache_files import open_lock, remove_entry
from feedline.loader.data.memory_cache import FileLayout, _checked, fill_arrays, read_rows
from feedline.loader.data.packed_columns import Packing, column_views, gather_packed
from feedline.loader.data.stage_exchange import (
    WAIT_TIMEOUT,
    ArrayLayout,
    Exchange,
    StorageExchange,
)
from feedline.loader.order.stage_routes import (
    StagePlan,
    check_nodes,
    node_of,
    node_row_groups,
    routes,
)
from feedline.store.commit import fsync_dir

__all__ = ["StagedEpochs", "staged_dir"]

logger = logging.getLogger(__name__)

MAGIC = b"FLSTAGE\x01"
VERSION = 1
ALIGN = 4096
#: magic, version, header bytes, header CRC-32
_PREAMBLE = struct.Struct("<8sIII")
#: a bucket holds at most this share of ``memory_budget`` (it is put in order in memory)
BUCKET_SHARE = 4
#: row groups decoded ahead (each by its own thread) while the stager routes one
READ_AHEAD = 2
#: the loop waited less than this share of an epoch's staging: the staging was hidden
HIDDEN_SHARE = 0.05


def staged_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The folder of staged files: ``<cache_dir>/staged`` (``~/.cache/feedline/staged``).

    Examples
    --------
    >>> staged_dir("/scratch/fl").as_posix()
    '/scratch/fl/staged'
    """
    base = Path(cache_dir).expanduser() if cache_dir else Path("~/.cache/feedline").expanduser()
    return base / "staged"


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# --------------------------------------------------------------------------- staged files


@dataclass
class _Staged:
    """One rank's rows of one epoch, in read order: ``ids`` (its row indices) and
    ``storage`` (arrays keyed as the packing's, views of a file or in memory); rows
    ``[0, ready)`` are in place."""

    ids: np.ndarray
    storage: dict[str, np.ndarray]
    path: Path | None = None
    ready: int = 0
    complete: bool = False
    error: BaseException | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)
    _memory: Any = None
    _sorted: np.ndarray | None = None

    def advance(self, rows: int, complete: bool = False) -> None:
        with self.changed:
            self.ready, self.complete = rows, self.complete or complete
            self.changed.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.changed:
            self.error = error
            self.changed.notify_all()

    def wait(self, rows: int) -> float:
        """Block until rows ``[0, rows)`` are in place; the seconds waited."""
        if self.ready >= rows:
            return 0.0
        start = time.perf_counter()
        with self.changed:
            while self.ready < rows and self.error is None:
                self.changed.wait(0.5)
        if self.ready < rows and self.error is not None:
            raise self.error
        return time.perf_counter() - start

    def locate(self, indices: np.ndarray) -> np.ndarray | None:
        """Positions holding rows ``indices`` (any, for a repeated row), or ``None``."""
        if self._sorted is None:
            self._sorted = np.argsort(self.ids, kind="stable")
        keys = self.ids[self._sorted]
        at = np.searchsorted(keys, indices)
        at = np.minimum(at, max(0, keys.size - 1))
        if keys.size == 0 or not np.array_equal(keys[at], indices):
            return None
        return self._sorted[at]

    def close(self) -> None:
        self.storage = {}
        if self._memory is not None:
            with contextlib.suppress(BufferError):
                self._memory.close()
            self._memory = None


def _arrays(packing: Packing) -> list[ArrayLayout]:
    """The storage arrays of ``packing``: key, dtype and one row's shape, in order."""
    return [(k, a.dtype, a.shape[1:]) for k, a in packing.allocate(0).items()]


def _file_layout(arrays: Sequence[ArrayLayout], rows: int) -> tuple[list[dict[str, Any]], int]:
    """Each array's offset (the row indices first) and the file's bytes after the header."""
    out, at = [{"key": "\x00ids", "offset": 0, "nbytes": rows * 8}], _round(rows * 8)
    for key, dtype, shape in arrays:
        nbytes = rows * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out.append({"key": key, "dtype": dtype.str, "shape": list(shape), "offset": at,
                    "nbytes": nbytes})  # fmt: skip
        at = _round(at + nbytes)
    return out, at


def _views(memory: Any, layout: Sequence[dict[str, Any]], base: int, rows: int
           ) -> dict[str, np.ndarray]:  # fmt: skip
    out = {}
    for a in layout[1:]:
        dtype = np.dtype(a["dtype"])
        count = a["nbytes"] // dtype.itemsize
        out[a["key"]] = np.frombuffer(memory, dtype, count, base + a["offset"]).reshape(
            rows, *a["shape"]
        )
    return out


HEADER_BYTES = 16 * ALIGN


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` (one call may write less)."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


class _Sink:
    """A staged file being written: a temporary file, mapped read-only for serving."""

    def __init__(self, path: Path, arrays: Sequence[ArrayLayout], ids: np.ndarray,
                 meta: Mapping[str, Any]) -> None:  # fmt: skip
        self.path, self.rows = path, len(ids)
        self.layout, data_bytes = _file_layout(arrays, self.rows)
        self.base = HEADER_BYTES
        self.size = self.base + data_bytes
        tmp_dir = path.parent / ".tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp_dir / f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                os.posix_fallocate(self.fd, 0, max(1, self.size))
            except OSError as exc:
                raise StorageError(
                    f"Cannot reserve {self.size} bytes for the staged file {str(self.tmp)!r}: "
                    f"{exc}. Fix: free disk space there or pass another cache_dir= (a local "
                    "disk with room for about three times this node's share of the data)."
                ) from exc
            ids = np.ascontiguousarray(ids, "<i8")
            os.pwrite(self.fd, ids.tobytes(), self.base)
            self.meta = dict(meta) | {"rows": self.rows, "arrays": self.layout,
                                      "ids_crc": zlib.crc32(ids.tobytes()),
                                      "file_bytes": self.size}  # fmt: skip
            memory = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            self.tmp.unlink(missing_ok=True)
            raise
        self.staged = _Staged(ids, _views(memory, self.layout, self.base, self.rows), path,
                              _memory=memory)  # fmt: skip
        self.offsets = {a["key"]: a["offset"] for a in self.layout[1:]}

    def write(self, at: int, rows: Mapping[str, np.ndarray]) -> None:
        for key, values in rows.items():
            row = values.nbytes // max(1, len(values))
            data = np.ascontiguousarray(values).reshape(-1).view(np.uint8).data
            _write_all(self.fd, data, self.base + self.offsets[key] + at * row)

    def complete(self) -> None:
        os.fsync(self.fd)
        text = json.dumps(self.meta).encode()
        if _PREAMBLE.size + len(text) > HEADER_BYTES:
            raise IntegrityError(
                f"The staged file header of {str(self.tmp)!r} outgrew its {HEADER_BYTES} bytes. "
                "Fix: report this bug; meanwhile use cache='memory' or cache='none'."
            )
        os.pwrite(self.fd, _PREAMBLE.pack(MAGIC, VERSION, len(text), zlib.crc32(text)) + text, 0)
        os.fsync(self.fd)
        os.close(self.fd)
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.tmp.unlink(missing_ok=True)


class _MemorySink:
    """A staged epoch held in memory (it fits a quarter of the budget)."""

    def __init__(self, packing: Packing, ids: np.ndarray) -> None:
        self.staged = _Staged(np.asarray(ids, np.int64), packing.allocate(len(ids)))

    def write(self, at: int, rows: Mapping[str, np.ndarray]) -> None:
        for key, values in rows.items():
            self.staged.storage[key][at : at + len(values)] = values

    def complete(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _open_staged(
    path: Path, ids: np.ndarray, meta: Mapping[str, Any]
) -> tuple[_Staged | None, str]:
    """The complete staged file ``path`` holding rows ``ids`` as ``meta`` says, mapped; else
    ``None`` and why not."""
    try:
        handle = open_regular(path, what="the staged file", error=IntegrityError)
    except FileNotFoundError:
        return None, "missing"
    except IntegrityError as exc:
        return None, str(exc).split(";", 1)[0]
    with handle:
        fd = handle.fileno()
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES:
            return None, "truncated"
        magic, version, length, crc = _PREAMBLE.unpack(os.pread(fd, _PREAMBLE.size, 0))
        text = os.pread(fd, min(length, HEADER_BYTES), _PREAMBLE.size)
        if magic != MAGIC or version != VERSION or zlib.crc32(text) != crc:
            return None, "no complete header"
        try:
            header = json.loads(text)
        except ValueError:
            return None, "no complete header"
        if header.get("file_bytes") != size or any(header.get(k) != v for k, v in meta.items()):
            return None, "another plan, or truncated"
        expected = np.ascontiguousarray(ids, "<i8")
        if header.get("rows") != len(expected) or header.get("ids_crc") != zlib.crc32(
            expected.tobytes()
        ):
            return None, "other rows"
        memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    found = np.frombuffer(memory, "<i8", len(expected), HEADER_BYTES)
    if not np.array_equal(found, expected):
        memory.close()
        return None, "other rows"
    if hasattr(memory, "madvise"):
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_SEQUENTIAL)
    rows = len(expected)
    staged = _Staged(expected, _views(memory, header["arrays"], HEADER_BYTES, rows), path,
                     rows, True, _memory=memory)  # fmt: skip
    return staged, ""


@contextlib.contextmanager
def _locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold the lock file ``path``; ``wait=False``: yield ``False`` at once when another
    process (or thread) holds it."""
    import fcntl

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


# --------------------------------------------------------------------------- staging


@dataclass
class _Report:
    """One epoch's staging, as ``Loader.stats()`` shows it."""

    epoch: int
    stage_s: float = 0.0
    wait_s: float = 0.0
    staged_here: bool = False
    rows_read: int = 0
    bytes_read: int = 0
    bytes_sent: int = 0
    buckets: int = 0

    def as_dict(self) -> dict[str, Any]:
        hidden = self.wait_s <= max(0.01, HIDDEN_SHARE * self.stage_s)
        return {"epoch": self.epoch, "stage_s": self.stage_s, "stage_wait_s": self.wait_s,
                "stage_hidden": hidden, "staged_here": self.staged_here,
                "stage_rows_read": self.rows_read, "stage_bytes_read": self.bytes_read,
                "stage_bytes_sent": self.bytes_sent, "stage_buckets": self.buckets}  # fmt: skip


class _Cancelled(Exception):
    """The loader was closed while an epoch was staged (no partial file is kept)."""


class _Task:
    """Staging one epoch for this process's rank: the handle once it exists."""

    def __init__(self, plan: StagePlan) -> None:
        self.plan = plan
        self.report = _Report(plan.epoch)
        self.staged: _Staged | None = None
        self.error: BaseException | None = None
        self.generation = 0  # the owner's, when asked for (close() moves the owner's on)
        self.started = threading.Event()  # the handle (or the error) is there
        self.done = threading.Event()

    def handle(self) -> _Staged:
        if not self.started.is_set():
            start = time.perf_counter()
            self.started.wait()
            self.report.wait_s += time.perf_counter() - start
        if self.staged is None:
            assert self.error is not None
            raise self.error
        return self.staged


class StagedEpochs:
    """The source of a ``cache="staged"`` backend: staged epochs, one session per epoch.

    ``planner(epoch)`` (set by the loader) gives every rank's row indices of that epoch
    (:func:`~feedline.loader.order.stage_routes.stage_plan`).
    """

    nbytes = 0  # held in files (the page cache), not in this process's memory

    def __init__(
        self,
        layout: FileLayout,
        packing: Packing,
        *,
        key: str,
        cache_dir: str | os.PathLike[str] | None,
        stage_dir: str | os.PathLike[str] | None,
        rank: int,
        world_size: int,
        ranks_per_node: int,
        budget: int,
        exchange: Exchange | None = None,
    ) -> None:
        if os.name != "posix":
            raise ConfigurationError(
                "cache='staged' needs POSIX file locks and memory maps (Linux, macOS). Fix: "
                "use cache='memory' or cache='none'."
            )
        unsupported = [c.name for c in packing.singles if c.dtype.hasobject]
        if unsupported:
            raise ConfigurationError(
                f"cache='staged' holds fixed-size numbers and tensors; columns {unsupported} "
                "are strings or binary. Fix: leave them out (columns=[...]) or use "
                "cache='memory' / cache='none'."
            )
        self.layout, self.packing, self.key = layout, packing, key
        self.rank, self.world_size = int(rank), int(world_size)
        self.ranks_per_node = int(ranks_per_node)
        self.nodes = check_nodes(self.world_size, self.ranks_per_node)
        self.node = node_of(self.rank, self.ranks_per_node)
        self.budget = int(budget)
        self.folder = staged_dir(cache_dir) / key
        exchange_dir = Path(stage_dir) if stage_dir else staged_dir(cache_dir) / "exchange"
        if self.nodes > 1 and not stage_dir:
            raise ConfigurationError(
                f"cache='staged' on {self.nodes} nodes (world_size={world_size}, "
                f"ranks_per_node={ranks_per_node}) exchanges rows through a folder every node "
                "reads, and stage_dir= names none. Fix: pass stage_dir= (a shared file system "
                "path), or ranks_per_node=world_size when every rank runs on one machine."
            )
        self.exchange = exchange or StorageExchange(
            exchange_dir, key, node=self.node, nodes=self.nodes
        )
        for sub in ("", ".locks", ".tmp"):
            try:
                (self.folder / sub).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigurationError(
                    f"Cannot create the staging folder {str(self.folder / sub)!r}: {exc}. Fix: "
                    "pass a writable local cache_dir= to the loader."
                ) from exc
        self.arrays = _arrays(packing)
        self.row_bytes = max(1, packing.row_bytes)
        self.bucket_rows = max(1, self.budget // BUCKET_SHARE // self.row_bytes)
        self.planner: Callable[[int], StagePlan] | None = None
        self._tasks: dict[tuple[int, str], _Task] = {}
        self._queue: list[_Task] = []
        self._lock = threading.Condition()
        self._worker: threading.Thread | None = None
        self._generation = 0
        self._current: _Task | None = None
        self.reports: dict[int, _Report] = {}

    # ------------------------------------------------------------------ serving

    def session(self, *, epoch: int, indices: np.ndarray | None) -> Any:
        """Epoch ``epoch``'s rows for this rank (staging it, and the next epoch behind it)."""
        if self.planner is None or indices is None:
            return _DirectRows(self.layout, self.packing)
        plan = self.planner(epoch)
        task = self._request(plan)
        self._request(self.planner(epoch + 1))  # staged while this epoch trains
        self._forget(epoch)
        return _StagedSession(task, self.packing, len(indices), self.layout)

    def _request(self, plan: StagePlan) -> _Task:
        with self._lock:
            task = self._tasks.get((plan.epoch, plan.key))
            if task is None:
                task = self._tasks[plan.epoch, plan.key] = _Task(plan)
                task.generation = self._generation
                self.reports[plan.epoch] = task.report
                self._queue.append(task)
                self._queue.sort(key=lambda t: t.plan.epoch)
                self._lock.notify_all()
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="feedline-stager",
                                                daemon=True)  # fmt: skip
                self._worker.start()
        return task

    def close(self) -> None:
        """Drop the epochs asked for but not begun, and stop the one being staged at its next
        row group or bucket (its session, if any, raises); a later session stages again."""
        with self._lock:
            dropped, self._queue = self._queue, []
            for task in dropped:
                self._tasks.pop((task.plan.epoch, task.plan.key), None)
                task.error = ConfigurationError(
                    f"Staging epoch {task.plan.epoch} was cancelled: the loader was closed. "
                    "Fix: iterate the loader again (it stages the epoch again)."
                )
                task.started.set()
                task.done.set()
            self._generation += 1  # the running task stops at its next check
            running = [t for t in self._tasks.values() if not t.done.is_set()]
            for task in running:
                self._tasks.pop((task.plan.epoch, task.plan.key), None)

    def _check_cancelled(self) -> None:
        """Raise :class:`_Cancelled` when :meth:`close` came after the task being staged was
        asked for."""
        task = self._current
        if task is not None and task.generation != self._generation:
            raise _Cancelled

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every epoch asked for is staged (or failed); ``False`` on timeout."""
        with self._lock:
            tasks = list(self._tasks.values())
        deadline = None if timeout is None else time.monotonic() + timeout
        for task in tasks:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not task.done.wait(left):
                return False
        return True

    def _forget(self, epoch: int) -> None:
        """Drop (and delete this rank's files of) the epochs before ``epoch``."""
        with self._lock:
            old = [k for k in self._tasks if k[0] < epoch]
            tasks = [self._tasks.pop(k) for k in old]
            self._queue = [t for t in self._queue if t.plan.epoch >= epoch]
        for task in tasks:
            if task.staged is not None and task.done.is_set():
                task.staged.close()
                if task.staged.path is not None:
                    task.staged.path.unlink(missing_ok=True)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    return
                task = self._queue.pop(0)
            self._current = task
            try:
                self._stage(task)
            except BaseException as exc:  # noqa: BLE001 (handed to the session waiting for it)
                error = exc
                if isinstance(exc, _Cancelled):
                    error = ConfigurationError(
                        f"Staging epoch {task.plan.epoch} was cancelled: the loader was closed. "
                        "Fix: iterate the loader again (it stages the epoch again)."
                    )
                elif not isinstance(exc, FeedlineError):
                    error = StorageError(
                        f"Staging epoch {task.plan.epoch} failed: {exc!r}. Fix: check the disk "
                        "under cache_dir= and stage_dir=, or use cache='memory' / 'none'."
                    )
                    error.__cause__ = exc
                task.error = error
                if task.staged is not None:
                    task.staged.fail(error)
                task.started.set()
            finally:
                task.done.set()

    def _path(self, plan: StagePlan, rank: int) -> Path:
        return self.folder / f"{plan.key}.e{plan.epoch}.r{rank}.stage"

    def _meta(self, plan: StagePlan, rank: int) -> dict[str, Any]:
        return {"key": self.key, "plan": plan.key, "epoch": plan.epoch, "rank": rank}

    def _stage(self, task: _Task) -> None:
        plan, report = task.plan, task.report
        start = time.perf_counter()
        mine = range(self.node * self.ranks_per_node, (self.node + 1) * self.ranks_per_node)
        lock = self.folder / ".locks" / f"{plan.key}.e{plan.epoch}.lock"
        with _locked(lock):
            found = {r: _open_staged(self._path(plan, r), plan.plans[r], self._meta(plan, r))[0]
                     for r in mine}  # fmt: skip
            complete = all(v is not None for v in found.values())
            if complete:  # staged already (by another rank of the node, or an earlier run)
                task.staged = found[self.rank]
                task.started.set()
            for staged in found.values():
                if staged is not None and not complete:
                    staged.close()
            if not complete:  # senders cut this node's buckets as it says
                self.exchange.publish(plan.key, plan.epoch, {"bucket_rows": self.bucket_rows})
            self._send(plan, report, waiting=not complete)  # to nodes lacking this one's rows
            if complete:
                report.stage_s = time.perf_counter() - start
                return
            for stale in (self.folder / ".tmp").glob(f"{plan.key}.e{plan.epoch}.*"):
                remove_entry(stale, what="staged temporary file")  # a killed stager's
            report.staged_here = True
            self.exchange.wait(plan.key, plan.epoch)
            todo = [self.rank] + [r for r in mine if r != self.rank]
            for r in todo:
                self._receive(plan, r, task if r == self.rank else None, report)

        self._clean(plan.epoch)
        report.stage_s = time.perf_counter() - start
        logger.info(
            "Loader staged epoch %d for ranks %d-%d in %.2f s (%d rows read, %d bytes sent)",
            plan.epoch, mine[0], mine[-1], report.stage_s, report.rows_read, report.bytes_sent,
        )  # fmt: skip

    def _clean(self, epoch: int) -> None:
        """Drop this node's rows received for epochs before ``epoch`` and its staged files of
        epochs before ``epoch - 1`` (of any order), each under its epoch's lock, skipping an
        epoch a process of the node is staging."""
        old: dict[tuple[str, int], list[Path]] = {}
        for path in self.folder.glob("*.stage"):
            with contextlib.suppress(ValueError, IndexError):
                plan, tag = path.name.split(".")[:2]
                if int(tag[1:]) < epoch - 1:
                    old.setdefault((plan, int(tag[1:])), []).append(path)
        for held in self.exchange.held():
            if held[1] < epoch:
                old.setdefault(held, [])
        for (plan, e), paths in old.items():
            with _locked(self.folder / ".locks" / f"{plan}.e{e}.lock", wait=False) as got:
                if not got:
                    continue
                self.exchange.release(plan, e)
                for path in paths:
                    path.unlink(missing_ok=True)

    def _send(self, plan: StagePlan, report: _Report, waiting: bool) -> None:
        """Pass 1: read this node's row groups in order; send each row to its buckets, cut as
        each receiving node published (``waiting``: wait for those that did not yet; else
        send only to those that did: they are staging the epoch)."""
        ex = self.exchange
        todo = [m for m in range(self.nodes) if not ex.delivered(plan.key, plan.epoch, m)]
        cuts: dict[int, int] = {}
        for m in todo:
            told = ex.layout(plan.key, plan.epoch, m, timeout=WAIT_TIMEOUT if waiting else None)
            if told is not None:
                cuts[m] = int(told["bucket_rows"])
        todo = [m for m in todo if m in cuts]
        if not todo:
            return
        layout, packing = self.layout, self.packing
        sizes = layout.row_group_sizes
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        groups = node_row_groups(sizes, self.nodes)[self.node]
        lo, hi = int(starts[groups.start]), int(starts[groups.stop])
        found = routes(plan.plans, lo, hi)
        outboxes = {m: self.exchange.send(plan.key, plan.epoch, m) for m in todo}
        file_of, local, _ = layout.locate()
        names = [s.name for s in packing.specs]
        piece = read_rows(packing, layout.source.schema())

        def read(g: int) -> dict[str, np.ndarray]:
            storage = packing.allocate(int(sizes[g]))
            views = column_views(packing, storage)
            f, i = int(file_of[g]), int(local[g])
            where = f"shard {layout.files[f].url!r}, row group {i}"
            parts = _checked(layout.iter_read(f, [i], names, piece), int(sizes[g]), where)
            first = int(starts[g])
            fill_arrays(views, parts, packing.specs, 0, where, lambda r: first + r)
            pa.default_memory_pool().release_unused()
            return storage

        try:
            todo_groups = [g for g in groups if sizes[g]]
            with ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="feedline-stage-read") as pool:
                ahead = deque(pool.submit(read, g) for g in todo_groups[:READ_AHEAD])
                for k, g in enumerate(todo_groups):
                    self._check_cancelled()
                    storage = ahead.popleft().result()
                    if k + READ_AHEAD < len(todo_groups):  # the next row groups decode meanwhile
                        ahead.append(pool.submit(read, todo_groups[k + READ_AHEAD]))
                    report.rows_read += int(sizes[g])
                    report.bytes_read += int(sizes[g]) * self.row_bytes
                    a, b = np.searchsorted(found.source, [starts[g], starts[g + 1]])
                    self._route(found, int(a), int(b), int(starts[g]), storage, outboxes,
                                cuts, report)  # fmt: skip
            for box in outboxes.values():
                box.commit()
        except BaseException:
            for box in outboxes.values():
                box.abort()
            raise

    def _route(self, found: Any, a: int, b: int, first: int, storage: Mapping[str, np.ndarray],
               outboxes: Mapping[int, Any], cuts: Mapping[int, int], report: _Report,
               ) -> None:  # fmt: skip
        """Send rows ``found[a:b]`` of one row group (its arrays ``storage``) to their buckets
        (``cuts``: each receiving node's rows per bucket)."""
        if a == b:
            return
        rank, pos = found.rank[a:b], found.position[a:b]
        rows = found.source[a:b] - first
        per_rank = np.array([cuts.get(node_of(r, self.ranks_per_node), 1)
                             for r in range(self.world_size)], dtype=np.int64)  # fmt: skip
        size = per_rank[rank]
        buckets = (rank << 32) | (pos // size)
        order = np.argsort(buckets, kind="stable")
        buckets = buckets[order]
        ends = np.flatnonzero(np.diff(buckets)) + 1
        for sel in np.split(order, ends):
            r = int(rank[sel[0]])
            box = outboxes.get(node_of(r, self.ranks_per_node))
            if box is None:  # delivered by an earlier run of this node
                continue
            picked = {k: v[rows[sel]] for k, v in storage.items()}
            box.write(r, int(pos[sel[0]]) // int(size[sel[0]]), pos[sel], picked)
            report.bytes_sent += len(sel) * self.row_bytes

    def _receive(self, plan: StagePlan, rank: int, task: _Task | None, report: _Report) -> None:
        """Pass 2: rank ``rank``'s buckets in order, each sorted in memory, into its file."""
        ids = plan.plans[rank]
        total = len(ids)
        path = self._path(plan, rank)
        in_memory = self.ranks_per_node == 1 and total * self.row_bytes <= (
            self.budget // BUCKET_SHARE
        )
        sink: Any = (
            _MemorySink(self.packing, ids) if in_memory
            else _Sink(path, self.arrays, ids, self._meta(plan, rank))
        )  # fmt: skip
        if task is not None:
            task.staged = sink.staged
            task.started.set()
        try:
            chunk = self.packing.allocate(min(self.bucket_rows, max(1, total)))
            for b in range(-(-total // self.bucket_rows)):
                if task is None:  # this rank's own file is finished even when closing
                    self._check_cancelled()
                at = b * self.bucket_rows
                rows = min(self.bucket_rows, total - at)
                filled = 0
                for positions, values in self.exchange.records(
                    plan.key, plan.epoch, rank, b, self.arrays
                ):
                    where = positions - at
                    if where.size and (where.min() < 0 or where.max() >= rows):
                        raise IntegrityError(
                            f"Staging epoch {plan.epoch}: a bucket of rank {rank} holds "
                            "positions outside it. Fix: delete the stage_dir folder and restart."
                        )
                    for key, part in values.items():
                        chunk[key][where] = part
                    filled += where.size
                if filled != rows:
                    raise IntegrityError(
                        f"Staging epoch {plan.epoch}: bucket {b} of rank {rank} got {filled} of "
                        f"its {rows} rows. Fix: check that every node runs the same loader "
                        "options (seed, world_size, ranks_per_node) on the same dataset."
                    )
                sink.write(at, {k: v[:rows] for k, v in chunk.items()})
                report.buckets += 1
                sink.staged.advance(at + rows)
            sink.complete()
            sink.staged.advance(total, complete=True)
        except BaseException as exc:
            sink.abort()
            sink.staged.fail(exc if isinstance(exc, FeedlineError) else StorageError(
                f"Staging epoch {plan.epoch} for rank {rank} failed: {exc!r}. Fix: check the "
                "disk under cache_dir=."))  # fmt: skip
            raise
        if task is None:
            sink.staged.close()

    def describe(self) -> dict[str, Any]:
        """What ``Loader.stats()`` shows: the mode, the folders, and each epoch's staging."""
        epochs = [self.reports[e].as_dict() for e in sorted(self.reports)]
        return {"cache": "staged", "staged_dir": str(self.folder), "stage_nodes": self.nodes,
                "stage_node": self.node, "stage_bucket_rows": self.bucket_rows,
                "staged_epochs": epochs}  # fmt: skip

    def epoch_report(self, epoch: int) -> dict[str, Any] | None:
        report = self.reports.get(epoch)
        return None if report is None else report.as_dict()


class _StagedSession:
    """One epoch's gathers: the next rows of this rank's staged file, checked against the
    requested row indices (any other request is served by position, or read directly)."""

    def __init__(self, task: _Task, packing: Packing, upcoming: int, layout: FileLayout) -> None:
        self._task, self._packing, self._upcoming = task, packing, upcoming
        self._cursor: int | None = None
        self._scratch: dict[str, np.ndarray] = {}
        self._layout = layout

    def gather(self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
               ) -> dict[str, np.ndarray]:  # fmt: skip
        staged = self._task.handle()
        ids, n = staged.ids, len(indices)
        if self._cursor is None:
            self._cursor = max(0, len(ids) - self._upcoming)
        at = self._cursor
        positions: np.ndarray | None = None
        if at + n <= len(ids) and np.array_equal(ids[at : at + n], indices):
            self._task.report.wait_s += staged.wait(at + n)
            positions = np.arange(at, at + n, dtype=np.int64)
            self._cursor = at + n
        else:
            self._task.report.wait_s += staged.wait(len(ids))
            positions = staged.locate(np.asarray(indices, np.int64))
        if positions is None:  # rows this rank does not read this epoch
            return _DirectRows(self._layout, self._packing).gather(indices, out)
        return gather_packed(self._packing, staged.storage, positions, out,
                             self._scratch if out else None)  # fmt: skip


class _DirectRows:
    """Gathers of any rows, read from their row groups (outside a staged epoch's plan: e.g.
    the content fingerprint of plain Parquet)."""

    def __init__(self, layout: FileLayout, packing: Packing) -> None:
        self._layout, self._packing = layout, packing
        self._starts = np.concatenate([[0], np.cumsum(layout.row_group_sizes, dtype=np.int64)])
        self._held: tuple[int, dict[str, np.ndarray]] | None = None

    def _group(self, g: int) -> dict[str, np.ndarray]:
        if self._held is None or self._held[0] != g:
            file_of, local, _ = self._layout.locate()
            rows = int(self._starts[g + 1] - self._starts[g])
            storage = self._packing.allocate(rows)
            f, i = int(file_of[g]), int(local[g])
            where = f"shard {self._layout.files[f].url!r}, row group {i}"
            names = [s.name for s in self._packing.specs]
            parts = _checked(self._layout.iter_read(f, [i], names), rows, where)
            fill_arrays(column_views(self._packing, storage), parts, self._packing.specs, 0, where)
            self._held = (g, storage)
        return self._held[1]

    def gather(self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
               ) -> dict[str, np.ndarray]:  # fmt: skip
        idx = np.asarray(indices, np.int64)
        result = self._packing.allocate(len(idx))
        groups = np.searchsorted(self._starts, idx, side="right") - 1
        for g in np.unique(groups):
            sel = np.flatnonzero(groups == g)
            storage = self._group(int(g))
            for key, values in storage.items():
                result[key][sel] = values[idx[sel] - self._starts[g]]
        return gather_packed(self._packing, result, np.arange(len(idx)), out)
