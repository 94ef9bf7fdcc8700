"""Epoch ``e + 1`` staged from epoch ``e``'s buckets as they are read: no second dataset pass.

Pass 1 (:mod:`~feedline.loader.data.staging.share`) reads the node's share of the dataset and
writes it to the next epoch's bucket files; pass 2 (:mod:`~feedline.loader.data.staging.
buckets`) reads those back, bucket by bucket. So each epoch moves the node's share through the
disk three times: the dataset read, the buckets written, the buckets read. On one node with one
rank (a single-process job: one GPU, or a CPU run), pass 2 of epoch ``e`` holds in memory, in
turn, every row of the dataset: the rows of the epoch's plan, and the few the plan leaves out
(``drop_last``'s remainder), which the stage of epoch ``e`` kept aside in a *spill* file
(bucket 0 of the pseudo-rank :func:`spill_rank`). Those are exactly the rows pass 1 of epoch
``e + 1`` would read from the dataset again.

A :class:`Recycler` routes each bucket of epoch ``e``, once it is read and checked, to its
rows' destinations in epoch ``e + 1`` (the bucket files, spill and marker pass 1 would write,
written aside and moved into place at the commit), in a thread of its own: the rows as read
from the bucket files, each row's bytes copied once, whole, its new position written over
the old. It commits when the last bucket was routed: the next epoch is staged as the current
one is read, from memory, and the dataset is read once, by the first epoch staged. Each later
epoch moves the share through the disk twice, not three times, and decodes no Parquet. Only
a row's first position in epoch ``e`` is routed (a padding repeat is sent once, to every
destination it has in epoch ``e + 1``). No thread waits for the training loop meanwhile: the
router stops when it has nothing to route, and the stager defers epoch ``e + 1`` until the
recycler is done (:meth:`~feedline.loader.data.staging.stager.StagedEpochs._defer`).

When epoch ``e``'s rows do not cover epoch ``e + 1``'s (an inbox staged without a spill, or
the finished segments of an elastic resume), when epoch ``e`` is not read from its start (a
resume mid-epoch), when it is left before its last bucket (the loader closed, the next epoch
asked for early), or when routing fails (logged), nothing is committed and epoch ``e + 1`` is
staged from the dataset as before. The rows are checked as ever: every bucket file against
its marker's size and CRC-32, every bucket for exactly its positions, every batch against
the plan.

Examples
--------
>>> first_positions(np.array([4, 2, 4, 7])).tolist()
[True, True, False, True]
>>> where = Destinations(np.array([5, 3, 9, 3]))
>>> source, position = where.find(np.array([3, 8, 9]))
>>> source.tolist(), position.tolist()
([0, 0, 2], [1, 3, 2])
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from feedline.loader.data.staging.exchange import Outbox

__all__ = ["QUEUED", "Destinations", "Recycler", "first_positions", "spill_rank"]

logger = logging.getLogger(__name__)

#: buckets of the epoch before waiting for the router at most (each also held by the reader
#: until it is routed: the router runs beside the reads, on another core, not after each)
QUEUED = 1


def spill_rank(world_size: int) -> int:
    """The pseudo-rank whose bucket 0 holds the rows an epoch's plans leave out (their
    positions are the rows' indices in the dataset).

    Examples
    --------
    >>> spill_rank(1)
    1
    """
    return int(world_size)


def first_positions(ids: np.ndarray) -> np.ndarray:
    """Whether each position of ``ids`` holds its row's first occurrence.

    Examples
    --------
    >>> first_positions(np.array([1, 1, 0])).tolist()
    [True, False, True]
    """
    ids = np.asarray(ids, np.int64)
    first = np.zeros(len(ids), dtype=bool)
    if len(ids):
        first[np.unique(ids, return_index=True)[1]] = True
    return first


class Destinations:
    """Where each row goes in a rank's ``plan`` (its row indices in read order): every
    position naming it (none for a row the plan leaves out, several for a padding repeat)."""

    def __init__(self, plan: np.ndarray) -> None:
        plan = np.asarray(plan, np.int64)
        self._order = np.argsort(plan, kind="stable")
        self._sorted = plan[self._order]

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For rows ``ids``: pairs ``(i, position)``, ``ids[i]`` at ``position`` of the plan,
        by ``i``, then position."""
        ids = np.asarray(ids, np.int64)
        lo = np.searchsorted(self._sorted, ids, "left")
        counts = np.searchsorted(self._sorted, ids, "right") - lo
        source = np.repeat(np.arange(len(ids), dtype=np.int64), counts)
        before = np.cumsum(counts) - counts
        at = np.repeat(lo - before, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        return source, self._order[at]

    def covers(self, held: np.ndarray) -> bool:
        """Whether every row of the plan is among the ``held`` rows (a boolean per dataset
        row)."""
        return bool(len(self._sorted) == 0 or held[self._sorted].all())


class Recycler:
    """Stages epoch ``epoch`` (one rank: its plan, given to :meth:`prepare`; ``cut`` positions
    per bucket) from the buckets of the epoch before as they are read (:meth:`take`, bucket
    numbers ``0 .. buckets - 1``, in any order, each once) and its ``spill`` (the rows its plan
    left out), through ``outbox`` (an outbox written aside: no lock is held while the epoch
    before is read); once every bucket came, ``settle(commit)`` commits it unless the epoch was
    staged otherwise meanwhile (another loader on the same folder), and says whether it did
    (else the rows sent are dropped). ``ids``: the epoch before's plan, whose bucket ``b`` is
    positions ``[b * bucket_rows, (b + 1) * bucket_rows)``; ``spill_to``: the pseudo-rank of the
    new epoch's spill (:func:`spill_rank`). :meth:`prepare` (sorting both plans: seconds at 10^7
    rows, so not on the loop's path) comes first; :meth:`take` waits for it.

    Examples
    --------
    >>> from feedline.loader.data.staging.exchange import pack_rows
    >>> class Box:
    ...     sent, done = [], False
    ...     def write(self, rank, bucket, block):
    ...         position, x = block[:, :8].copy().view("<i8"), block[:, 8:].copy().view("<i8")
    ...         self.sent.append((rank, bucket, position.ravel().tolist(), x.ravel().tolist()))
    ...     def commit(self): self.done = True
    ...     def abort(self): pass
    >>> box = Box()
    >>> recycler = Recycler(epoch=1, ids=np.array([2, 0]), bucket_rows=2, outbox=box,
    ...                     cut=2, spill_to=1)
    >>> recycler.prepare(np.array([1, 0]), rows=3,
    ...                  spill=[pack_rows(np.array([1]), {"x": np.array([10])})])
    True
    >>> recycler.take(0, [pack_rows(np.array([0, 1]), {"x": np.array([20, 0])})])
    >>> recycler.join(10), recycler.committed, box.sent
    (True, True, [(0, 0, [0], [10]), (0, 0, [1], [0]), (1, 0, [2], [20])])
    """

    def __init__(self, *, epoch: int, ids: np.ndarray, bucket_rows: int, outbox: Outbox,
                 cut: int, spill_to: int,
                 settle: Callable[[Callable[[], None]], bool] | None = None) -> None:  # fmt: skip
        self.epoch, self.bucket_rows, self.cut = int(epoch), int(bucket_rows), int(cut)
        self._ids = np.asarray(ids, np.int64)
        self._outbox, self._spill_to = outbox, int(spill_to)
        self._settle = settle or _commit_now
        self._buckets = -(-len(self._ids) // self.bucket_rows)
        self._left = set(range(self._buckets))  # not handed over yet
        self._routed = 0
        self._pending = 0  # buckets handed to the router and not yet taken by it
        self._queue: queue.Queue[tuple[int, Sequence[np.ndarray]]] = queue.Queue(QUEUED)
        self._router: threading.Thread | None = None
        self._finished = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._finish_lock = threading.Lock()  # for these two (the router holds _lock long)
        self._first = np.zeros(0, dtype=bool)
        self._where: Destinations | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.committed = self.aborted = False
        self.busy_s = 0.0
        self.rows_sent = 0

    def prepare(self, target: np.ndarray, *, rows: int, spill: Iterable[np.ndarray]) -> bool:
        """Get ready to route into the plan ``target`` (row indices of a dataset of ``rows``
        rows), and route the epoch before's ``spill`` (tables of rows whose positions are
        their row indices); ``False`` (and aborted) when the epoch before's plan and spill do
        not hold every row ``target`` names."""
        try:
            start = time.perf_counter()
            spilled = [(_positions(t), t) for t in spill]
            if any(len(i) and (i.min() < 0 or i.max() >= rows) for i, _ in spilled):
                raise ValueError("a spilled row's index is outside the dataset")
            held = np.zeros(int(rows), dtype=bool)
            held[self._ids] = True
            for ids, _ in spilled:
                held[ids] = True
            self._where = Destinations(target)
            if not self._where.covers(held):
                self.abort()
                return False
            self._first = first_positions(self._ids)
            with self._lock:
                for ids, table in spilled:
                    if not self.aborted:
                        self._route(table, ids)
            self.busy_s += time.perf_counter() - start
        except Exception:  # the epoch is then staged from the dataset
            logger.warning("Staging epoch %d from the epoch before failed; it is staged from "
                           "the dataset", self.epoch, exc_info=True)  # fmt: skip
            self.abort()
            return False
        finally:
            self._ready.set()
        if not self._buckets:  # an empty epoch before: nothing to wait for
            with self._lock:
                if not self.aborted:
                    self._commit()
        return not self.aborted

    def take(self, bucket: int, tables: Sequence[np.ndarray]) -> None:
        """Hand bucket ``bucket`` of the epoch before to the router thread: its rows as read
        from its bucket files (tables of bytes, :func:`~feedline.loader.data.staging.
        exchange.split_rows`; their positions checked by the bucket's reader), waiting while
        :data:`QUEUED` buckets wait for it (so the reader of the epoch before holds at most
        that many more); a bucket taken before, or after an abort, is ignored."""
        self._ready.wait()
        with self._lock:
            if self.aborted or self.committed or bucket not in self._left:
                return
            self._left.discard(bucket)
            self._pending += 1  # handed over, not yet routed: the router stays for it
            if self._router is None:
                self._router = threading.Thread(target=self._run, daemon=True,
                                                name="feedline-stage-recycle")  # fmt: skip
                self._router.start()
        while not self.aborted:
            try:
                self._queue.put((bucket, tables), timeout=0.1)
                return
            except queue.Full:
                continue

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the epoch is committed or aborted; ``False`` on timeout."""
        return self._finished.wait(timeout)

    def when_finished(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once the epoch is committed or aborted (in the thread that
        finishes it); ``False`` (and no call) when it is finished already."""
        with self._finish_lock:
            if self._finished.is_set():
                return False
            self._callbacks.append(callback)
            return True

    def _run(self) -> None:
        """The router: each bucket handed over, routed in turn; the commit after the last."""
        while not (self.aborted or self.committed):
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                with self._lock:  # idle: no thread waits for the training loop
                    if not self._pending:
                        self._router = None
                        return
                continue
            with self._lock:
                self._pending -= 1
                if self.aborted or self.committed:
                    return
                try:
                    self._route_bucket(*item)
                except Exception:  # the epoch is then staged from the dataset
                    logger.warning("Staging epoch %d from the epoch before failed; it is staged "
                                   "from the dataset", self.epoch, exc_info=True)  # fmt: skip
                    if not self.aborted:
                        self._close(abort=True)

    def _route_bucket(self, bucket: int, tables: Sequence[np.ndarray]) -> None:
        """Route one bucket of the epoch before (under the lock); commit after the last."""
        start = time.perf_counter()
        for table in tables:
            positions = _positions(table)
            first = self._first[positions]
            if first.all():
                self._route(table, self._ids[positions])
            else:  # a padding repeat: its row was routed from its first position
                keep = np.flatnonzero(first)
                self._route(table[keep], self._ids[positions[keep]])
        self._routed += 1
        self.busy_s += time.perf_counter() - start
        if self._routed == self._buckets:
            self._commit()

    def _route(self, table: np.ndarray, ids: np.ndarray) -> None:
        """Send the rows of ``table`` (dataset rows ``ids``) to their buckets in the new
        epoch: each row's bytes copied once, whole, with its new position written over the
        old (no row is split into its arrays and packed again), a bucket's rows at a time
        (no copy of the whole table is made: a bucket's memory goes to write buffers)."""
        assert self._where is not None
        source, position = self._where.find(ids)
        if len(source):
            bucket = position // self.cut
            order = np.argsort(bucket, kind="stable")
            source, position, bucket = source[order], position[order], bucket[order]
            ends = np.flatnonzero(np.diff(bucket)) + 1
            for lo, hi in zip([0, *ends], [*ends, len(bucket)], strict=True):
                rows = _with_positions(table, source[lo:hi], position[lo:hi])
                self._outbox.write(0, int(bucket[lo]), rows)
            self.rows_sent += len(source)
        unused = np.ones(len(ids), dtype=bool)
        unused[source] = False
        if unused.any():  # left out of the new epoch's plan: kept for the one after
            spilled = np.flatnonzero(unused)
            self._outbox.write(self._spill_to, 0, _with_positions(table, spilled, ids[spilled]))
            self.rows_sent += int(spilled.size)

    def _commit(self) -> None:
        try:
            settled = self._settle(self._outbox.commit)
        except BaseException:
            self._close(abort=True)
            raise
        if not settled:  # staged meanwhile by another loader, or being staged
            self._close(abort=True)
            return
        self.committed = True
        self._close(abort=False)
        logger.info("Loader staged epoch %d from the epoch before's buckets (%.2f s of routing, "
                    "no dataset read)", self.epoch, self.busy_s)  # fmt: skip

    def release(self) -> None:
        """The epoch before is dropped by its reader: stop unless every bucket was handed
        over (then its last ones are still being routed: they finish)."""
        with self._lock:
            if self._left and not (self.committed or self.aborted):
                self._close(abort=True)

    def abort(self) -> None:
        """Stop: drop what was sent (the epoch is then staged from the dataset)."""
        with self._lock:
            if not (self.committed or self.aborted):
                self._close(abort=True)

    def _close(self, abort: bool) -> None:
        if abort:
            self.aborted = True
            try:
                self._outbox.abort()
            except Exception:  # best effort: the epoch is staged again
                logger.debug("Dropping a recycled epoch's files failed", exc_info=True)
        with contextlib.suppress(queue.Empty):  # let the buckets waiting go
            while True:
                self._queue.get_nowait()
        with self._finish_lock:
            self._finished.set()
            callbacks, self._callbacks = self._callbacks, []
        if callbacks:  # in a thread of their own: this one may hold locks they take
            threading.Thread(target=lambda: [c() for c in callbacks], daemon=True,
                             name="feedline-stage-recycled").start()  # fmt: skip


def _commit_now(commit: Callable[[], None]) -> bool:
    """A :class:`Recycler`'s ``settle`` with no one else to ask: commit."""
    commit()
    return True


def _positions(table: np.ndarray) -> np.ndarray:
    """The positions of a table of rows (each row's first 8 bytes)."""
    return table[:, :8].view("<i8").reshape(len(table)).astype(np.int64, copy=False)


def _with_positions(table: np.ndarray, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """A copy of rows ``rows`` of ``table`` with ``positions`` as theirs."""
    out = np.take(table, rows, axis=0)
    out[:, :8] = np.asarray(positions, "<i8").reshape(-1, 1).view(np.uint8)
    return out
