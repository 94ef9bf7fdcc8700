"""Decoding binary columns of NumPy ``.npy`` / ``.npz`` bytes into tensors or nested lists.

One column's values usually share one ``.npy`` header (same dtype and shape), so the header
is parsed once (with :mod:`numpy.lib.format`, never unpickling: ``allow_pickle=False``) and,
when every value has the same length and the same header bytes, all payloads are sliced out
of the column's data buffer at once and viewed as one ``(rows, *shape)`` array: no per-row
Python. Otherwise (shapes differ, nulls aside) each value is parsed on its own.

The result, :class:`Cells`, then becomes an Arrow column (:func:`cells_to_arrow`): a
``fixed_shape_tensor`` when the shape is fixed and the values are numbers, otherwise nested
lists (one level per dimension; ``list<list<float>>`` for a ``(None, 3)`` shape). Values
that cannot be decoded, or whose dtype or shape do not fit, are reported per row, so the
caller can raise or skip them (``on_error``).

Examples
--------
>>> import io, numpy as np, pyarrow as pa
>>> def npy(a):
...     buf = io.BytesIO(); np.save(buf, a); return buf.getvalue()
>>> column = pa.array([npy(np.arange(6, dtype=np.int16).reshape(2, 3)), None,
...                    npy(np.ones((2, 3), np.int16))])
>>> cells = decode_npy(column)
>>> cells.stacked.shape, cells.present.tolist()
((2, 2, 3), [True, False, True])
>>> array, bad = cells_to_arrow(cells, (2, 3), np.dtype(np.int16))
>>> array.type
FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=int16, shape=[2,3]]>)
>>> array.to_pylist()[1] is None, bad
(True, {})
"""

from __future__ import annotations

import io
import math
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from feedline.errors import DataError

__all__ = [
    "NPY_MAGIC",
    "ZIP_MAGIC",
    "Cells",
    "arrow_type_for",
    "cells_to_arrow",
    "decode_npy",
    "decode_npz",
    "load_npy",
    "read_header",
]

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
#: dtype kinds a decoded value may have: bool, integers, floats, str, bytes
_KINDS = "biufUS"
#: the largest compressed member (bytes) one ``.npz`` value may expand to
_MAX_NPZ_BYTES = 1 << 31
#: serializes NumPy's header parsing (see read_header)
_HEADER_LOCK = threading.Lock()

Shape = tuple[int | None, ...]


@dataclass
class Cells:
    """The decoded values of one column of ``n`` rows.

    Attributes
    ----------
    n:
        Rows in the column.
    present:
        ``True`` where a value was decoded (``False``: null or failed).
    failed:
        Row → why its value could not be decoded.
    stacked:
        When every decoded value has the same dtype and shape: one array
        ``(present.sum(), *shape)`` of them, in row order; else ``None``.
    arrays:
        Otherwise one array per present row, in row order.
    """

    n: int
    present: np.ndarray
    failed: dict[int, str] = field(default_factory=dict)
    stacked: np.ndarray | None = None
    arrays: list[np.ndarray] | None = None

    @classmethod
    def from_values(cls, values: Sequence[np.ndarray | None], failed: dict[int, str]) -> Cells:
        """Cells from one array (or ``None``) per row; stacked when they all agree."""
        present = np.array([v is not None for v in values], dtype=bool)
        arrays = [v for v in values if v is not None]
        if arrays and all(a.dtype == arrays[0].dtype and a.shape == arrays[0].shape
                          for a in arrays):
            return cls(len(values), present, failed, stacked=np.stack(arrays))
        if not arrays:
            return cls(len(values), present, failed, stacked=None, arrays=[])
        return cls(len(values), present, failed, arrays=arrays)

    def values(self) -> list[np.ndarray]:
        """The decoded arrays, one per present row."""
        if self.stacked is not None:
            return list(self.stacked)
        return list(self.arrays or [])


