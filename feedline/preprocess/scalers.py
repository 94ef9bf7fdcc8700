"""Numeric scalers: ``StandardScaler``, ``MinMaxScaler``, ``RobustScaler``.

All three ignore nulls and NaN when fitting (as scikit-learn ignores NaN), keep nulls null
and NaN NaN when transforming, and compute in float64. Outputs are float64, or float32 when
the input column is float16/float32. The shared column helpers live here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.preprocess.preprocessor import Preprocessor, register
from feedline.statistics.quantile_sketch import QuantileSketch

__all__ = ["MinMaxScaler", "RobustScaler", "StandardScaler"]

_EPS = float(np.finfo(np.float64).eps)


# ---------------------------------------------------------------------- shared helpers


def is_numeric(dtype: pa.DataType) -> bool:
    """Integers, floats, decimals, booleans, and the null type of an all-``None`` record."""
    t = pa.types
    return (
        t.is_integer(dtype)
        or t.is_floating(dtype)
        or t.is_decimal(dtype)
        or t.is_boolean(dtype)
        or t.is_null(dtype)
    )


def numeric_column(owner: Preprocessor, array: Any, column: str, where: str) -> pa.Array:
    """``array`` cast to float64 (nulls stay null); ``SchemaError`` when it is not numeric."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not is_numeric(array.type):
        raise SchemaError(
            f"{type(owner).__name__} needs a numeric column, but {column!r} in {where} has type "
            f"{array.type}. Fix: cast it, or encode strings first (fl.StringIndexer)."
        )
    return pc.cast(array, pa.float64())


def float_values(owner: Preprocessor, array: Any, column: str, where: str = "the data") -> Any:
    """The column as a float64 NumPy array with NaN for nulls."""
    return numeric_column(owner, array, column, where).to_numpy(zero_copy_only=False)


def output_float(result: pa.Array, source_type: pa.DataType) -> pa.Array:
    """float32 when the source was float16/float32, else the float64 ``result``."""
    if pa.types.is_float32(source_type) or pa.types.is_float16(source_type):
        return pc.cast(result, pa.float32(), safe=False)
    return result


def put_column(batch: pa.RecordBatch, name: str, array: pa.Array) -> pa.RecordBatch:
    """Replace column ``name`` in place, or append it when it is new."""
    i = batch.schema.get_field_index(name)
    if i >= 0:
        return batch.set_column(i, pa.field(name, array.type), array)
    return batch.append_column(pa.field(name, array.type), array)


def tensor_array(matrix: np.ndarray) -> pa.Array:
    """An ``arrow.fixed_shape_tensor`` column from an ``(n, *shape)`` array (n may be 0)."""
    shape = list(matrix.shape[1:])
    width = int(np.prod(shape)) if shape else 1
    flat = pa.array(np.ascontiguousarray(matrix).reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(flat, width)
    return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(flat.type, shape), storage)


def check_outputs(owner: Preprocessor) -> None:
    """One output name per input column."""
    if len(owner.output) != len(owner.columns):
        raise ConfigurationError(
            f"{type(owner).__name__} got {len(owner.columns)} column(s) but "
            f"{len(owner.output)} output name(s). Fix: give one output per column, or none."
        )


def no_values_error(owner: Preprocessor, column: str, rows: int) -> DataError:
    """The fit-time error for a column without a single usable value."""
    return DataError(
        f"{type(owner).__name__} cannot be fitted on column {column!r}: none of its {rows} "
        "fitted row(s) has a value (all are null or NaN), so its statistics would be NaN. "
        "Fix: drop the column, fill it first (fl.Imputer(..., strategy='constant')), or fit on "
        "more data."
    )


