"""Distributions: the mergeable sketches behind ``stats`` (quantiles, HyperLogLog), and drift.

:func:`compare` checks a new dataset against a reference (datasets, :class:`Stats`, or
their ``to_dict()`` as stored in a manifest), column by column:

- numeric columns (and image width/height): each side is summarized by its quantile function
  at ``CDF_POINTS`` = 201 probabilities (the ``cdf`` list kept with the statistics); the CDF
  between those points is interpolated linearly.

  * **KS statistic** ``sup |F_new - F_ref|`` of those CDFs: within ``1/200`` plus both sides'
    ``rank_error`` of the exact two-sample statistic. Its p-value uses the asymptotic
    Kolmogorov distribution with ``n_eff = n·m/(n+m)`` (Stephens' small-sample correction).
  * **PSI** (population stability index) over ``PSI_BINS`` = 10 bins cut at the reference's
    deciles (tied edges merged): ``Σ (a - e)·ln(a / e)``, fractions floored at ``1e-4``.

- categorical columns: PSI over the reference's stored top categories plus one ``(other)``
  bin. Exact when both sides list all their categories (at most ``top_k``); a reference
  category missing from the new side's list counts as 0 there. Identifier-like columns
  (more distinct values than listed, and more than half of the values distinct) are not
  compared: every new id is "new", so PSI says nothing there.

A column is flagged ``drift`` when PSI > ``psi_threshold`` (0.2, the usual "significant
shift" rule of thumb), or when the KS p-value < ``ks_alpha`` (0.01) *and* KS ≥ ``ks_min``
(0.1) — with millions of rows every negligible difference is significant, so an effect
size is required too — or when the null fraction moves by more than ``null_threshold``
(0.1), or when the column is missing on one side, changed kind, or has values on one side
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError

if TYPE_CHECKING:
    from rich.table import Table

    from feedline.dataset import Dataset
    from feedline.engines.base import Engine
    from feedline.preprocess.stats import Stats

__all__ = [
    "CompactorSketch",
    "DriftReport",
    "compare",
    "hash_values",
    "hll_estimate",
    "hll_registers",
    "ks_pvalue",
]

SKETCH_K = 8192
HLL_BITS = 12
PSI_BINS = 10
_FLOOR = 1e-4


class CompactorSketch:
    """Mergeable quantile sketch: sorted compactor levels whose items weigh ``2**level``.

    Exact while it holds at most ``SKETCH_K`` values; the rank-error bound is in the
    :mod:`feedline.preprocess.stats` docstring. (Kept here, independent of
    :class:`feedline.preprocess.sketch.QuantileSketch`, whose design is the same family.)

    Examples
    --------
    >>> s = CompactorSketch.of(np.arange(100.0)).merge(CompactorSketch.of(np.arange(100.0, 201)))
    >>> s.quantiles([0.5]).tolist(), s.exact
    ([100.0], True)
    """

    __slots__ = ("_items_cache", "err", "levels", "n")

    def __init__(self, levels: list[np.ndarray], n: int, err: int = 0) -> None:
        self.levels, self.n, self.err = levels, n, err
        self._items_cache: tuple[np.ndarray, np.ndarray] | None = None
        h = 0
        while h < len(self.levels):
            level = self.levels[h]
            if len(level) > SKETCH_K:  # keep every other item of sorted pairs, at double weight
                even = len(level) - len(level) % 2
                up = level[(self.n >> h) & 1 : even : 2]  # offset: a function of n (symmetric)
                self.levels[h] = level[even:]
                if h + 1 == len(self.levels):
                    self.levels.append(up)
                else:
                    self.levels[h + 1] = np.sort(np.concatenate([self.levels[h + 1], up]))
                self.err += 1 << h
            h += 1

    @classmethod
    def of(cls, values: np.ndarray) -> CompactorSketch:
        """A sketch of ``values`` (no NaN)."""
        return cls([np.sort(np.asarray(values, np.float64))], len(values))

    def merge(self, other: CompactorSketch) -> CompactorSketch:
        """A new sketch of both inputs' values (the inputs are not changed)."""
        depth = max(len(self.levels), len(other.levels))
        pick = [
            s.levels[h] if h < len(s.levels) else np.empty(0)
            for s in (self, other)
            for h in range(depth)
        ]
        levels = [np.sort(np.concatenate([pick[h], pick[depth + h]])) for h in range(depth)]
        return CompactorSketch(levels, self.n + other.n, self.err + other.err)

    @property
    def exact(self) -> bool:
        return self.err == 0

    @property
    def rank_error(self) -> float:
        """Worst-case error of any rank, as a fraction of ``n``."""
        return self.err / self.n if self.n else 0.0

    def _items(self) -> tuple[np.ndarray, np.ndarray]:
        """All items sorted, with their cumulative weights (computed once: queries repeat)."""
        if self._items_cache is None:
            values = np.concatenate(self.levels)
            weights = np.concatenate([np.full(len(v), 2.0**h) for h, v in enumerate(self.levels)])
            order = np.argsort(values, kind="stable")
            self._items_cache = values[order], np.cumsum(weights[order])
        return self._items_cache

    def quantiles(self, ps: Sequence[float]) -> np.ndarray:
        """Quantiles at probabilities ``ps`` (NumPy's ``linear`` method on the weighted items)."""
        values, cum = self._items()
        if not len(values):
            return np.full(len(ps), np.nan)
        t = np.asarray(ps, np.float64) * (cum[-1] - 1)
        low = np.floor(t)
        a = values[np.minimum(np.searchsorted(cum, low, "right"), len(values) - 1)]
        b = values[np.minimum(np.searchsorted(cum, low + 1, "right"), len(values) - 1)]
        with np.errstate(invalid="ignore"):
            return np.where(t > low, a + (b - a) * (t - low), a)

    def midranks(self, x: np.ndarray) -> np.ndarray:
        """Average ranks (1-based, ties averaged) of ``x`` among the sketched values (NaN for
        NaN and ±inf)."""
        values, cum = self._items()
        cum = np.concatenate([[0.0], cum])
        order = np.argsort(x)  # sorted queries make searchsorted several times faster
        ordered, ranks = x[order], np.empty(len(x))
        below = cum[np.searchsorted(values, ordered, "left")]
        ranks[order] = (below + cum[np.searchsorted(values, ordered, "right")] + 1) / 2
        ranks[~np.isfinite(x)] = np.nan
        return ranks


