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
- quantiles ``p01 … p99``: a mergeable compactor sketch (KLL/MRL style) with ``SKETCH_K``
  (8192, in :mod:`feedline.preprocess.drift`) items per level; exact (NumPy's default
  ``linear`` method) while a column holds at most ``SKETCH_K`` values. Beyond that each
  compaction at level ``h`` moves any rank by at most ``2**h``; the sum is tracked and
  reported as ``rank_error`` (a worst-case bound on the normalized rank error, at most
  ``(log2(n / K) + 1) / K``: 0.2% at a billion values).
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
import importlib.util
import io
import math
import os
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import FormatError
from feedline.preprocess.drift import CompactorSketch, hash_values, hll_estimate, hll_registers

if TYPE_CHECKING:
    from rich.table import Table

    from feedline.dataset import Dataset
    from feedline.engines.base import Engine

__all__ = ["Profiler", "Stats", "stats", "store_stats", "stored_stats"]

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
STATS_VERSION = 1
_TINY = 1e-12  # variance below (TINY * max|x|)**2 per value is rounding noise: treated as 0


# ----------------------------------------------------------------------------- accumulators


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
class _Numeric:
    nulls: int
    infinite: int  # ±inf values: counted, and left out of every other statistic
    moments: tuple[int, float, float, float, float]  # n, mean, M2, M3, M4 (central sums)
    low: Any
    high: Any
    sketch: CompactorSketch

    @classmethod
    def of(cls, arr: pa.Array, x: np.ndarray) -> _Numeric:
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
        return cls(len(x) - n - infinite, infinite, moments, low, high, CompactorSketch.of(valid))

    def merge(self, other: _Numeric) -> _Numeric:
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
        return _Numeric(
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
        values = self.sketch.quantiles(list(QUANTILES.values()))
        out["quantiles"] = {k: _num(v) for k, v in zip(QUANTILES, values, strict=True)}
        out["quantiles_exact"], out["rank_error"] = self.sketch.exact, self.sketch.rank_error
        grid = self.sketch.quantiles(np.linspace(0.0, 1.0, CDF_POINTS)) if n else []
        out["cdf"] = [_num(v) for v in grid]
        return out


@dataclasses.dataclass(frozen=True)
class _Categorical:
    nulls: int
    n: int
    counts: dict[Any, int]  # Misra-Gries counters
    err: int  # every count is low by at most this much
    registers: np.ndarray  # HyperLogLog

    @classmethod
    def of(cls, arr: pa.Array, x: Any = None) -> _Categorical:
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

    def merge(self, other: _Categorical) -> _Categorical:
        counts, err = dict(self.counts), self.err + other.err
        for key, value in other.counts.items():
            counts[key] = counts.get(key, 0) + value
        cut = _prune(np.fromiter(counts.values(), np.int64, len(counts)))
        if cut:
            counts, err = {k: v - cut for k, v in counts.items() if v > cut}, err + cut
        return _Categorical(
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
class _Images:
    nulls: int
    unreadable: int
    width: _Numeric
    height: _Numeric
    sizes: _Categorical
    modes: _Categorical

    @classmethod
    def of(cls, arr: pa.Array, x: Any = None) -> _Images:
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
            _Numeric.of(pa.array(w), w.astype(np.float64)),
            _Numeric.of(pa.array(h), h.astype(np.float64)),
            _Categorical.of(pa.array([f"{a}x{b}" for a, b, _ in found], pa.string())),
            _Categorical.of(pa.array([m for _, _, m in found], pa.string())),
        )

    def merge(self, other: _Images) -> _Images:
        return _Images(
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
class _Other:
    nulls: int
    n: int

    @classmethod
    def of(cls, arr: pa.Array, x: Any = None) -> _Other:
        return cls(arr.null_count, len(arr) - arr.null_count)

    def merge(self, other: _Other) -> _Other:
        return _Other(self.nulls + other.nulls, self.n + other.n)

    def summary(self, top_k: int) -> dict[str, Any]:
        return {"kind": "other", "count": self.n, "nulls": self.nulls}


def _gram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a.T @ b`` without BLAS threads for narrow inputs: inside the engine's worker threads
    BLAS's own thread pool oversubscribes the cores and spins (5-100x slower, measured)."""
    return np.einsum("ij,ik->jk", a, b) if a.shape[1] * b.shape[1] <= 1024 else a.T @ b


@dataclasses.dataclass(frozen=True)
class _CoMoments:
    """Pairwise-complete co-moments: entry ``[i, j]`` covers rows where columns i and j are set."""

    n: np.ndarray  # rows with both set
    mean: np.ndarray  # mean of column i over those rows
    m2: np.ndarray  # sum of squared deviations of column i over those rows
    c: np.ndarray  # co-moment of columns i and j

    @classmethod
    def of(cls, x: np.ndarray) -> _CoMoments:
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

    def merge(self, other: _CoMoments) -> _CoMoments:
        n = self.n + other.n
        with np.errstate(all="ignore"):
            d = other.mean - self.mean
            f = np.where(n > 0, self.n * other.n / n, 0.0)
            mean = np.where(n > 0, (self.n * self.mean + other.n * other.mean) / n, 0.0)
        return _CoMoments(n, mean, self.m2 + other.m2 + d * d * f, self.c + other.c + d * d.T * f)

    def correlation(self, scale: np.ndarray) -> list[list[Any]]:
        m2 = np.where(self.m2 <= self.n * (_TINY * scale[:, None]) ** 2, 0.0, self.m2)
        with np.errstate(all="ignore"):
            r = np.where(m2 * m2.T > 0, np.clip(self.c / np.sqrt(m2 * m2.T), -1.0, 1.0), np.nan)
        return [[_num(v) for v in row] for row in r]


_KINDS: dict[str, Any] = {
    "numeric": _Numeric,
    "categorical": _Categorical,
    "image": _Images,
    "other": _Other,
}


def _kind(field: pa.Field, image_columns: Sequence[str]) -> str:
    t = field.type
    categorical = (
        pa.types.is_dictionary,
        pa.types.is_boolean,
        pa.types.is_string,
        pa.types.is_large_string,
        getattr(pa.types, "is_string_view", bool),
    )
    if any(test(t) for test in categorical):
        return "categorical"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "numeric"
    if (
        (pa.types.is_binary(t) or pa.types.is_large_binary(t))
        and field.name in image_columns
        and importlib.util.find_spec("PIL") is not None
    ):
        return "image"
    return "other"


@dataclasses.dataclass(frozen=True)
class _Partial:
    rows: int
    columns: dict[str, Any]
    pearson: _CoMoments | None  # None with fewer than two numeric columns


class Profiler:
    """The mergeable core of :func:`stats` for one schema: ``partial``, ``merge``, ``finish``.

    Engines run ``partial`` per batch and ``merge`` the results in any order; ``rank_partial``
    is the second (Spearman) pass, given the merged first-pass partial.

    Examples
    --------
    >>> batch = pa.record_batch({"x": [1.0, 2.0, 4.0], "y": [1, 3, 2]})
    >>> p = Profiler(batch.schema)
    >>> merged = p.merge(p.partial(batch.slice(0, 1)), p.partial(batch.slice(1)))
    >>> p.finish(merged)["x"]["mean"]
    2.3333333333333335
    """

    def __init__(
        self,
        schema: pa.Schema,
        *,
        top_k: int = 20,
        image_columns: Sequence[str] = ("bytes", "image"),
    ) -> None:
        self.schema, self.top_k = schema, top_k
        self.kinds = {f.name: _kind(f, image_columns) for f in schema}
        self.numeric = [name for name, kind in self.kinds.items() if kind == "numeric"]

    def _matrix(self, batch: pa.RecordBatch) -> np.ndarray:
        columns = [
            pc.cast(batch.column(c), pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            for c in self.numeric
        ]
        return np.column_stack(columns) if columns else np.empty((batch.num_rows, 0))

    def partial(self, batch: pa.RecordBatch) -> _Partial:
        x = self._matrix(batch)
        where = {c: i for i, c in enumerate(self.numeric)}
        columns = {
            name: _KINDS[kind].of(
                batch.column(name), x[:, where.get(name, 0)] if kind == "numeric" else None
            )
            for name, kind in self.kinds.items()
        }
        return _Partial(batch.num_rows, columns, _CoMoments.of(x) if x.shape[1] > 1 else None)

    def merge(self, a: _Partial, b: _Partial) -> _Partial:
        return _Partial(
            a.rows + b.rows,
            {k: v.merge(b.columns[k]) for k, v in a.columns.items()},
            a.pearson.merge(b.pearson) if a.pearson else None,
        )

    def empty(self) -> _Partial:
        return self.partial(pa.RecordBatch.from_pylist([], schema=self.schema))

    def rank_partial(self, batch: pa.RecordBatch, merged: _Partial) -> _CoMoments:
        x = self._matrix(batch)
        ranks = [merged.columns[c].sketch.midranks(x[:, i]) for i, c in enumerate(self.numeric)]
        return _CoMoments.of(np.column_stack(ranks))

    def finish(self, merged: _Partial, ranks: _CoMoments | None = None) -> Stats:
        columns = {
            name: {"type": str(self.schema.field(name).type)}
            | (acc.summary() if isinstance(acc, _Numeric) else acc.summary(self.top_k))
            for name, acc in merged.columns.items()
        }
        scale = np.array(
            [max(abs(columns[c]["min"] or 0), abs(columns[c]["max"] or 0)) for c in self.numeric],
            np.float64,
        )
        correlation = {
            "columns": list(self.numeric),
            "pearson": merged.pearson.correlation(scale) if merged.pearson else None,
            "spearman": ranks.correlation(np.full(len(scale), merged.rows + 1.0))
            if ranks is not None
            else None,
        }
        return Stats(merged.rows, columns, correlation)


def stats(
    ds: Dataset,
    columns: Sequence[str] | None = None,
    *,
    engine: str | Engine | None = None,
    top_k: int = 20,
    spearman: bool = True,
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
    >>> import feedline as fl
    >>> s = fl.from_arrow(pa.table({"x": [1.0, 2.0, 3.0, None], "c": ["a", "b", "a", None]}))
    >>> result = stats(s)
    >>> result["x"]["mean"], result["x"]["nulls"], result["c"]["top"][0]
    (2.0, 1, ['a', 2])
    """
    from feedline.engines.base import get_engine
    from feedline.plan import Select

    if columns is not None:
        ds = ds.select(list(columns))
    plan, engine = ds._resolved_plan(), get_engine(engine)
    profiler = Profiler(ds.schema(), top_k=top_k)
    merged = engine.aggregate(plan, profiler.partial, profiler.merge) or profiler.empty()
    ranks = None
    if spearman and len(profiler.numeric) > 1 and merged.rows:
        ranks = engine.aggregate(
            plan.then(Select(tuple(profiler.numeric))),
            lambda b: profiler.rank_partial(b, merged),
            _CoMoments.merge,
        )
    return profiler.finish(merged, ranks)


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


def store_stats(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    engine: str | Engine | None = None,
) -> Stats:
    """Compute :func:`stats` of the feedline dataset at ``path`` and store them in its manifest.

    The manifest is replaced atomically (temporary file, then rename), so readers see either
    the old or the new manifest. ``Dataset.write(stats=True)`` calls this after its commit.
    """
    from feedline.io.format import MANIFEST_NAME
    from feedline.io.storage import resolve
    from feedline.readers import open as open_dataset

    ds = open_dataset(path, storage_options=storage_options)
    if ds.manifest is None:
        raise FormatError(
            f"{os.fspath(path)!r} has no feedline manifest to store statistics in. "
            "Fix: write it with Dataset.write() first."
        )
    result = stats(ds, engine=engine)
    text = dataclasses.replace(ds.manifest, statistics=result.to_dict()).to_json().encode()
    target = resolve(path, storage_options)
    final = target.join(MANIFEST_NAME)
    if target.is_local:
        temporary = target.join(f"{MANIFEST_NAME}.tmp-{uuid.uuid4().hex[:8]}")
        with open(temporary, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    else:  # object stores: a single upload replaces the object
        target.fs.pipe_file(final, text)
    return result


def _fmt(value: Any) -> str:
    """Numbers for tables: thousands separators, about four significant digits."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "" if value is None else str(value)
    if isinstance(value, int) or value == 0:
        return f"{value:,.0f}"
    digits = math.floor(math.log10(abs(value)))
    return f"{value:,.{max(0, 3 - digits)}f}" if -3 <= digits < 7 else f"{value:.3e}"


class Stats:
    """The result of :func:`stats`: ``rows``, per-column entries and correlation matrices.

    ``stats["col"]`` is the column's dict (``kind`` is ``numeric``, ``categorical``, ``image``
    or ``other``); ``to_dict()`` is JSON-safe and ``Stats.from_dict`` reads it back.

    Examples
    --------
    >>> import feedline as fl
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
        return f"Stats(rows={self.rows}, columns={list(self.columns)})"

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
        names = self.correlation["columns"]
        for method in ("pearson", "spearman"):
            if self.correlation.get(method) and len(names) > 1:
                table = _table(f"{method} correlation", "", *names)
                for name, row in zip(names, self.correlation[method], strict=True):
                    table.add_row(name, *("" if v is None else f"{v:.3f}" for v in row))
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
    if c["kind"] == "categorical":
        top = ", ".join(f"{k} ({v:,})" for k, v in c["top"][:3])
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
    return c["type"]
