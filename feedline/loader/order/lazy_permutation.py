"""An epoch's permutation evaluated lazily: a seeded bijection on ``[0, n)``, in O(1) memory.

:func:`~feedline.loader.order.sample_order.epoch_permutation` draws the whole permutation:
``n`` int64 (8 GB at ``n = 10**9``) on every rank. :class:`LazyPermutation` gives
``perm[positions]`` for just the positions asked for, so a rank evaluates only its own
batches: a keyed Feistel network on the ``2**bits >= n`` integers (alternating unbalanced
halves, so the domain is below ``2 n``), walked along its cycle until the value falls in
``[0, n)`` (*cycle walking*: a bijection of ``[0, 2**bits)`` restricted to ``[0, n)`` this way
is a bijection of ``[0, n)``). Each round mixes one half with a 64-bit finalizer of the other
half and a round key; the round keys come from ``SeedSequence([seed, epoch, 3])``, so the
permutation is a pure function of ``(n, seed, epoch)``, the same on every platform, and
different for every epoch.

Quality: :data:`ROUNDS` rounds of a strong mixing function make a pseudo-random permutation
(Luby-Rackoff: 4 rounds of a pseudo-random function suffice); the tests run it through the
same uniformity checks as the drawn permutation. It is *not* the same permutation as
:func:`~feedline.loader.order.sample_order.epoch_permutation` for a given seed: see
:data:`~feedline.loader.order.sample_order.LAZY_ROWS` for when the loader uses it.

Examples
--------
>>> p = LazyPermutation(10, seed=0, epoch=0)
>>> sorted(p.take(range(10)).tolist())
[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
>>> bool((p.take([3, 7]) == p.take(range(10))[[3, 7]]).all())
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.checks import checked_int

__all__ = ["ROUNDS", "LazyPermutation", "LazyRemaining"]

#: Feistel rounds (an even count, so the two halves end at their starting widths)
ROUNDS = 8

# Domain-separation tag of the lazy permutation's keys (sample_order uses 0, 1, 2).
_LAZY = 3

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (a bijection with full avalanche), wrapping."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


class LazyPermutation:
    """The permutation of ``range(n)`` for ``(seed, epoch)``, evaluated at chosen positions.

    ``take(positions)`` returns ``perm[positions]`` (int64) for any int array of positions in
    ``[0, n)``, in memory proportional to the positions asked for; ``len()`` is ``n``;
    ``np.asarray(perm)`` draws it all (n int64: only for checks and small ``n``).

    Examples
    --------
    >>> p = LazyPermutation(1_000_000_000, seed=7, epoch=2)
    >>> first = p.take(np.arange(4))
    >>> first.dtype, bool(((first >= 0) & (first < 10**9)).all()), len(p)
    (dtype('int64'), True, 1000000000)
    """

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        def fail(name: str, value: Any) -> Any:
            return lambda expected: ConfigurationError(
                f"LazyPermutation: {name} must be {expected}, got {value!r}. Fix: pass a "
                "non-negative integer."
            )

        self.n = checked_int(n, 0, fail=fail("n", n))
        self.seed = checked_int(seed, 0, fail=fail("seed", seed))
        self.epoch = checked_int(epoch, 0, fail=fail("epoch", epoch))
        self.bits = max(2, (self.n - 1).bit_length())
        self._high = self.bits // 2  # widths of the two halves: (high, low), then swapped
        self._low = self.bits - self._high
        words = np.random.SeedSequence([self.seed, self.epoch, _LAZY]).generate_state(
            ROUNDS, dtype=np.uint64
        )
        self._keys = [np.uint64(k) for k in words]

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"LazyPermutation(n={self.n}, seed={self.seed}, epoch={self.epoch})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.take(np.arange(self.n, dtype=np.int64))
        return out if dtype is None else out.astype(dtype, copy=False)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        """One pass of the network over ``[0, 2**bits)`` (uint64 in, uint64 out)."""
        a, b = self._high, self._low  # x = left (a bits) << b | right (b bits)
        for key in self._keys:
            left, right = x >> np.uint64(b), x & np.uint64((1 << b) - 1)
            mixed = (left ^ _mix(right ^ key)) & np.uint64((1 << a) - 1)
            x = (right << np.uint64(a)) | mixed  # left is now b bits, right a bits
            a, b = b, a
        return x

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """``perm[positions]`` as int64 (same shape as ``positions``).

        Raises
        ------
        ConfigurationError
            If a position is outside ``[0, n)``.

        Examples
        --------
        >>> LazyPermutation(5, seed=1, epoch=0).take([[0, 1], [2, 3]]).shape
        (2, 2)
        """
        return self._walk(positions, self._feistel, "positions",
                          "ask for positions of the epoch's order only")  # fmt: skip

    def _walk(self, values: Sequence[int] | np.ndarray, step: Callable[[np.ndarray], np.ndarray],
              name: str,
              fix: str) -> np.ndarray:  # fmt: skip
        """``step`` (the network, or its inverse) applied to ``values`` and walked along the
        cycle until in ``[0, n)`` (fewer than 2 steps expected: ``2**bits < 2 n``)."""
        v = np.asarray(values)
        if v.size == 0:
            return np.zeros(v.shape, dtype=np.int64)
        if not np.issubdtype(v.dtype, np.integer) or v.min() < 0 or v.max() >= self.n:
            raise ConfigurationError(
                f"LazyPermutation: {name} must be integers in [0, {self.n}), got dtype "
                f"{v.dtype} in [{v.min()}, {v.max()}]. Fix: {fix}."
            )
        x = step(v.astype(np.uint64).reshape(-1))
        n = np.uint64(self.n)
        outside = np.flatnonzero(x >= n)
        while outside.size:
            x[outside] = step(x[outside])
            outside = outside[x[outside] >= n]
        return x.astype(np.int64).reshape(v.shape)

    def _feistel_inverse(self, y: np.ndarray) -> np.ndarray:
        """:meth:`_feistel` undone: the rounds in reverse, each with the widths it used."""
        widths = [(self._high, self._low), (self._low, self._high)]
        for i in range(len(self._keys) - 1, -1, -1):
            a, b = widths[i % 2]  # round i split x as left (a bits) << b | right (b bits)
            right, mixed = y >> np.uint64(a), y & np.uint64((1 << a) - 1)
            left = (mixed ^ _mix(right ^ self._keys[i])) & np.uint64((1 << a) - 1)
            y = (left << np.uint64(b)) | right
        return y

    def inverse(self, values: Sequence[int] | np.ndarray) -> np.ndarray:
        """The positions holding ``values``: ``p.take(p.inverse(v)) == v`` (int64, the shape of
        ``values``), in memory proportional to the values asked for.

        Raises
        ------
        ConfigurationError
            If a value is outside ``[0, n)``.

        Examples
        --------
        >>> p = LazyPermutation(1000, seed=3, epoch=1)
        >>> at = p.inverse([5, 999])
        >>> p.take(at).tolist()
        [5, 999]
        """
        return self._walk(values, self._feistel_inverse, "values",
                          "ask for rows of the dataset only")  # fmt: skip


class LazyRemaining:
    """A lazy order with some of its positions removed: what an elastic resume still serves.

    ``base`` is a lazy order (:class:`LazyPermutation`, another ``LazyRemaining``, a
    :class:`~feedline.loader.order.lazy_block_order.LazyBlockOrder`: anything with ``take``
    and ``len``); ``runs`` are the
    removed positions of ``base``, as ``(start, length)`` pairs (any order, may touch). The
    ``k``-th remaining position is found by a binary search over the runs, so memory is
    proportional to the number of runs (a few per rank after a lock-step checkpoint), not
    to ``n``.

    Examples
    --------
    >>> base = LazyPermutation(10, seed=0, epoch=0)
    >>> rest = LazyRemaining(base, [(0, 4), (6, 1)])
    >>> len(rest), rest.take(range(5)).tolist() == base.take([4, 5, 7, 8, 9]).tolist()
    (5, True)
    """

    def __init__(self, base: Any, runs: Sequence[tuple[int, int]]) -> None:
        self.base = base
        n = len(base)
        spans = sorted((max(0, s), min(n, s + length)) for s, length in runs if length > 0)
        merged: list[list[int]] = []
        for start, end in spans:
            if start >= end:
                continue
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        starts = np.array([s for s, _ in merged], dtype=np.int64)
        lengths = np.array([e - s for s, e in merged], dtype=np.int64)
        self._removed = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self._kept_before = starts - self._removed[:-1]  # remaining positions before each run
        self.n = n - int(self._removed[-1])

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"LazyRemaining({self.base!r}, {len(self._kept_before)} runs removed)"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.take(np.arange(self.n, dtype=np.int64))
        return out if dtype is None else out.astype(dtype, copy=False)

    def take(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The rows at the remaining order's ``positions`` (int64, same shape).

        Examples
        --------
        >>> LazyRemaining(LazyPermutation(6, 1, 0), [(1, 2)]).take([0, 1]).dtype
        dtype('int64')
        """
        pos = np.asarray(positions)
        if pos.size and (
            not np.issubdtype(pos.dtype, np.integer) or pos.min() < 0 or pos.max() >= self.n
        ):
            raise ConfigurationError(
                f"LazyRemaining: positions must be integers in [0, {self.n}). Fix: ask for "
                "positions of the remaining order only."
            )
        pos = pos.astype(np.int64)
        runs_before = np.searchsorted(self._kept_before, pos, side="right")
        return self.base.take(pos + self._removed[runs_before])
