"""Drift: a new dataset's column distributions against a reference's.

:func:`compare` checks a new dataset against a reference (datasets, :class:`Stats`, or
their ``to_dict()`` as stored in a manifest), column by column:

- numeric columns (and image width/height, and the pooled elements of tensor columns): each
  side is summarized by its quantile function at ``CDF_POINTS`` = 201 probabilities (the
  ``cdf`` list kept with the statistics); the CDF between those points is interpolated
  linearly.

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

from feedline.engines.protocol import get_engine
from feedline.errors import ConfigurationError
from feedline.statistics.compute import stats
from feedline.statistics.numbers import fixed
from feedline.statistics.result import Stats, rich_table
from feedline.ui.notebook import Markup, names, table, view

if TYPE_CHECKING:
    from rich.table import Table

    from feedline.dataset.dataset import Dataset
    from feedline.engines.protocol import Engine
    from feedline.statistics.result import Stats

__all__ = ["DriftReport", "compare", "ks_pvalue"]

PSI_BINS = 10
_FLOOR = 1e-4


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
        else [(new["elements"], ref["elements"])]
        if out["kind"] == "tensor"
        else [(new, ref)]
    )
    if (new["count"] == 0) != (ref["count"] == 0):
        reasons.append(f"no values in {'new' if new['count'] == 0 else 'ref'}")
    elif new["count"] and out["kind"] in ("numeric", "image", "tensor"):
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

        drifted = self.drifted
        return (
            f"DriftReport({len(drifted):,} of {len(self.columns):,} columns drifted"
            + (f": {names(drifted)}" if drifted else "")
            + f"; {self.rows_new:,} new rows vs {self.rows_ref:,} reference)"
        )

    def _rows(self, drifted_first: bool = False) -> list[list[Any]]:
        """One row per column for the tables (flagged ones first if ``drifted_first``)."""

        def fmt(v: float | None, spec: str = ".3f") -> str:
            return "" if v is None else fixed(v) if spec == ".3f" else format(v, spec)

        rows = []
        items = list(self.columns.items())
        if drifted_first:
            items.sort(key=lambda kv: not kv[1]["drift"])  # stable: columns in order otherwise
        for name, c in items:
            nulls = "" if c["nulls_ref"] is None else f"{c['nulls_ref']:.0%}→{c['nulls_new']:.0%}"
            rows.append([
                name, fmt(c["ks"]), fmt(c["ks_pvalue"], ".2g"), fmt(c["psi"]), nulls,
                c["drift"], c["reason"] or c.get("note", ""),
            ])  # fmt: skip
        return rows

    def _repr_html_(self) -> str:
        """The notebook view: flagged columns first, at most 20 rows."""

        rows = [
            [*row[:5], Markup("<b style='color:#cf222e'>DRIFT</b>" if row[5] else "ok"), row[6]]
            for row in self._rows(drifted_first=True)
        ]
        lines = [
            f"{len(self.drifted):,} of {len(self.columns):,} columns drifted; "
            f"{self.rows_new:,} new rows vs {self.rows_ref:,} reference rows",
        ]
        head = ["column", "KS", "KS p", "PSI", "nulls (ref→new)", "status", "reason"]
        return view("feedline DriftReport", lines, table(head, rows))

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
        from rich.text import Text

        table = rich_table(
            f"drift: {self.rows_new:,} new rows vs {self.rows_ref:,} reference",
            "column",
            "KS",
            "KS p",
            "PSI",
            "nulls",
        )
        table.add_column("status", no_wrap=True)
        table.add_column("reason")
        for name, ks, p, psi, nulls, drift, reason in self._rows():
            status = Text("DRIFT", "bold red") if drift else Text("ok", "green")
            table.add_row(name, ks, p, psi, nulls, status, reason)
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
    :class:`~feedline.statistics.compute.Stats`, or its ``to_dict()`` (as in a manifest).

    Examples
    --------
    >>> import feedline as fl, numpy as np, pyarrow as pa
    >>> rng = np.random.default_rng(0)
    >>> ref = fl.from_arrow(pa.table({"x": rng.normal(0, 1, 5000)}))
    >>> new = fl.from_arrow(pa.table({"x": rng.normal(1, 1, 5000)}))
    >>> compare(new, ref).drifted, compare(ref, ref).drifted
    (['x'], [])
    """

    if not all(isinstance(side, Stats | dict) for side in (new, ref)):
        engine = get_engine(engine)  # resolved once, for both sides

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
