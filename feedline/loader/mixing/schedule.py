"""The mixed stream's order: a pure function of (sizes, weights, seed, epoch, position).

The stream is cut into windows of ``window`` positions. In each window source ``s`` takes
``counts[s]`` positions: the largest-remainder rounding of ``window * weights[s]`` (so each
count is within 1 of ``window * weights[s]``), laid out in a random order drawn by a generator
keyed by ``(seed, epoch, segment, block)`` (a block: the windows of about
:data:`BLOCK_POSITIONS` positions, laid out together). Layout 2 (the default) gives each
position of a window a distinct random key and hands the ``counts[0]`` smallest keys to
source 0, the next ``counts[1]`` to source 1, and so on: one draw of random numbers and one
sort of each window's keys per block, most of it outside the GIL. Layout 1 (checkpoints of
feedline's first mixing release) shuffled each window's codes in place, 64 windows of 256 at
a time.

A *segment* is a run of positions with one set of weights: a curriculum appends a segment
where the weights change, and the positions before it keep their sources.

Source ``s``'s ``k``-th draw (counted from the start of the run: ``offsets[s]`` draws were
made in earlier epochs) reads sample ``perm[j][k % n]`` where ``j = k // n`` is the source's
own pass over its ``n`` samples and ``perm[j]`` that pass's permutation (keyed by
``(seed, source, j)``): no sample repeats within a pass, and a small source starts its next
pass, reshuffled, while the others go on.

Examples
--------
>>> s = MixSchedule([10, 10], [(0, (0.75, 0.25))], window=4, seed=0, epoch=0)
>>> sorted(s.sources(0, 4).tolist()), s.drawn_before(8).tolist()
([0, 0, 0, 1], [6, 2])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.order.sample_order import global_order

__all__ = ["BLOCK_POSITIONS", "LAYOUT", "MixSchedule", "source_permutation", "window_counts"]

#: keeps the window layouts' and the sources' generators apart from the loader's shuffles
_LAYOUT, _PASS = 0x4D49584C, 0x4D495850
#: up to this many sources, a chunk's rows are put in place source by source (else: one sort)
_FEW = 8
#: about this many positions are laid out at once, by layout (see the module docstring)
BLOCK_POSITIONS = {1: 1 << 14, 2: 1 << 17}
#: the layout new schedules use
LAYOUT = 2


def window_counts(weights: Sequence[float], window: int) -> np.ndarray:
    """Positions per source in a window: the largest-remainder rounding of ``window*weights``.

    Examples
    --------
    >>> window_counts([0.6, 0.3, 0.1], 10).tolist(), window_counts([1, 1, 1], 4).tolist()
    ([6, 3, 1], [2, 1, 1])
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not len(w) or not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
        raise ConfigurationError(
            f"Mixing weights {list(weights)!r}: expected one finite weight >= 0 per source, "
            "at least one > 0. Fix: pass weights such as {'web': 0.7, 'code': 0.3}."
        )
    exact = window * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    left = int(window - counts.sum())
    # ties go to the first source: stable sort of the remainders, largest first
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:left]] += 1
    return counts


def source_permutation(size: int, seed: int, source: int, npass: int,
                       layout: int = LAYOUT) -> np.ndarray:  # fmt: skip
    """Source ``source``'s ``npass``-th pass over its ``size`` samples (a permutation).

    Layout 2 draws it with an SFC64 generator keyed by ``(seed, source, npass)``: the fastest
    of NumPy's generators at a shuffle (it runs beside the gathers, whose memory traffic slows
    a shuffle of a large source two- to threefold). Layout 1 drew it as one dataset's epoch
    order (:func:`~feedline.loader.order.sample_order.global_order`).

    Examples
    --------
    >>> sorted(source_permutation(5, seed=0, source=1, npass=2).tolist())
    [0, 1, 2, 3, 4]
    """
    key = np.random.SeedSequence([seed, _PASS, source]).generate_state(1)[0]
    if layout != 1:
        bits = np.random.SFC64(np.random.SeedSequence([int(key), int(npass)]))
        return np.random.Generator(bits).permutation(size).astype(np.int64, copy=False)
    # a source over LAZY_ROWS gets a lazy permutation: drawn whole here (sources are in memory)
    order = global_order([size], shuffle=True, seed=int(key), epoch=npass, window=None)
    return np.asarray(order, dtype=np.int64)


