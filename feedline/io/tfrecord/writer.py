"""Writing record batches as TFRecord files of ``tf.train.Example`` records.

Each row becomes one Example with a feature per column: integer and boolean values (scalar,
list, ``fixed_size_list`` or ``arrow.fixed_shape_tensor``, flattened in row-major order) as
``int64_list``, floating-point values as ``float_list`` (float32: the only float type of an
Example), binary and string values as ``bytes_list``. A null value (of any type, strings
included) leaves the feature out of that row's Example (how ``tf.io.parse_example`` sees a
missing feature: read it back with a ``FixedLen`` default or a ``VarLen``); a null inside a
list cannot be written and raises :class:`~feedline.errors.DataError`.

What an Example cannot hold is refused, never stored as another value: a ``uint64`` value
above ``2**63 - 1`` (``int64_list`` would give it back negative) and a float64 value whose
magnitude exceeds float32's largest (``3.4e38``; float32 would make it ``inf``) raise
:class:`~feedline.errors.DataError` naming the column, the row and the value, before the
file is published. Other float64 values are rounded to the nearest float32 (values smaller
than float32's smallest become 0), as every float of an Example is; ``inf`` and ``nan``
pass unchanged. To opt in, convert the column yourself (e.g. in ``map_batches``): a
float32 column is written as it is (out-of-range values as ``inf``), and an int64 column
holding a uint64's bit pattern (``pc.cast(col, pa.int64(), safe=False)``) reads back exactly
with ``features={name: "uint64"}``.

Files are streamed from the batches: a file is closed after ``records_per_file`` records or
about ``bytes_per_file`` bytes and the next one opened, named ``part-00000.tfrecord``
(``.tfrecord.gz`` / ``.tfrecord.zlib`` when compressed). Each is written under a hidden
temporary name and renamed when complete, so a crash never leaves a half file under a
``part-`` name. Numbers are encoded per batch with NumPy (vectorized varints); only the
nesting of each row's messages is Python.

Examples
--------
>>> import pyarrow as pa
>>> encode_examples(pa.record_batch({"x": [3]}))[0].hex()
'0a0c0a0a0a017812051a030a0103'
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.io.storage.paths import Location
from feedline.io.tfrecord.frames import frame

__all__ = ["encode_examples", "write_tfrecord"]

_SMALL = [bytes([i]) for i in range(128)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode_varints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Varint bytes of int64 ``values`` and the byte offset of each value (n + 1)."""
    v = values.astype(np.int64, copy=False).view(np.uint64)
    size = np.ones(v.size, np.int64)
    for k in range(1, 10):
        size += v >= np.uint64(1 << (7 * k))
    offsets = np.concatenate([[0], np.cumsum(size)])
    out = np.zeros(int(offsets[-1]), np.uint8)
    for k in range(10):
        at = np.flatnonzero(size > k)
        if not at.size:
            break
        byte = (v[at] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (size[at] > k + 1).astype(np.uint64) << np.uint64(7)
        out[offsets[at] + k] = (byte | more).astype(np.uint8)
    return out.tobytes(), offsets


def _flat(column: pa.Array, name: str) -> tuple[pa.Array, np.ndarray | None, np.ndarray]:
    """``(values, value offsets per row or None for one value per row, row validity)``."""
    kind = column.type
    if isinstance(kind, pa.FixedShapeTensorType) and list(kind.permutation or []) != sorted(
        kind.permutation or []
    ):  # row-major order of the logical shape, not the stored one
        array = column.to_numpy_ndarray()
        flat = pa.array(array.reshape(len(column), -1).reshape(-1))
        column = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(kind.shape)))
        kind = column.type
    if isinstance(kind, pa.BaseExtensionType):
        column, kind = column.storage, column.type.storage_type
    if pa.types.is_dictionary(kind):
        column = column.dictionary_decode()
        kind = column.type
    valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), bool)
    if pa.types.is_fixed_size_list(kind):
        column = column.cast(pa.list_(kind.value_field))
        kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = np.asarray(column.offsets.to_numpy(), np.int64)
        values = column.values.slice(offsets[0], offsets[-1] - offsets[0])
        offsets = offsets - offsets[0]
        if values.null_count:
            raise DataError(
                f"Column {name!r} holds a null inside a list, which a tf.train.Example cannot "
                "store. Fix: fill the nulls (e.g. with map_batches) or drop those rows first."
            )
        return values, offsets, valid
    return column, None, valid


def _filled(values: pa.Array, fill: Any) -> np.ndarray:
    """``values`` as NumPy, nulls (rows left out of the Examples) replaced by ``fill``."""
    if values.null_count:
        values = values.fill_null(pa.scalar(fill, values.type))
    return values.to_numpy(zero_copy_only=False)


