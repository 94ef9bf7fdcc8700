"""Consumer-side timing of a loader: a bounded per-batch timeline and per-epoch metrics.

For every batch the loader hands to the training loop, its iteration generator appends the
raw clock readings ``(run, batch, asked, got, previous got)`` to :attr:`Timing.rows`: when
the loop asked for the batch (entered ``next()``), when it got it, and when it got the one
before in the same iteration (``run``). Everything else is derived when read:

- ``wait_s = got - asked``: the loop blocked on data the prefetching could not hide;
- ``step_s = asked - previous got``: the loop's own work between two batches (0 for an
  iteration's first batch).

That is two ``time.perf_counter()`` calls and one tuple appended per batch (about 0.3 µs,
measured; a batch at 11M samples/s and batch size 256 takes 23 µs). The timeline keeps the
last ``maxlen`` batches: older rows are folded into per-iteration sums (checked once per
prefetched group), so epoch metrics stay exact however long an epoch is.

Examples
--------
>>> t = Timing(batch_size=4)
>>> t.begin(10.0)
>>> run = t.start_run(0, reset=True)
>>> t.rows.append((run, 0, 10.0, 10.5, None)); t.rows.append((run, 1, 11.0, 11.25, 10.5))
>>> t.end_run(run, tail_step=0.25)
1
>>> [(r["time"], r["wait_s"], r["step_s"]) for r in t.timeline()]
[(0.5, 0.5, 0.0), (1.25, 0.25, 0.5)]
>>> m = t.metrics()[0]
>>> m["samples"], m["seconds"], m["data_wait_fraction"]
(8, 1.5, 0.5)
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["MAX_TIMELINE", "Timing", "epoch_metrics"]

#: most recent batches the timeline keeps
MAX_TIMELINE = 100_000


def epoch_metrics(epoch: int, batches: int, samples: int, wait: float, step: float) -> dict:
    """One epoch's metrics from its totals.

    ``seconds`` is the time the loop spent in the epoch (waiting plus stepping; pauses
    between iterations are left out), ``samples_per_s`` the samples over it, and
    ``data_wait_fraction`` the waiting share of it (0 when nothing was timed).

    Examples
    --------
    >>> m = epoch_metrics(2, 10, 640, 0.25, 0.75)
    >>> m["samples_per_s"], m["data_wait_fraction"]
    (640.0, 0.25)
    """
    seconds = wait + step
    return {
        "epoch": epoch,
        "batches": batches,
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "data_wait_fraction": wait / seconds if seconds > 0 else 0.0,
    }


class Timing:
    """The timing records of one loader (see the module docstring).

    Attributes
    ----------
    rows:
        ``(run, batch, asked, got, previous got or None)`` per batch delivered
        (``time.perf_counter()`` readings), the last ``maxlen`` or a few more.
    limit:
        Row count above which :meth:`trim` folds the oldest rows away.
    """

    def __init__(self, batch_size: int = 1, maxlen: int = MAX_TIMELINE) -> None:
        self.batch_size, self.maxlen, self.limit = batch_size, maxlen, maxlen
        self.rows: deque[tuple[int, int, float, float, float | None]] = deque()
        self.origin: float | None = None
        self._epoch_of: dict[int, int] = {}  # run -> epoch
        self._runs: dict[int, list[int]] = {}  # epoch -> the runs its metrics add up
        self._sums: dict[int, list[Any]] = {}  # run -> [batches, wait, step] folded so far
        self._finished: set[int] = set()
        self._short: dict[tuple[int, int], int] = {}  # (run, batch) -> samples under batch_size

    def short(self, run: int, batch: int, missing: int) -> None:
        """Batch ``batch`` of ``run`` held ``missing`` samples fewer than ``batch_size`` (a
        short last batch, or samples a transform skipped)."""
        self._short[(run, batch)] = missing

    def begin(self, now: float) -> None:
        """Mark the start of the first iteration (later calls keep the first mark)."""
        if self.origin is None:
            self.origin = now

    def start_run(self, epoch: int, *, reset: bool) -> int:
        """A new iteration over ``epoch``; ``reset`` (it starts at the epoch's first batch)
        drops earlier iterations of the epoch from its metrics."""
        run = len(self._epoch_of)
        self._epoch_of[run] = epoch
        self._sums[run] = [0, 0.0, 0.0]
        self._runs[epoch] = [run] if reset else [*self._runs.get(epoch, []), run]
        return run

    @staticmethod
    def _add(sums: list[Any], row: tuple[int, int, float, float, float | None]) -> None:
        sums[0] += 1
        sums[1] += row[3] - row[2]
        if row[4] is not None:
            sums[2] += row[2] - row[4]

    def trim(self) -> None:
        """Fold the rows beyond the newest ``maxlen`` into their iteration's sums."""
        while len(self.rows) > self.maxlen:
            row = self.rows.popleft()
            if row[0] not in self._finished:  # finished runs were summed whole already
                self._add(self._sums[row[0]], row)

    def _tail(self, run: int) -> list[tuple[int, int, float, float, float | None]]:
        """The rows of ``run`` still held, newest first (a run's rows are contiguous and
        later runs' rows follow them)."""
        found = []
        for row in reversed(self.rows):
            if row[0] < run:
                break
            if row[0] == run:
                found.append(row)
        return found

    def end_run(self, run: int, tail_step: float | None) -> int:
        """Close iteration ``run`` (``tail_step``: the loop's step after its last batch, when
        it asked for more); returns the last batch number it delivered (-1 for none)."""
        rows, sums = self._tail(run), self._sums[run]
        for row in rows:
            self._add(sums, row)
        if tail_step is not None:
            sums[2] += tail_step
        self._finished.add(run)
        return rows[0][1] if rows else -1

    def _totals(self, run: int) -> list[Any]:
        sums = list(self._sums[run])
        if run not in self._finished:
            for row in self._tail(run):
                self._add(sums, row)
        return sums

    def timeline(self) -> list[dict[str, Any]]:
        """One dict per batch delivered (oldest first, the last ``maxlen``)."""
        origin, n, epoch_of = self.origin or 0.0, self.batch_size, self._epoch_of
        short = self._short
        rows = list(self.rows)[-self.maxlen :]
        return [
            {
                "epoch": epoch_of[run],
                "batch": k,
                "time": got - origin,
                "samples": n - short.get((run, k), 0),
                "wait_s": got - asked,
                "step_s": 0.0 if previous is None else asked - previous,
            }
            for run, k, asked, got, previous in rows
        ]

    def metrics_of(self, epoch: int) -> dict[str, Any]:
        """The metrics of one epoch (zeros when it delivered nothing)."""
        batches, wait, step = 0, 0.0, 0.0
        runs = self._runs.get(epoch, [])
        for run in runs:
            b, w, s = self._totals(run)
            batches, wait, step = batches + b, wait + w, step + s
        missing = sum(m for (run, _), m in self._short.items() if run in runs)
        return epoch_metrics(epoch, batches, batches * self.batch_size - missing, wait, step)

    def metrics(self) -> list[dict[str, Any]]:
        """One dict per epoch with at least one batch delivered, in epoch order."""
        found = [self.metrics_of(epoch) for epoch in sorted(self._runs)]
        return [m for m in found if m["batches"]]