def check_finite(owner: Preprocessor, column: str, **stats: Any) -> None:
    """A ``DataError`` naming the column when a fitted statistic is infinite or NaN."""
    bad = {k: v for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        raise DataError(
            f"{type(owner).__name__} cannot be fitted on column {column!r}: its fitted "
            f"statistics {bad} are not finite (the column holds infinite values). Fix: filter "
            f"them out first, e.g. ds.filter(pc.is_finite(pc.field({column!r})))."
        )


def moments(x: np.ndarray) -> np.ndarray:
    """``[rows, n, mean, M2, min, max]`` of the non-NaN values of ``x``."""
    v = x[~np.isnan(x)]
    if not v.size:
        return np.array([x.size, 0, 0.0, 0.0, np.inf, -np.inf])
    with np.errstate(invalid="ignore", over="ignore"):  # infinities: caught in finish
        mean = v.mean()
        return np.array([x.size, v.size, mean, np.square(v - mean).sum(), v.min(), v.max()])


def merge_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan et al.'s parallel update of count, mean and M2 (plus rows, min, max)."""
    na, nb = a[1], b[1]
    n = na + nb
    if n == 0:
        return np.array([a[0] + b[0], 0, 0.0, 0.0, np.inf, -np.inf])
    with np.errstate(invalid="ignore", over="ignore"):
        delta = b[2] - a[2]
        mean = a[2] + delta * (nb / n)
        m2 = a[3] + b[3] + delta * delta * (na * nb / n)
    return np.array([a[0] + b[0], n, mean, m2, min(a[4], b[4]), max(a[5], b[5])])


class ColumnwisePreprocessor(Preprocessor):
    """Base of per-column preprocessors: one output per input column."""

    def __init__(
        self, columns: str | Sequence[str], output: str | Sequence[str] | None = None
    ) -> None:
        super().__init__(columns, output)
        check_outputs(self)

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {c: self._merge_one(a[c], b[c]) for c in self.columns}

    def _merge_one(self, a: Any, b: Any) -> Any:
        if isinstance(a, np.ndarray):
            return merge_moments(a, b)
        return (a[0] + b[0], a[1].merge(b[1]))  # (rows, QuantileSketch)

    def _affine(
        self,
        batch: pa.RecordBatch,
        where: str,
        shift: dict[str, float],
        factor: dict[str, float],
        divide: bool,
    ) -> pa.RecordBatch:
        """``(x - shift) / factor`` or ``x * factor + shift`` per column, nulls kept."""
        out = batch
        for column, name in zip(self.columns, self.output, strict=True):
            source = batch.column(column)
            x = numeric_column(self, source, column, where)
            if divide:
                y = pc.divide(pc.subtract(x, shift[column]), factor[column])
            else:
                y = pc.add(pc.multiply(x, factor[column]), shift[column])
            out = put_column(out, name, output_float(y, source.type))
        return out


def sketch_partial(owner: Preprocessor, batch: pa.RecordBatch) -> dict[str, Any]:
    """Per column: ``(rows, QuantileSketch)`` of the batch."""
    return {
        c: (batch.num_rows, QuantileSketch.of(float_values(owner, batch.column(c), c)))
        for c in owner.columns
    }


# ---------------------------------------------------------------------- scalers


@register
class StandardScaler(ColumnwisePreprocessor):
    """Center to mean 0 and scale to unit (population, ``ddof=0``) standard deviation.

    Mean and variance are merged across batches with Chan et al.'s parallel algorithm
    (numerically stable). A constant column gets scale 1 (scikit-learn's rule). The fitted
    state holds ``mean``, ``var``, ``scale`` and ``count`` per column.

    Parameters
    ----------
    columns:
        Numeric column(s).
    output:
        Output name(s); by default the inputs are replaced.
    with_mean, with_std:
        Center / scale (as in scikit-learn).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.scalers import StandardScaler
    >>> ds = fl.from_arrow(pa.table({"x": [1.0, 2.0, 3.0, None]}))
    >>> sc = StandardScaler("x").fit(ds)
    >>> sc.fitted["mean"], round(sc.fitted["scale"]["x"], 4)
    ({'x': 2.0}, 0.8165)
    >>> ds.transform(sc).to_arrow()["x"].to_pylist()[1:]
    [0.0, 1.224744871391589, None]
    >>> sc.transform_record({"x": 3.0})
    {'x': 1.224744871391589}
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        output: str | Sequence[str] | None = None,
        with_mean: bool = True,
        with_std: bool = True,
    ) -> None:
        super().__init__(columns, output)
        self.with_mean = bool(with_mean)
        self.with_std = bool(with_std)

    def params(self) -> dict[str, Any]:
        return super().params() | {"with_mean": self.with_mean, "with_std": self.with_std}

    def fitted_spec(self) -> dict[str, str]:
        return {"mean": "number", "var": "nonnegative", "scale": "positive", "count": "count"}

    def partial(self, batch: pa.RecordBatch) -> dict[str, Any]:
        return {c: moments(float_values(self, batch.column(c), c)) for c in self.columns}

    def finish(self, partial: dict[str, Any]) -> dict[str, Any]:
        fitted: dict[str, dict[str, Any]] = {"mean": {}, "var": {}, "scale": {}, "count": {}}
        for c in self.columns:
            rows, n, mean, m2 = partial[c][:4]
            if n == 0:
                raise no_values_error(self, c, int(rows))
            var = max(m2 / n, 0.0)
            constant = var <= n * _EPS * var + (n * mean * _EPS) ** 2
            fitted["mean"][c] = float(mean) if self.with_mean else 0.0
            fitted["var"][c] = float(var)
            fitted["scale"][c] = 1.0 if constant or not self.with_std else math.sqrt(var)
            fitted["count"][c] = int(n)
            check_finite(self, c, mean=float(mean), var=float(var))
        return fitted

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        f = self.fitted
        assert f is not None
        return self._affine(batch, where, f["mean"], f["scale"], divide=True)


@register
class MinMaxScaler(ColumnwisePreprocessor):
    """Scale each column linearly so its fitted min/max map onto ``feature_range``.

    ``x * scale + min`` with ``scale = (hi - lo) / (data_max - data_min)`` (1 for a constant
    column) and ``min = lo - data_min * scale``, as in scikit-learn. Values outside the
    fitted range map outside ``feature_range`` (no clipping).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.scalers import MinMaxScaler
    >>> ds = fl.from_arrow(pa.table({"x": [2, 4, 6]}))
    >>> ds.transform(MinMaxScaler("x", feature_range=(-1, 1))).to_arrow()["x"].to_pylist()
    [-1.0, 0.0, 1.0]
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        output: str | Sequence[str] | None = None,
        feature_range: Sequence[float] = (0.0, 1.0),
    ) -> None:
        super().__init__(columns, output)
        lo, hi = (float(v) for v in feature_range)
        if not lo < hi:
            raise ConfigurationError(
                f"MinMaxScaler feature_range={tuple(feature_range)} must be (low, high) with "
                "low < high. Fix: e.g. feature_range=(0, 1)."
            )
        self.feature_range = (lo, hi)

    def params(self) -> dict[str, Any]:
        return super().params() | {"feature_range": list(self.feature_range)}

    def fitted_spec(self) -> dict[str, str]:
        return {"data_min": "number", "data_max": "number", "scale": "positive", "min": "number"}

    def partial(self, batch: pa.RecordBatch) -> dict[str, Any]:
        return {c: moments(float_values(self, batch.column(c), c)) for c in self.columns}

    def finish(self, partial: dict[str, Any]) -> dict[str, Any]:
        lo, hi = self.feature_range
        fitted: dict[str, dict[str, Any]] = {"data_min": {}, "data_max": {}, "scale": {}, "min": {}}
        for c in self.columns:
            rows, n, _, _, dmin, dmax = partial[c]
            if n == 0:
                raise no_values_error(self, c, int(rows))
            span = dmax - dmin
            scale = (hi - lo) / (span if span >= 10 * _EPS else 1.0)
            fitted["data_min"][c], fitted["data_max"][c] = float(dmin), float(dmax)
            fitted["scale"][c] = float(scale)
            fitted["min"][c] = float(lo - dmin * scale)
            check_finite(self, c, data_min=float(dmin), data_max=float(dmax), scale=float(scale))
        return fitted

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        f = self.fitted
        assert f is not None
        return self._affine(batch, where, f["min"], f["scale"], divide=False)


