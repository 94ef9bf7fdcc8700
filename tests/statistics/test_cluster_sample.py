"""The spread check of row-group samples: quiet on well-mixed row groups, loud on clustered
ones, and the row groups it asks for bring the fitted mean within the tolerance."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from feedline.statistics.cluster_sample import (
    MAX_ENTRIES,
    TOLERANCE,
    batch_moments,
    cluster_spread,
    groups_needed,
    merge_moments,
)

GROUPS, ROWS = 200, 5_000


def entries(means: np.ndarray, rng: np.random.Generator, batches: int = 2) -> list[dict]:
    """Moments of ``batches`` batches per row group, rows N(mean, 1)."""
    out = []
    for mean in means:
        for _ in range(batches):
            x = rng.normal(mean, 1.0, ROWS // batches)
            out.append({"x": (x.size, float(x.mean()), float(np.square(x - x.mean()).sum()))})
    return out


def test_well_mixed_row_groups_pass_with_few_of_them() -> None:
    rng = np.random.default_rng(0)
    alarms = 0
    for _ in range(200):
        k = int(rng.integers(2, 12))
        spread = cluster_spread(entries(np.zeros(k), rng), groups=k, total=GROUPS)
        alarms += not spread.representative
    assert alarms <= 2  # a uniform sample of 10,000+ rows is as good as it looks


def test_row_groups_of_distinct_series_are_caught_and_enough_of_them_read() -> None:
    rng = np.random.default_rng(1)
    caught, errors = 0, []
    for _ in range(100):
        series = rng.normal(0.0, 0.3, GROUPS)  # one series per row group
        spread = cluster_spread(entries(series[:3], rng), groups=3, total=GROUPS)
        if spread.representative:
            continue
        caught += 1
        needed = groups_needed(spread, GROUPS)
        chosen = rng.choice(GROUPS, needed, replace=False)
        # the fitted mean from those row groups, thinned to 3 groups' worth of rows
        estimate = series[chosen].mean() + rng.normal(0, 1 / np.sqrt(3 * ROWS))
        errors.append((estimate - series.mean()) / np.sqrt(1 + series.var()))
    assert caught >= 97
    assert np.sqrt(np.mean(np.square(errors))) < 1.5 * TOLERANCE


def test_moments_of_batches_and_pooling_are_exact() -> None:
    x = np.random.default_rng(2).normal(3.0, 2.0, 1000)
    batch = pa.record_batch({"x": x, "i": np.arange(1000), "s": ["a"] * 1000})
    n, mean, m2 = batch_moments(batch)["x"]
    assert n == 1000 and np.isclose(mean, x.mean()) and np.isclose(m2, 999 * x.var(ddof=1))
    assert set(batch_moments(batch)) == {"x", "i"}
    many = [batch_moments(pa.record_batch({"x": x[i : i + 10]})) for i in range(0, 1000, 10)]
    pooled = merge_moments(many * (MAX_ENTRIES // 50))
    assert len(pooled) <= MAX_ENTRIES
    total = sum(e["x"][0] for e in pooled)
    grand = sum(e["x"][0] * e["x"][1] for e in pooled) / total
    assert total == 1000 * (MAX_ENTRIES // 50) and np.isclose(grand, x.mean())
