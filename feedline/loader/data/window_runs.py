"""Contiguous windows: runs of consecutive windows from a random start, cut anew each epoch.

For recurrent models (see :class:`~feedline.loader.data.windows.Windows`):

- ``contiguous=True``: every batch is one *run* of ``batch_size`` consecutive windows of one
  series (``stride`` rows apart), in time order, so a model may carry its state from one row
  of the batch to the next;
- ``stream_batches=K``: every batch holds ``batch_size`` *streams*, each a run of ``K``
  consecutive windows; row ``i`` of batch ``b + 1`` is the window right after row ``i`` of
  batch ``b`` (truncated back-propagation through time: carry the state across batches),
  for ``K`` batches, then every row starts a new stream.

Each epoch every series is cut into runs of ``L`` windows (``L = batch_size``, or ``K`` for
streams) from a random offset in ``[0, n mod L]`` (``n``: the series' windows), so the run
boundaries move from epoch to epoch and the at most ``L - 1`` windows left over fall at
either end; the runs are then permuted (``shuffle=False``: offset 0, stored order). The
loader orders *positions* ``0 .. num_samples - 1`` sequentially, and shards and resumes
them as it does rows (:mod:`feedline.loader.order.sample_order`: rank ``r``'s ``k``-th
batch is positions ``(k * world_size + r) * batch_size`` onwards); :class:`WindowRuns` maps
each position to its window, a pure function of ``(seed, epoch, world_size, batch_size)``.
Runs never straddle two batches of a rank (``contiguous``), and a stream's ``K`` windows
fall at the same row of one rank's ``K`` consecutive batches (``stream_batches``):
``num_samples`` is a whole number of runs (``contiguous``), of groups of ``world_size *
batch_size`` streams (``stream_batches``: the streams of an incomplete group wait for
another epoch).

Memory per epoch is the run permutation (8 bytes a run) and one offset per series.
"""

from __future__ import annotations

import numpy as np

from feedline.errors import ConfigurationError

__all__ = ["RUNS_TAG", "WindowRuns"]

#: mixed into the seed: the runs' draws never coincide with the shuffle's or a sample's
RUNS_TAG = 0x52554E53


class WindowRuns:
    """Where each loader position's window is, epoch by epoch (see the module docstring).

    Parameters
    ----------
    counts:
        The windows of each series, in series order (window ids run series after series).
    length:
        Windows per run: ``batch_size`` (``contiguous=True``) or ``stream_batches``.
    streams:
        ``world_size * batch_size`` for ``stream_batches`` (runs are streams, laid out across
        ``length`` consecutive batches), ``None`` for ``contiguous=True``.

    Examples
    --------
    >>> runs = WindowRuns(np.array([7, 2, 9]), length=3)  # 2 + 0 + 3 runs of 3 windows
    >>> runs.num_samples
    15
    >>> ids = runs.windows(np.arange(15), runs.epoch(shuffle=False, seed=0, epoch=0))
    >>> ids.reshape(5, 3).tolist()  # series 0: ids 0..6, series 2: ids 9..17
    [[0, 1, 2], [3, 4, 5], [9, 10, 11], [12, 13, 14], [15, 16, 17]]
    >>> plan = runs.epoch(shuffle=True, seed=0, epoch=1)
    >>> shuffled = runs.windows(np.arange(15), plan).reshape(5, 3)
    >>> bool((np.diff(shuffled, axis=1) == 1).all())  # every run: consecutive windows
    True
    """

    def __init__(self, counts: np.ndarray, length: int, streams: int | None = None) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        self.length, self.streams = int(length), streams
        self.first_ids = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.runs = counts // self.length
        self.leftover = counts - self.runs * self.length
        self.first_runs = np.concatenate([[0], np.cumsum(self.runs)]).astype(np.int64)
        total = int(self.first_runs[-1])
        if streams is None:
            self.used_runs = total
        else:
            self.used_runs = total // streams * streams
        self.num_samples = self.used_runs * self.length
        if counts.sum() and not self.num_samples:
            what = (f"{self.length} consecutive windows (batch_size)" if streams is None else
                    f"{streams} streams (world_size x batch_size) of stream_batches="
                    f"{self.length} consecutive windows: it has {total}")  # fmt: skip
            raise ConfigurationError(
                f"Windows: no batch can be made: the data does not hold {what} (the longest "
                f"series has {int(counts.max())} windows). Fix: a smaller batch_size"
                + ("" if streams is None else " or stream_batches")
                + ", a smaller stride, or "
                "longer series."
            )

    def epoch(self, *, shuffle: bool, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's run order (the runs in yield order, ``used_runs`` of them) and each
        series' offset (its first run's first window)."""
        total = int(self.first_runs[-1])
        if not shuffle:
            return np.arange(self.used_runs, dtype=np.int64), np.zeros_like(self.leftover)
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, epoch,
                                                                           RUNS_TAG])))  # fmt: skip
        offsets = rng.integers(0, self.leftover + 1)
        order = rng.permutation(total).astype(np.int64)[: self.used_runs]
        return order, offsets.astype(np.int64)

    def windows(self, positions: np.ndarray, plan: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """The window ids of loader ``positions`` under an epoch's ``plan`` (:meth:`epoch`)."""
        order, offsets = plan
        p = np.asarray(positions, dtype=np.int64)
        if self.streams is None:
            slot, step = p // self.length, p % self.length
        else:
            at, row = p // self.streams, p % self.streams
            slot, step = (at // self.length) * self.streams + row, at % self.length
        run = order[slot]
        series = self.first_runs.searchsorted(run, side="right") - 1
        within = run - self.first_runs[series]
        return self.first_ids[series] + offsets[series] + within * self.length + step
