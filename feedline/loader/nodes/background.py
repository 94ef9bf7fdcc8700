"""A background thread that keeps the next items of an iterator ready in a bounded queue.

The thread is not a daemon: :meth:`Prefetcher.close` stops and joins it, and the consuming
generator closes it when the loop ends, breaks or raises. Should a caller keep an unfinished
iterator until the interpreter exits, the thread notices that the main thread has finished
and stops, so exit never hangs. An exception in the thread is handed over and re-raised in
the consumer as the same object, its traceback (the thread's frames) intact.

The queue's bound can change while the thread runs (:meth:`Prefetcher.resize`, what
``prefetch="auto"`` uses), and the time the thread spent blocked on a full queue is counted
(:attr:`Prefetcher.blocked_s`): the producer had headroom then.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Prefetcher"]

T = TypeVar("T")
_ITEM, _END, _ERROR = 0, 1, 2
#: seconds between checks for a stop request while blocked on the queue
POLL_S = 0.05


class Prefetcher(Generic[T]):
    """Iterate ``source`` in a background thread, ``depth`` items ahead.

    Examples
    --------
    >>> with Prefetcher(iter(range(5)), depth=2) as items:
    ...     list(items)
    [0, 1, 2, 3, 4]
    """

    def __init__(self, source: Iterator[T], depth: int, name: str = "feedline-prefetch") -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source = source
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        #: seconds the thread spent blocked on a full queue (only it adds to this)
        self.blocked_s = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=False)
        self._thread.start()

    def _put(self, item: tuple[int, Any]) -> bool:
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:  # the consumer is behind: wait, and count the wait
            pass
        main, start = threading.main_thread(), time.perf_counter()
        try:
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=POLL_S)
                    return True
                except queue.Full:
                    if not main.is_alive():  # the interpreter is exiting: give up quietly
                        return False
            return False
        finally:
            self.blocked_s += time.perf_counter() - start

    def resize(self, depth: int) -> None:
        """Keep up to ``depth`` items ready from now on (a smaller bound lets the queue drain
        to it; nothing queued is dropped)."""
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        q = self._queue
        with q.mutex:  # queue.Queue reads maxsize under this lock
            q.maxsize = depth
            q.not_full.notify_all()

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put((_ITEM, item)):
                    return
            self._put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer and re-raised
            self._put((_ERROR, exc))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()
            self._source = None  # type: ignore[assignment]

    def queued(self) -> int:
        """Items ready in the queue now (approximate, as ``queue.Queue.qsize``)."""
        return self._queue.qsize()

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                kind, value = self._queue.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self.close()
                    raise RuntimeError("the feedline prefetch thread stopped") from None
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            raise value  # the same exception object: the worker's traceback comes along
        raise StopIteration

    def close(self) -> None:
        """Stop the thread and wait for it (idempotent)."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:  # unblock a producer waiting on a full queue
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=POLL_S)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
