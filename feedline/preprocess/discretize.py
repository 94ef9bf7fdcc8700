"""Discretizers: ``Bucketizer`` (given splits) and ``QuantileDiscretizer`` (fitted splits).

Both output ``int64`` bucket ids. With splits ``s_0 < s_1 < ... < s_n``, bucket ``i`` holds
``s_i <= x < s_{i+1}``, and the last bucket also holds ``x == s_n`` (Spark's
``Bucketizer``). Nulls stay null. NaN and values outside ``[s_0, s_n]`` are *invalid* and
follow ``handle_invalid``: ``"error"`` raises a :class:`~feedline.errors.DataError` naming
the value and column, ``"keep"`` puts them in an extra bucket ``n``, ``"skip"`` drops the
row. Infinite splits are written ``"inf"``/``"-inf"`` in the JSON state.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, DataError
from feedline.preprocess.preprocessor import register
from feedline.preprocess.scalers import (
    ColumnwisePreprocessor,
    float_values,
    no_values_error,
    put_column,
    sketch_partial,
)

__all__ = ["Bucketizer", "QuantileDiscretizer"]

_INVALID = ("error", "keep", "skip")


def _encode(values: Sequence[float]) -> list[float | str]:
    """JSON-safe floats: infinities as ``"inf"`` / ``"-inf"``."""
    return [("inf" if v > 0 else "-inf") if math.isinf(v) else float(v) for v in values]


def _decode(values: Sequence[float | str]) -> list[float]:
    return [float(v) for v in values]


def _check_splits(splits: Sequence[float | str], owner: str) -> list[float]:
    try:
        values = _decode(splits)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{owner}: splits must be numbers, got {splits!r}. Fix: e.g. [0, 10, 100] or "
            "[-inf, 0, inf]."
        ) from exc
    if (
        len(values) < 2
        or any(math.isnan(v) for v in values)
        or any(b <= a for a, b in itertools.pairwise(values))
    ):
        raise ConfigurationError(
            f"{owner}: splits {splits!r} must be at least two strictly increasing numbers. "
            "Fix: e.g. splits=[-inf, 0, 10, inf] for buckets (-inf,0), [0,10), [10,inf]."
        )
    return values


class _Discretizer(ColumnwisePreprocessor):
    handle_invalid: str

    @property
    def drops_rows(self) -> bool:
        """True when ``transform`` may drop rows (``handle_invalid="skip"``)."""
        return self.handle_invalid == "skip"

    def _splits(self, column: str) -> list[float]:
        raise NotImplementedError

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        out, drop = batch, None
        for column, name in zip(self.columns, self.output, strict=True):
            source = batch.column(column)
            x = float_values(self, source, column, where)
            null = source.is_null().to_numpy(zero_copy_only=False)
            splits = np.asarray(self._splits(column))
            n = len(splits) - 1
            ids = np.searchsorted(splits, x, side="right") - 1
            ids[x == splits[-1]] = n - 1
            with np.errstate(invalid="ignore"):
                invalid = ~null & (np.isnan(x) | (x < splits[0]) | (x > splits[-1]))
            if invalid.any():
                if self.handle_invalid == "error":
                    value = float(x[np.argmax(invalid)])
                    raise DataError(
                        f"{type(self).__name__}: column {column!r} in {where} has the value "
                        f"{value!r}, outside the splits [{splits[0]}, {splits[-1]}] (or NaN). "
                        "Fix: add -inf/inf splits, or pass handle_invalid='keep' or 'skip'."
                    )
                ids[invalid] = n
                if self.handle_invalid == "skip":
                    drop = invalid if drop is None else drop | invalid
            out = put_column(out, name, pa.array(ids.astype(np.int64), mask=null))
        if drop is not None and drop.any():
            out = out.filter(pa.array(~drop))
            if report is not None:
                report.add(records_skipped=int(drop.sum()))
        return out


@register
class Bucketizer(_Discretizer):
    """Map numbers to bucket ids with given ``splits`` (stateless).

    Parameters
    ----------
    columns:
        Numeric column(s).
    splits:
        Strictly increasing bucket edges, shared by all columns, or a dict
        ``{column: splits}``. Use ``float("inf")`` / ``-inf`` to catch everything.
    output:
        Output name(s); by default the inputs are replaced.
    handle_invalid:
        ``"error"``, ``"keep"`` or ``"skip"`` (see the module docs).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.preprocess.discretize import Bucketizer
    >>> b = Bucketizer("x", splits=[float("-inf"), 0, 10, float("inf")])
    >>> b.transform_batch(pa.record_batch({"x": [-5.0, 0.0, 9.9, 10.0, None]}))["x"].to_pylist()
    [0, 1, 1, 2, None]
    >>> b.state["params"]["splits"]
    ['-inf', 0.0, 10.0, 'inf']
    """

    needs_fit = False

    def __init__(
        self,
        columns: str | Sequence[str],
        splits: Sequence[float | str] | Mapping[str, Sequence[float | str]],
        output: str | Sequence[str] | None = None,
        handle_invalid: str = "error",
    ) -> None:
        super().__init__(columns, output)
        if isinstance(splits, Mapping):
            missing = [c for c in self.columns if c not in splits]
            if missing:
                raise ConfigurationError(
                    f"Bucketizer: no splits for column(s) {missing}. Fix: add them to the "
                    "splits dict, or pass one list of splits for every column."
                )
            self.splits = {c: _check_splits(splits[c], "Bucketizer") for c in self.columns}
            self._shared = False
        else:
            shared = _check_splits(splits, "Bucketizer")
            self.splits = {c: shared for c in self.columns}
            self._shared = True
        if handle_invalid not in _INVALID:
            raise ConfigurationError(
                f"Bucketizer(handle_invalid={handle_invalid!r}). Fix: use one of {list(_INVALID)}."
            )
        self.handle_invalid = handle_invalid

    def params(self) -> dict[str, Any]:
        if self._shared:
            splits: Any = _encode(self.splits[self.columns[0]])
        else:
            splits = {c: _encode(v) for c, v in self.splits.items()}
        return super().params() | {"splits": splits, "handle_invalid": self.handle_invalid}

    def _splits(self, column: str) -> list[float]:
        return self.splits[column]


@register
class QuantileDiscretizer(_Discretizer):
    """Bucket numbers into ``num_buckets`` buckets of about equal counts (fitted splits).

    The inner splits are the ``i / num_buckets`` quantiles (numpy's linear interpolation)
    from the mergeable quantile sketch: exact up to 100,000 fitted values per column,
    within the sketch's stated rank error beyond. Repeated quantiles are merged, so a
    column may get fewer buckets; the outer splits are ``-inf`` and ``inf`` (Spark's
    ``QuantileDiscretizer``). Only NaN is invalid.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.discretize import QuantileDiscretizer
    >>> ds = fl.from_arrow(pa.table({"x": [float(i) for i in range(1, 9)]}))
    >>> qd = QuantileDiscretizer("x", num_buckets=4).fit(ds)
    >>> qd.fitted["splits"]
    {'x': [2.75, 4.5, 6.25]}
    >>> ds.transform(qd).to_arrow()["x"].to_pylist()
    [0, 0, 1, 1, 2, 2, 3, 3]
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        num_buckets: int,
        output: str | Sequence[str] | None = None,
        handle_invalid: str = "error",
    ) -> None:
        super().__init__(columns, output)
        if not isinstance(num_buckets, int) or num_buckets < 2:
            raise ConfigurationError(
                f"QuantileDiscretizer(num_buckets={num_buckets!r}) must be an int >= 2. "
                "Fix: e.g. num_buckets=10."
            )
        if handle_invalid not in _INVALID:
            raise ConfigurationError(
                f"QuantileDiscretizer(handle_invalid={handle_invalid!r}). Fix: use one of "
                f"{list(_INVALID)}."
            )
        self.num_buckets = num_buckets
        self.handle_invalid = handle_invalid

    def params(self) -> dict[str, Any]:
        return super().params() | {
            "num_buckets": self.num_buckets,
            "handle_invalid": self.handle_invalid,
        }

    def fitted_spec(self) -> dict[str, str]:
        return {"splits": "splits", "rank_error": "nonnegative"}

    def partial(self, batch: pa.RecordBatch) -> dict[str, Any]:
        return sketch_partial(self, batch)

    def finish(self, partial: dict[str, Any]) -> dict[str, Any]:
        fitted: dict[str, dict[str, Any]] = {"splits": {}, "rank_error": {}}
        for c in self.columns:
            rows, sketch = partial[c]
            if not sketch.count:
                raise no_values_error(self, c, rows)
            inner = sketch.quantile(np.arange(1, self.num_buckets) / self.num_buckets)
            fitted["splits"][c] = _encode(np.unique(inner).tolist())
            fitted["rank_error"][c] = sketch.relative_error
        return fitted

    def _splits(self, column: str) -> list[float]:
        assert self.fitted is not None
        return [-math.inf, *_decode(self.fitted["splits"][column]), math.inf]

    @property
    def num_buckets_fitted(self) -> dict[str, int]:
        """Per column: the number of buckets after merging repeated quantiles."""
        assert self.fitted is not None, "fit first"
        return {c: len(s) + 1 for c, s in self.fitted["splits"].items()}
