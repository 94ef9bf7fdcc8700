"""``cache="staged"``: each epoch staged ahead, in each rank's read order, and served from memory.

The exact shuffle of ``cache="memory"`` needs the whole dataset in memory (or, with
``cache="node"``, paged at random from a node-wide file: a few 4 KiB faults per row). But the
order of every epoch is a pure function known in advance (:func:`~feedline.loader.order.
stage_routes.stage_plan`), so the rows can be *staged*: sorted, before they are read, into
each rank's read order, with sequential reads only and a bounded amount of memory:

1. pass 1 (:mod:`~feedline.loader.data.staging.share`): each node reads its share of the row
   groups, sequentially (all of them for one node;
   :func:`~feedline.loader.order.stage_routes.node_row_groups` for several), and sends each
   row to the bucket of each of its destinations ``(rank, position)``: buckets of
   ``bucket_rows`` consecutive positions of one rank, a sixteenth of ``memory_budget`` each
   (an eighth with one rank on one node: :data:`RECYCLED_BUCKET_SHARE`),
   written as files through the exchange (:mod:`~feedline.loader.data.staging.exchange`);
2. pass 2 (:mod:`~feedline.loader.data.staging.buckets`): each rank takes its buckets one by
   one from every sender as it reaches them, puts each in order in memory and serves its
   batches from there, the next bucket read and ordered ahead by a thread.

Across the cluster each row is read from the dataset once per epoch, and crosses the disk
(or the shared folder) once more: written to a bucket file, read back once. On one node with
one rank (a single-process job), every epoch after the first skips pass 1: pass 2 of epoch
``e`` holds every row in turn (the rows its plan leaves out are kept in a spill file), so
each bucket, once ordered, is also routed to epoch ``e + 1``'s buckets
(:mod:`~feedline.loader.data.staging.recycle`): the dataset is read once, by the first epoch,
and no Parquet is decoded again; ``stats()["staged_epochs"]`` says ``"stage_source": "epoch
before"``. An epoch left before its end, or resumed mid-way, stages the next one from the
dataset. A *node* is a
group of ``ranks_per_node`` consecutive ranks (torchrun's ``LOCAL_WORLD_SIZE``; by default all
ranks are on one node); one process of the node (whichever takes the epoch's lock first) runs
pass 1 for the node, every rank runs its own pass 2 from the node's inbox. No rank writes a
staged file for another: a rank reading another's staged file would cost each row one more
write and read than reading its own buckets from the inbox.

Pipelining: the first epoch's pass 1 runs before its first batch; every later epoch's pass 1
runs in a background thread while the one before it trains, and its first bucket is ordered
ahead. ``Loader.stats()["staged_epochs"]`` and ``Loader.metrics()`` report each epoch's
staging time (pass 1) and whether it was hidden (the loop waited for it and for its buckets
less than 5% of it).

Safety: the exchange writes each sender's bucket files, then a marker with their sizes and
CRC-32 (an atomic rename). A rank reads a bucket only once all its senders' markers are there,
and each file is checked against its marker before any row of it is served; a stager killed
mid-way leaves no marker (its next run rewrites its files), and a reused inbox whose files do
not match their markers is sent again. Every batch is checked against the plan, so the
batches, their order and ``state_dict()`` are exactly those of ``cache="memory"``.

Disk: a node's inbox holds its ranks' rows of about two epochs (the one read, the one
staged ahead, while its ranks keep in step): twice its share of the data, under
``stage_dir`` (default ``<cache_dir>/staged/exchange``). An epoch's inbox stays until every
rank of the node serves a later epoch and none reads it, so a restart within that epoch
reuses it (pass 1 is not run again).

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

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, FeedlineError, IntegrityError, StorageError
from feedline.host import memory_room
from feedline.loader.data.file_cache_checks import check_file_cache
from feedline.loader.data.memory_cache import FileLayout
from feedline.loader.data.packed_columns import Packing
from feedline.loader.data.staging.buckets import AHEAD, Buckets, order_bucket
from feedline.loader.data.staging.exchange import (
    IN_FLIGHT,
    WAIT_TIMEOUT,
    ArrayLayout,
    Exchange,
    Outbox,
    StorageExchange,
    split_rows,
)
from feedline.loader.data.staging.locks import hold_shared, locked
from feedline.loader.data.staging.recycle import Recycler, spill_rank
from feedline.loader.data.staging.report import StageReport
from feedline.loader.data.staging.session import DirectRows, StagedSession
from feedline.loader.data.staging.share import Share, send_share
from feedline.loader.order.stage_routes import StagePlan, check_nodes, node_of

__all__ = ["BUCKET_SHARE", "RECYCLE", "RECYCLED_BUCKET_SHARE", "StagedEpochs", "staged_dir"]

logger = logging.getLogger(__name__)

#: a bucket holds at most this share of ``memory_budget`` (the one served and ``AHEAD`` read
#: ahead, twice its size while its file is read: three sixteenths of the budget at most,
#: beside pass 1's row groups of the next epoch)
BUCKET_SHARE = 16
#: ... or this share with one rank on one node (epochs staged from the epoch before): no
#: pass 1 runs beside the buckets after the first epoch, and the router copies rows out a
#: destination at a time (no copy of a whole bucket), so buckets twice as big fit the same
#: memory (the bench's 300 MB cgroup peaked at 183-186 MB, against 183-189 MB): half as many
#: bucket files, each written twice as much at a time (42-44k -> 46-51k samples/s there)
RECYCLED_BUCKET_SHARE = 8


#: pass 1's write buffers (one per bucket file, see exchange._BucketFile) hold at most this
#: share of ``memory_budget`` together while an epoch before is read (its buckets: a few
#: sixteenths) ...
WRITE_SHARE = 4
#: ... or this share when no epoch is being read (the first staged: 8% sooner to its first
#: batch, measured) or when the rows come from the epoch before's buckets (no row groups
#: are decoded then: pass 1's half of the budget is free)
ALONE_WRITE_SHARE = 2
#: ... and between these sizes each (a bigger ``O_DIRECT`` write runs faster: 64 KiB 0.7,
#: 256 KiB 1.6, 1 MiB 2.4 GB/s on the bench's disk)
WRITE_MIN, WRITE_MAX = 16 << 10, 1 << 20


#: on one node with one rank, stage each epoch after the first from the epoch before's buckets
#: as they are read (:mod:`~feedline.loader.data.staging.recycle`), not from the dataset
RECYCLE = True


def staged_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The stager's folder: ``<cache_dir>/staged`` (``~/.cache/feedline/staged``).

    Examples
    --------
    >>> staged_dir("/scratch/fl").as_posix()
    '/scratch/fl/staged'
    """
    base = Path(cache_dir).expanduser() if cache_dir else Path("~/.cache/feedline").expanduser()
    return base / "staged"


