"""Is a row-group sample representative? The spread between its clusters, from the rows read.

``fit(ds, fraction=f)`` reads whole row groups (:mod:`feedline.store.sampling`): a *cluster*
sample. When row groups differ in what is fitted (50 sensor series written one per row
group, files per day, rows sorted by price), a few of them do not represent the whole: 3
series of 50 gave fitted means 0.1 standard deviations off. This module measures that from
the sample itself, per numeric column, with the one-way analysis of variance of survey
sampling:

- every batch the fit sees contributes its count, mean and sum of squared deviations
  (:func:`batch_moments`, folded into the fit's own partials); a batch never spans two row
  groups, so the spread between batches bounds the spread between row groups from above;
- the batches' means are first tested for differing more than their rows' noise explains
  (the F test ``MSB / MSW`` at 1%); when they do, ``s_b^2``, the variance *between* them
  beyond that noise (``(MSB - MSW) / n0``), is raised to a one-sided 75% upper confidence
  bound for the ``k`` row groups read (``s_b^2 (k - 1) / chi2_0.25(k - 1)``,
  Wilson-Hilferty): two or three row groups say little about the rest;
- the standard error of the fitted mean is then ``sqrt(s_b^2 (1/k - 1/K) + s_w^2 / n)``
  (``K`` row groups in all, ``n`` rows read), reported in units of the column's standard
  deviation, with the *design effect*: that variance over a uniform sample's, ``s^2 / n``.

A sample is not representative when that standard error exceeds the tolerance
(:data:`TOLERANCE`: 0.01 standard deviations, so a deviation of 0.02 is a two-sigma event)
*and* the clusters are to blame (design effect above 2; a sample that is merely small is
not helped by other row groups). :func:`groups_needed` then says how many row groups bring
the error within the tolerance. Only numeric columns are measured (a category set or a
vocabulary is not).

Examples
--------
>>> import pyarrow as pa
>>> rng = np.random.default_rng(0)
>>> series = [pa.record_batch({"x": rng.normal(m, 1.0, 1000)}) for m in rng.normal(0, 1, 4)]
>>> spread = cluster_spread([batch_moments(b) for b in series], groups=4, total=100)
>>> spread.column, spread.representative, spread.design_effect > 100
('x', False, True)
>>> groups_needed(spread, total=100) > 50
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = [
    "MAX_ENTRIES",
    "TOLERANCE",
    "ClusterSpread",
    "batch_moments",
    "cluster_spread",
    "groups_needed",
    "merge_moments",
]

#: the largest acceptable standard error of a fitted mean, in standard deviations
TOLERANCE = 0.01
#: per-batch moments kept by a fit before neighbours are pooled (bounds the partial's size)
MAX_ENTRIES = 1 << 14
#: the design effect above which the clusters, not the sample's size, make the error
_DESIGN_EFFECT = 2.0
#: the quantile of the one-sided confidence bound on the between-cluster variance
_Z_LOWER = -0.6744897501960817  # the standard normal's 25% quantile
#: the quantile of the test for clusters (their means differ more than noise explains)
_Z_TEST = 2.3263478740408408  # the standard normal's 99% quantile

#: one batch's moments: column -> (count, mean, sum of squared deviations)
Moments = dict[str, tuple[int, float, float]]


def batch_moments(batch: pa.RecordBatch) -> Moments:
    """Count, mean and sum of squared deviations of each numeric column's finite values.

    Examples
    --------
    >>> batch_moments(pa.record_batch({"x": [1.0, 3.0, None], "s": ["a", "b", "c"]}))
    {'x': (2, 2.0, 2.0)}
    """
    out: Moments = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        kind = column.type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            continue
        values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size:
            mean = float(values.mean())
            out[name] = (int(values.size), mean, float(np.square(values - mean).sum()))
    return out


def merge_moments(entries: list[Moments]) -> list[Moments]:
    """``entries`` with neighbours pooled pairwise while more than :data:`MAX_ENTRIES`
    (pooled moments are exact: Chan et al.'s parallel formula).

    Examples
    --------
    >>> merge_moments([{"x": (1, 1.0, 0.0)}] * 3) == [{"x": (1, 1.0, 0.0)}] * 3
    True
    """
    while len(entries) > MAX_ENTRIES:
        pooled = [_pool(entries[i], entries[i + 1]) for i in range(0, len(entries) - 1, 2)]
        entries = pooled + ([entries[-1]] if len(entries) % 2 else [])
    return entries


def _pool(a: Moments, b: Moments) -> Moments:
    out = dict(a)
    for name, (nb, mb, sb) in b.items():
        if name not in out:
            out[name] = (nb, mb, sb)
            continue
        na, ma, sa = out[name]
        n = na + nb
        delta = mb - ma
        out[name] = (n, ma + delta * nb / n, sa + sb + delta * delta * na * nb / n)
    return out


@dataclass(frozen=True)
class ClusterSpread:
    """How well a row-group sample estimates a column's mean.

    Attributes
    ----------
    column:
        The column measured (the least representative one).
    std:
        Its standard deviation in the sample.
    error:
        The standard error of its mean from this sample, in standard deviations.
    design_effect:
        That error's variance over a uniform sample's of the same size.
    between:
        The between-row-group variance (its upper confidence bound) in variance units.
    within:
        The variance of one row around its row group's mean.
    rows:
        Rows read.
    groups:
        Row groups read (``k``) of ``total`` (``K``).
    total:
        Row groups in the input.
    """

    column: str
    std: float
    error: float
    design_effect: float
    between: float
    within: float
    rows: int
    groups: int
    total: int

    @property
    def representative(self) -> bool:
        """False when the error exceeds :data:`TOLERANCE` because of the clusters."""
        return self.error <= TOLERANCE or self.design_effect <= _DESIGN_EFFECT

    def describe(self) -> str:
        """One line with the figures, for warnings and logs."""
        return (
            f"column {self.column!r}: standard error of the mean up to {self.error:.3f} std from "
            f"{self.groups} of {self.total} row groups ({self.rows} rows), design effect "
            f"{self.design_effect:.0f}"
        )


def cluster_spread(entries: Sequence[Moments], groups: int, total: int) -> ClusterSpread | None:
    """The spread of the sample whose batches had the moments ``entries``, read from
    ``groups`` of ``total`` row groups: the least representative numeric column, or ``None``
    when no column has two batches with values and a spread.

    Examples
    --------
    >>> flat = [{"x": (100, float(i % 2), 99.0)} for i in range(10)]  # two kinds of groups
    >>> cluster_spread(flat, groups=10, total=200).representative
    False
    >>> noise = [{"x": (100, 0.01 * (i % 2), 99.0)} for i in range(10)]
    >>> cluster_spread(noise, groups=10, total=200).representative
    True
    """
    worst: ClusterSpread | None = None
    names = sorted({name for entry in entries for name in entry})
    for name in names:
        parts = [entry[name] for entry in entries if name in entry and entry[name][0] > 0]
        spread = _column_spread(name, parts, groups, total)
        if spread is None:
            continue
        if worst is None or (spread.representative, -spread.error) < (
            worst.representative,
            -worst.error,
        ):
            worst = spread
    return worst


def _column_spread(
    name: str, parts: list[tuple[int, float, float]], groups: int, total: int
) -> ClusterSpread | None:
    batches = len(parts)
    counts = np.array([p[0] for p in parts], dtype=np.float64)
    rows = float(counts.sum()) if batches else 0.0
    if batches < 2 or rows < 3:
        return None
    means = np.array([p[1] for p in parts])
    grand = float((counts * means).sum() / rows)
    between_ss = float((counts * np.square(means - grand)).sum())
    within_ss = float(sum(p[2] for p in parts))
    variance = (between_ss + within_ss) / (rows - 1)
    if not variance > 0 or not math.isfinite(variance):
        return None
    within = within_ss / (rows - batches) if rows > batches else 0.0
    n0 = (rows - float(np.square(counts).sum()) / rows) / (batches - 1)
    spread = between_ss / (batches - 1)  # MSB: the batches' means, row-count weighted
    component = (spread - within) / n0 if n0 > 0 else 0.0
    if spread <= within * _chi2(batches - 1, _Z_TEST) / (batches - 1):
        component = 0.0  # no evidence of clusters (F test at 1%): a uniform sample
    between = max(0.0, component) * (max(groups, 2) - 1) / _chi2(max(groups, 2) - 1, _Z_LOWER)
    k, big_k = max(groups, 1), max(total, groups, 1)
    error_var = between * (1 / k - 1 / big_k) + within / rows
    uniform = variance / rows
    return ClusterSpread(
        column=name,
        std=math.sqrt(variance),
        error=math.sqrt(max(error_var, 0.0) / variance),
        design_effect=error_var / uniform,
        between=between,
        within=within,
        rows=int(rows),
        groups=groups,
        total=total,
    )


def _chi2(df: int, z: float) -> float:
    """The chi-square quantile with ``df`` degrees of freedom at the standard normal's
    quantile ``z`` (Wilson-Hilferty; within 3% of the exact value from 1 degree of freedom
    on, at the 25% and 99% quantiles used here).

    Examples
    --------
    >>> round(_chi2(1, _Z_LOWER), 3), round(_chi2(10, _Z_LOWER), 2), round(_chi2(5, _Z_TEST), 1)
    (0.097, 6.75, 15.1)
    """
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def groups_needed(spread: ClusterSpread, total: int) -> int:
    """How many of ``total`` row groups bring the standard error within :data:`TOLERANCE`
    (at least twice those read; all of them past half of them, when reading the rest costs
    less than another check would).

    Examples
    --------
    >>> s = ClusterSpread("x", 1.0, 0.1, 50.0, between=0.04, within=1.0, rows=5000,
    ...                   groups=5, total=1000)
    >>> groups_needed(s, total=1000)
    167
    """
    variance = spread.std**2
    within = spread.within / spread.rows
    bound = max(TOLERANCE**2 * variance - within, within)
    if spread.between <= 0:
        needed = 2 * spread.groups
    else:
        needed = max(math.ceil(1.0 / (bound / spread.between + 1.0 / total)), 2 * spread.groups)
    return total if 2 * needed > total else needed
