"""List columns as tensors: ``list`` / ``large_list`` / ``fixed_size_list`` rows of one length.

Spark's ``ArrayType`` and pyarrow's default for NumPy arrays write tensors as Parquet lists:
one ``list<uint8>`` (or ``list<list<float>>``) value per row. When every row has the same
length such a column is a tensor column in disguise. This module turns one Arrow chunk of it
into an ``(rows, *shape)`` NumPy array without a Python loop over rows:

- the list offsets (computed for ``fixed_size_list``) are checked with NumPy to be an
  arithmetic progression whose step is the expected length, level by level;
- the flattened values between the first and the last offset are then the tensor's elements
  in row-major order: a zero-copy view of the values buffer, reshaped (the array's slice
  offset and the child's own offset are honoured).

A row of another length (or a null row) raises :class:`~feedline.errors.DataError` naming the
column, the row, its length and the expected one, unless ``ragged`` asks to pad or cut rows to
the shape (then a gather places each row's elements: slower, but still vectorized).

``ragged`` policies (one word each, so that nothing is lost silently by default):

=====================  =========================================================
``"raise"`` (default)  any row of another length, or a null row, is an error
``"pad"``              short and null rows are filled with ``pad_value``; a row
                       longer than the shape is still an error (no data dropped)
``"truncate"``         long rows are cut to the shape; a short or null row is an error
``"pad_or_truncate"``  both: every row is made to fit (like a tokenizer's
                       ``max_length`` with padding)
=====================  =========================================================

Examples
--------
>>> import pyarrow as pa
>>> images = pa.array([list(range(6)), list(range(6, 12))], pa.list_(pa.uint8()))
>>> list_to_numpy(images, (2, 3)).tolist()
[[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]
>>> ragged = pa.array([[1, 2, 3], [4], None], pa.list_(pa.int32()))
>>> list_to_numpy(ragged, (2,), ragged="pad_or_truncate", pad_value=-1).tolist()
[[1, 2], [4, -1], [-1, -1]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, DataError

__all__ = [
    "RAGGED",
    "check_ragged",
    "infer_list_shape",
    "is_list_tensor_type",
    "level_sizes",
    "list_levels",
    "list_to_numpy",
    "needs_shape",
    "schema_shape",
]

#: the ``ragged=`` policies (see the module docstring)
RAGGED = ("raise", "pad", "truncate", "pad_or_truncate")

#: maps a position at some nesting level to the (global) row it belongs to
RowOf = Callable[[int], int]


def _is_list(kind: pa.DataType) -> bool:
    t = pa.types
    return t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind)


def list_levels(kind: pa.DataType) -> tuple[list[pa.DataType], pa.DataType] | None:
    """The list types of a nested list type from the outside in, and its leaf value type.

    ``None`` unless ``kind`` is a (nested) list of booleans, integers or floats.

    Examples
    --------
    >>> levels, leaf = list_levels(pa.list_(pa.large_list(pa.float32())))
    >>> len(levels), leaf
    (2, DataType(float))
    >>> list_levels(pa.list_(pa.string())) is None
    True
    """
    levels = []
    while _is_list(kind):
        levels.append(kind)
        kind = kind.value_type
    t = pa.types
    numeric = t.is_boolean(kind) or t.is_integer(kind) or t.is_floating(kind)
    return (levels, kind) if levels and numeric else None


def is_list_tensor_type(kind: pa.DataType) -> bool:
    """True for list types this module decodes: numeric leaves under list levels.

    Examples
    --------
    >>> is_list_tensor_type(pa.list_(pa.uint8())), is_list_tensor_type(pa.uint8())
    (True, False)
    """
    return list_levels(kind) is not None


def needs_shape(kind: pa.DataType) -> bool:
    """True when the schema alone does not give the shape (a variable-length level).

    Examples
    --------
    >>> needs_shape(pa.list_(pa.list_(pa.int8(), 3), 2)), needs_shape(pa.list_(pa.int8()))
    (False, True)
    """
    levels = list_levels(kind)
    return levels is not None and not all(pa.types.is_fixed_size_list(k) for k in levels[0])


def schema_shape(kind: pa.DataType) -> tuple[int, ...]:
    """The shape of a list type whose levels are all fixed-size.

    Examples
    --------
    >>> schema_shape(pa.list_(pa.list_(pa.int8(), 3), 2))
    (2, 3)
    """
    levels, _ = list_levels(kind)  # type: ignore[misc]
    return tuple(int(k.list_size) for k in levels)


def level_sizes(kind: pa.DataType, shape: Sequence[int]) -> tuple[int, ...]:
    """The length each list level of ``kind`` must have for tensors of ``shape``.

    The outer levels take the leading dimensions one each; the innermost list holds the
    remaining dimensions flattened (``list<uint8>`` rows of ``3*64*64`` values make
    ``shape=(3, 64, 64)``).

    Raises
    ------
    ValueError
        When ``shape`` has fewer dimensions than ``kind`` has levels, or a negative one.

    Examples
    --------
    >>> level_sizes(pa.list_(pa.uint8()), (3, 64, 64))
    (12288,)
    >>> level_sizes(pa.list_(pa.list_(pa.float32())), (4, 2, 5))
    (4, 10)
    """
    levels, _ = list_levels(kind)  # type: ignore[misc]
    shape = tuple(int(d) for d in shape)
    if len(shape) < len(levels) or min(shape, default=0) < 0:
        raise ValueError(
            f"shape {shape} does not fit {kind}: it needs at least {len(levels)} non-negative "
            "dimension(s), one per list level"
        )
    inner = int(np.prod(shape[len(levels) - 1 :], dtype=np.int64))
    return (*shape[: len(levels) - 1], inner)


def check_ragged(value: str, name: str = "ragged") -> str:
    """``value`` if it is one of :data:`RAGGED`, else :class:`ConfigurationError`.

    Examples
    --------
    >>> check_ragged("pad")
    'pad'
    """
    if value not in RAGGED:
        raise ConfigurationError(
            f"{name}={value!r} is not one of {RAGGED}. Fix: pass 'raise' to refuse rows of "
            "another length, 'pad' / 'truncate' / 'pad_or_truncate' to fit them to the shape."
        )
    return value


def infer_list_shape(chunk: pa.Array) -> tuple[int, ...] | None:
    """The shape of the first non-null row of a list chunk (one length per level), or
    ``None`` when it holds no such row.

    Examples
    --------
    >>> kind = pa.list_(pa.list_(pa.float64()))
    >>> infer_list_shape(pa.array([None, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], kind))
    (3, 2)
    """
    if isinstance(chunk, pa.ChunkedArray):
        for piece in chunk.chunks:
            found = infer_list_shape(piece)
            if found is not None:
                return found
        return None
    valid = np.flatnonzero(np.asarray(chunk.is_valid())) if chunk.null_count else [0]
    if not len(chunk) or not len(valid):
        return None
    row: pa.Array = chunk.slice(int(valid[0]), 1)
    shape = []
    while _is_list(row.type):
        offsets = _offsets(row)
        shape.append(int(offsets[1] - offsets[0]))
        if not shape[-1]:  # an empty list: the inner levels have no first element to look at
            break
        row = row.values.slice(int(offsets[0]), 1)
    levels, _ = list_levels(chunk.type)  # type: ignore[misc]
    return tuple(shape) + (0,) * (len(levels) - len(shape))


def _offsets(arr: pa.Array) -> np.ndarray:
    """``len(arr) + 1`` int64 offsets of ``arr``'s rows into ``arr.values`` (slice honoured)."""
    if pa.types.is_fixed_size_list(arr.type):
        size = int(arr.type.list_size)
        return (np.arange(len(arr) + 1, dtype=np.int64) + arr.offset) * size
    return np.asarray(arr.offsets, dtype=np.int64)


