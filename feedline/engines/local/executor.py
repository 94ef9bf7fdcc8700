"""A bounded, streaming, parallel map over read tasks (the local engine's executor).

Each read task runs in a worker thread and pushes its output batches into a queue bounded
in *bytes*; when a queue is full the worker waits (backpressure), so memory is bounded by
the budget, not by the size of the data. With ``preserve_order=True`` the consumer reads
the tasks' queues in task order; otherwise batches are taken as soon as they are ready.

:func:`run_stage` adds a stage of its own threads after the read tasks (the model stage of
batch inference), so a slow model and the reads run at the same time.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["run_stage", "run_tasks"]

_POLL_SECONDS = 0.05

# Stop events of executions still running. At interpreter exit, an abandoned (never
# closed) stream would leave workers waiting on a full queue while Python joins them;
# the hook below, registered on first use, tells them to stop first.
_ACTIVE: weakref.WeakSet[threading.Event] = weakref.WeakSet()
_HOOK_REGISTERED = False
_HOOK_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    for event in list(_ACTIVE):
        event.set()


def _track(stop: threading.Event) -> None:
    global _HOOK_REGISTERED
    with _HOOK_LOCK:
        if not _HOOK_REGISTERED:
            # runs before concurrent.futures joins its workers (hooks run in reverse order)
            threading._register_atexit(_stop_all_at_exit)  # type: ignore[attr-defined]
            _HOOK_REGISTERED = True
        _ACTIVE.add(stop)


class _Stopped(Exception):
    """Raised inside a worker when the consumer has gone away."""


@dataclass(frozen=True)
class _Done:
    task: int


@dataclass(frozen=True)
class _Failed:
    task: int
    error: BaseException


@dataclass
class _StageState:
    """What :func:`run_stage`'s threads share (under its condition)."""

    #: the number of batches once the input is exhausted (-1 until then)
    fed: int = -1
    #: the first error of any thread
    failed: BaseException | None = None


class _ByteQueue:
    """A FIFO bounded by the total ``nbytes`` of its items (always admits one item)."""

    def __init__(self, capacity: int, stop: threading.Event) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._bytes = 0
        self._capacity = capacity
        self._stop = stop
        self._cond = threading.Condition()

    def put(self, item: Any, nbytes: int = 0) -> None:
        with self._cond:
            while self._items and self._bytes + nbytes > self._capacity:
                if self._stop.is_set():
                    raise _Stopped
                self._cond.wait(_POLL_SECONDS)
            if self._stop.is_set():
                raise _Stopped
            self._items.append((item, nbytes))
            self._bytes += nbytes
            self._cond.notify_all()

    def get(self) -> Any:
        with self._cond:
            while not self._items:
                self._cond.wait(_POLL_SECONDS)
            item, nbytes = self._items.popleft()
            self._bytes -= nbytes
            self._cond.notify_all()
            return item


def run_tasks(
    tasks: Sequence[Callable[[], Iterator[pa.RecordBatch]]],
    *,
    parallelism: int,
    memory_budget: int,
    preserve_order: bool,
) -> Iterator[pa.RecordBatch]:
    """Run ``tasks`` (each a function returning a batch iterator) and stream their batches.

    At most ``parallelism`` tasks run at once; queued output never exceeds about
    ``memory_budget`` bytes (plus one batch per running task). Closing the returned
    generator early (``take``, ``limit``, ``break``) stops the workers promptly. An
    exception in a task is re-raised in the consumer with its original traceback.
    """
    if not tasks:
        return
    parallelism = max(1, min(parallelism, len(tasks)))
    stop = threading.Event()
    _track(stop)
    pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="feedline-task")

    def work(index: int, queue: _ByteQueue) -> None:
        try:
            if stop.is_set():
                raise _Stopped
            for batch in tasks[index]():
                queue.put(batch, batch.nbytes)
            queue.put(_Done(index))
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
            with contextlib.suppress(_Stopped):
                queue.put(_Failed(index, exc))

    try:
        if preserve_order:
            yield from _ordered(tasks, work, pool, parallelism, memory_budget, stop)
        else:
            yield from _unordered(tasks, work, pool, parallelism, memory_budget, stop)
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