def _refuse(name: str, numbers: np.ndarray, bad: np.ndarray, offsets: np.ndarray | None,
            first_row: int, what: str, fix: str) -> None:  # fmt: skip
    """Raise :class:`DataError` for the first value of ``numbers`` flagged in ``bad``
    (``offsets``: the value offsets of each row, ``None`` for one value a row)."""
    at = int(np.flatnonzero(bad)[0])
    row = at if offsets is None else int(np.searchsorted(offsets, at, side="right") - 1)
    raise DataError(
        f"Column {name!r} holds {numbers[at].item()!r} at row {first_row + row} "
        f"({int(bad.sum())} such value(s) in its batch), {what}. Fix: {fix}"
    )


def _int64s(values: pa.Array, name: str, offsets: np.ndarray | None, first_row: int) -> np.ndarray:
    """Integer or boolean ``values`` as int64, refusing uint64 values above int64's max."""
    numbers = _filled(values, False if pa.types.is_boolean(values.type) else 0)
    if numbers.dtype == np.uint64:
        big = numbers > np.uint64(np.iinfo(np.int64).max)
        if big.any():
            _refuse(name, numbers, big, offsets, first_row,
                    "more than an int64_list can hold (2**63 - 1; it would read back negative)",
                    f"opt in to its int64 bit pattern (pc.cast({name!r} column, pa.int64(), "
                    f"safe=False) in map_batches; read it back with features={{{name!r}: "
                    "'uint64'}), or drop those rows.")  # fmt: skip
    return numbers.astype(np.int64)


def _float32s(
    values: pa.Array, name: str, offsets: np.ndarray | None, first_row: int
) -> np.ndarray:
    """Floating-point ``values`` as float32, refusing finite values that would become inf."""
    numbers = _filled(values, float("nan"))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        out = numbers.astype("<f4")
    if numbers.dtype.itemsize > 4:
        huge = np.isfinite(numbers) & ~np.isfinite(out)
        if huge.any():
            _refuse(name, numbers, huge, offsets, first_row,
                    "beyond float32's range (3.4e38), the only float of a tf.train.Example "
                    "(it would read back as inf)",
                    f"clip or rescale {name!r}, or opt in to inf by converting the column to "
                    "float32 yourself (e.g. in map_batches) before writing.")  # fmt: skip
    return out


def _column_features(column: pa.Array, name: str, first_row: int = 0) -> list[bytes | None]:
    """Each row's ``Feature`` message as map-entry bytes (``None``: leave it out);
    ``first_row`` numbers the rows in errors."""
    values, offsets, valid = _flat(column, name)
    kind = values.type
    if pa.types.is_dictionary(kind):
        values, kind = values.dictionary_decode(), values.type.value_type
    key = name.encode()
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        data, value_offsets = _encode_varints(_int64s(values, name, offsets, first_row))
        tag = b"\x1a"
    elif pa.types.is_floating(kind):
        data = _float32s(values, name, offsets, first_row).tobytes()
        value_offsets = np.arange(len(values) + 1, dtype=np.int64) * 4
        tag = b"\x12"
    elif (
        pa.types.is_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_large_string(kind)
    ):
        return _bytes_features(values, offsets, valid, key)
    else:
        raise SchemaError(
            f"Column {name!r} has type {column.type}, which a tf.train.Example cannot hold. Fix: "
            "cast it to an integer, float, binary or string type (or a list of those), or drop it."
        )
    rows = offsets if offsets is not None else np.arange(len(values) + 1, dtype=np.int64)
    starts = value_offsets[rows[:-1]].tolist()
    stops = value_offsets[rows[1:]].tolist()
    head = _varint(len(key))
    out: list[bytes | None] = []
    for start, stop, ok in zip(starts, stops, valid.tolist(), strict=True):
        if not ok:
            out.append(None)
            continue
        size = stop - start
        listed = b"\x0a" + _varint(size) + data[start:stop] if size else b""
        feature = tag + _varint(len(listed)) + listed
        out.append(b"\x0a" + head + key + b"\x12" + _varint(len(feature)) + feature)
    return out


