"""A bounded, streaming, parallel map over read tasks (the local engine's executor).

Each read task runs in a worker thread and pushes its output batches into a queue bounded
in *bytes*; when a queue is full the worker waits (backpressure), so memory is bounded by
the budget, not by the size of the data. With ``preserve_order=True`` the consumer reads
the tasks' queues in task order; otherwise batches are taken as soon as they are ready.
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

__all__ = ["run_tasks"]

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


def _ordered(tasks, work, pool, parallelism, memory_budget, stop):
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


def _unordered(tasks, work, pool, parallelism, memory_budget, stop):
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
