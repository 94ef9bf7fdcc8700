"""Categorical encoders: ``StringIndexer`` and ``OneHotEncoder``.

Categories are strings: non-string columns are cast to strings first (as Spark's
``StringIndexer`` does; ``5`` becomes ``"5"``). Matching is exact and case-sensitive:
normalize case or whitespace before encoding if you need it (e.g. ``map_batches`` with
``pc.utf8_lower``). Nulls are never a category; they follow the ``handle_unknown`` policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError
from feedline.preprocess.preprocessor import Preprocessor, register
from feedline.preprocess.scalers import (
    ColumnwisePreprocessor,
    put_column,
    tensor_array,
)

__all__ = ["OneHotEncoder", "StringIndexer"]


# ---------------------------------------------------------------------- helpers


def as_strings(array: Any) -> pa.Array:
    """``array`` as ``string`` (or ``large_string``) values; nulls and NaN become null."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = pc.cast(array, array.type.value_type)
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array
    if pa.types.is_floating(array.type):  # NaN is missing, not the category "nan"
        array = pc.if_else(pc.is_nan(array), pa.scalar(None, array.type), array)
    return pc.cast(array, pa.string())


def value_counts(array: pa.Array) -> pa.Table:
    """Table ``(value, count)`` of the non-null values (merge with :func:`merge_counts`)."""
    vc = pc.value_counts(array.drop_null())
    return pa.table({"value": vc.field("values"), "count": vc.field("counts")})


def merge_counts(a: pa.Table, b: pa.Table) -> pa.Table:
    """Add two count tables (exact, order-independent)."""
    both = pa.concat_tables([a, b], promote_options="permissive")
    summed = both.group_by("value").aggregate([("count", "sum")])
    return summed.rename_columns(["value", "count"])


def top_values(counts: pa.Table, limit: int | None = None) -> list[Any]:
    """Values by decreasing count, ties in ascending value order."""
    ranked = counts.sort_by([("count", "descending"), ("value", "ascending")])
    values = ranked.column("value").to_pylist()
    return values if limit is None else values[:limit]


