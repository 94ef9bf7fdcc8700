"""Mergeable per-column accumulators behind :func:`feedline.stats` (estimators documented in
:mod:`feedline.statistics.compute`), and the pairwise co-moments behind its correlations.

Each accumulator has ``of(arr, x)`` (one batch: the Arrow column and, for numeric columns,
its float64 values), ``merge`` (associative and commutative) and ``summary`` (a JSON-safe
dict): :class:`Numeric` (moments, extremes and a
:class:`~feedline.statistics.quantile_sketch.QuantileSketch`), :class:`Categorical` (Misra-Gries
counters and a HyperLogLog), :class:`Images` (sizes and modes from headers) and
:class:`Other` (counts). :class:`CoMoments` holds pairwise-complete co-moments.

Examples
--------
>>> x = np.array([1.0, 2.0, 4.0])
>>> a = Numeric.of(pa.array(x[:1]), x[:1]).merge(Numeric.of(pa.array(x[1:]), x[1:]))
>>> a.summary()["mean"], a.summary()["quantiles"]["p50"], a.ranks(np.array([4.0, 1.5])).tolist()
(2.3333333333333335, 2.0, [3.0, 1.5])
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.statistics.hll import hash_values, hll_estimate, hll_registers
from feedline.statistics.quantile_sketch import QuantileSketch

__all__ = [
    "CDF_POINTS",
    "COUNTER_CAPACITY",
    "QUANTILES",
    "Categorical",
    "CoMoments",
    "Images",
    "Numeric",
    "Other",
]

COUNTER_CAPACITY = 10_000
CDF_POINTS = 201  # the stored quantile function, at p = 0, 0.005, ..., 1 (used for drift)
QUANTILES = {
    "p01": 0.01,
    "p05": 0.05,
    "p25": 0.25,
    "p50": 0.5,
    "p75": 0.75,
    "p95": 0.95,
    "p99": 0.99,
}
_TINY = 1e-12  # variance below (TINY * max|x|)**2 per value is rounding noise: treated as 0


def _num(value: Any) -> Any:
    """A JSON-safe number: Python int/float, or None for missing and non-finite values."""
    if value is None or isinstance(value, bool | int):
        return value
    value = float(value)
    return value if np.isfinite(value) else None


def _pick(best: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else best(a, b)


def _prune(counts: np.ndarray) -> int:
    """The Misra-Gries cut: the (capacity + 1)-th largest count (0 when all fit)."""
    if len(counts) <= COUNTER_CAPACITY:
        return 0
    return int(np.partition(counts, len(counts) - COUNTER_CAPACITY - 1)[-COUNTER_CAPACITY - 1])


@dataclasses.dataclass(frozen=True)
class Numeric:
    nulls: int
    infinite: int  # ±inf values: counted, and left out of every other statistic
    moments: tuple[int, float, float, float, float]  # n, mean, M2, M3, M4 (central sums)
    low: Any
    high: Any
    sketch: QuantileSketch

    @classmethod
    def of(cls, arr: pa.Array, x: np.ndarray) -> Numeric:
        valid = x[np.isfinite(x)]
        n, infinite = len(valid), int(np.isinf(x).sum())
        if pa.types.is_integer(arr.type):
            bounds = pc.min_max(arr)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
        else:
            low, high = (float(valid.min()), float(valid.max())) if n else (None, None)
        mean = float(valid.mean()) if n else 0.0
        d = valid - mean
        d2 = d * d
        moments = (n, mean, float(d2.sum()), float((d2 * d).sum()), float((d2 * d2).sum()))
        return cls(len(x) - n - infinite, infinite, moments, low, high, QuantileSketch.of(valid))

    def merge(self, other: Numeric) -> Numeric:
        (na, ma, a2, a3, a4), (nb, mb, b2, b3, b4) = self.moments, other.moments
        n = na + nb
        if not na or not nb:
            moments = other.moments if not na else self.moments
        else:  # Pébay (2008), pairwise update of central moment sums
            d = mb - ma
            dn = d / n
            nab = na * nb
            moments = (
                n,
                (na * ma + nb * mb) / n,
                a2 + b2 + d * dn * nab,
                a3 + b3 + d * dn * dn * nab * (na - nb) + 3 * dn * (na * b2 - nb * a2),
                a4
                + b4
                + d * dn**3 * nab * (na * na - nab + nb * nb)
                + 6 * dn * dn * (na * na * b2 + nb * nb * a2)
                + 4 * dn * (na * b3 - nb * a3),
            )
        return Numeric(
            self.nulls + other.nulls,
            self.infinite + other.infinite,
            moments,
            _pick(min, self.low, other.low),
            _pick(max, self.high, other.high),
            self.sketch.merge(other.sketch),
        )

    def summary(self) -> dict[str, Any]:
        n, mean, m2, m3, m4 = self.moments
        scale = max(abs(float(self.low or 0)), abs(float(self.high or 0)))
        flat = m2 <= n * (_TINY * scale) ** 2
        out = {
            "kind": "numeric",
            "count": n,
            "nulls": self.nulls,
            "infinite": self.infinite,
            "mean": _num(mean) if n else None,
            "std": (0.0 if flat else _num(np.sqrt(m2 / (n - 1)))) if n > 1 else None,
            "min": _num(self.low),
            "max": _num(self.high),
            "skewness": None if flat else _num(np.sqrt(n) * m3 / m2**1.5),
            "kurtosis": None if flat else _num(n * m4 / (m2 * m2) - 3),
        }
        values = self.sketch.quantile(list(QUANTILES.values()))
        out["quantiles"] = {k: _num(v) for k, v in zip(QUANTILES, values, strict=True)}
        out["quantiles_exact"] = self.sketch.is_exact
        out["rank_error"] = self.sketch.relative_error
        grid = self.sketch.quantile(np.linspace(0.0, 1.0, CDF_POINTS)) if n else []
        out["cdf"] = [_num(v) for v in grid]
        return out

    def ranks(self, x: np.ndarray) -> np.ndarray:
        """Average ranks (1-based, ties averaged) of ``x`` among the sketched values, for
        Spearman: NaN for NaN and ±inf."""
        ranks = self.sketch.midrank(x)
        ranks[~np.isfinite(x)] = np.nan
        return ranks


@dataclasses.dataclass(frozen=True)
class Categorical:
    nulls: int
    n: int
    counts: dict[Any, int]  # Misra-Gries counters
    err: int  # every count is low by at most this much
    registers: np.ndarray  # HyperLogLog

    @classmethod
    def of(cls, arr: pa.Array, x: Any = None) -> Categorical:
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if getattr(pa.types, "is_string_view", bool)(arr.type):
            arr = arr.cast(pa.large_string())
        valid = pc.drop_null(arr)
        table = pc.value_counts(valid)
        values, counts = table.field("values"), table.field("counts").to_numpy().astype(np.int64)
        registers, cut = hll_registers(hash_values(values)), _prune(counts)
        if cut:
            keep = counts > cut
            values, counts = values.filter(pa.array(keep)), counts[keep] - cut
        counted = dict(zip(values.to_pylist(), counts.tolist(), strict=True))
        return cls(arr.null_count, len(valid), counted, cut, registers)

    def merge(self, other: Categorical) -> Categorical:
        counts, err = dict(self.counts), self.err + other.err
        for key, value in other.counts.items():
            counts[key] = counts.get(key, 0) + value
        cut = _prune(np.fromiter(counts.values(), np.int64, len(counts)))
        if cut:
            counts, err = {k: v - cut for k, v in counts.items() if v > cut}, err + cut
        return Categorical(
            self.nulls + other.nulls,
            self.n + other.n,
            counts,
            err,
            np.maximum(self.registers, other.registers),
        )

    def summary(self, top_k: int) -> dict[str, Any]:
        top = sorted(self.counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[:top_k]
        exact = self.err == 0
        return {
            "kind": "categorical",
            "count": self.n,
            "nulls": self.nulls,
            "distinct": len(self.counts) if exact else hll_estimate(self.registers),
            "distinct_exact": exact,
            "top": [[k, v] for k, v in top],
            "top_error": self.err,
        }


@dataclasses.dataclass(frozen=True)
class Images:
    nulls: int
    unreadable: int
    width: Numeric
    height: Numeric
    sizes: Categorical
    modes: Categorical

    @classmethod
    def of(cls, arr: pa.Array, x: Any = None) -> Images:
        from PIL import Image

        found: list[tuple[int, int, str]] = []
        for blob in pc.drop_null(arr).to_pylist():
            try:
                with Image.open(io.BytesIO(blob)) as image:  # reads the header only
                    found.append((*image.size, image.mode))
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
                continue
        w, h = (np.array([f[i] for f in found], np.int64) for i in (0, 1))
        return cls(
            arr.null_count,
            len(arr) - arr.null_count - len(found),
            Numeric.of(pa.array(w), w.astype(np.float64)),
            Numeric.of(pa.array(h), h.astype(np.float64)),
            Categorical.of(pa.array([f"{a}x{b}" for a, b, _ in found], pa.string())),
            Categorical.of(pa.array([m for _, _, m in found], pa.string())),
        )

    def merge(self, other: Images) -> Images:
        return Images(
            self.nulls + other.nulls,
            self.unreadable + other.unreadable,
            *(
                getattr(self, k).merge(getattr(other, k))
                for k in ("width", "height", "sizes", "modes")
            ),
        )

    def summary(self, top_k: int) -> dict[str, Any]:
        return {
            "kind": "image",
            "count": self.width.moments[0] + self.unreadable,
            "nulls": self.nulls,
            "unreadable": self.unreadable,
            "width": self.width.summary(),
            "height": self.height.summary(),
            "top_sizes": self.sizes.summary(top_k)["top"],
            "modes": self.modes.summary(top_k)["top"],
        }


@dataclasses.dataclass(frozen=True)
class Other:
    nulls: int
    n: int

    @classmethod
    def of(cls, arr: pa.Array, x: Any = None) -> Other:
        return cls(arr.null_count, len(arr) - arr.null_count)

    def merge(self, other: Other) -> Other:
        return Other(self.nulls + other.nulls, self.n + other.n)

    def summary(self, top_k: int) -> dict[str, Any]:
        return {"kind": "other", "count": self.n, "nulls": self.nulls}


def _gram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a.T @ b`` without BLAS threads for narrow inputs: inside the engine's worker threads
    BLAS's own thread pool oversubscribes the cores and spins (5-100x slower, measured)."""
    return np.einsum("ij,ik->jk", a, b) if a.shape[1] * b.shape[1] <= 1024 else a.T @ b


