"""``Imputer``: fill missing values with a fitted mean, median, most frequent value or constant.

Missing means null, or NaN in float columns (scikit-learn's ``SimpleImputer`` treats NaN
as missing). Reporting: the fitted state records, per column, the fraction of missing
values seen at fit time (:attr:`Imputer.missing_fraction`); and every transform adds the
number of values it filled to the execution report's free-form counter
``"imputed:<column>"`` (so ``WriteInfo.report["counters"]`` and the manifest's write report
show how much was imputed per column while writing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, SchemaError
from feedline.preprocess.encoders import merge_counts, top_values, value_counts
from feedline.preprocess.preprocessor import register
from feedline.preprocess.scalers import (
    ColumnwisePreprocessor,
    check_finite,
    float_values,
    is_numeric,
    moments,
    no_values_error,
    numeric_column,
    output_float,
    put_column,
)
from feedline.statistics.quantile_sketch import QuantileSketch

__all__ = ["Imputer"]

_STRATEGIES = ("mean", "median", "most_frequent", "constant")


@register
class Imputer(ColumnwisePreprocessor):
    """Fill nulls (and NaN) with a statistic fitted per column, or a constant.

    Parameters
    ----------
    columns:
        Column(s) to fill.
    output:
        Output name(s); by default the inputs are replaced.
    strategy:
        ``"mean"`` or ``"median"`` (numeric columns; the output is float64, float32 for a
        float32 input; the median is exact up to 100,000 fitted values, then within the
        quantile sketch's rank error), ``"most_frequent"`` (any column; ties go to the
        smallest value, as scikit-learn; the type is kept), or ``"constant"``.
    fill_value:
        The constant for ``strategy="constant"``; by default ``0`` for numeric columns and
        ``"missing_value"`` for others (scikit-learn's defaults).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.imputer import Imputer
    >>> ds = fl.from_arrow(pa.table({"x": [1.0, None, 5.0, None]}))
    >>> imp = Imputer("x", strategy="mean").fit(ds)
    >>> imp.fitted["fill"], imp.missing_fraction
    ({'x': 3.0}, {'x': 0.5})
    >>> info = ds.transform(imp).analyze()
    >>> info.counters
    {'imputed:x': 2}
    >>> imp.transform_record({"x": None})
    {'x': 3.0}
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        output: str | Sequence[str] | None = None,
        strategy: str = "mean",
        fill_value: Any = None,
    ) -> None:
        super().__init__(columns, output)
        if strategy not in _STRATEGIES:
            raise ConfigurationError(
                f"Imputer(strategy={strategy!r}) is not supported. Fix: use one of "
                f"{list(_STRATEGIES)}."
            )
        if fill_value is not None and not isinstance(fill_value, str | int | float | bool):
            raise ConfigurationError(
                f"Imputer(fill_value={fill_value!r}) must be a str, int, float or bool. "
                "Fix: pass a plain value of the column's type."
            )
        self.strategy = strategy
        self.fill_value = fill_value

    def params(self) -> dict[str, Any]:
        return super().params() | {"strategy": self.strategy, "fill_value": self.fill_value}

    def fitted_spec(self) -> dict[str, str]:
        fill = "number" if self.strategy in ("mean", "median") else "scalar"
        return {"fill": fill, "missing_fraction": "fraction", "rows": "count"}

    @property
    def missing_fraction(self) -> dict[str, float]:
        """Per column: the fraction of missing values seen when fitting."""
        if self.fitted is None:
            raise ConfigurationError(f"{self!r} is not fitted. Fix: call .fit(ds) first.")
        return dict(self.fitted["missing_fraction"])

    # ------------------------------------------------------------------ fitting

    def partial(self, batch: pa.RecordBatch) -> dict[str, Any]:
        out: dict[str, Any] = {}  # per column: moments, (count, sketch) or (count, missing, x)
        for c in self.columns:
            array = batch.column(c)
            if self.strategy in ("mean", "median"):
                x = float_values(self, array, c)
                out[c] = moments(x) if self.strategy == "mean" else (len(x), QuantileSketch.of(x))
                continue
            missing = pc.is_null(array, nan_is_null=True)
            n_missing = pc.sum(missing).as_py() or 0
            if self.strategy == "constant":  # remember the default fill for the type
                default = (
                    None
                    if pa.types.is_null(array.type)
                    else (0 if is_numeric(array.type) else "missing_value")
                )
                out[c] = (len(array), n_missing, default)
            else:
                kept = _plain(array).filter(pc.invert(missing))
                out[c] = (len(array), n_missing, value_counts(kept))
        return out

    def _merge_one(self, a: Any, b: Any) -> Any:
        if self.strategy in ("mean", "median"):
            return super()._merge_one(a, b)
        if self.strategy == "constant":
            third = a[2] if a[2] is not None else b[2]
        else:
            third = merge_counts(a[2], b[2])
        return (a[0] + b[0], a[1] + b[1], third)

    def finish(self, partial: dict[str, Any]) -> dict[str, Any]:
        fitted: dict[str, dict[str, Any]] = {"fill": {}, "missing_fraction": {}, "rows": {}}
        for c in self.columns:
            p = partial[c]
            fill: Any  # a number, or the constant or most frequent value
            if self.strategy == "mean":
                rows, n, fill = int(p[0]), int(p[1]), float(p[2])
            elif self.strategy == "median":
                rows, n, fill = p[0], p[1].count, p[1].quantile(0.5)
            else:
                rows, n = p[0], p[0] - p[1]
                if self.strategy == "constant":
                    fill = self.fill_value if self.fill_value is not None else p[2]
                else:
                    fill = (top_values(p[2], 1) or [None])[0]
            if n == 0 and self.strategy != "constant":
                raise no_values_error(self, c, rows)
            check_finite(self, c, fill=fill)
            fitted["fill"][c] = fill
            fitted["missing_fraction"][c] = (rows - n) / rows if rows else 0.0
            fitted["rows"][c] = rows
        return fitted

    # ------------------------------------------------------------------ applying

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        assert self.fitted is not None
        out = batch
        for column, name in zip(self.columns, self.output, strict=True):
            array = batch.column(column)
            missing = pc.is_null(array, nan_is_null=True)
            if self.strategy in ("mean", "median"):
                x = numeric_column(self, array, column, where)
                filled = output_float(
                    pc.if_else(missing, self.fitted["fill"][column], x), array.type
                )
            else:
                filled = self._fill_typed(_plain(array), missing, column, where)
            if report is not None and hasattr(report, "count"):
                n = pc.sum(missing).as_py() or 0
                if n:
                    report.count(f"imputed:{column}", n)
            out = put_column(out, name, filled)
        return out

    def _fill_typed(self, array: pa.Array, missing: pa.Array, column: str, where: str) -> pa.Array:
        value = self.fitted["fill"][column] if self.fitted else None
        if value is None:
            value = (
                0
                if is_numeric(array.type) and not pa.types.is_null(array.type)
                else "missing_value"
            )
        target = array.type
        if pa.types.is_null(target):
            target = pa.scalar(value).type
        try:
            scalar = pa.scalar(value).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SchemaError(
                f"Imputer cannot put the fill value {value!r} into column {column!r} of type "
                f"{array.type} in {where}: {exc}. Fix: pass a fill_value of the column's type."
            ) from exc
        return pc.if_else(missing, scalar, array.cast(target))


def _plain(array: Any) -> pa.Array:
    """A contiguous array with dictionary encoding undone."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = pc.cast(array, array.type.value_type)
    return array
