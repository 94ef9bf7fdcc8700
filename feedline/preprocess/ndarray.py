"""Decode a binary column of NumPy ``.npy`` (or ``.npz``) bytes into tensors, in ``transform``.

Data written with ``np.save`` per value (Petastorm's ``NdarrayCodec``, a ``mapInPandas`` job
that stores ``arr.tobytes()`` with its header) decodes here without ``map_batches``: the
``.npy`` header is parsed once per batch and, when every value shares it, all payloads are
sliced out of the column's buffer at once (:mod:`feedline.io.npy`, shared with
``fl.read_petastorm``). Nothing is ever unpickled (object arrays are refused).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.npy import decode_npy, decode_npz
from feedline.io.npy_arrow import cells_to_arrow
from feedline.preprocess.preprocessor import Preprocessor, register

__all__ = ["DecodeNdarray"]


@register
class DecodeNdarray(Preprocessor):
    """Decode ``.npy`` bytes into a tensor column (fixed shape) or nested lists (``None`` dims).

    Parameters
    ----------
    column:
        A binary column, one ``np.save`` output per row (nulls stay null).
    shape:
        The shape of every value; ``None`` in a dimension lets it vary (the column then holds
        nested lists, one level per dimension). ``None`` (default): the first value's shape in
        each batch, required of the others; pass it to fix the column's type up front.
    dtype:
        The dtype of the output (values are cast with NumPy's ``same_kind`` rule); ``None``:
        as stored.
    format:
        ``"npy"`` (``np.save``) or ``"npz"`` (``np.savez_compressed``; the member ``arr``, as
        Petastorm's ``CompressedNdarrayCodec`` writes, else the first one).
    on_error:
        For values that do not decode or do not fit ``shape``/``dtype``: ``"raise"`` raises
        :class:`~feedline.errors.DataError` naming the row; ``"skip"`` drops the row and
        records it in the execution report.
    output:
        The output column; by default the decoded values replace ``column``.

    Examples
    --------
    >>> import io, numpy as np, pyarrow as pa
    >>> def npy(a):
    ...     buf = io.BytesIO(); np.save(buf, a); return buf.getvalue()
    >>> batch = pa.record_batch({"x": [npy(np.eye(2)), npy(np.ones((2, 2)))]})
    >>> out = DecodeNdarray("x", dtype="float32").transform_batch(batch)
    >>> out.schema.field("x").type
    FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=float, shape=[2,2]]>)
    >>> DecodeNdarray("x", shape=(None, 2)).transform_batch(batch).column("x").type
    ListType(list<item: list<item: double>>)
    """

    needs_fit: ClassVar[bool] = False

    def __init__(
        self,
        column: str,
        shape: Sequence[int | None] | None = None,
        dtype: str | None = None,
        *,
        format: str = "npy",  # noqa: A002
        on_error: str = "raise",
        output: str | None = None,
    ) -> None:
        super().__init__(column, output)
        if len(self.columns) != 1 or len(self.output) != 1:
            raise ConfigurationError(
                "DecodeNdarray takes one column. Fix: one DecodeNdarray per binary column."
            )
        if format not in ("npy", "npz") or on_error not in ("raise", "skip"):
            raise ConfigurationError(
                f"DecodeNdarray got format={format!r}, on_error={on_error!r}. Fix: format is "
                "'npy' or 'npz', on_error is 'raise' or 'skip'."
            )
        self.shape = _shape(shape)
        self.dtype = None if dtype is None else _dtype(dtype)
        self.format, self.on_error = format, on_error

    def params(self) -> dict[str, Any]:
        return {
            "column": self.columns[0],
            "shape": None if self.shape is None else list(self.shape),
            "dtype": None if self.dtype is None else self.dtype.name,
            "format": self.format,
            "on_error": self.on_error,
            "output": None if self.output == self.columns else self.output[0],
        }

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        name = self.columns[0]
        column = batch.column(name)
        if not any(
            check(column.type)
            for check in (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
        ):
            raise SchemaError(
                f"DecodeNdarray needs a binary column of .npy bytes; {name!r} in {where} is "
                f"{column.type}. Fix: pass the column holding np.save output (list columns "
                "need no decoding)."
            )
        cells = (decode_npy if self.format == "npy" else decode_npz)(column)
        array, failed = cells_to_arrow(cells, self.shape, self.dtype)
        if failed:
            rows = sorted(failed)
            if self.on_error == "raise":
                more = f" ({len(rows) - 1} more in the batch)" if len(rows) > 1 else ""
                raise DataError(
                    f"DecodeNdarray cannot decode row {rows[0]} of {where}, column {name!r}: "
                    f"{failed[rows[0]]}{more}. Fix: pass shape= with None for the dimensions "
                    "that vary, or on_error='skip' to drop such rows (they are counted in the "
                    "execution report)."
                )
            for row in rows:
                if report is not None:
                    report.record_skip(f"{where} row {row} column {name!r}", failed[row])
            if report is None:  # called outside an engine: still never silent
                warnings.warn(
                    f"DecodeNdarray skipped {len(rows)} row(s) of {where}, e.g. row "
                    f"{rows[0]}: {failed[rows[0]]}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            keep = pa.array(np.setdiff1d(np.arange(batch.num_rows), np.asarray(rows)))
            batch, array = batch.take(keep), array.take(keep)
        target = self.output[0]
        index, field = batch.schema.get_field_index(target), pa.field(target, array.type)
        if index >= 0:
            return batch.set_column(index, field, array)
        return batch.append_column(field, array)


def _shape(shape: Sequence[int | None] | None) -> tuple[int | None, ...] | None:
    if shape is None:
        return None
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(dims) > 32 or not all(
        d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in dims
    ):
        raise ConfigurationError(
            f"shape={shape!r} is not a tuple of sizes. Fix: e.g. shape=(3, 64, 64), or "
            "(None, 3) for a first dimension that varies."
        )
    return dims


def _dtype(dtype: Any) -> np.dtype:
    try:
        value = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"dtype={dtype!r} is not a NumPy dtype. Fix: e.g. dtype='float32'."
        ) from exc
    if value.kind not in "biuf":
        raise ConfigurationError(
            f"dtype={dtype!r} is not a number or bool type. Fix: e.g. dtype='float32', or "
            "None to keep the stored dtype."
        )
    return value