def read_header(data: bytes | memoryview) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, header_length)`` of one ``.npy`` value.

    Raises ``ValueError`` when it is not ``.npy`` data or holds Python objects.

    Examples
    --------
    >>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3), np.float32))
    >>> dtype, shape, fortran, length = read_header(buf.getvalue())
    >>> dtype, shape, fortran, length
    (dtype('float32'), (2, 3), False, 128)
    """
    handle = io.BytesIO(data)
    version = np.lib.format.read_magic(handle)
    # NumPy parses the header with ast.literal_eval, which is not thread-safe on CPython 3.11
    # (reader threads raised "SystemError: AST constructor recursion depth mismatch")
    with _HEADER_LOCK:
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise ValueError(f"npy format version {version} is not supported")
    if dtype.hasobject or dtype.kind not in _KINDS or dtype.fields is not None:
        raise ValueError(f"its dtype {dtype} is not a plain number, bool or string type")
    return dtype, tuple(int(d) for d in shape), bool(fortran), handle.tell()


def load_npy(data: bytes | memoryview) -> np.ndarray:
    """One ``.npy`` value as an array (native byte order); never unpickles.

    Examples
    --------
    >>> buf = io.BytesIO(); np.save(buf, np.arange(3, dtype=">i4"))
    >>> load_npy(buf.getvalue()).tolist()
    [0, 1, 2]
    """
    if bytes(data[:6]) != NPY_MAGIC:
        raise ValueError("it does not start with the .npy magic bytes")
    read_header(data)  # refuses Python objects and dtypes that are not plain values
    return _native(np.lib.format.read_array(io.BytesIO(data), allow_pickle=False))


def _load_npz(data: bytes | memoryview) -> np.ndarray:
    """The first (Petastorm: only, ``arr``) member of one ``.npz`` value."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        if not members:
            raise ValueError("the .npz archive is empty")
        member = next((m for m in members if m.filename == "arr.npy"), members[0])
        if member.file_size > _MAX_NPZ_BYTES:
            raise ValueError(f"its member expands to {member.file_size:,} bytes")
        return load_npy(archive.read(member))


def _native(array: np.ndarray) -> np.ndarray:
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array)


