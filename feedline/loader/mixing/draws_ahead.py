"""The mixed stream's draws in chunks, the next ones computed ahead in a background thread.

Which source and which of its samples each position of the mixed stream reads is a pure
function of the schedule (:class:`~feedline.loader.mixing.schedule.MixSchedule`), so it may be
computed anywhere and early without changing a single index, like one dataset's epoch order
(:mod:`feedline.loader.order.ahead`). :class:`DrawsAhead` cuts the stream into chunks of
:data:`CHUNK` positions and computes a chunk vectorised (:meth:`MixSchedule.chunk`: the
windows' layouts, the sources' permutations, one placement per source). Whenever a batch
touches a chunk, a short-lived background thread computes the :data:`AHEAD` chunks after it
that are not ready yet, one after the other, past the epoch's end into the next epoch's (whose
first chunk draws each source's next pass: the costliest), so the gathering thread only slices
and takes, and most of the thread's work is in NumPy calls that release the GIL. Memory holds
at most ``AHEAD + 2`` chunks: 9 bytes a position. A chunk costs about as much as one dataset's
order of as many rows: with no core to spare, the thread takes its share from the gathers.

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
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.mixing.schedule import MixSchedule

__all__ = ["AHEAD", "CHUNK", "DrawsAhead"]

#: positions per chunk (a chunk of the stream costs a few ms to compute)
CHUNK = 1 << 17
#: chunks computed ahead of the last one a batch touched
AHEAD = 2
_Chunk = tuple[np.ndarray, np.ndarray]
_Key = tuple[Any, int]
#: seconds between checks that the thread computing a chunk waited for still runs
_WAIT_S = 0.05


class _Work:
    """Chunks computed one after the other in a (non-daemon, short-lived) thread; each
    result (or error) is put into ``done`` under ``lock`` as soon as it is ready."""

    def __init__(self, todo: Sequence[tuple[_Key, Callable[[], _Chunk]]],
                 done: Callable[[_Key, _Chunk | BaseException], None]) -> None:  # fmt: skip
        self.keys = {key for key, _ in todo}
        self._thread = threading.Thread(target=self._run, args=(todo, done), name="feedline-mix")
        self._thread.start()

    @staticmethod
    def _run(todo: Sequence[tuple[_Key, Callable[[], _Chunk]]],
             done: Callable[[_Key, _Chunk | BaseException], None]) -> None:  # fmt: skip
        for key, work in todo:
            try:
                done(key, work())
            except BaseException as exc:  # noqa: BLE001 - re-raised where the chunk is asked for
                done(key, exc)
                return

    def running(self) -> bool:
        return self._thread.is_alive()


class DrawsAhead:
    """Chunks of the mixed stream's ``(codes, rows)``; see the module docstring.

    Parameters
    ----------
    chunk:
        Positions per chunk.
    bases:
        Added to each row by its source code (the sources' first rows in a combined cache);
        ``None``: rows are sample indices in their own source.
    ahead:
        Chunks computed ahead of the last one touched (0: none, each computed when needed).
    sample_tokens:
        Per source, each sample's tokens: needed by a ``{"tokens": n}`` stop.
    """

    def __init__(self, stop: int | str | dict[str, int], chunk: int = CHUNK,
                 bases: np.ndarray | None = None, ahead: int = AHEAD,
                 sample_tokens: Sequence[np.ndarray] | None = None) -> None:  # fmt: skip
        self.stop, self.chunk, self.bases, self.ahead = stop, int(chunk), bases, int(ahead)
        self.sample_tokens = sample_tokens
        self._lengths: dict[Any, int] = {}
        self._schedules: dict[Any, MixSchedule] = {}  # by key: the ones in use (see adopt)
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # notified as each chunk is put
        #: computed chunks (and errors met ahead), the oldest first
        self._done: OrderedDict[_Key, _Chunk | BaseException] = OrderedDict()
        self._work: _Work | None = None
        self._next: tuple[Any, MixSchedule] | None = None
        self._touched: _Key | None = None  # the last chunk take() started the next ones of

    def adopt(self, schedule: MixSchedule) -> MixSchedule:
        """The schedule equal to ``schedule`` (the same key) already in use here, whose window
        layouts are computed, or else ``schedule``, from now on the one in use."""
        with self._lock:
            known = self._schedules.get(schedule.key)
            if known is not None:
                return known
            if len(self._schedules) > 4:
                self._schedules.clear()
            self._schedules[schedule.key] = schedule
        return schedule

    def length(self, schedule: MixSchedule) -> int:
        """Positions in ``schedule``'s epoch (computed once per schedule)."""
        key = schedule.key
        with self._lock:
            length = self._lengths.get(key)
        if length is None:
            length = (self._token_length(schedule, self.stop["tokens"])
                      if isinstance(self.stop, dict) else schedule.length(self.stop))  # fmt: skip
            with self._lock:
                if len(self._lengths) > 4:
                    self._lengths.clear()
                self._lengths[key] = length
        return length

    def _token_length(self, schedule: MixSchedule, budget: int) -> int:
        """Positions up to and including the one whose sample brings the epoch's tokens to
        ``budget`` (the stream walked a chunk at a time)."""
        tokens = self.sample_tokens
        if tokens is None:
            raise ConfigurationError(
                "Mixing: a token stop needs each sample's tokens. Fix: build DrawsAhead with "
                "sample_tokens= (fl.mix's loader passes them for stop={'tokens': n})."
            )
        drawn = [s for s, c in enumerate(np.sum(schedule.counts, axis=0).tolist()) if c]
        last = [s for s, c in enumerate(schedule.counts[-1].tolist()) if c]
        if not any(int(tokens[s].sum()) for s in last):  # the walk could never end
            raise ConfigurationError(
                f"Mixing: stop={self.stop!r}, but every sample drawn has 0 tokens. Fix: stop "
                "after a number of samples, or mix sources with tokens."
            )
        # walk in steps sized by the expected tokens a position (doubling up to a chunk)
        per_window = sum(int(c) * float(tokens[s].mean()) for s, c in
                         enumerate(schedule.counts[-1].tolist()) if c)  # fmt: skip
        step = int(min(self.chunk, max(256, 1.25 * budget * schedule.window / per_window)))
        total, start = 0, 0
        while True:
            codes, rows = schedule.chunk(start, start + step)
            per = np.zeros(len(codes), np.int64)
            for s in drawn:
                where = codes == s
                per[where] = tokens[s][rows[where]]
            reached = np.cumsum(per) + total
            at = int(np.searchsorted(reached, budget, side="left"))
            if at < len(per):
                return start + at + 1
            total, start, step = int(reached[-1]), start + step, min(self.chunk, 2 * step)

    def _compute(self, schedule: MixSchedule, c: int) -> _Chunk:
        """Chunk ``c`` (cut at the epoch's end)."""
        end = min((c + 1) * self.chunk, self.length(schedule))
        return schedule.chunk(c * self.chunk, max(end, c * self.chunk), self.bases)

    def _put(self, key: _Key, got: _Chunk | BaseException) -> None:
        with self._ready:
            self._done[key] = got
            self._done.move_to_end(key)
            while len(self._done) > self.ahead + 2:  # the oldest is done with
                self._done.popitem(last=False)
            self._ready.notify_all()

    def _get(self, schedule: MixSchedule, c: int) -> _Chunk:
        key = (schedule.key, c)
        with self._ready:
            got = self._done.get(key)
            work = self._work
            # being computed ahead: wait for that chunk (not for the ones after it), while the
            # thread runs (it puts every chunk or error it reaches, then ends)
            while got is None and work is not None and key in work.keys and work.running():
                self._ready.wait(_WAIT_S)
                got = self._done.get(key)
        if isinstance(got, BaseException):
            raise got
        if got is None:
            got = self._compute(schedule, c)
            self._put(key, got)
        return got

    def _after(self, schedule: MixSchedule, c: int) -> list[tuple[MixSchedule, int]]:
        """The :attr:`ahead` chunks after chunk ``c``, into the next epoch past the end (its
        length is left to the background thread: chunks past it are empty)."""
        out: list[tuple[MixSchedule, int]] = []
        crossed = False
        while len(out) < self.ahead:
            c += 1
            if not crossed and c * self.chunk >= self.length(schedule):
                schedule, c, crossed = self._following(schedule), 0, True
            out.append((schedule, c))
        return out

    def _start(self, schedule: MixSchedule, c: int) -> None:
        """Compute the chunks after ``c`` not ready yet, unless a thread is still at work."""
        with self._lock:
            busy = self._work is not None and self._work.running()
        if busy or not self.ahead:
            return
        self._touched = (schedule.key, c)
        after = self._after(schedule, c)
        with self._lock:
            todo = [((s.key, k), partial(self._compute, s, k)) for s, k in after
                    if (s.key, k) not in self._done]  # fmt: skip
            self._work = _Work(todo, self._put) if todo else None

    def take(self, schedule: MixSchedule,
             positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The codes and rows of ``positions`` (all before the epoch's end); starts the chunks
        after the last one touched in the background."""
        n = len(positions)
        if not n:
            return np.empty(0, np.int8), np.empty(0, np.int64)
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
        top = int(positions.max()) // self.chunk
        if self._touched != (schedule.key, top):  # (a busy thread: asked again next time)
            self._start(schedule, top)
        return out

    def _following(self, schedule: MixSchedule) -> MixSchedule:
        key = schedule.key
        if self._next is None or self._next[0] != key:
            self._next = (key, self.adopt(schedule.following(self.length(schedule))))
        return self._next[1]

    def clear(self) -> None:
        """Forget every chunk (the memory is released once no batch refers to it)."""
        with self._lock:
            self._done.clear()
