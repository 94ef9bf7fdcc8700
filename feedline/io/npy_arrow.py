"""Decoded NumPy values (:class:`feedline.io.npy.Cells`) as one Arrow column.

A ``fixed_shape_tensor`` when the shape is fixed and the values are numbers, otherwise
nested lists (one level per dimension; ``list<list<float>>`` for a ``(None, 3)`` shape).
Values whose dtype or shape do not fit are reported per row, so the caller can raise or
skip them (``on_error``); the decoding itself lives in :mod:`feedline.io.npy`.

Examples
--------
>>> import numpy as np
>>> from feedline.io.npy import Cells
>>> cells = Cells(2, np.array([True, True]), stacked=np.ones((2, 3), np.float32))
>>> array, bad = cells_to_arrow(cells, (None,), np.dtype(np.float32))
>>> array.type, array.to_pylist()[0], bad
(ListType(list<item: float>), [1.0, 1.0, 1.0], {})
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from feedline.errors import DataError, SchemaError

if TYPE_CHECKING:
    from feedline.io.npy import Cells

__all__ = ["MAX_TENSOR_VALUES", "Shape", "arrow_type_for", "cells_to_arrow"]

#: the most values one fixed-shape tensor may hold: Arrow's largest fixed-size list
MAX_TENSOR_VALUES = 2**31 - 1

#: what values must look like: one entry a dimension, ``None`` where it varies
Shape = tuple[int | None, ...]


def arrow_type_for(dtype: np.dtype, shape: Shape) -> pa.DataType:
    """The Arrow type of values of ``dtype`` and ``shape`` (``None``: a variable dimension).

    Examples
    --------
    >>> arrow_type_for(np.dtype(np.float32), (2, 3))
    FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=float, shape=[2,3]]>)
    >>> arrow_type_for(np.dtype(np.int64), (None, 3))
    ListType(list<item: list<item: int64>>)
    >>> arrow_type_for(np.dtype(np.uint8), ())
    DataType(uint8)
    """
    value = _value_type(dtype)
    if not shape:
        return value
    size = math.prod(d or 0 for d in shape) if None not in shape else 0
    if size > 0 and dtype.kind in "iuf":
        if size > MAX_TENSOR_VALUES:
            raise SchemaError(
                f"The shape {_show(shape)} holds {size:,} values, more than an Arrow "
                f"fixed-shape tensor can ({MAX_TENSOR_VALUES:,}). Fix: check the shape (a "
                "schema's or shape=); use None for a dimension that varies."
            )
        return pa.fixed_shape_tensor(value, [d or 0 for d in shape])
    kind = value
    for _ in shape:
        kind = pa.list_(kind)
    return kind


def _value_type(dtype: np.dtype) -> pa.DataType:
    if dtype.kind == "U":
        return pa.string()
    if dtype.kind == "S":
        return pa.binary()
    return pa.from_numpy_dtype(dtype)


def _fits(array: np.ndarray, shape: Shape | None) -> bool:
    if shape is None:
        return True
    if array.ndim != len(shape):
        return False
    return all(w is None or w == d for w, d in zip(shape, array.shape, strict=True))


def cells_to_arrow(
    cells: Cells, shape: Shape | None, dtype: np.dtype | None
) -> tuple[pa.Array, dict[int, str]]:
    """``cells`` as an Arrow column, plus the rows that failed (decoding, dtype or shape).

    ``shape`` (``None`` dimensions vary) and ``dtype`` are what the values must be; ``None``
    for either: the first decoded value's. Values of another dtype are cast when NumPy's
    ``same_kind`` casting allows it. Null and failed rows are null in the result.
    """
    failed = dict(cells.failed)
    present = cells.present.copy()
    stacked = cells.stacked
    arrays = [] if stacked is not None else list(cells.arrays or [])
    sample = (
        (stacked[0] if len(stacked) else None)
        if stacked is not None
        else (arrays[0] if arrays else None)
    )
    if dtype is None:
        dtype = sample.dtype if sample is not None else np.dtype(np.float64)
    if shape is None:
        shape = tuple(sample.shape) if sample is not None else ()
    kind = arrow_type_for(dtype, shape)
    block = None
    if stacked is not None and sample is not None and _fits(sample, shape):
        block = _cast(stacked, dtype)  # one dtype and shape for all: checked once
    if block is None:  # value by value
        rows = np.flatnonzero(present).tolist()
        arrays = arrays if stacked is None else list(stacked)
        kept: list[np.ndarray] = []
        for row, array in zip(rows, arrays, strict=True):
            cast = _cast(array, dtype)
            if cast is not None and _fits(array, shape):
                kept.append(cast)
                continue
            failed[row] = (
                f"its dtype {array.dtype} cannot be cast to {dtype}"
                if cast is None
                else f"its shape {array.shape} does not fit {_show(shape)}"
            )
            present[row] = False
        arrays = kept
    if isinstance(kind, pa.FixedShapeTensorType):
        if block is None:
            # a fixed-shape tensor type: no None in shape (mypy cannot see it)
            block = np.stack(arrays) if arrays else np.empty((0, *shape), dtype)  # type: ignore[arg-type]
        return _tensor(block, present, kind, dtype), failed
    return _nested(
        list(block) if block is not None else arrays, present, len(shape), kind, dtype
    ), failed


def _show(shape: Shape) -> str:
    return (
        "("
        + ", ".join("None" if d is None else str(d) for d in shape)
        + (",)" if len(shape) == 1 else ")")
    )


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    if array.dtype == dtype:
        return array
    if dtype.kind in "US" and array.dtype.kind in "US":
        return array
    if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        return None
    return array.astype(dtype)


def _tensor(
    block: np.ndarray, present: np.ndarray, kind: pa.FixedShapeTensorType, dtype: np.dtype
) -> pa.Array:
    n = len(present)
    complete = bool(present.all())
    if complete:
        full = block
    else:
        full = np.zeros((n, *block.shape[1:]), dtype)
        full[present] = block
    width = math.prod(kind.shape)
    flat = pa.array(np.ascontiguousarray(full).reshape(-1))
    mask = None if complete else pa.array(~present)
    storage = pa.FixedSizeListArray.from_arrays(flat, width, mask=mask)
    return pa.ExtensionArray.from_storage(kind, storage)


def _nested(
    arrays: list[np.ndarray], present: np.ndarray, depth: int, kind: pa.DataType, dtype: np.dtype
) -> pa.Array:
    """Nested lists (``depth`` levels) from one array per present row; others are null."""
    n = len(present)
    if depth == 0:
        out = np.zeros(n, dtype) if dtype.kind not in "US" else np.array([""] * n, dtype)
        if arrays:
            out[present] = np.array([a[()] for a in arrays], dtype)
        return pa.array(out, kind, mask=~present)
    shapes = np.zeros((n, depth), np.int64)
    if arrays:
        shapes[present] = np.array([a.shape for a in arrays], np.int64).reshape(-1, depth)
    flat = (
        np.concatenate([np.ascontiguousarray(a).reshape(-1) for a in arrays])
        if arrays
        else np.empty(0, dtype)
    )
    values: pa.Array = pa.array(flat, _innermost(kind))
    for level in range(depth - 1, 0, -1):
        counts = np.prod(shapes[:, :level], axis=1)
        lengths = np.repeat(shapes[:, level], counts)
        values = pa.ListArray.from_arrays(_offsets(lengths), values)
    outer = pa.ListArray.from_arrays(
        _offsets(shapes[:, 0]), values, mask=None if present.all() else pa.array(~present)
    )
    return outer.cast(kind) if outer.type != kind else outer


def _innermost(kind: pa.DataType) -> pa.DataType:
    while pa.types.is_list(kind):
        kind = kind.value_type
    return kind


def _offsets(lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise DataError(
            f"One batch of variable-shape arrays holds {offsets[-1]:,} values, more than a list "
            "column can (2**31). Fix: read smaller batches (fewer rows per row group)."
        )
    return pa.array(offsets.astype(np.int32))