def _first_null(arr: pa.Array) -> int:
    return int(np.flatnonzero(~np.asarray(arr.is_valid()))[0])


class _Where:
    """What an error names: the column, the piece, the shape, the policy."""

    def __init__(self, column: str, where: str, shape: tuple[int, ...], ragged: str) -> None:
        self.column, self.where, self.shape, self.ragged = column, where, shape, ragged

    def fix(self) -> str:
        return (
            f"pass shapes={{{self.column!r}: (...)}} if its tensors have another shape, "
            "ragged='pad' / 'truncate' / 'pad_or_truncate' (with pad_value=) to fit the rows "
            f"to {self.shape}, or make every row that long before writing."
        )

    def wrong_length(self, row: int, level: int, length: int, expected: int) -> DataError:
        part = "a row" if level == 0 else f"a list at nesting level {level} of a row"
        policy = "" if self.ragged == "raise" else f" (ragged={self.ragged!r} does not fit it)"
        return DataError(
            f"Column {self.column!r}: {part} has length {length} at row {row} ({self.where}); "
            f"the tensor shape {self.shape} needs length {expected}{policy}. Fix: {self.fix()}"
        )

    def null(self, row: int, level: int, elements: bool = False) -> DataError:
        what = "a null element" if elements else ("a null row" if level == 0 else "a null list")
        return DataError(
            f"Column {self.column!r} has {what} at row {row} ({self.where}); loader tensors "
            "cannot hold nulls. Fix: fill or filter them before writing"
            + (", or pass ragged='pad' (with pad_value=) to fill null lists." if not elements
               else " (e.g. pc.fill_null).")
        )  # fmt: skip