class _Cancelled(Exception):
    """The loader was closed while an epoch was staged."""


class _Task:
    """Staging one epoch for this process's rank: its buckets once pass 1 is done."""

    def __init__(self, plan: StagePlan) -> None:
        self.plan = plan
        self.report = StageReport(plan.epoch)
        self.staged: Buckets | None = None
        self.error: BaseException | None = None
        self.start = 0  # the first position its session reads (a resume starts later)
        self.generation = 0  # the owner's, when asked for (close() moves the owner's on)
        self.started = threading.Event()  # the buckets (or the error) are there
        self.done = threading.Event()

    def handle(self) -> Buckets:
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

    nbytes = 0  # at most two buckets (see buckets.AHEAD), freed as the epoch is read

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
        check_file_cache(packing, "staged", "POSIX file locks", "cache='memory' or cache='none'")
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
        try:
            (self.folder / ".locks").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"Cannot create the staging folder {str(self.folder)!r}: {exc}. Fix: pass a "
                "writable local cache_dir= to the loader."
            ) from exc
        self.arrays: list[ArrayLayout] = [
            (k, a.dtype, a.shape[1:]) for k, a in packing.allocate(0).items()
        ]
        self.row_bytes = max(1, packing.row_bytes)
        bucket_share = RECYCLED_BUCKET_SHARE if self._recycles else BUCKET_SHARE
        self.bucket_rows = max(1, self.budget // bucket_share // self.row_bytes)
        share_bytes = layout.num_rows * self.row_bytes // self.nodes
        self.share = Share(self.node, self.nodes, self.ranks_per_node, self.world_size,
                           drop_pages=share_bytes > memory_room())  # fmt: skip
        self.planner: Callable[[int], StagePlan] | None = None
        self._tasks: dict[tuple[int, str], _Task] = {}
        self._queue: list[_Task] = []
        self._lock = threading.Condition()
        self._worker: threading.Thread | None = None
        self._generation = 0
        self._current: _Task | None = None
        self._recyclers: dict[tuple[int, str], Recycler] = {}
        self._waiting: _Task | None = None  # deferred until its recycler is done (_defer)
        self.reports: dict[int, StageReport] = {}

    @property
    def _recycles(self) -> bool:
        """Whether epochs are staged from the epoch before (one node, one rank): pass 1 then
        keeps the rows no plan names aside (a spill) for the next epoch."""
        return RECYCLE and self.nodes == 1 and self.world_size == 1

    # ------------------------------------------------------------------ serving

    def session(self, *, epoch: int, indices: np.ndarray | None) -> Any:
        """Epoch ``epoch``'s rows for this rank (staging it, and the next epoch behind it)."""
        if self.planner is None or indices is None:
            return DirectRows(self.layout, self.packing)
        plan = self.planner(epoch)
        self._reached(plan.key, epoch)
        task = self._request(plan, start=plan.length(self.rank) - len(indices))
        self._request(self.planner(epoch + 1))  # staged while this epoch trains
        self._forget(epoch)
        return StagedSession(task.handle, task.report, self.packing, len(indices), self.layout)

    def _request(self, plan: StagePlan, start: int = 0) -> _Task:
        with self._lock:
            task = self._tasks.get((plan.epoch, plan.key))
            if task is None:
                task = self._tasks[plan.epoch, plan.key] = _Task(plan)
                task.generation = self._generation
                task.start = max(0, start)
                self.reports[plan.epoch] = task.report
                self._queue.append(task)
                self._queue.sort(key=lambda t: t.plan.epoch)
                self._lock.notify_all()
            self._start_worker()
        return task

    def _start_worker(self) -> None:
        """(Under the lock.) Start the stager thread unless it runs (it ends when the queue
        is empty, or holds only epochs after a deferred one)."""
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="feedline-stager",
                                            daemon=True)  # fmt: skip
            self._worker.start()

    def close(self) -> None:
        """Drop the epochs asked for but not begun, and stop the one being staged at its next
        row group (its session, if any, raises); a later session stages again."""
        with self._lock:
            dropped, self._queue = self._queue, []
            for task in dropped:
                self._tasks.pop((task.plan.epoch, task.plan.key), None)
                task.error = _cancelled(task.plan.epoch)
                task.started.set()
                task.done.set()
            self._generation += 1  # the running task stops at its next check
            running = [t for t in self._tasks.values() if not t.done.is_set()]
            for task in running:
                self._tasks.pop((task.plan.epoch, task.plan.key), None)
            recyclers, self._recyclers = list(self._recyclers.values()), {}
            self._waiting = None
        for recycler in recyclers:  # the epoch they stage is staged from the dataset, if asked
            recycler.abort()

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
        """Drop the epochs before ``epoch`` (their buckets, and this rank's hold on their
        inboxes)."""
        with self._lock:
            old = [k for k in self._tasks if k[0] < epoch]
            tasks = [self._tasks.pop(k) for k in old]
            self._queue = [t for t in self._queue if t.plan.epoch >= epoch]
        for task in tasks:
            if task.staged is not None and task.done.is_set():
                task.staged.close()

    # ------------------------------------------------------------------ staging

    def _run(self) -> None:
        while True:
            with self._lock:
                waiting = self._waiting
                held = waiting is not None and self._queue[:1] != [] and (
                    self._queue[0].plan.epoch > waiting.plan.epoch)  # fmt: skip
                if not self._queue or held:  # a later epoch waits for the deferred one
                    self._worker = None
                    return
                task = self._queue.pop(0)
            self._current = task
            deferred = False
            try:
                with self._lock:
                    deferred = self._defer(task)
                if not deferred:
                    self._stage(task)
            except BaseException as exc:  # noqa: BLE001 (handed to the session waiting for it)
                error = exc
                if isinstance(exc, _Cancelled):
                    error = _cancelled(task.plan.epoch)
                elif not isinstance(exc, FeedlineError):
                    error = StorageError(
                        f"Staging epoch {task.plan.epoch} failed: {exc!r}. Fix: check the disk "
                        "under cache_dir= and stage_dir=, or use cache='memory' / 'none'."
                    )
                    error.__cause__ = exc
                task.error = error
                task.started.set()
            finally:
                if not deferred:
                    task.done.set()

    def _resume(self, task: _Task) -> None:
        """Queue ``task`` again once the recycler staging its epoch is done (committed, or
        aborted: then it is staged from the dataset); a task the loader dropped meanwhile
        (closed, or its epoch forgotten) ends cancelled."""
        with self._lock:
            if self._waiting is task:
                self._waiting = None
            alive = task.generation == self._generation and self._tasks.get(
                (task.plan.epoch, task.plan.key)) is task  # fmt: skip
            if alive:
                self._queue.append(task)
                self._queue.sort(key=lambda t: t.plan.epoch)
                self._start_worker()
        if not alive:
            task.error = task.error or _cancelled(task.plan.epoch)
            task.started.set()
            task.done.set()

    def _lock_path(self, plan: str, epoch: int, kind: str = "lock") -> Path:
        return self.folder / ".locks" / f"{plan}.e{epoch}.{kind}"

    def _defer(self, task: _Task) -> bool:
        """(Under the lock.) Whether ``task``'s epoch is being staged from the epoch before
        as that is read: then it waits, and the epochs after it with it, until that is done
        (:meth:`_resume` queues it again; no thread waits for the training loop meanwhile)."""
        recycled = self._recyclers.get((task.plan.epoch, task.plan.key))
        if recycled is None or not recycled.when_finished(lambda: self._resume(task)):
            return False
        self._waiting = task
        return True

    def _stage(self, task: _Task) -> None:
        """Pass 1 for this node unless its inbox holds the epoch already (an earlier run's,
        or another rank's of the node), then this rank's buckets."""
        plan, report = task.plan, task.report
        start = time.perf_counter()
        with self._lock:
            recycled = self._recyclers.pop((plan.epoch, plan.key), None)
        with locked(self._lock_path(plan.key, plan.epoch)):
            ready = self.exchange.complete(plan.key, plan.epoch)
            if not ready:  # senders cut this node's buckets as it says
                self.exchange.publish(plan.key, plan.epoch, {"bucket_rows": self.bucket_rows})
            self._send(plan, report, waiting=not ready)  # to nodes lacking this one's rows
            if not ready:
                report.staged_here = True
                self.exchange.wait(plan.key, plan.epoch)
            self._receive(plan, task, report)
        report.stage_s = time.perf_counter() - start
        if ready and recycled is not None and recycled.committed:
            report.staged_here, report.source = True, "epoch before"
            report.stage_s = recycled.busy_s  # its routing, spread over the epoch before
            report.bytes_sent = recycled.rows_sent * self.row_bytes
        self._clean(plan.epoch, plan.key)
        if report.staged_here:
            logger.info(
                "Loader staged epoch %d for node %d in %.2f s (%d rows read, %d bytes sent)",
                plan.epoch, self.node, report.stage_s, report.rows_read, report.bytes_sent,
            )  # fmt: skip

    def _receive(self, plan: StagePlan, task: _Task, report: StageReport) -> None:
        """Pass 2, handed to the session: this rank's buckets from the node's inbox (held,
        shared, until the epoch is dropped), its first one ordered ahead; and the next epoch
        staged from them as they are read, where it can be (:meth:`_recycler`)."""
        ids = plan.plan(self.rank)
        size, total = self._cut(plan), len(ids)
        fd = hold_shared(self._lock_path(plan.key, plan.epoch, "read"))
        ahead = self._recycler(plan, ids, size)
        recycler = ahead[0] if ahead else None

        def load(b: int, spare: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
            at = b * size
            try:
                tables = list(self.exchange.tables(plan.key, plan.epoch, self.rank, b,
                                                   self.arrays))  # fmt: skip
                records = [split_rows(table, self.arrays) for table in tables]
                chunk = order_bucket(records, self.packing, at=at, rows=min(size, total - at),
                                     epoch=plan.epoch, rank=self.rank, bucket=b,
                                     into=spare)  # fmt: skip
                if recycler is not None:  # its rows as read, checked: to the next epoch
                    recycler.take(b, tables)
                return chunk
            except FeedlineError:
                raise
            except Exception as exc:
                raise StorageError(
                    f"Staging epoch {plan.epoch}: reading bucket {b} of rank {self.rank} "
                    f"failed: {exc!r}. Fix: check the disk under stage_dir= / cache_dir=."
                ) from exc

        def release() -> None:
            if recycler is not None:  # left before its last bucket: nothing is committed
                recycler.release()
            os.close(fd)

        staged = Buckets(np.asarray(ids, np.int64), size, load, release,
                         recycler.abort if recycler else None)  # fmt: skip
        report.buckets = staged.count
        if task.start:  # a resumed session: its first bucket (else bucket 0 when it starts)
            staged.ahead(task.start // size)
        task.staged = staged
        task.started.set()
        if ahead:  # off the first batch's path: sorts both plans
            recycler, target = ahead
            try:
                spill = self.exchange.tables(plan.key, plan.epoch, spill_rank(self.world_size),
                                             0, self.arrays)  # fmt: skip
                recycler.prepare(target.plan(self.rank), rows=self.layout.num_rows, spill=spill)
            except BaseException:
                recycler.abort()
                raise

    def _cut(self, plan: StagePlan) -> int:
        """The rows per bucket of this node's inbox of ``plan``: as its senders cut it, by the
        layout the node published (another rank of the node, or an earlier run, may have
        another ``memory_budget``: ``"auto"`` follows the memory free when a loader starts),
        else this loader's own."""
        told = self.exchange.layout(plan.key, plan.epoch, self.node, timeout=None)
        if told is None:
            return self.bucket_rows
        cut = told.get("bucket_rows")
        if isinstance(cut, bool) or not isinstance(cut, int) or cut < 1:
            raise IntegrityError(
                f"Staging epoch {plan.epoch}: node {self.node}'s published layout names "
                f"bucket_rows={cut!r}, not a positive count. Fix: delete the stage_dir folder "
                "of this epoch and restart."
            )
        return cut

    def _recycler(self, plan: StagePlan, ids: np.ndarray, cut: int
                  ) -> tuple[Recycler, StagePlan] | None:  # fmt: skip
        """A :class:`~feedline.loader.data.staging.recycle.Recycler` staging the epoch after
        ``plan``'s (and that epoch's plans) from its buckets as this rank reads them: on one
        node with one rank (this process reads every row), unless that epoch is staged or
        being staged already; ``cut``: the rows per bucket of ``plan``'s inbox."""
        if not self._recycles or self.planner is None:
            return None
        target = self.planner(plan.epoch + 1)
        if self.exchange.complete(target.key, target.epoch):
            return None
        # its bucket size is published when it commits, under the epoch's lock: published
        # now, it could replace the size of a loader staging that epoch from the dataset
        buffer = self._write_buffer(target, {self.node: self.bucket_rows}, ALONE_WRITE_SHARE)
        outbox = self.exchange.send(target.key, target.epoch, self.node, buffer, aside=True)
        lock = self._lock_path(target.key, target.epoch)

        def settle(commit: Callable[[], None]) -> bool:
            """Commit, unless another loader on this folder stages the epoch or did, with
            this loader's bucket size published (another that published its own and stopped
            before committing may have left that one)."""
            with locked(lock, wait=False) as got:
                if not got or self.exchange.complete(target.key, target.epoch):
                    return False
                self.exchange.publish(target.key, target.epoch, {"bucket_rows": self.bucket_rows})
                commit()
                return True

        recycler = Recycler(epoch=target.epoch, ids=ids, bucket_rows=cut,
                            outbox=outbox, cut=self.bucket_rows,
                            spill_to=spill_rank(self.world_size), settle=settle)  # fmt: skip
        with self._lock:
            self._recyclers[target.epoch, target.key] = recycler
        return recycler, target

    def _reached(self, plan: str, epoch: int) -> None:
        """Note that this rank serves epoch ``epoch`` of ``plan`` (and is done with the ones
        before it)."""
        path = self.folder / ".locks" / f"{plan}.r{self.rank}.reached"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(str(int(epoch)))
            os.replace(tmp, path)
        except OSError as exc:
            raise StorageError(
                f"Cannot write {str(path)!r}: {exc}. Fix: pass a writable local cache_dir=."
            ) from exc

    def _passed(self, plan: str, epoch: int) -> bool:
        """Whether every rank of this node serves an epoch after ``epoch`` of ``plan``."""
        for r in range(self.node * self.ranks_per_node, (self.node + 1) * self.ranks_per_node):
            try:
                reached = int((self.folder / ".locks" / f"{plan}.r{r}.reached").read_text())
            except (OSError, ValueError):
                return False
            if reached <= epoch:
                return False
        return True

    def _clean(self, epoch: int, plan_key: str) -> None:
        """Drop this node's inbox of the epochs before ``epoch``, each under its epoch's lock,
        skipping an epoch that a process of the node stages or reads, and one of this order
        (``plan_key``) that a rank of the node has not moved past (it will read it)."""
        for plan, e in self.exchange.held():
            if e >= epoch or (plan == plan_key and not self._passed(plan, e)):
                continue
            with locked(self._lock_path(plan, e), wait=False) as got:
                if not got:
                    continue
                with locked(self._lock_path(plan, e, "read"), wait=False) as free:
                    if free:
                        self.exchange.release(plan, e)

    def _send(self, plan: StagePlan, report: StageReport, waiting: bool) -> None:
        """Pass 1 to the nodes lacking this node's rows, cut as each receiving node published
        (``waiting``: wait for those that did not yet; else send only to those that did:
        they are staging the epoch)."""
        ex = self.exchange
        todo = [m for m in range(self.nodes) if not ex.delivered(plan.key, plan.epoch, m)]
        cuts: dict[int, int] = {}
        for m in todo:
            told = ex.layout(plan.key, plan.epoch, m, timeout=WAIT_TIMEOUT if waiting else None)
            if told is not None:
                cuts[m] = int(told["bucket_rows"])
        if not cuts:
            return
        with self._lock:  # an epoch before being read: its buckets take a share of the budget
            reading = any(
                e < plan.epoch and t.staged is not None for (e, _), t in self._tasks.items()
            )
        buffer = self._write_buffer(plan, cuts, WRITE_SHARE if reading else ALONE_WRITE_SHARE)
        outboxes: dict[int, Outbox] = {}
        try:
            for m in cuts:
                outboxes[m] = ex.send(plan.key, plan.epoch, m, buffer)
            spill = spill_rank(self.world_size) if self._recycles else None
            # row groups held: a share of what the buckets being read leave (the one served,
            # and each read ahead twice over while its file is read)
            held = (1 + 2 * AHEAD) * self.bucket_rows * self.row_bytes if reading else 0
            send_share(self.layout, self.packing, plan, self.share, outboxes, cuts, report,
                       self._check_cancelled, max(1, self.budget - held), spill)  # fmt: skip
            for box in outboxes.values():
                box.commit()
        except (OSError, StorageError) as exc:
            for box in outboxes.values():
                box.abort()
            gone = [m for m in cuts if ex.layout(plan.key, plan.epoch, m, timeout=None) is None]
            if waiting or not gone:
                raise
            # sent only because these nodes asked (this node's inbox was complete): they moved
            # past the epoch meanwhile and dropped their inbox under the rows being written
            logger.info("Staging epoch %d: nodes %s moved past it while this node sent them "
                        "its rows (%r); not sent", plan.epoch, gone, exc)  # fmt: skip
        except BaseException:
            for box in outboxes.values():
                box.abort()
            raise

    def _write_buffer(self, plan: StagePlan, cuts: dict[int, int], share: int = WRITE_SHARE
                      ) -> int:  # fmt: skip
        """Bytes buffered per bucket file in pass 1: a ``share`` of ``memory_budget``
        (:data:`WRITE_SHARE`, or :data:`ALONE_WRITE_SHARE` when no row group or no bucket is
        held beside them) over the bucket files open at once (one per bucket of every rank
        sent to) and the :data:`~feedline.loader.data.staging.exchange.IN_FLIGHT` buffers
        being written, within ``[WRITE_MIN, WRITE_MAX]``."""
        files = 0
        for r in range(plan.world_size):
            cut = cuts.get(node_of(r, self.ranks_per_node))
            if cut:
                files += -(-plan.length(r) // cut)
        each = self.budget // share // (files + IN_FLIGHT)  # and those being written
        return min(WRITE_MAX, max(WRITE_MIN, each))

    def describe(self) -> dict[str, Any]:
        """What ``Loader.stats()`` shows: the mode, the folders, and each epoch's staging."""
        epochs = [self.reports[e].as_dict() for e in sorted(self.reports)]
        return {"cache": "staged", "staged_dir": str(self.folder), "stage_nodes": self.nodes,
                "stage_node": self.node, "stage_bucket_rows": self.bucket_rows,
                "staged_epochs": epochs}  # fmt: skip

    def epoch_report(self, epoch: int) -> dict[str, Any] | None:
        report = self.reports.get(epoch)
        return None if report is None else report.as_dict()


def _cancelled(epoch: int) -> ConfigurationError:
    return ConfigurationError(
        f"Staging epoch {epoch} was cancelled: the loader was closed. Fix: iterate the loader "
        "again (it stages the epoch again)."
    )
