"""The mixed stream's draws in chunks, the next chunk computed ahead in a background thread.

Which source and which of its samples each position of the mixed stream reads is a pure
function of the schedule (:class:`~feedline.loader.mixing.schedule.MixSchedule`), so it may be
computed anywhere and early without changing a single index, like one dataset's epoch order
(:mod:`feedline.loader.order.ahead`). :class:`DrawsAhead` cuts the stream into chunks of
:data:`CHUNK` positions, computes a chunk vectorised (:meth:`MixSchedule.chunk`: the windows'
layouts, the sources' permutations, one stable sort) when a batch first needs it, and starts
the next chunk (at an epoch's end: the next epoch's first) in a short-lived background thread
(most of its work is in NumPy calls that release the GIL), so the gathering thread only slices
and takes. Memory holds at most three chunks: 16 bytes a position. A chunk costs about as
much as one dataset's order of as many rows (the layouts, and each source's permutation once
per pass): with no core to spare, the thread takes its share from the gathers.

Examples
--------
>>> from feedline.loader.mixing.schedule import MixSchedule
>>> s = MixSchedule([300, 200], [(0, (0.5, 0.5))], window=8, seed=0, epoch=0)
>>> ahead = DrawsAhead(stop=400, chunk=64)
>>> codes, rows = ahead.take(s, np.arange(60, 70))
>>> c, r = s.chunk(60, 70)
>>> bool((codes == c).all() and (rows == r).all())
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from feedline.loader.mixing.schedule import MixSchedule

__all__ = ["CHUNK", "DrawsAhead"]

#: positions per chunk (a chunk of the stream costs a few ms to compute)
CHUNK = 1 << 17
_Chunk = tuple[np.ndarray, np.ndarray]


class _Work:
    """One chunk computed in its own (non-daemon, short-lived) thread."""

    def __init__(self, work: Callable[[], _Chunk]) -> None:
        self._result: _Chunk | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name="feedline-mix")
        self._thread.start()

    def _run(self, work: Callable[[], _Chunk]) -> None:
        try:
            self._result = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised where the chunk is asked for
            self._error = exc

    def result(self) -> _Chunk:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


class DrawsAhead:
    """Chunks of the mixed stream's ``(codes, rows)``; see the module docstring.

    Parameters
    ----------
    chunk:
        Positions per chunk.
    bases:
        Added to each row by its source code (the sources' first rows in a combined cache);
        ``None``: rows are sample indices in their own source.
    """

    def __init__(self, stop: int | str, chunk: int = CHUNK,
                 bases: np.ndarray | None = None) -> None:  # fmt: skip
        self.stop, self.chunk, self.bases = stop, int(chunk), bases
        self._lengths: dict[Any, int] = {}
        self._lock = threading.Lock()
        self._done: dict[tuple[Any, int], _Chunk] = {}
        self._ahead: tuple[tuple[Any, int], _Work] | None = None
        self._next: tuple[Any, MixSchedule] | None = None

    def _length(self, schedule: MixSchedule) -> int:
        key = schedule.key
        with self._lock:
            length = self._lengths.get(key)
        if length is None:
            length = schedule.length(self.stop)
            with self._lock:
                if len(self._lengths) > 4:
                    self._lengths.clear()
                self._lengths[key] = length
        return length

    def _compute(self, schedule: MixSchedule, c: int) -> _Chunk:
        """Chunk ``c`` (cut at the epoch's end)."""
        end = min((c + 1) * self.chunk, self._length(schedule))
        return schedule.chunk(c * self.chunk, max(end, c * self.chunk), self.bases)

    def _get(self, schedule: MixSchedule, c: int) -> _Chunk:
        key = (schedule.key, c)
        with self._lock:
            got = self._done.get(key)
            ahead = self._ahead
            if got is None and ahead is not None and ahead[0] == key:
                self._ahead = None
            else:
                ahead = None
        if got is not None:
            return got
        got = ahead[1].result() if ahead is not None else self._compute(schedule, c)
        with self._lock:
            if len(self._done) >= 2:  # the chunk before the previous one is done with
                self._done.pop(next(iter(self._done)))
            self._done[key] = got
        return got

    def _start(self, schedule: MixSchedule, c: int) -> None:
        key = (schedule.key, c)
        with self._lock:
            if key in self._done or (self._ahead is not None and self._ahead[0] == key):
                return
            self._ahead = (key, _Work(lambda: self._compute(schedule, c)))

    def take(self, schedule: MixSchedule,
             positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The codes and rows of ``positions`` (all before the epoch's end); starts the chunk
        after the last one touched in the background."""
        n = len(positions)
        length = self._length(schedule)
        if not n:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        first, last = int(positions[0]), int(positions[-1])
        c0, c1 = first // self.chunk, last // self.chunk
        if c0 == c1 and last - first + 1 == n:  # one run in one chunk: views
            codes, rows = self._get(schedule, c0)
            a = first - c0 * self.chunk
            out = codes[a : a + n], rows[a : a + n]
        else:
            chunks = positions // self.chunk
            out = np.empty(n, np.int64), np.empty(n, np.int64)
            for c in np.unique(chunks).tolist():
                codes, rows = self._get(schedule, c)
                where = chunks == c
                at = positions[where] - c * self.chunk
                out[0][where], out[1][where] = codes[at], rows[at]
        top = int(positions.max()) // self.chunk + 1
        if top * self.chunk < length:
            self._start(schedule, top)
        else:  # the next epoch's first chunk
            self._start(self._following(schedule, length), 0)
        return out

    def _following(self, schedule: MixSchedule, length: int) -> MixSchedule:
        key = schedule.key
        if self._next is None or self._next[0] != key:
            self._next = (key, schedule.following(length))
        return self._next[1]

    def clear(self) -> None:
        """Forget every chunk (the memory is released once no batch refers to it)."""
        with self._lock:
            self._done.clear()
            self._ahead = None
