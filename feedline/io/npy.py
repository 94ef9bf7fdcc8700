"""Decoding binary columns of NumPy ``.npy`` / ``.npz`` bytes into tensors or nested lists.

One column's values usually share one ``.npy`` header (same dtype and shape), so the header
is parsed once (with :mod:`numpy.lib.format`, never unpickling: ``allow_pickle=False``) and,
when every value has the same length and the same header bytes, all payloads are sliced out
of the column's data buffer at once and viewed as one ``(rows, *shape)`` array: no per-row
Python. Otherwise (shapes differ, nulls aside) each value is parsed on its own.

A header's shape and dtype are claims of the data: :func:`read_header` checks them against
the bytes the value really holds (``shape × itemsize`` must equal the bytes after the
header) before anything is allocated, so a 16-byte value claiming ``(2**40,)`` is refused in
microseconds instead of asking for terabytes. ``.npy`` has no checksum: a flipped byte in a
payload gives another value of the same shape (a flipped byte in a header is refused, or
yields a value whose shape still matches its bytes). :func:`read_header` is the one checked
parser of ``.npy`` headers in feedline: readers of other formats holding ``.npy`` members
call it (or :func:`load_npy`) rather than :mod:`numpy.lib.format` directly.

The result, :class:`Cells`, then becomes an Arrow column with :func:`cells_to_arrow`
(in :mod:`feedline.io.npy_arrow`, re-exported here). Values that cannot be decoded are
reported per row in ``Cells.failed``, so the caller can raise or skip them (``on_error``).

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
>>> from feedline.io.npy_arrow import cells_to_arrow
>>> array, bad = cells_to_arrow(cells, (2, 3), np.dtype(np.int16))
>>> array.type
FixedShapeTensorType(extension<arrow.fixed_shape_tensor[value_type=int16, shape=[2,3]]>)
>>> array.to_pylist()[1] is None, bad
(True, {})
"""

from __future__ import annotations

import io
import math
import struct
import threading
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

__all__ = ["NPY_MAGIC", "ZIP_MAGIC", "Cells", "decode_npy", "decode_npz", "load_npy", "read_header"]

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
#: dtype kinds a decoded value may have: bool, integers, floats, str, bytes
_KINDS = "biufUS"
#: the largest compressed member (bytes) one ``.npz`` value may expand to
_MAX_NPZ_BYTES = 1 << 31
#: the most (sub)arrays an empty value's leading dimensions may claim (an empty ``(2**40, 0)``
#: holds no bytes but would become 2**40 empty lists)
_MAX_EMPTY_ITEMS = 1 << 16
#: serializes NumPy's header parsing (see read_header)
_HEADER_LOCK = threading.Lock()


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
        if arrays and all(
            a.dtype == arrays[0].dtype and a.shape == arrays[0].shape for a in arrays
        ):
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
    """``(dtype, shape, fortran_order, header_length)`` of one whole ``.npy`` value, checked.

    ``data`` is the whole value: its header's claims are checked against it before anything
    is allocated. Raises ``ValueError`` (with a reason naming the field and the claimed size)
    when it is not ``.npy`` data, holds Python objects or a dtype that is not a plain number,
    bool or string, has a dimension that is not a non-negative integer, or when
    ``shape × itemsize`` is not the number of bytes after the header (a truncated value, or a
    header claiming more than the value holds).

    Examples
    --------
    >>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3), np.float32))
    >>> dtype, shape, fortran, length = read_header(buf.getvalue())
    >>> dtype, shape, fortran, length
    (dtype('float32'), (2, 3), False, 128)
    >>> read_header(buf.getvalue()[:128] + b"x" * 8)
    Traceback (most recent call last):
    ...
    ValueError: its header's shape (2, 3) of float32 claims 24 bytes, but the value holds 8 ...
    """
    if bytes(data[:6]) != NPY_MAGIC:
        raise ValueError("it does not start with the .npy magic bytes")
    handle = io.BytesIO(data)
    # NumPy parses the header with ast.literal_eval, which is not thread-safe on CPython 3.11
    # (reader threads raised "SystemError: AST constructor recursion depth mismatch")
    try:
        version = np.lib.format.read_magic(handle)
        with _HEADER_LOCK:
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            else:
                raise ValueError(f"npy format version {version} is not supported")
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - a hostile header may upset NumPy's parser anyhow
        raise ValueError(f"its header cannot be parsed ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.kind not in _KINDS or dtype.fields is not None:
        raise ValueError(f"its dtype {dtype} is not a plain number, bool or string type")
    if dtype.itemsize == 0:
        raise ValueError(f"its dtype {dtype} has no size")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"its header's shape {shape!r} is not a tuple of sizes")
    shape = tuple(int(d) for d in shape)
    header = handle.tell()
    claimed = math.prod(shape) * dtype.itemsize
    held = len(data) - header
    if claimed != held:
        raise ValueError(
            f"its header's shape {shape} of {dtype} claims {claimed:,} bytes, but the value "
            f"holds {held:,} after its {header}-byte header"
        )
    if not claimed:
        leading = 1
        for d in shape:
            leading *= d
            if leading > _MAX_EMPTY_ITEMS:
                raise ValueError(
                    f"its header's shape {shape} claims {leading:,} empty (sub)arrays, more "
                    f"than the {_MAX_EMPTY_ITEMS:,} an empty value may have"
                )
            if not leading:
                break
    return dtype, shape, bool(fortran), header