class MixSchedule:
    """The sources of the positions of one epoch of the mixed stream (module docstring).

    ``segments``: ``(start position, weights)`` pairs, the first at position 0, starts
    increasing; ``offsets``: each source's draws in the epochs before this one.
    """

    def __init__(self, sizes: Sequence[int], segments: Sequence[tuple[int, Sequence[float]]],
                 *, window: int, seed: int, epoch: int,
                 offsets: Sequence[int] | None = None, layout: int = LAYOUT) -> None:  # fmt: skip
        self.sizes = [int(n) for n in sizes]
        self.window, self.seed, self.epoch = int(window), int(seed), int(epoch)
        if layout not in BLOCK_POSITIONS:
            raise ConfigurationError(
                f"Mixing: layout {layout!r} is not one of {sorted(BLOCK_POSITIONS)}. Fix: pass "
                "the state_dict() unchanged."
            )
        self.layout = int(layout)
        self.offsets = np.zeros(len(self.sizes), np.int64) if offsets is None else (
            np.asarray(offsets, dtype=np.int64))  # fmt: skip
        if not segments or segments[0][0] != 0:
            raise ConfigurationError(
                "Mixing: the first weights must start at position 0. "
                "Fix: pass the state_dict() unchanged."
            )
        self.starts = [int(p) for p, _ in segments]
        if any(b <= a for a, b in zip(self.starts, self.starts[1:], strict=False)):
            raise ConfigurationError(f"Mixing: weight changes at positions {self.starts} must "
                                     "increase. Fix: pass the state_dict() unchanged.")  # fmt: skip
        self.weights = [tuple(float(x) for x in w) for _, w in segments]
        self.counts = [window_counts(w, self.window) for w in self.weights]
        for w in self.weights:
            if len(w) != len(self.sizes):
                raise ConfigurationError(
                    f"Mixing: {len(w)} weights for {len(self.sizes)} sources. Fix: give one "
                    "weight per source."
                )
        #: windows laid out together (one generator and one vectorized shuffle per block)
        self.block = max(1, BLOCK_POSITIONS[self.layout] // self.window)
        self._blocks = lru_cache(maxsize=4)(self._make_block)
        self._ranks = lru_cache(maxsize=4)(self._make_ranks)
        #: the sources' codes in the smallest int type (a stable argsort of them is a radix sort)
        self._code_type = np.int8 if len(self.sizes) < 128 else np.int16

    @cached_property
    def key(self) -> tuple[Any, ...]:
        """What the order depends on: equal keys, equal schedules."""
        return (tuple(self.sizes), self.window, self.seed, self.epoch, tuple(self.offsets.tolist()),
                tuple(zip(self.starts, self.weights, strict=True)), self.layout)  # fmt: skip

    def following(self, length: int) -> MixSchedule:
        """The next epoch's schedule when this one ends at ``length`` positions: the sources'
        draws carried over, the last weights from its start."""
        return MixSchedule(self.sizes, [(0, self.weights[-1])], window=self.window,
                           seed=self.seed, epoch=self.epoch + 1,
                           offsets=self.offsets + self.drawn_before(length),
                           layout=self.layout)  # fmt: skip

    def _make_block(self, segment: int, block: int) -> np.ndarray:
        """Windows ``block * self.block ...`` of a segment, flat: their source codes (in
        :attr:`_code_type`), drawn by a generator keyed by ``(seed, epoch, segment, block)``."""
        key = [self.seed, _LAYOUT, self.epoch, segment, block]
        counts = self.counts[segment]
        if self.layout == 1:  # each window's codes shuffled in place
            codes = np.repeat(np.arange(len(self.sizes), dtype=np.int64), counts)
            rng = np.random.default_rng(key)
            laid = rng.permuted(np.tile(codes, (self.block, 1)), axis=1).ravel()
            return laid.astype(self._code_type)
        return _ranked_codes(np.random.default_rng([*key, 2]), self.block, counts)

    def _make_ranks(self, segment: int, block: int) -> np.ndarray:
        """Each position's rank among its window's positions of the same source."""
        layout = self._blocks(segment, block).reshape(self.block, self.window)
        ranks = np.zeros(layout.shape, np.int64)
        for s in range(len(self.sizes)):
            mask = layout == s
            ranks[mask] = (np.cumsum(mask, axis=1) - 1)[mask]
        return ranks.ravel()

    def _layout(self, segment: int, index: int) -> np.ndarray:
        """Window ``index`` of a segment: its source codes."""
        block, row = divmod(index, self.block)
        return self._blocks(segment, block)[row * self.window : (row + 1) * self.window]

    def _chunks(self, start: int, stop: int) -> Iterator[tuple[int, int, int, int, int]]:
        """``(p, end, segment, block, at)``: runs of positions in one block of one segment."""
        p = start
        span = self.block * self.window
        while p < stop:
            seg = self._segment(p)
            block, at = divmod(p - self.starts[seg], span)
            end = min(stop, p + span - at)
            if seg + 1 < len(self.starts):
                end = min(end, self.starts[seg + 1])
            yield p, end, seg, block, at
            p = end

    def _segment(self, position: int) -> int:
        return int(np.searchsorted(self.starts, position, side="right")) - 1

    def sources(self, start: int, stop: int) -> np.ndarray:
        """Source codes of positions ``start`` to ``stop`` (exclusive)."""
        return self._codes(start, stop).astype(np.int64)

    def _codes(self, start: int, stop: int) -> np.ndarray:
        """:meth:`sources` in :attr:`_code_type` (a view of a block when it holds them all)."""
        runs = list(self._chunks(start, stop))
        if len(runs) == 1:
            p, end, seg, block, at = runs[0]
            return self._blocks(seg, block)[at : at + end - p]
        out = np.empty(max(0, stop - start), self._code_type)
        for p, end, seg, block, at in runs:
            out[p - start : end - start] = self._blocks(seg, block)[at : at + end - p]
        return out

    def _drawn_in(self, seg: int, length: int) -> np.ndarray:
        full, rest = divmod(length, self.window)
        drawn = full * self.counts[seg]
        if rest:
            drawn = drawn + np.bincount(self._layout(seg, full)[:rest], minlength=len(self.sizes))
        return drawn

    def drawn_before(self, position: int) -> np.ndarray:
        """Draws of each source at positions before ``position`` (this epoch only)."""
        drawn = np.zeros(len(self.sizes), np.int64)
        for seg, start in enumerate(self.starts):
            if start >= position:
                break
            end = self.starts[seg + 1] if seg + 1 < len(self.starts) else position
            drawn += self._drawn_in(seg, min(end, position) - start)
        return drawn

    def position_of(self, source: int, k: int) -> int | None:
        """The position of this epoch's ``k``-th draw (from 0) of ``source``; ``None``: never."""
        for seg, start in enumerate(self.starts):
            last = seg + 1 == len(self.starts)
            c = int(self.counts[seg][source])
            if not last:
                d = int(self._drawn_in(seg, self.starts[seg + 1] - start)[source])
                if k >= d:
                    k -= d
                    continue
            if c == 0:
                return None
            index, j = divmod(k, c)
            at = int(np.flatnonzero(self._layout(seg, index) == source)[j])
            return start + index * self.window + at
        return None

    def length(self, stop: int | str) -> int:
        """Positions in this epoch: ``stop`` samples, or up to the end of the first (or the
        last) source's current pass, ``"first_exhausted"`` (``"all_exhausted"``)."""
        if isinstance(stop, int):
            return stop
        ends = []
        for s, n in enumerate(self.sizes):
            left = n - int(self.offsets[s]) % n if n else 0
            at = self.position_of(s, left - 1) if left else None
            if at is not None:
                ends.append(at + 1)
        if not ends:
            raise ConfigurationError(
                f"Mixing: no source is ever drawn to its end (stop={stop!r}). Fix: give a "
                "source with samples a weight > 0, or stop after a number of samples."
            )
        return min(ends) if stop == "first_exhausted" else max(ends)

    def draws(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions ``start`` to ``stop``: their source codes, and each one's draw number in
        its source (counted from the run's start, ``offsets`` included)."""
        codes = np.empty(max(0, stop - start), np.int64)
        draws = np.empty(len(codes), np.int64)
        for p, end, seg, block, at in self._chunks(start, stop):
            layout, ranks = self._blocks(seg, block), self._ranks(seg, block)
            c = layout[at : at + end - p]
            first = self.starts[seg]
            base = self.offsets + self.drawn_before(first)
            window = np.arange(p - first, end - first, dtype=np.int64) // self.window
            codes[p - start : end - start] = c
            draws[p - start : end - start] = (base[c] + window * self.counts[seg][c]
                                              + ranks[at : at + end - p])  # fmt: skip
        return codes, draws

    def rows(self, source: int, draws: np.ndarray) -> np.ndarray:
        """The sample indices that ``source``'s draws numbered ``draws`` read."""
        n = self.sizes[source]
        passes, rows = np.divmod(draws, n)
        if not len(draws):
            return rows
        first = int(passes[0])
        if int(passes[-1]) == first and (len(passes) < 2 or int(passes.max()) == first):
            return _permutation(n, self.seed, source, first, self.layout)[rows]
        idx = np.empty(len(draws), np.int64)
        for j in np.unique(passes):
            sel = passes == j
            idx[sel] = _permutation(n, self.seed, source, int(j), self.layout)[rows[sel]]
        return idx

    def samples(self, codes: np.ndarray, start: int) -> list[np.ndarray]:
        """Per source: the sample indices read by the positions ``start, start+1, ...`` whose
        source codes are ``codes`` (each source's draws in position order)."""
        before = self.offsets + self.drawn_before(start)
        out = []
        for s, n in enumerate(self.sizes):
            k = int(before[s]) + np.arange(int((codes == s).sum()), dtype=np.int64)
            if not len(k):
                out.append(k)
                continue
            passes, rows = np.divmod(k, n)
            idx = np.empty(len(k), np.int64)
            for j in np.unique(passes):
                sel = passes == j
                idx[sel] = _permutation(n, self.seed, s, int(j), self.layout)[rows[sel]]
            out.append(idx)
        return out

    def chunk(self, start: int, stop: int,
              bases: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """Positions ``start`` to ``stop``: their source codes and the sample each one reads
        (plus ``bases[code]`` when given: rows of a cache over every source), vectorised.

        A source's draws in a run of positions are consecutive numbers, so its samples are
        slices of its passes' permutations, put in place by one stable sort of the codes.

        Examples
        --------
        >>> s = MixSchedule([4, 6], [(0, (0.5, 0.5))], window=4, seed=0, epoch=0)
        >>> codes, rows = s.chunk(0, 8)
        >>> sorted(rows[codes == 0].tolist()), len(set(rows[codes == 1].tolist()))
        ([0, 1, 2, 3], 4)
        """
        small = self._codes(start, stop)
        if not len(small):
            return small, np.empty(0, np.int64)
        before = self.offsets + self.drawn_before(start)
        rows = np.empty(len(small), np.int64)
        if len(self.sizes) > _FEW:  # a stable sort of the codes lists each source's positions
            where = np.argsort(small, kind="stable")
            counts = np.bincount(small, minlength=len(self.sizes))
            parts = [self._consecutive(s, int(before[s]), int(c), bases)
                     for s, c in enumerate(counts.tolist()) if c]  # fmt: skip
            rows[where] = np.concatenate(parts)
            return small, rows
        for s in range(len(self.sizes)):
            at = np.flatnonzero(small == s)
            if len(at):
                rows[at] = self._consecutive(s, int(before[s]), len(at), bases)
        return small, rows

    def _consecutive(self, source: int, first: int, count: int,
                     bases: np.ndarray | None) -> np.ndarray:  # fmt: skip
        """The samples read by ``source``'s draws ``first`` to ``first + count - 1`` (plus
        ``bases[source]``)."""
        n = self.sizes[source]
        parts, k, end = [], first, first + count
        while k < end:
            npass, at = divmod(k, n)
            take = min(end - k, n - at)
            parts.append(_permutation(n, self.seed, source, npass, self.layout)[at : at + take])
            k += take
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return rows + bases[source] if bases is not None else rows


def _ranked_codes(rng: np.random.Generator, windows: int, counts: np.ndarray) -> np.ndarray:
    """``windows`` windows of ``counts.sum()`` positions, flat: each position gets a distinct
    random key (the generator's raw bits, the low ones replaced by the position's index in its
    window); the ``counts[0]`` smallest keys of a window read source 0, the next ``counts[1]``
    source 1, and so on.

    Keys are 32-bit for windows of up to 256 positions (24 random bits: two keys' random parts
    are equal in about one window in 500, and then the earlier position sorts first), 64-bit
    past that.

    Examples
    --------
    >>> codes = _ranked_codes(np.random.default_rng(0), 3, np.array([2, 0, 3]))
    >>> [np.bincount(w, minlength=3).tolist() for w in codes.reshape(3, 5)]
    [[2, 0, 3], [2, 0, 3], [2, 0, 3]]
    """
    window = int(counts.sum())
    sources = len(counts)
    code_type = np.int8 if sources < 128 else np.int16
    bits = max(1, (window - 1).bit_length())
    key_type = np.uint32 if bits <= 8 else np.uint64
    per_raw = 8 // np.dtype(key_type).itemsize  # keys per 64 raw bits
    raw = rng.bit_generator.random_raw(-(-windows * window // per_raw))
    keys = raw.view(key_type)[: windows * window].reshape(windows, window)
    keys &= key_type(~((1 << bits) - 1) & np.iinfo(key_type).max)
    keys |= np.arange(window, dtype=key_type)  # distinct keys: exact counts
    bounds = np.cumsum(counts)[:-1]  # rank >= bounds[s] reads a source after s
    inner = sorted({int(b) for b in bounds if 0 < b < window})
    first = int((bounds == 0).sum())  # sources before it take no position
    codes = np.full((windows, window), first, code_type)
    if len(inner) <= _FEW:  # each row sorted (NumPy's vectorized sort of integers: faster
        # here than np.partition, ten times faster than a partition at several kth), then one
        # comparison per source boundary with the key ranked there
        ordered = np.sort(keys, axis=1) if inner else keys
        for b in bounds.tolist():
            if 0 < b < window:
                codes += keys >= ordered[:, b : b + 1]
        return codes.ravel()
    ranked = np.repeat(np.arange(sources, dtype=code_type), counts)  # the sorted keys' sources
    np.put_along_axis(codes, np.argsort(keys, axis=1), ranked[None, :], axis=1)
    return codes.ravel()


@lru_cache(maxsize=16)
def _permutation(size: int, seed: int, source: int, npass: int, layout: int) -> np.ndarray:
    return source_permutation(size, seed, source, npass, layout)
