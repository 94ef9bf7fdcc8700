"""Descriptive statistics of a dataset from mergeable partials, so they run on any engine.

:func:`stats` runs :meth:`Profiler.partial` on every batch in the workers and merges the
results with :meth:`Profiler.merge` (associative and commutative); a second, column-pruned
pass turns values into ranks for the Spearman matrix. Estimators:

- ``count``/``nulls``: finite and null values (NaN counts as null in float columns); ±inf
  values are counted in ``infinite`` and left out of every other statistic.
- ``std``: the *sample* standard deviation (``ddof=1``, as pandas and Spark).
- ``skewness``/``kurtosis``: population moments, ``g1 = m3 / m2**1.5`` and the *excess*
  ``g2 = m4 / m2**2 - 3`` (``scipy.stats.skew``/``kurtosis`` with ``bias=True``). Central
  moments are merged with the Chan/Pébay pairwise formulas (numerically stable).
- quantiles ``p01 … p99``: a mergeable :class:`~feedline.statistics.quantile_sketch.QuantileSketch`
  (compactor levels of ``DEFAULT_K`` = 8192 items); exact (NumPy's default ``linear``
  method) while a column holds at most ``EXACT_LIMIT`` (100,000) values. Beyond that each
  compaction at level ``h`` moves any rank by at most ``2**h``; the sum is tracked and
  reported as ``rank_error`` (a worst-case bound on the normalized rank error, at most
  ``1 / EXACT_LIMIT + ceil(log2(n / K)) / K``: 0.2% at a billion values).
- ``distinct``/``top`` (string, bool, dictionary columns): Misra-Gries counters of capacity
  ``COUNTER_CAPACITY`` (10,000); exact while a column has no more distinct values, after which top
  counts are lower bounds off by at most ``top_error`` and ``distinct`` comes from a
  HyperLogLog sketch (4096 registers, about 1.6% standard error).
- ``pearson``: pairwise-complete co-moments (equal to ``np.corrcoef`` without nulls and to
  ``pandas.DataFrame.corr()`` with them). ``spearman``: Pearson of average ranks computed
  per column from the merged sketch in a second pass: exact (equal to
  ``scipy.stats.spearmanr``) while the sketches are exact and no values are null; with
  nulls the ranks are over each column's values, not re-ranked per pair. A pair whose rows
  are constant in either column gives ``None``.
- images (binary ``bytes``/``image`` columns): width/height as stored (before any EXIF
  rotation), read from headers with Pillow (no decode), top sizes and modes; files Pillow
  refuses (corrupt, unknown, decompression bombs) count as ``unreadable``.

Merging is exact for counts, extremes, counters, sketches while exact, and HyperLogLog;
moments merge to within rounding (relative ``1e-9`` unless a column's coefficient of
variation is below about ``1e-6``, where any float64 method is that imprecise).

An empty dataset gives ``rows == 0`` and ``None`` for every statistic that needs data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from feedline.engines.protocol import get_engine
from feedline.errors import FormatError
from feedline.statistics.accumulators import CoMoments
from feedline.statistics.indexed import indexed_labels, indexed_outputs
from feedline.statistics.profiler import Profiler
from feedline.statistics.result import STATS_VERSION, Stats
from feedline.store.commit import replace_manifest

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.engines.protocol import Engine

__all__ = ["stats", "store_stats", "stored_stats"]


def stats(
    ds: Dataset,
    columns: Sequence[str] | None = None,
    *,
    engine: str | Engine | None = None,
    top_k: int = 20,
    spearman: bool = True,
    categorical: Sequence[str] | None = None,
) -> Stats:
    """Descriptive statistics of ``ds`` (see the module docstring for every estimator).

    Parameters
    ----------
    ds:
        The dataset; ``columns`` restricts it (pushed into the reader).
    engine:
        Where the partial statistics run (``"local"``, ``"spark"``, ``"ray"`` or an engine).
    top_k:
        Most frequent values kept per categorical column.
    spearman:
        Compute the Spearman matrix: a second pass over the numeric columns, so the plan
        must give the same rows twice (seeded ``sample`` does; a random ``map_batches`` may
        not). Pass ``False`` to read the data once.

    Returns
    -------
    Stats
        ``rows``, one dict per column, and ``correlation`` (``columns``, ``pearson``,
        ``spearman``: lists of lists, ``None`` where undefined).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> s = fl.from_arrow(pa.table({"x": [1.0, 2.0, 3.0, None], "c": ["a", "b", "a", None]}))
    >>> result = stats(s)
    >>> result["x"]["mean"], result["x"]["nulls"], result["c"]["top"][0]
    (2.0, 1, ['a', 2])
    """

    engine = get_engine(engine)  # resolved once, for every pass below
    if columns is not None:
        ds = ds.select(list(columns))
    indexed = indexed_outputs(ds) if categorical is None else list(categorical)
    profiler = Profiler(ds.schema(), top_k=top_k, categorical=indexed)
    merged = ds.aggregate(profiler.partial, profiler.merge, engine=engine) or profiler.empty()
    ranks = None
    if spearman and len(profiler.numeric) > 1 and merged.rows:
        ranks = ds.select(list(profiler.numeric)).aggregate(
            lambda b: profiler.rank_partial(b, merged), CoMoments.merge, engine=engine
        )
    result = profiler.finish(merged, ranks)
    found = indexed_labels(ds, engine) if categorical is None and indexed else {}
    for name, labels in found.items():
        column = result.columns.get(name)
        if column is not None and column["kind"] == "categorical":
            column["labels"] = {
                str(k): labels[k] if 0 <= k < len(labels) else "(unknown)"
                for k, _ in column["top"]
                if isinstance(k, int)
            }
    return result


def stored_stats(ds: Dataset, columns: Sequence[str] | None = None) -> Stats | None:
    """The statistics stored in ``ds``'s manifest when complete for ``columns``, else None."""
    manifest = ds.manifest
    if manifest is None:
        return None
    doc = manifest.statistics
    if not doc or ds.plan.ops or doc.get("version") != STATS_VERSION:
        return None
    found = Stats.from_dict(doc)
    wanted = list(columns) if columns is not None else manifest.schema.names
    if found.rows != manifest.rows or any(c not in found.columns for c in wanted):
        return None
    return found.select(wanted)


def store_stats(ds: Dataset, *, engine: str | Engine | None = None) -> Stats:
    """Compute :func:`stats` of an opened feedline dataset and store them in its manifest.

    ``ds`` is ``fl.open(path)`` with no operators applied. The manifest is replaced
    atomically under the dataset's writer lock (:func:`feedline.store.commit.replace_manifest`),
    so readers see either the old or the new manifest and a write that committed meanwhile
    is never overwritten. ``Dataset.write(stats=True)`` calls this after its commit.
    """

    target = getattr(ds.plan.source, "target", None)
    if ds.manifest is None or target is None or ds.plan.ops:
        raise FormatError(
            f"{ds.plan.source.describe()} is not an opened feedline dataset with a manifest "
            "to store statistics in. Fix: write it with Dataset.write() and pass "
            "fl.open(path)."
        )
    result = stats(ds, engine=engine)
    updated = dataclasses.replace(ds.manifest, statistics=result.to_dict())
    replace_manifest(target, ds.manifest, updated)
    return result