@register
class RobustScaler(ColumnwisePreprocessor):
    """Center on the median and scale by an inter-quantile range (robust to outliers).

    Quantiles come from a mergeable :class:`~feedline.statistics.quantile_sketch.QuantileSketch`:
    exact (numpy's linear interpolation, as scikit-learn) up to 100,000 fitted values per
    column, within the sketch's stated rank error beyond. A zero range gives scale 1.

    Parameters
    ----------
    quantile_range:
        Percentiles ``(q_min, q_max)`` in [0, 100] (default the inter-quartile range).
    with_centering, with_scaling:
        Subtract the median / divide by the range (as in scikit-learn).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.scalers import RobustScaler
    >>> ds = fl.from_arrow(pa.table({"x": [1.0, 2.0, 3.0, 4.0, 100.0]}))
    >>> rs = RobustScaler("x").fit(ds)
    >>> rs.fitted["center"], rs.fitted["scale"]
    ({'x': 3.0}, {'x': 2.0})
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        output: str | Sequence[str] | None = None,
        quantile_range: Sequence[float] = (25.0, 75.0),
        with_centering: bool = True,
        with_scaling: bool = True,
    ) -> None:
        super().__init__(columns, output)
        q_min, q_max = (float(v) for v in quantile_range)
        if not 0 <= q_min <= q_max <= 100:
            raise ConfigurationError(
                f"RobustScaler quantile_range={tuple(quantile_range)} must satisfy "
                "0 <= q_min <= q_max <= 100. Fix: e.g. (25, 75)."
            )
        self.quantile_range = (q_min, q_max)
        self.with_centering = bool(with_centering)
        self.with_scaling = bool(with_scaling)

    def params(self) -> dict[str, Any]:
        return super().params() | {
            "quantile_range": list(self.quantile_range),
            "with_centering": self.with_centering,
            "with_scaling": self.with_scaling,
        }

    def fitted_spec(self) -> dict[str, str]:
        return {"center": "number", "scale": "positive", "rank_error": "nonnegative"}

    def partial(self, batch: pa.RecordBatch) -> dict[str, Any]:
        return sketch_partial(self, batch)

    def finish(self, partial: dict[str, Any]) -> dict[str, Any]:
        fitted: dict[str, dict[str, Any]] = {"center": {}, "scale": {}, "rank_error": {}}
        for c in self.columns:
            rows, sketch = partial[c]
            if not sketch.count:
                raise no_values_error(self, c, rows)
            lo, med, hi = sketch.quantile(
                [self.quantile_range[0] / 100, 0.5, self.quantile_range[1] / 100]
            )
            span = hi - lo
            fitted["center"][c] = float(med) if self.with_centering else 0.0
            fitted["scale"][c] = float(span) if self.with_scaling and span >= 10 * _EPS else 1.0
            fitted["rank_error"][c] = sketch.relative_error
            check_finite(self, c, center=float(med), scale=fitted["scale"][c])
        return fitted

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        f = self.fitted
        assert f is not None
        return self._affine(batch, where, f["center"], f["scale"], divide=True)