def list_to_numpy(
    chunk: pa.Array,
    shape: Sequence[int],
    *,
    ragged: str = "raise",
    pad_value: float = 0,
    column: str = "",
    where: str = "",
    row_of: RowOf | None = None,
) -> np.ndarray:
    """One list chunk as an ``(len(chunk), *shape)`` array of its leaf type.

    Zero-copy (a view of the values buffer) when every row has the expected length and no
    row is null. ``row_of(i)`` maps a row of the chunk to the row an error names (default:
    the row inside the chunk); ``column`` and ``where`` are named too.

    Raises
    ------
    DataError
        A row of another length or a null row that ``ragged`` does not cover, or a null
        element.

    Examples
    --------
    >>> chunk = pa.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], pa.large_list(pa.int16()))
    >>> list_to_numpy(chunk.slice(1), (2, 2)).tolist()
    [[[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    >>> list_to_numpy(chunk, (3,), column="v")
    Traceback (most recent call last):
    ...
    feedline.errors.DataError: Column 'v': a row has length 4 at row 0 (); the tensor shape ...
    """
    if isinstance(chunk, pa.ExtensionArray):
        chunk = chunk.storage
    shape = tuple(int(d) for d in shape)
    dims = level_sizes(chunk.type, shape)
    at = _Where(column, where, shape, check_ragged(ragged))
    out = _decode(chunk, dims, at, pad_value, row_of or (lambda i: i))
    return out.reshape((len(chunk), *shape))


def _decode(arr: pa.Array, dims: tuple[int, ...], at: _Where, pad: float, row_of: RowOf,
            level: int = 0) -> np.ndarray:  # fmt: skip
    """``arr`` (a list array at nesting ``level``) as ``(len(arr), *dims)``."""
    if not dims:  # the leaf values
        if arr.null_count:
            raise at.null(row_of(_first_null(arr)), level, elements=True)
        return arr.to_numpy(zero_copy_only=False)
    n, d = len(arr), dims[0]
    offsets = _offsets(arr)
    lengths = np.diff(offsets)
    if not arr.null_count and bool((lengths == d).all()):  # the fast path: one reshape
        child = arr.values.slice(int(offsets[0]), n * d)
        inner = _decode(child, dims[1:], at, pad, lambda p: row_of(p // d) if d else 0, level + 1)
        return inner.reshape((n, d, *dims[1:]))
    return _fit(arr, offsets, lengths, dims, at, pad, row_of, level)


def _fit(arr: pa.Array, offsets: np.ndarray, lengths: np.ndarray, dims: tuple[int, ...],
         at: _Where, pad: float, row_of: RowOf, level: int) -> np.ndarray:  # fmt: skip
    """The rows of ``arr`` padded / cut to ``dims[0]`` as ``ragged`` allows (else the error)."""
    n, d = len(arr), dims[0]
    mode = at.ragged
    allowed_short = mode in ("pad", "pad_or_truncate")
    allowed_long = mode in ("truncate", "pad_or_truncate")
    null = ~np.asarray(arr.is_valid()) if arr.null_count else np.zeros(n, bool)
    lengths = np.where(null, 0, lengths)  # a null row's segment holds nothing of its own
    bad = ((lengths < d) & (not allowed_short)) | ((lengths > d) & (not allowed_long))
    bad |= null & (not allowed_short)
    if bad.any():  # the first problem in row order
        i = int(np.argmax(bad))
        if null[i]:
            raise at.null(row_of(i), level)
        raise at.wrong_length(row_of(i), level, int(lengths[i]), d)
    take = np.minimum(lengths, d)
    total = int(take.sum())
    starts = np.cumsum(take) - take
    within = np.arange(total, dtype=np.int64) - np.repeat(starts, take)
    src = np.repeat(offsets[:-1], take) + within
    dst = np.repeat(np.arange(n, dtype=np.int64) * d, take) + within
    rows = np.repeat(np.arange(n, dtype=np.int64), take)
    _, leaf = list_levels(arr.type) or ([], arr.type.value_type)
    child_rows: RowOf = lambda p: row_of(int(rows[p]))  # noqa: E731
    if len(dims) == 1:
        values = arr.values
        base = int(offsets[0]) if n else 0
        span = values.slice(base, int(offsets[-1]) - base if n else 0)
        if span.null_count:
            nulls = ~np.asarray(span.is_valid())[src - base]
            if nulls.any():
                raise at.null(child_rows(int(np.argmax(nulls))), level + 1, elements=True)
        flat = span.to_numpy(zero_copy_only=False)[src - base]
    else:
        child = arr.values.take(pa.array(src, pa.int64()))
        flat = _decode(child, dims[1:], at, pad, child_rows, level + 1)
    out = np.full((n * d, *dims[1:]), pad, dtype=np.dtype(leaf.to_pandas_dtype()))
    out[dst] = flat
    return out.reshape((n, d, *dims[1:]))