def _binary_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(valid mask, offsets, data bytes)`` of a binary column (any binary flavour)."""
    if pa.types.is_binary_view(column.type) or pa.types.is_fixed_size_binary(column.type):
        column = column.cast(pa.large_binary())
    n = len(column)
    valid = np.ones(n, bool) if column.null_count == 0 else ~np.asarray(
        column.is_null().to_numpy(zero_copy_only=False))
    buffers = column.buffers()
    kind = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    offsets = np.frombuffer(buffers[1], kind)[column.offset: column.offset + n + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    return valid, offsets, data


def decode_npy(column: pa.Array) -> Cells:
    """Decode a binary column of ``.npy`` values (nulls stay absent).

    The fast path (one header for all, equal lengths) slices every payload out of the data
    buffer at once; anything else falls back to one parse per value.
    """
    valid, offsets, data = _binary_parts(column)
    n = len(valid)
    rows = np.flatnonzero(valid)
    if rows.size == 0:
        return Cells(n, valid.copy(), stacked=None, arrays=[])
    if rows.size < n:  # nulls: the values back to back (one copy, in Arrow)
        _, dense_offsets, dense_data = _binary_parts(column.drop_null())
        stacked = _fast_path(dense_data, dense_offsets)
    else:
        stacked = _fast_path(data, offsets)
    if stacked is not None:
        return Cells(n, valid.copy(), stacked=stacked)
    values: list[np.ndarray | None] = [None] * n
    failed: dict[int, str] = {}
    for row in rows.tolist():
        blob = memoryview(data)[offsets[row]: offsets[row + 1]]
        try:
            values[row] = load_npy(blob)
        except (ValueError, OSError, EOFError, TypeError) as exc:
            failed[row] = f"not a readable .npy value ({exc})"
    return Cells.from_values(values, failed)


def _fast_path(data: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
    """All values of a column without nulls as one ``(rows, *shape)`` array, or ``None``
    unless they share one header and one length."""
    count = len(offsets) - 1
    size = int(offsets[1] - offsets[0])
    if size < 10 or not bool((offsets[1:] - offsets[:-1] == size).all()):
        return None
    start = int(offsets[0])
    head = data[start: start + size]
    if bytes(head[:6]) != NPY_MAGIC:
        return None
    try:
        dtype, shape, fortran, header = read_header(head.tobytes())
    except ValueError:
        return None
    if header + dtype.itemsize * math.prod(shape) != size:
        return None
    matrix = data[start: start + count * size].reshape(count, size)
    if not bool((matrix[:, :header] == matrix[0, :header]).all()):
        return None
    payload = np.ascontiguousarray(matrix[:, header:]).view(dtype)
    if fortran and len(shape) > 1:
        values = payload.reshape((count, *shape[::-1])).transpose(0, *range(len(shape), 0, -1))
    else:
        values = payload.reshape((count, *shape))
    return _native(values)


def decode_npz(column: pa.Array) -> Cells:
    """Decode a binary column of ``.npz`` values (``np.savez_compressed``): the member
    ``arr`` (Petastorm's ``CompressedNdarrayCodec``) or else the first one, never unpickling."""
    valid, offsets, data = _binary_parts(column)
    values: list[np.ndarray | None] = [None] * len(valid)
    failed: dict[int, str] = {}
    for row in np.flatnonzero(valid).tolist():
        blob = memoryview(data)[offsets[row]: offsets[row + 1]]
        try:
            values[row] = _load_npz(blob)
        except (ValueError, OSError, EOFError, TypeError, zipfile.BadZipFile,
                NotImplementedError, RuntimeError) as exc:
            failed[row] = f"not a readable .npz value ({type(exc).__name__}: {exc})"
    return Cells.from_values(values, failed)


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
    if None not in shape and dtype.kind in "iuf" and math.prod(shape) > 0:  # type: ignore[arg-type]
        return pa.fixed_shape_tensor(value, [int(d) for d in shape])  # type: ignore[arg-type]
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


def cells_to_arrow(cells: Cells, shape: Shape | None, dtype: np.dtype | None
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
    sample = (stacked[0] if len(stacked) else None) if stacked is not None else (
        arrays[0] if arrays else None)
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
            failed[row] = (f"its dtype {array.dtype} cannot be cast to {dtype}" if cast is None
                           else f"its shape {array.shape} does not fit {_show(shape)}")
            present[row] = False
        arrays = kept
    if isinstance(kind, pa.FixedShapeTensorType):
        if block is None:
            block = np.stack(arrays) if arrays else np.empty((0, *shape), dtype)
        return _tensor(block, present, kind, dtype), failed
    return _nested(list(block) if block is not None else arrays, present, len(shape), kind,
                   dtype), failed


def _show(shape: Shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + (",)" if len(
        shape) == 1 else ")")


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    if array.dtype == dtype:
        return array
    if dtype.kind in "US" and array.dtype.kind in "US":
        return array
    if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        return None
    return array.astype(dtype)


def _tensor(block: np.ndarray, present: np.ndarray, kind: pa.FixedShapeTensorType,
            dtype: np.dtype) -> pa.Array:
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


def _nested(arrays: list[np.ndarray], present: np.ndarray, depth: int, kind: pa.DataType,
            dtype: np.dtype) -> pa.Array:
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
    flat = (np.concatenate([np.ascontiguousarray(a).reshape(-1) for a in arrays])
            if arrays else np.empty(0, dtype))
    values: pa.Array = pa.array(flat, _innermost(kind))
    for level in range(depth - 1, 0, -1):
        counts = np.prod(shapes[:, :level], axis=1)
        lengths = np.repeat(shapes[:, level], counts)
        values = pa.ListArray.from_arrays(_offsets(lengths), values)
    outer = pa.ListArray.from_arrays(_offsets(shapes[:, 0]), values,
                                     mask=None if present.all() else pa.array(~present))
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