def _ordered(
    tasks: Sequence[Callable[[], Iterator[pa.RecordBatch]]],
    work: Callable[[int, _ByteQueue], None],
    pool: ThreadPoolExecutor,
    parallelism: int,
    memory_budget: int,
    stop: threading.Event,
) -> Iterator[pa.RecordBatch]:
    capacity = max(1, memory_budget // parallelism)
    pending: collections.deque[_ByteQueue] = collections.deque()
    upcoming = iter(range(len(tasks)))

    def submit_next() -> None:
        index = next(upcoming, None)
        if index is not None:
            queue = _ByteQueue(capacity, stop)
            pool.submit(work, index, queue)
            pending.append(queue)

    for _ in range(parallelism):
        submit_next()
    while pending:
        queue = pending[0]
        while True:
            item = queue.get()
            if isinstance(item, _Done):
                break
            if isinstance(item, _Failed):
                raise item.error
            yield item
        pending.popleft()
        submit_next()


def _unordered(
    tasks: Sequence[Callable[[], Iterator[pa.RecordBatch]]],
    work: Callable[[int, _ByteQueue], None],
    pool: ThreadPoolExecutor,
    parallelism: int,
    memory_budget: int,
    stop: threading.Event,
) -> Iterator[pa.RecordBatch]:
    queue = _ByteQueue(max(1, memory_budget), stop)
    upcoming = iter(range(len(tasks)))
    running = 0
    for _ in range(parallelism):
        index = next(upcoming, None)
        if index is not None:
            pool.submit(work, index, queue)
            running += 1
    while running:
        item = queue.get()
        if isinstance(item, _Failed):
            raise item.error
        if isinstance(item, _Done):
            running -= 1
            index = next(upcoming, None)
            if index is not None:
                pool.submit(work, index, queue)
                running += 1
            continue
        yield item


def run_stage(
    batches: Iterator[pa.RecordBatch],
    process: Callable[[int, pa.RecordBatch], list[pa.RecordBatch]],
    *,
    workers: int,
    memory_budget: int,
    preserve_order: bool,
    setup: Callable[[], Any] | None = None,
    name: str = "feedline-model",
) -> Iterator[pa.RecordBatch]:
    """Run ``process(seq, batch)`` over a stream in ``workers`` threads of their own.

    A feeder thread pulls ``batches`` (the upstream stages keep running in their own
    threads) and hands them out with a sequence number; each worker thread calls ``setup``
    once when it starts (to build a model), then ``process`` per batch. Worker ``k`` starts
    when the ``k``-th batch arrives, so ``min(workers, batches)`` threads run ``setup``.
    Batches handed out and not yet consumed are bounded in bytes by ``memory_budget``
    (always at least one), so the feeder waits when the workers or the consumer fall behind.
    With ``preserve_order`` the outputs come in input order; otherwise as they finish. An
    exception anywhere is re-raised in the consumer; closing the stream stops the threads.

    Examples
    --------
    >>> stream = (pa.record_batch({"x": [i]}) for i in range(4))
    >>> out = run_stage(stream, lambda seq, b: [b], workers=2, memory_budget=1 << 20,
    ...                 preserve_order=True)
    >>> [b["x"][0].as_py() for b in out]
    [0, 1, 2, 3]
    """
    stop = threading.Event()
    _track(stop)
    cond = threading.Condition()
    inbox: collections.deque[tuple[int, pa.RecordBatch]] = collections.deque()
    results: dict[int, Any] = {}
    held: dict[int, int] = {}  # seq -> bytes of batches handed out and not yet consumed
    state = _StageState()
    threads: list[threading.Thread] = []

    def wait(predicate: Callable[[], bool]) -> None:
        while not predicate():
            if stop.is_set():
                raise _Stopped
            cond.wait(_POLL_SECONDS)

    def fail(error: BaseException) -> None:
        with cond:
            if state.failed is None:
                state.failed = error
            cond.notify_all()

    def work() -> None:
        try:
            if setup is not None:
                setup()
            while True:
                with cond:
                    wait(lambda: bool(inbox) or state.fed >= 0)
                    if not inbox:
                        return
                    seq, batch = inbox.popleft()
                out = process(seq, batch)
                with cond:
                    results[seq] = out
                    cond.notify_all()
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
            fail(exc)

    def feed() -> None:
        seq = 0
        try:
            for batch in batches:
                nbytes = batch.nbytes
                with cond:

                    def fits(n: int = nbytes) -> bool:
                        return not held or sum(held.values()) + n <= memory_budget

                    wait(fits)
                    held[seq] = nbytes
                    inbox.append((seq, batch))
                    if len(threads) < workers + 1:  # the feeder is threads[0]
                        start(work, f"{name}-{len(threads) - 1}")
                    cond.notify_all()
                seq += 1
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
            fail(exc)
        finally:
            with cond:
                state.fed = seq
                cond.notify_all()
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def start(target: Callable[[], None], thread_name: str) -> None:
        thread = threading.Thread(target=target, name=thread_name, daemon=True)
        threads.append(thread)
        thread.start()

    def ready() -> bool:
        if state.failed is not None:
            return True
        if preserve_order:
            return consumed in results or consumed == state.fed
        return bool(results) or (not held and state.fed >= 0)

    consumed = 0
    try:
        with cond:
            start(feed, f"{name}-feeder")
        while True:
            with cond:
                while not ready():
                    cond.wait(_POLL_SECONDS)
                if state.failed is not None:
                    raise state.failed
                if preserve_order:
                    if consumed not in results:
                        return  # consumed == fed: everything was yielded
                    seq = consumed
                else:
                    if not results:
                        return
                    seq = next(iter(results))
                out = results.pop(seq)
                held.pop(seq, None)
                consumed += 1
                cond.notify_all()
            yield from out
    finally:
        stop.set()
        with cond:
            cond.notify_all()
        for thread in threads:
            thread.join()