def _bytes_features(
    values: pa.Array, offsets: np.ndarray | None, valid: np.ndarray, key: bytes
) -> list[bytes | None]:
    items = [
        v if isinstance(v, bytes) else b"" if v is None else v.encode() for v in values.to_pylist()
    ]  # fmt: skip  (a None is a null row: left out)
    head = _varint(len(key))
    out: list[bytes | None] = []
    for row, ok in enumerate(valid.tolist()):
        if not ok:
            out.append(None)
            continue
        chosen = items[offsets[row] : offsets[row + 1]] if offsets is not None else [items[row]]
        listed = b"".join([b"\x0a" + _varint(len(v)) + v for v in chosen])
        feature = b"\x0a" + _varint(len(listed)) + listed
        out.append(b"\x0a" + head + key + b"\x12" + _varint(len(feature)) + feature)
    return out


def encode_examples(batch: pa.RecordBatch, first_row: int = 0) -> list[bytes]:
    """The serialized ``tf.train.Example`` of each row of ``batch`` (whose first row is row
    ``first_row`` of the output, as errors name it).

    Raises :class:`DataError` for a value an Example cannot hold (see the module docstring).
    """
    columns = [
        _column_features(batch.column(i), name, first_row)
        for i, name in enumerate(batch.schema.names)
    ]
    out = []
    for entries in zip(*columns, strict=True) if columns else [()] * batch.num_rows:
        body = b"".join([b"\x0a" + _varint(len(e)) + e for e in entries if e is not None])
        out.append(b"\x0a" + _varint(len(body)) + body)
    return out


class _Compressed:
    """A ``write`` target compressing into ``raw`` (GZIP or ZLIB) or passing through."""

    def __init__(self, raw: Any, compression: str | None) -> None:
        self._raw = raw
        self._gzip = gzip.GzipFile(fileobj=raw, mode="wb") if compression == "GZIP" else None
        self._zlib = zlib.compressobj() if compression == "ZLIB" else None

    def write(self, data: bytes) -> None:
        if self._gzip is not None:
            self._gzip.write(data)
        elif self._zlib is not None:
            self._raw.write(self._zlib.compress(data))
        else:
            self._raw.write(data)

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()
        elif self._zlib is not None:
            self._raw.write(self._zlib.flush())
        self._raw.close()


def write_tfrecord(
    batches: Iterator[pa.RecordBatch],
    target: Location,
    *,
    compression: str | None = None,
    records_per_file: int | None = None,
    bytes_per_file: int | None = 256 << 20,
    overwrite: bool = False,
) -> tuple[int, list[str], int]:
    """Write ``batches`` as TFRecord files into the folder ``target``.

    Returns ``(records, file paths, bytes)``."""
    if compression not in (None, "GZIP", "ZLIB"):
        raise ConfigurationError(
            f"compression={compression!r} is not valid for write_tfrecord. Fix: use None, "
            "'GZIP' or 'ZLIB'."
        )
    if records_per_file is not None and records_per_file < 1:
        raise ConfigurationError(
            f"records_per_file={records_per_file} must be >= 1. Fix: pass a positive int or None."
        )
    fs = target.fs
    suffix = {None: ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zlib"}[compression]
    old = [p for p in (fs.ls(target.path, detail=False) if fs.isdir(target.path) else [])
           if p.rsplit("/", 1)[-1].startswith("part-")]  # fmt: skip
    if old and not overwrite:
        raise ConfigurationError(
            f"{target.url!r} already holds {len(old)} part- files. Fix: write to a new folder, "
            "or pass overwrite=True to replace them."
        )
    fs.makedirs(target.path, exist_ok=True)
    done: list[str] = []
    temp: str | None = None
    handle: _Compressed | None = None
    rows = in_file = size = 0
    try:
        for batch in batches:
            for record in encode_examples(batch, rows):
                if handle is not None and (
                    (records_per_file is not None and in_file >= records_per_file)
                    or (bytes_per_file is not None and size >= bytes_per_file)
                ):
                    handle.close()
                    handle = None
                    done.append(_publish(fs, temp, target, len(done), suffix))
                if handle is None:
                    temp = target.join(f"_tmp-{len(done):05d}{suffix}")
                    handle = _Compressed(fs.open(temp, "wb"), compression)
                    in_file = size = 0
                framed = frame(record)
                handle.write(framed)
                in_file += 1
                size += len(framed)
                rows += 1
        if handle is not None:
            handle.close()
            handle = None
            done.append(_publish(fs, temp, target, len(done), suffix))
    except BaseException:
        if handle is not None:
            handle.close()
        if temp is not None and fs.exists(temp):
            fs.rm(temp)
        raise
    for path in old:
        if path not in done:
            fs.rm(path)
    return rows, done, sum(fs.size(p) for p in done)


def _publish(fs: Any, temp: str | None, target: Location, index: int, suffix: str) -> str:
    final = target.join(f"part-{index:05d}{suffix}")
    fs.mv(temp, final)
    return final