# ------------------------------------------------------------------- distinct values (HyperLogLog)


def _mix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, vectorized (uint64 arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash_values(values: pa.Array) -> np.ndarray:
    """Stable 64-bit hashes of strings (or values cast to string), without a Python loop."""
    arr = values.cast(pa.large_string()).cast(pa.large_binary())
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    data, offsets = data[offsets[0] : offsets[-1]], offsets - offsets[0]
    lengths = np.diff(offsets)
    pos = np.arange(len(data), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    terms = _mix(data.astype(np.uint64) | (pos.astype(np.uint64) << np.uint64(8)))
    cum = np.concatenate([np.zeros(1, np.uint64), np.cumsum(terms, dtype=np.uint64)])
    total = cum[offsets[1:]] - cum[offsets[:-1]]
    return _mix(total + lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))


def hll_registers(hashes: np.ndarray) -> np.ndarray:
    """HyperLogLog registers (max of trailing-zero runs) of 64-bit hashes."""
    registers = np.zeros(1 << HLL_BITS, np.uint8)
    rest = hashes & np.uint64((1 << (64 - HLL_BITS)) - 1)
    lowest = rest & (~rest + np.uint64(1))
    rho = np.log2(np.maximum(lowest, np.uint64(1)).astype(np.float64)).astype(np.uint8) + 1
    rho[rest == 0] = 64 - HLL_BITS + 1
    np.maximum.at(registers, (hashes >> np.uint64(64 - HLL_BITS)).astype(np.intp), rho)
    return registers


def hll_estimate(registers: np.ndarray) -> int:
    """Distinct values from HyperLogLog registers (Flajolet et al. 2007, small-range fix)."""
    m = len(registers)
    estimate = 0.7213 / (1 + 1.079 / m) * m * m / float(np.sum(np.exp2(-registers.astype(float))))
    zeros = int(np.count_nonzero(registers == 0))
    if estimate <= 2.5 * m and zeros:
        estimate = m * np.log(m / zeros)  # small-range (linear counting) correction
    return round(estimate)


# ----------------------------------------------------------------------------- drift


def _cdf(grid: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The CDF at ``x`` of a distribution given by its quantiles at evenly spaced ``p``."""
    p = np.linspace(0.0, 1.0, len(grid))
    j = np.searchsorted(grid, x, "right")  # grid points <= x
    lo, hi = np.clip(j - 1, 0, len(grid) - 1), np.clip(j, 0, len(grid) - 1)
    with np.errstate(all="ignore"):
        frac = np.where(grid[hi] > grid[lo], (x - grid[lo]) / (grid[hi] - grid[lo]), 0.0)
    return np.where(j == 0, 0.0, np.where(j >= len(grid), 1.0, p[lo] + frac * (p[hi] - p[lo])))


def _psi(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = np.maximum(actual, _FLOOR), np.maximum(expected, _FLOOR)
    return float(np.sum((a - e) * np.log(a / e)))


def ks_pvalue(d: float, n: int, m: int) -> float:
    """Asymptotic p-value of a two-sample KS statistic ``d`` for sample sizes ``n`` and ``m``.

    Examples
    --------
    >>> round(ks_pvalue(0.1, 1000, 1000), 4)
    0.0001
    """
    ne = n * m / (n + m)
    lam = (np.sqrt(ne) + 0.12 + 0.11 / np.sqrt(ne)) * d
    if lam < 0.3:  # Q_KS(0.3) = 0.99999: the series below converges slowly there
        return 1.0
    j = np.arange(1, 101)
    return float(np.clip(2 * np.sum((-1.0) ** (j - 1) * np.exp(-2 * j * j * lam * lam)), 0, 1))


def _numeric(new: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    a, e = (np.asarray(s["cdf"], np.float64) for s in (new, ref))
    points = np.union1d(a, e)
    ks = float(np.max(np.abs(_cdf(a, points) - _cdf(e, points))))
    cut = np.linspace(0, len(e) - 1, PSI_BINS + 1).round().astype(int)[1:-1]
    edges = np.unique(e[cut])
    bins = [np.diff(np.concatenate([[0.0], _cdf(g, edges), [1.0]])) for g in (a, e)]
    return {"ks": ks, "ks_pvalue": ks_pvalue(ks, new["count"], ref["count"]), "psi": _psi(*bins)}


def _categorical(new: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    expected, actual = dict(map(tuple, ref["top"])), dict(map(tuple, new["top"]))
    e = np.array([*expected.values(), 0.0]) / ref["count"]
    a = np.array([*(actual.get(k, 0) for k in expected), 0.0]) / new["count"]
    e[-1], a[-1] = max(0.0, 1 - e[:-1].sum()), max(0.0, 1 - a[:-1].sum())
    return {"psi": _psi(a, e)}


def _column(
    new: dict[str, Any] | None, ref: dict[str, Any] | None, t: dict[str, float]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": (ref or new or {}).get("kind"),
        "ks": None,
        "ks_pvalue": None,
        "psi": None,
        "nulls_new": None,
        "nulls_ref": None,
        "note": "",
    }
    if new is None or ref is None:
        return out | {"drift": True, "reason": f"missing in {'new' if new is None else 'ref'}"}
    if new["kind"] != ref["kind"]:
        return out | {"drift": True, "reason": f"kind changed: {ref['kind']} -> {new['kind']}"}
    for side, s in (("new", new), ("ref", ref)):
        total = s["count"] + s["nulls"]
        out[f"nulls_{side}"] = s["nulls"] / total if total else 0.0
    reasons = []
    if abs(out["nulls_new"] - out["nulls_ref"]) > t["null_threshold"]:
        reasons.append(f"null fraction {out['nulls_ref']:.3g} -> {out['nulls_new']:.3g}")
    pairs = (
        [(new["width"], ref["width"]), (new["height"], ref["height"])]
        if (out["kind"] == "image")
        else [(new, ref)]
    )
    if (new["count"] == 0) != (ref["count"] == 0):
        reasons.append(f"no values in {'new' if new['count'] == 0 else 'ref'}")
    elif new["count"] and out["kind"] in ("numeric", "image"):
        found = [_numeric(a, e) for a, e in pairs if a["count"] and e["count"]]
        if found:
            out |= max(found, key=lambda f: f["psi"])
    elif new["count"] and out["kind"] == "categorical":
        if ref["distinct"] > len(ref["top"]) and ref["distinct"] > 0.5 * ref["count"]:
            out["note"] = "identifier-like (distinct ≈ count): not compared"
        else:
            out |= _categorical(new, ref)
    if out["psi"] is not None and out["psi"] > t["psi_threshold"]:
        reasons.append(f"PSI {out['psi']:.3g} > {t['psi_threshold']:g}")
    if out["ks"] is not None and out["ks_pvalue"] < t["ks_alpha"] and out["ks"] >= t["ks_min"]:
        reasons.append(f"KS {out['ks']:.3g} (p={out['ks_pvalue']:.2g})")
    return out | {"drift": bool(reasons), "reason": "; ".join(reasons)}


class DriftReport:
    """Per-column drift between a new dataset and a reference (see :func:`compare`).

    ``columns[name]`` holds ``kind``, ``ks``, ``ks_pvalue``, ``psi``, ``nulls_new``,
    ``nulls_ref`` (fractions), ``drift`` (bool), ``reason`` (why it was flagged) and ``note``
    (why it was not compared); ``drifted`` lists the flagged columns.
    """

    def __init__(
        self,
        columns: dict[str, dict[str, Any]],
        thresholds: dict[str, float],
        rows_new: int,
        rows_ref: int,
    ) -> None:
        self.columns, self.thresholds = columns, thresholds
        self.rows_new, self.rows_ref = rows_new, rows_ref

    @property
    def drifted(self) -> list[str]:
        return [name for name, c in self.columns.items() if c["drift"]]

    def __repr__(self) -> str:
        return f"DriftReport(drifted={self.drifted}, columns={len(self.columns)})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "rows_new": self.rows_new,
            "rows_ref": self.rows_ref,
            "thresholds": dict(self.thresholds),
            "drifted": self.drifted,
            "columns": {k: dict(v) for k, v in self.columns.items()},
        }

    def table(self) -> Table:
        """A rich table: one row per column, with a DRIFT flag."""
        from feedline.preprocess.stats import _table

        def fmt(v: float | None, spec: str = ".3f") -> str:
            return "" if v is None else format(v, spec)

        table = _table(
            f"drift: {self.rows_new:,} new rows vs {self.rows_ref:,} reference",
            "column",
            "KS",
            "KS p",
            "PSI",
            "nulls",
        )
        table.add_column("status", no_wrap=True)
        table.add_column("reason")
        for name, c in self.columns.items():
            nulls = "" if c["nulls_ref"] is None else f"{c['nulls_ref']:.0%}→{c['nulls_new']:.0%}"
            table.add_row(
                name,
                fmt(c["ks"]),
                fmt(c["ks_pvalue"], ".2g"),
                fmt(c["psi"]),
                nulls,
                "[bold red]DRIFT[/]" if c["drift"] else "[green]ok[/]",
                c["reason"] or c.get("note", ""),
            )
        return table


def compare(
    new: Dataset | Stats | dict[str, Any],
    ref: Dataset | Stats | dict[str, Any],
    *,
    columns: Sequence[str] | None = None,
    engine: str | Engine | None = None,
    psi_threshold: float = 0.2,
    ks_alpha: float = 0.01,
    ks_min: float = 0.1,
    null_threshold: float = 0.1,
) -> DriftReport:
    """Compare ``new`` against the reference ``ref`` per column (rules in the module docstring).

    Either side may be a dataset (statistics are computed, without Spearman), a
    :class:`~feedline.preprocess.stats.Stats`, or its ``to_dict()`` (as in a manifest).

    Examples
    --------
    >>> import feedline as fl, numpy as np
    >>> rng = np.random.default_rng(0)
    >>> ref = fl.from_arrow(pa.table({"x": rng.normal(0, 1, 5000)}))
    >>> new = fl.from_arrow(pa.table({"x": rng.normal(1, 1, 5000)}))
    >>> compare(new, ref).drifted, compare(ref, ref).drifted
    (['x'], [])
    """
    from feedline.preprocess.stats import Stats, stats

    def as_stats(side: Any) -> Stats:
        if isinstance(side, Stats):
            return side
        if isinstance(side, dict):
            return Stats.from_dict(side)
        return stats(side, columns, engine=engine, spearman=False)

    new_stats, ref_stats = as_stats(new), as_stats(ref)
    for label, s in (("new", new_stats), ("reference", ref_stats)):
        if not s.rows:
            raise ConfigurationError(
                f"The {label} data has no rows, so there is nothing to "
                "compare. Fix: check the path or the filters."
            )
    names = (
        list(columns)
        if columns is not None
        else list(dict.fromkeys([*ref_stats.columns, *new_stats.columns]))
    )
    thresholds = {
        "psi_threshold": psi_threshold,
        "ks_alpha": ks_alpha,
        "ks_min": ks_min,
        "null_threshold": null_threshold,
    }
    result = {
        name: _column(new_stats.columns.get(name), ref_stats.columns.get(name), thresholds)
        for name in names
    }
    return DriftReport(result, thresholds, new_stats.rows, ref_stats.rows)