def load_npy(data: bytes | memoryview) -> np.ndarray:
    """One ``.npy`` value as an array (native byte order); never unpickles.

    The header is checked against the value's bytes first (:func:`read_header`); the
    payload is then viewed in place, never allocated from the header's claims.

    Examples
    --------
    >>> buf = io.BytesIO(); np.save(buf, np.arange(3, dtype=">i4"))
    >>> load_npy(buf.getvalue()).tolist()
    [0, 1, 2]
    """
    dtype, shape, fortran, header = read_header(data)
    flat = np.frombuffer(data, dtype, count=math.prod(shape), offset=header)
    if fortran and len(shape) > 1:
        array = flat.reshape(shape[::-1]).transpose()
    else:
        array = flat.reshape(shape)
    return _native(array)


def _load_npz(data: bytes | memoryview) -> np.ndarray:
    """The first (Petastorm: only, ``arr``) member of one ``.npz`` value."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = archive.infolist()
        if not members:
            raise ValueError("the .npz archive is empty")
        member = next((m for m in members if m.filename == "arr.npy"), members[0])
        if member.file_size > _MAX_NPZ_BYTES:
            raise ValueError(f"its member expands to {member.file_size:,} bytes")
        with archive.open(member) as handle:  # inflates at most what the member claims
            data = handle.read(member.file_size)
        if len(data) != member.file_size:
            raise ValueError(
                f"its member holds {len(data):,} bytes, not the {member.file_size:,} it claims"
            )
        return load_npy(data)


def _native(array: np.ndarray) -> np.ndarray:
    """``array`` in native byte order, C-contiguous and writable (a view of read-only bytes
    is copied); a 0-d value stays 0-d (``np.ascontiguousarray`` would make it ``(1,)``)."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if array.flags.c_contiguous and array.flags.writeable:
        return array
    return array.copy(order="C")


def _binary_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(valid mask, offsets, data bytes)`` of a binary column (any binary flavour)."""
    if pa.types.is_binary_view(column.type) or pa.types.is_fixed_size_binary(column.type):
        column = column.cast(pa.large_binary())
    n = len(column)
    valid = (
        np.ones(n, bool)
        if column.null_count == 0
        else ~np.asarray(column.is_null().to_numpy(zero_copy_only=False))
    )
    buffers = column.buffers()
    kind = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    offsets = np.frombuffer(buffers[1], kind)[column.offset : column.offset + n + 1].astype(
        np.int64
    )
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
        blob = data.data[offsets[row] : offsets[row + 1]]  # the bytes as a memoryview
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
    head = data[start : start + size]
    if bytes(head[:6]) != NPY_MAGIC:
        return None
    try:
        dtype, shape, fortran, header = read_header(head.tobytes())  # size checked there
    except ValueError:
        return None
    matrix = data[start : start + count * size].reshape(count, size)
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
        blob = data.data[offsets[row] : offsets[row + 1]]  # the bytes as a memoryview
        try:
            values[row] = _load_npz(blob)
        except (
            ValueError,
            OSError,
            EOFError,
            TypeError,
            zipfile.BadZipFile,
            zlib.error,
            struct.error,
            OverflowError,
            KeyError,
            NotImplementedError,
            RuntimeError,
        ) as exc:
            failed[row] = f"not a readable .npz value ({type(exc).__name__}: {exc})"
    return Cells.from_values(values, failed)