@dataclasses.dataclass(frozen=True)
class CoMoments:
    """Pairwise-complete co-moments: entry ``[i, j]`` covers rows where columns i and j are set."""

    n: np.ndarray  # rows with both set
    mean: np.ndarray  # mean of column i over those rows
    m2: np.ndarray  # sum of squared deviations of column i over those rows
    c: np.ndarray  # co-moment of columns i and j

    @classmethod
    def of(cls, x: np.ndarray) -> CoMoments:
        valid, k = np.isfinite(x), x.shape[1]
        shift = np.where(valid, x, 0.0).sum(axis=0) / np.maximum(valid.sum(axis=0), 1)
        xs = np.where(valid, x - shift, 0.0)  # centred per batch: no cancellation below
        if valid.all():  # the other sums are per column
            p, n = _gram(xs, xs), np.full((k, k), float(len(x)))
            a, q = np.tile(xs.sum(axis=0)[:, None], k), np.tile((xs * xs).sum(axis=0)[:, None], k)
        else:  # a[i, j]: sum of column i over rows where j is set too; q likewise of squares
            w = valid.astype(np.float64)
            p, a, n, q = _gram(xs, xs), _gram(xs, w), _gram(w, w), _gram(xs * xs, w)
        with np.errstate(all="ignore"):
            mean_s = np.where(n > 0, a / n, 0.0)
        m2, c = q - a * mean_s, p - a * mean_s.T
        flat = m2 <= 1e-11 * q  # below the cancellation noise: constant over the pair's rows
        return cls(
            n, mean_s + shift[:, None], np.where(flat, 0.0, m2), np.where(flat | flat.T, 0.0, c)
        )

    def merge(self, other: CoMoments) -> CoMoments:
        n = self.n + other.n
        with np.errstate(all="ignore"):
            d = other.mean - self.mean
            f = np.where(n > 0, self.n * other.n / n, 0.0)
            mean = np.where(n > 0, (self.n * self.mean + other.n * other.mean) / n, 0.0)
        return CoMoments(n, mean, self.m2 + other.m2 + d * d * f, self.c + other.c + d * d.T * f)

    def correlation(self, scale: np.ndarray) -> list[list[Any]]:
        m2 = np.where(self.m2 <= self.n * (_TINY * scale[:, None]) ** 2, 0.0, self.m2)
        with np.errstate(all="ignore"):
            r = np.where(m2 * m2.T > 0, np.clip(self.c / np.sqrt(m2 * m2.T), -1.0, 1.0), np.nan)
        return [[_num(v) for v in row] for row in r]
