"""A mergeable quantile sketch with a deterministic rank-error bound, exact while small.

The sketch keeps every value while it has seen at most ``exact_limit`` of them (100,000 by
default), so medians and quantiles of small data are exact (numpy's ``"linear"`` method).
Beyond that it becomes a deterministic compactor hierarchy (the MRL/KLL family): level
``h`` holds values of weight ``2**h``; when a level overflows, it is sorted and every other
value is promoted to the next level (alternating the offset between compactions).

Error bound
-----------
One compaction at level ``h`` moves the estimated rank of any value by at most ``2**h``.
The sketch adds up these weights as it compacts, so :attr:`QuantileSketch.error` is a
*guaranteed* bound on the absolute rank error of every query (0 while exact), and merging
adds the bounds of its inputs. A priori, since a compaction at level ``h`` consumes more
than ``k`` values of weight ``2**h``, the relative rank error is at most
``1 / exact_limit + H / k`` where ``H = ceil(log2(n / k))`` is the number of levels above
0: 0.17% for ``n = 10**8`` with the default ``k = 8192``. Measured errors are far smaller
(the alternating offsets cancel; see the tests).

Examples
--------
>>> import numpy as np
>>> a = QuantileSketch.of(np.arange(0, 50, dtype=float))
>>> b = QuantileSketch.of(np.arange(50, 101, dtype=float))
>>> s = a.merge(b)
>>> s.count, s.is_exact, float(s.quantile(0.5))
(101, True, 50.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline.errors import ConfigurationError

__all__ = ["DEFAULT_K", "EXACT_LIMIT", "QuantileSketch"]

#: values kept exactly before the sketch starts compacting
EXACT_LIMIT = 100_000
#: capacity of each compacted level
DEFAULT_K = 8192


class QuantileSketch:
    """Mergeable quantile summary of a stream of floats (NaN values are ignored).

    Parameters
    ----------
    k:
        Capacity of each compacted level (even, >= 8); the rank error shrinks as ``1/k``.
    exact_limit:
        Values kept exactly before compacting starts (also the capacity of level 0).

    Sketches are immutable values: :meth:`merge` returns a new sketch, so partials can
    be reused and merged in any order.

    Examples
    --------
    >>> import numpy as np
    >>> s = QuantileSketch.of(np.array([1.0, 2.0, np.nan, 3.0, 4.0]))
    >>> s.count, [float(v) for v in s.quantile([0.25, 0.5, 0.75])]
    (4, [1.75, 2.5, 3.25])
    >>> big = QuantileSketch.of(np.random.default_rng(0).random(300_000))
    >>> big.is_exact, big.relative_error < 0.001, abs(float(big.quantile(0.5)) - 0.5) < 0.002
    (False, True, True)
    """

    __slots__ = (
        "_chunks",
        "_flips",
        "_sorted_cache",
        "count",
        "error",
        "exact_limit",
        "k",
        "levels",
        "max",
        "min",
    )

    def __init__(self, k: int = DEFAULT_K, exact_limit: int = EXACT_LIMIT) -> None:
        if k < 8 or k % 2 or exact_limit < k:
            raise ConfigurationError(
                f"QuantileSketch(k={k}, exact_limit={exact_limit}): k must be even and >= 8, "
                "and exact_limit >= k. Fix: use the defaults."
            )
        self.k = int(k)
        self.exact_limit = int(exact_limit)
        self._chunks: list[np.ndarray] = []  # level 0, unsorted, concatenated lazily
        self.levels: list[np.ndarray] = [np.empty(0)]  # level h >= 1 holds weight 2**h
        self._flips: list[int] = [0]  # compactions done per level (alternates the offset)
        self.count = 0
        self.error = 0  # guaranteed bound on the absolute rank error
        self.min = float("inf")
        self.max = float("-inf")
        self._sorted_cache: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def of(cls, values: Any, k: int = DEFAULT_K, exact_limit: int = EXACT_LIMIT) -> QuantileSketch:
        """A sketch of ``values`` (array-like of numbers; NaN is skipped)."""
        x = np.asarray(values, dtype=np.float64).ravel()
        x = x[~np.isnan(x)]
        sketch = cls(k, exact_limit)
        if x.size:
            sketch._chunks = [np.sort(x)]  # sorted here (in the workers): merges sort runs
            sketch.count = int(x.size)
            sketch.min, sketch.max = float(x.min()), float(x.max())
            sketch._compress()
        return sketch

    # ------------------------------------------------------------------ merging

    def merge(self, other: QuantileSketch) -> QuantileSketch:
        """A new sketch of both inputs' values (commutative; associative up to ``error``)."""
        if (self.k, self.exact_limit) != (other.k, other.exact_limit):
            raise ConfigurationError(
                f"Cannot merge quantile sketches with k={self.k}/{other.k} and "
                f"exact_limit={self.exact_limit}/{other.exact_limit}. Fix: build both alike."
            )
        out = QuantileSketch(self.k, self.exact_limit)
        out._chunks = self._chunks + other._chunks
        depth = max(len(self.levels), len(other.levels))
        out.levels = [_concat([_at(self.levels, h), _at(other.levels, h)]) for h in range(depth)]
        out._flips = [_at_int(self._flips, h) + _at_int(other._flips, h) for h in range(depth)]
        out.count = self.count + other.count
        out.error = self.error + other.error
        out.min, out.max = min(self.min, other.min), max(self.max, other.max)
        out._compress()
        return out

    def _compress(self) -> None:
        self._sorted_cache = None
        if sum(c.size for c in self._chunks) > self.exact_limit:
            kept = self._compact(0, _concat(self._chunks))
            self._chunks = [kept] if kept.size else []
        for h in range(1, len(self.levels)):
            if self.levels[h].size > self.k:
                self.levels[h] = self._compact(h, self.levels[h])

    def _compact(self, h: int, items: np.ndarray) -> np.ndarray:
        """Promote every other sorted item to level ``h + 1``; return what stays at ``h``."""
        items = np.sort(items, kind="stable")  # timsort: fast on the sorted runs merged here
        keep = items[-1:] if items.size % 2 else items[:0]
        pairs = items[: items.size - keep.size]
        promoted = pairs[self._flips[h] % 2 :: 2]
        self._flips[h] += 1
        self.error += 2**h
        if h + 1 == len(self.levels):
            self.levels.append(np.empty(0))
            self._flips.append(0)
        self.levels[h + 1] = _concat([self.levels[h + 1], promoted])
        return keep

    # ------------------------------------------------------------------ queries

    @property
    def is_exact(self) -> bool:
        """True while every value is kept (quantiles are then exact)."""
        return self.error == 0

    @property
    def relative_error(self) -> float:
        """Guaranteed bound on the rank error as a fraction of ``count`` (0 while exact)."""
        return self.error / self.count if self.count else 0.0

    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """All values sorted, with cumulative weights (computed once: queries repeat)."""
        if self._sorted_cache is None:
            parts = [_concat(self._chunks), *self.levels[1:]]
            values = _concat(parts)
            weights = np.concatenate(
                [np.full(p.size, 2**h, dtype=np.int64) for h, p in enumerate(parts)]
            )
            order = np.argsort(values, kind="stable")
            self._sorted_cache = values[order], np.cumsum(weights[order])
        return self._sorted_cache

    def quantile(self, q: float | Any) -> Any:
        """Quantile(s) ``q`` in [0, 1], interpolated linearly like ``numpy.quantile``.

        Exact while :attr:`is_exact`; otherwise the rank of the answer is within
        :attr:`error` of ``q * (count - 1)``. NaN when the sketch is empty.
        """
        qs = np.asarray(q, dtype=np.float64)
        if np.any((qs < 0) | (qs > 1)):
            raise ConfigurationError(
                f"Quantiles must lie in [0, 1], got {q!r}. Fix: e.g. 0.5 for the median."
            )
        if not self.count:
            return np.full(qs.shape, np.nan) if qs.ndim else float("nan")
        values, cum = self._sorted()
        pos = qs * (self.count - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, self.count - 1)
        a = values[np.searchsorted(cum, lo, side="right")]
        b = values[np.searchsorted(cum, hi, side="right")]
        t = pos - lo
        with np.errstate(invalid="ignore"):  # inf - inf with infinite values
            diff = b - a
            out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)  # numpy's _lerp
        out = np.clip(out, self.min, self.max)
        out = np.where(qs == 0, self.min, np.where(qs == 1, self.max, out))
        return out if qs.ndim else float(out)

    def rank(self, x: float | Any) -> Any:
        """Estimated number of values ``<= x`` (within :attr:`error` of the true count)."""
        values, cum = self._sorted()
        idx = np.searchsorted(values, np.asarray(x, dtype=np.float64), side="right")
        cum0 = np.concatenate([[0], cum])
        return cum0[idx]

    def midrank(self, x: Any) -> np.ndarray:
        """Estimated average rank (1-based, ties averaged) of each ``x`` among the values: the
        ranks of Spearman's correlation. Exact while :attr:`is_exact`, else within
        :attr:`error`; NaN for NaN.

        Examples
        --------
        >>> QuantileSketch.of([10.0, 20.0, 20.0, 30.0]).midrank([20.0, 5.0, 30.0]).tolist()
        [2.5, 0.5, 4.0]
        """
        values, cum = self._sorted()
        cum0 = np.concatenate([[0], cum])
        xs = np.asarray(x, dtype=np.float64)
        flat = xs.ravel()
        order = np.argsort(flat)  # sorted queries make searchsorted several times faster
        ordered, ranks = flat[order], np.empty(flat.size)
        below = cum0[np.searchsorted(values, ordered, side="left")]
        ranks[order] = (below + cum0[np.searchsorted(values, ordered, side="right")] + 1) / 2
        ranks[np.isnan(flat)] = np.nan
        return ranks.reshape(xs.shape)

    def __repr__(self) -> str:
        mode = "exact" if self.is_exact else f"rank error <= {self.relative_error:.2e}"
        return f"QuantileSketch(count={self.count}, {mode})"


def _at(levels: list[np.ndarray], h: int) -> np.ndarray:
    return levels[h] if h < len(levels) else np.empty(0)


def _at_int(values: list[int], h: int) -> int:
    return values[h] if h < len(values) else 0


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    arrays = [a for a in arrays if a.size]
    if not arrays:
        return np.empty(0)
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
