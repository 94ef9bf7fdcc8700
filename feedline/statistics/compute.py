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
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feedline.errors import FormatError
from feedline.statistics.accumulators import QUANTILES, CoMoments
from feedline.statistics.profiler import Profiler

if TYPE_CHECKING:
    from rich.table import Table

    from feedline.dataset.dataset import Dataset
    from feedline.engines.base import Engine

__all__ = ["Stats", "stats", "store_stats", "stored_stats"]

STATS_VERSION = 1


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
    from feedline.statistics.indexed import indexed_labels, indexed_outputs

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
    manifest, doc = ds.manifest, (ds.manifest.statistics if ds.manifest is not None else {})
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
    from feedline.store.commit import replace_manifest

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


def _fmt(value: Any) -> str:
    """Numbers for tables: thousands separators, about four significant digits, no ``-0``."""
    from feedline.statistics.numbers import number

    return number(value)


class Stats:
    """The result of :func:`stats`: ``rows``, per-column entries and correlation matrices.

    ``stats["col"]`` is the column's dict (``kind`` is ``numeric``, ``categorical``, ``image``
    or ``other``); ``to_dict()`` is JSON-safe and ``Stats.from_dict`` reads it back.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> result = stats(fl.from_arrow(pa.table({"x": [1, 2, 3, 4], "y": [2.0, 4.0, 6.0, 9.0]})))
    >>> result["x"]["quantiles"]["p50"], result.correlation["spearman"][0][1]
    (2.5, 1.0)
    >>> Stats.from_dict(result.to_dict()).select(["y"]).columns["y"]["max"]
    9.0
    """

    def __init__(
        self, rows: int, columns: dict[str, dict[str, Any]], correlation: dict[str, Any]
    ) -> None:
        self.rows, self.columns, self.correlation = rows, columns, correlation

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self.columns[name]

    def __repr__(self) -> str:
        from feedline.ui.notebook import MAX_NAMES

        shown = [f"{k} ({c.get('kind')})" for k, c in list(self.columns.items())[:MAX_NAMES]]
        more = len(self.columns) - len(shown)
        listed = ", ".join(shown) + (f", … +{more:,} more" if more > 0 else "")
        noun = "column" if len(self.columns) == 1 else "columns"
        return f"Stats(rows={self.rows:,}, {len(self.columns):,} {noun}: {listed})"

    def _repr_html_(self) -> str:
        """The notebook view: one row per column (at most 20), kind, counts and a summary."""
        from feedline.statistics.html_page import summary_line
        from feedline.ui.notebook import Markup, table, view

        rows = [
            [name, c.get("kind"), c.get("type", ""), _fmt(c.get("count")),
             _fmt(c.get("nulls")), Markup(summary_line(c))]
            for name, c in self.columns.items()
        ]  # fmt: skip
        head = ["column", "kind", "type", "count", "nulls", "summary"]
        lines = [
            f"{self.rows:,} rows · {len(self.columns):,} columns",
            "The page with charts: stats.write_html(path) or `feedline stats PATH --html FILE`.",
        ]
        return view("feedline Stats", lines, table(head, rows))

    def write_html(self, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
        """Write the statistics page (histograms, top values, correlations) to ``path``; see
        :func:`feedline.statistics.html_page.write_html`."""
        from feedline.statistics.html_page import write_html

        return write_html(self, path, title=title)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (the form stored in the manifest)."""
        import copy

        return {
            "version": STATS_VERSION,
            "rows": self.rows,
            "columns": copy.deepcopy(self.columns),
            "correlation": copy.deepcopy(self.correlation),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Stats:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(doc, dict) or doc.get("version") != STATS_VERSION:
            raise FormatError(
                f"Not feedline statistics (version {STATS_VERSION}): "
                f"{str(doc)[:120]!r}. Fix: recompute them with fl.stats(ds)."
            )
        return cls(int(doc["rows"]), dict(doc["columns"]), dict(doc["correlation"]))

    def select(self, columns: Sequence[str]) -> Stats:
        """Only ``columns`` (and their rows and columns of the correlation matrices)."""
        keep = [i for i, c in enumerate(self.correlation["columns"]) if c in columns]
        sub = {"columns": [self.correlation["columns"][i] for i in keep]}
        for method in ("pearson", "spearman"):
            m = self.correlation.get(method)
            sub[method] = None if m is None else [[m[i][j] for j in keep] for i in keep]
        return Stats(self.rows, {c: self.columns[c] for c in columns}, sub)

    def table(self) -> Table:
        """A rich table: one row per column, with a one-line summary of its distribution."""
        table = _table(f"statistics: {self.rows:,} rows", "column", "kind", "count", "nulls")
        table.add_column("summary")
        for name, c in self.columns.items():
            table.add_row(name, c["kind"], _fmt(c["count"]), _fmt(c["nulls"]), _describe(c))
        return table

    def tables(self) -> list[Table]:
        """Every table: the summary, numeric moments and quantiles, and the correlations."""
        numeric = {k: v for k, v in self.columns.items() if v["kind"] == "numeric"}
        numeric |= {
            f"{k}.{d}": v[d]
            for k, v in self.columns.items()
            if v["kind"] == "image"
            for d in ("width", "height")
        }
        numeric |= {f"{k}[elements]": v["elements"] for k, v in self.columns.items()
                    if v["kind"] == "tensor"}  # fmt: skip
        heads = {
            "moments": ("mean", "std", "min", "max", "skewness", "kurtosis"),
            "quantiles": tuple(QUANTILES),
        }
        out = [self.table()]
        for title, keys in heads.items() if numeric else ():
            table = _table(title, "column", *keys)
            for name, c in numeric.items():
                table.add_row(name, *(_fmt(c.get(k, c["quantiles"].get(k))) for k in keys))
            out.append(table)
        from feedline.statistics.numbers import fixed

        names = self.correlation["columns"]
        for method in ("pearson", "spearman"):
            if self.correlation.get(method) and len(names) > 1:
                table = _table(f"{method} correlation", "", *names)
                for name, row in zip(names, self.correlation[method], strict=True):
                    table.add_row(name, *("" if v is None else fixed(v) for v in row))
                out.append(table)
        return out


def _table(title: str, *headers: str) -> Table:
    """A compact rich table: labels left-aligned, numbers right-aligned."""
    from rich.table import Table

    table = Table(title=title, pad_edge=False, show_edge=False)
    for i, name in enumerate(headers):
        table.add_column(
            name, justify="left" if i == 0 or name == "kind" else "right", no_wrap=True
        )
    return table


def _describe(c: dict[str, Any]) -> str:
    """One line about a column's distribution."""
    if c["kind"] == "tensor":
        shapes = ", ".join(k for k, _ in c["shapes"][:2])
        return f"shape {shapes or '-'}; elements: " + _describe(c["elements"])
    if c["kind"] == "categorical":
        from feedline.statistics.svg_charts import shown_value

        labels = c.get("labels") or {}
        top = ", ".join(
            shown_value(k)[0] + (f" · {labels[str(k)]}" if str(k) in labels else "") + f" ({v:,})"
            for k, v in c["top"][:3]
        )
        return f"{c['distinct']:,}{'' if c['distinct_exact'] else ' (approx.)'} distinct; {top}"
    if c["kind"] == "image":
        w, h = c["width"]["quantiles"]["p50"], c["height"]["quantiles"]["p50"]
        return f"median {w or 0:g}x{h or 0:g}; {c['unreadable']} unreadable; " + ", ".join(
            f"{k} ({v:,})" for k, v in c["top_sizes"][:2]
        )
    if c["kind"] == "numeric" and c["count"]:
        return (
            f"mean {_fmt(c['mean'])} ± {_fmt(c['std'])}; min {_fmt(c['min'])}, "
            f"median {_fmt(c['quantiles']['p50'])}, max {_fmt(c['max'])}"
        )
    return c.get("type", "")