def _choice(owner: str, name: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ConfigurationError(
            f"{owner}({name}={value!r}) is not supported. Fix: use one of {list(allowed)}."
        )
    return value


def _unknown_error(
    owner: Preprocessor, column: str, values: pa.Array, mask: pa.Array, known: int, where: str
) -> DataError:
    first = pc.filter(values, mask)[0].as_py()
    what = "a null value" if first is None else f"the value {first!r}"
    return DataError(
        f"{type(owner).__name__}: column {column!r} in {where} has {what}, which was not seen "
        f"when fitting ({known} known categories). Fix: pass handle_unknown='keep'/'ignore' or "
        "'skip', refit on data that includes it, or clean the column first."
    )


class _CategoryEncoder(ColumnwisePreprocessor):
    """Fits per-column category counts; caches the fitted label arrays."""

    def partial(self, batch: pa.RecordBatch) -> dict[str, Any]:
        return {c: value_counts(as_strings(batch.column(c))) for c in self.columns}

    def _merge_one(self, a: pa.Table, b: pa.Table) -> pa.Table:
        return merge_counts(a, b)

    def _check_nonempty(self, column: str, labels: list[Any]) -> None:
        if not labels:
            raise DataError(
                f"{type(self).__name__} cannot be fitted on column {column!r}: it has no "
                "non-null values in the fitted data. Fix: drop or fill the column first."
            )

    def _label_arrays(self, key: str) -> dict[str, pa.Array]:
        if getattr(self, "_arrays_of", None) is not self.fitted:
            assert self.fitted is not None
            self._arrays = {c: pa.array(v, pa.string()) for c, v in self.fitted[key].items()}
            self._arrays_of = self.fitted
        return self._arrays


# ---------------------------------------------------------------------- encoders


@register
class StringIndexer(_CategoryEncoder):
    """Map categories to integer ids ``0 .. len(labels) - 1`` (``int64``).

    Parameters
    ----------
    columns:
        Categorical column(s); non-strings are cast to strings.
    output:
        Output name(s); by default the inputs are replaced.
    order:
        ``"frequency"``: most frequent first, ties alphabetical (Spark's ``frequencyDesc``);
        ``"alphabetical"``: sorted (scikit-learn's ``OrdinalEncoder``).
    handle_unknown:
        For values not seen when fitting, and for nulls: ``"error"`` raises a
        :class:`~feedline.errors.DataError` naming the value and column; ``"keep"`` maps
        them to ``len(labels)``; ``"skip"`` drops the row.
    max_categories:
        Keep only the most frequent ones (ties alphabetical); the rest are unknown.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.encoders import StringIndexer
    >>> ds = fl.from_arrow(pa.table({"c": ["b", "a", "b", "c", "a", "b"]}))
    >>> si = StringIndexer("c").fit(ds)
    >>> si.labels("c")
    ['b', 'a', 'c']
    >>> si.transform_batch(pa.record_batch({"c": ["a", "c"]}))["c"].to_pylist()
    [1, 2]
    >>> si.inverse_transform_batch(pa.record_batch({"c": [2, 0]}))["c"].to_pylist()
    ['c', 'b']
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        output: str | Sequence[str] | None = None,
        order: str = "frequency",
        handle_unknown: str = "error",
        max_categories: int | None = None,
    ) -> None:
        super().__init__(columns, output)
        self.order = _choice("StringIndexer", "order", order, ("frequency", "alphabetical"))
        self.handle_unknown = _choice(
            "StringIndexer", "handle_unknown", handle_unknown, ("error", "keep", "skip")
        )
        if max_categories is not None and max_categories < 1:
            raise ConfigurationError(
                f"StringIndexer(max_categories={max_categories}) must be >= 1 or None. "
                "Fix: pass a positive count, or None to keep every category."
            )
        self.max_categories = max_categories

    @property
    def drops_rows(self) -> bool:
        """True when ``transform`` may drop rows (``handle_unknown="skip"``)."""
        return self.handle_unknown == "skip"

    def params(self) -> dict[str, Any]:
        return super().params() | {
            "order": self.order,
            "handle_unknown": self.handle_unknown,
            "max_categories": self.max_categories,
        }

    def fitted_spec(self) -> dict[str, str]:
        return {"labels": "labels"}

    def finish(self, partial: dict[str, Any]) -> dict[str, Any]:
        labels = {}
        for c in self.columns:
            values = top_values(partial[c], self.max_categories)
            self._check_nonempty(c, values)
            labels[c] = sorted(values) if self.order == "alphabetical" else values
        return {"labels": labels}

    def labels(self, column: str) -> list[str]:
        """The fitted labels of ``column``: label ``i`` has id ``i``."""
        if self.fitted is None or column not in self.fitted["labels"]:
            raise ConfigurationError(
                f"{self!r} has no labels for {column!r}. Fix: fit it, and use one of "
                f"{list(self.columns)}."
            )
        return list(self.fitted["labels"][column])

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        arrays = self._label_arrays("labels")
        out, drop = batch, None
        for column, name in zip(self.columns, self.output, strict=True):
            values = as_strings(batch.column(column))
            ids = pc.index_in(values, value_set=arrays[column])
            unknown = pc.is_null(ids)
            n_unknown = pc.sum(unknown).as_py() or 0
            if n_unknown and self.handle_unknown == "error":
                raise _unknown_error(self, column, values, unknown, len(arrays[column]), where)
            if n_unknown and self.handle_unknown == "skip":
                drop = unknown if drop is None else pc.or_(drop, unknown)
            ids = pc.fill_null(ids, len(arrays[column]))
            out = put_column(out, name, pc.cast(ids, pa.int64()))
        if drop is not None:
            out = out.filter(pc.invert(drop))
            if report is not None:
                report.add(records_skipped=batch.num_rows - out.num_rows)
        return out

    def inverse_transform_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Map ids in the output column(s) back to labels in the input column(s).

        Ids outside ``0 .. len(labels) - 1`` (unknown, ``"keep"``) become null.
        """
        if self.fitted is None:
            raise ConfigurationError(f"{self!r} is not fitted. Fix: call .fit(ds) first.")
        arrays = self._label_arrays("labels")
        out = batch
        for column, name in zip(self.columns, self.output, strict=True):
            labels = arrays[column]
            ids = pc.cast(batch.column(name), pa.int64())
            ok = pc.and_(pc.greater_equal(ids, 0), pc.less(ids, len(labels)))
            safe = pc.if_else(ok, ids, len(labels))
            decoded = pc.take(pa.concat_arrays([labels, pa.nulls(1, pa.string())]), safe)
            if name != column:
                out = out.drop_columns([name])
            out = put_column(out, column, decoded)
        return out


@register
class OneHotEncoder(_CategoryEncoder):
    """One fixed-shape ``float32`` tensor column of shape ``(n_categories,)`` per input.

    Categories are sorted (as scikit-learn's). Unknown values and nulls give all zeros
    with ``handle_unknown="ignore"``, or a :class:`~feedline.errors.DataError` naming the
    value and column with ``"error"``. ``drop="first"`` drops each column's first
    category, ``"if_binary"`` only for two-category columns (as scikit-learn).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.encoders import OneHotEncoder
    >>> ds = fl.from_arrow(pa.table({"c": ["b", "a", "c"]}))
    >>> oh = OneHotEncoder("c").fit(ds)
    >>> oh.fitted["categories"]
    {'c': ['a', 'b', 'c']}
    >>> oh.transform_batch(pa.record_batch({"c": ["c", "zzz"]}))["c"].to_numpy_ndarray()
    array([[0., 0., 1.],
           [0., 0., 0.]], dtype=float32)
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        output: str | Sequence[str] | None = None,
        handle_unknown: str = "ignore",
        drop: str | None = None,
    ) -> None:
        super().__init__(columns, output)
        self.handle_unknown = _choice(
            "OneHotEncoder", "handle_unknown", handle_unknown, ("ignore", "error")
        )
        if drop not in (None, "first", "if_binary"):
            raise ConfigurationError(
                f"OneHotEncoder(drop={drop!r}) is not supported. Fix: use None, 'first' or "
                "'if_binary'."
            )
        self.drop = drop

    def params(self) -> dict[str, Any]:
        return super().params() | {"handle_unknown": self.handle_unknown, "drop": self.drop}

    def fitted_spec(self) -> dict[str, str]:
        return {"categories": "labels", "drop": "drop"}

    def finish(self, partial: dict[str, Any]) -> dict[str, Any]:
        categories, dropped = {}, {}
        for c in self.columns:
            values = sorted(partial[c].column("value").to_pylist())
            self._check_nonempty(c, values)
            categories[c] = values
            binary = self.drop == "if_binary" and len(values) == 2
            dropped[c] = 0 if self.drop == "first" or binary else None
        return {"categories": categories, "drop": dropped}

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        assert self.fitted is not None
        arrays = self._label_arrays("categories")
        out = batch
        for column, name in zip(self.columns, self.output, strict=True):
            values = as_strings(batch.column(column))
            ids = pc.index_in(values, value_set=arrays[column])
            unknown = pc.is_null(ids)
            if self.handle_unknown == "error" and pc.any(unknown).as_py():
                raise _unknown_error(self, column, values, unknown, len(arrays[column]), where)
            idx = pc.fill_null(ids, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            width = len(arrays[column])
            drop = self.fitted["drop"][column]
            if drop is not None:
                idx = np.where(idx == drop, -1, np.where(idx > drop, idx - 1, idx))
                width -= 1
            matrix = np.zeros((len(idx), width), dtype=np.float32)
            rows = np.flatnonzero(idx >= 0)
            matrix[rows, idx[rows]] = 1.0
            out = put_column(out, name, tensor_array(matrix))
        return out
