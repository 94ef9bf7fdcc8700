"""Fixed-shape tensor columns stored so that reading them is a memory copy.

Parquet has no tensor type: pyarrow writes an ``arrow.fixed_shape_tensor`` (or any
``fixed_size_list``) column as a nested list, with a repetition and a definition level per
value, and stores ``uint8`` values as ``INT32``. Decoding that costs far more than the bytes
(about 0.1 GB/s for 3×64×64 ``uint8`` images against 1-4 GB/s for plain bytes here). So
feedline's writer stores every fixed-shape tensor column of a numeric type as
``fixed_size_binary(itemsize × elements)``: one value per row holding the row's elements in
C (row-major) order, little-endian, ``PLAIN`` encoded, never dictionary encoded. Reading it
back is a copy of each page's bytes.

The logical type is kept twice, so that nothing is lost:

- the manifest's schema holds the column's real type (``arrow.fixed_shape_tensor`` with its
  shape, ``dim_names`` and ``permutation``, or the ``fixed_size_list``);
- the stored field carries the metadata key ``feedline.tensor``, a JSON object such as
  ``{"type": "arrow.fixed_shape_tensor", "value_type": "uint8", "shape": [3, 64, 64],
  "dim_names": null, "permutation": null, "order": "C", "byte_order": "little"}``
  (``"type": "fixed_size_list"`` adds ``value_field`` and ``value_nullable``).

Reading through feedline (``fl.open(path).to_arrow()``, ``fl.read_parquet`` of the shards,
the loader) gives the tensor type back without a copy (:func:`decode_array`). Other readers
see a binary column plus that metadata; each value decodes with NumPy:

- pyarrow: ``col = pq.read_table(f)["image"].combine_chunks()``, then
  ``np.frombuffer(col.buffers()[1], "uint8")[col.offset * n:][: len(col) * n]`` reshaped to
  ``(-1, 3, 64, 64)`` (``n`` = elements per row), or
  ``pa.ExtensionArray.from_storage(type, ...)`` as :func:`decode_array` does;
- pandas / Polars: a column of ``bytes``; ``np.frombuffer(b"".join(df["image"]),
  "uint8").reshape(-1, 3, 64, 64)`` (Polars: ``df["image"].to_list()``).

Datasets written before this encoding (tensors as lists) are read as before. Boolean tensors
(bit-packed in Arrow) and tensors of non-numeric values keep the list encoding.

Examples
--------
>>> import numpy as np, pyarrow as pa
>>> images = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((2, 3, 4), np.uint8))
>>> stored = encode_schema(pa.schema({"image": images.type}))
>>> stored.field("image").type
FixedSizeBinaryType(fixed_size_binary[12])
>>> logical_schema(stored).field("image").type == images.type
True
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import DataError, SchemaError

__all__ = [
    "TENSOR_KEY",
    "TensorStorage",
    "decode_array",
    "decode_batch",
    "encode_schema",
    "encode_table",
    "encoded_type",
    "is_tensor_type",
    "logical_schema",
    "logical_type",
    "tensor_columns",
]

#: the stored field's metadata key holding the tensor type (JSON)
TENSOR_KEY = b"feedline.tensor"
_TENSOR = "arrow.fixed_shape_tensor"
_LIST = "fixed_size_list"
#: the largest number of dimensions / elements per row a stored description may claim
_MAX_DIMS = 32
_MAX_ELEMENTS = 1 << 40
#: a tensor column is compressed only when the codec saves at least this share of a sample
MIN_SAVING = 0.1
#: bytes of each tensor column compressed to decide whether compression pays
SAMPLE_BYTES = 1 << 20


def _value_ok(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _parts(kind: pa.DataType) -> tuple[pa.DataType, tuple[int, ...]] | None:
    """``(value type, shape)`` of a tensor type this codec stores, else ``None``."""
    if isinstance(kind, pa.FixedShapeTensorType):
        return (
            (kind.value_type, tuple(int(d) for d in kind.shape))
            if _value_ok(kind.value_type)
            else None
        )
    if pa.types.is_fixed_size_list(kind) and _value_ok(kind.value_type):
        return kind.value_type, (int(kind.list_size),)
    return None


def is_tensor_type(kind: pa.DataType) -> bool:
    """True for the types stored as fixed-size binary: numeric fixed-shape tensors and
    fixed-size lists.

    Examples
    --------
    >>> is_tensor_type(pa.list_(pa.float32(), 4)), is_tensor_type(pa.list_(pa.float32()))
    (True, False)
    >>> is_tensor_type(pa.list_(pa.bool_(), 4))
    False
    """
    return _parts(kind) is not None


def encoded_type(kind: pa.DataType) -> pa.DataType:
    """The stored type of a tensor type: ``fixed_size_binary(itemsize × elements)``.

    Examples
    --------
    >>> encoded_type(pa.fixed_shape_tensor(pa.float32(), [2, 3]))
    FixedSizeBinaryType(fixed_size_binary[24])
    """
    parts = _parts(kind)
    if parts is None:
        raise SchemaError(
            f"{kind} is not a numeric fixed-shape tensor type. Fix: pass a fixed_shape_tensor "
            "or fixed_size_list of integers or floats."
        )
    value, shape = parts
    return pa.binary(max(1, value.bit_width // 8) * int(np.prod(shape, dtype=np.int64)))


def _description(kind: pa.DataType) -> dict[str, Any]:
    value, shape = _parts(kind)  # type: ignore[misc]
    doc: dict[str, Any] = {
        "type": _TENSOR if isinstance(kind, pa.FixedShapeTensorType) else _LIST,
        "value_type": np.dtype(value.to_pandas_dtype()).name,
        "shape": list(shape),
    }
    if isinstance(kind, pa.FixedShapeTensorType):
        doc["dim_names"] = list(kind.dim_names) if kind.dim_names else None
        doc["permutation"] = list(kind.permutation) if kind.permutation else None
    else:
        doc["value_field"] = kind.value_field.name
        doc["value_nullable"] = kind.value_field.nullable
    return doc | {"order": "C", "byte_order": "little"}


def tensor_columns(schema: pa.Schema) -> list[str]:
    """Names of the columns of ``schema`` stored as fixed-size binary.

    Examples
    --------
    >>> tensor_columns(pa.schema({"x": pa.list_(pa.int8(), 2), "y": pa.int8()}))
    ['x']
    """
    return [f.name for f in schema if is_tensor_type(f.type)]


def encode_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as stored: tensor fields become fixed-size binary with their description.

    Examples
    --------
    >>> s = encode_schema(pa.schema({"v": pa.list_(pa.float32(), 2)}))
    >>> json.loads(s.field("v").metadata[TENSOR_KEY])["shape"]
    [2]
    """
    fields = []
    for f in schema:
        if is_tensor_type(f.type):
            meta = dict(f.metadata or {}) | {TENSOR_KEY: json.dumps(_description(f.type))}
            f = pa.field(f.name, encoded_type(f.type), f.nullable, meta)
        fields.append(f)
    return pa.schema(fields, schema.metadata)


def _encode_chunk(chunk: pa.Array, where: str) -> pa.Array:
    """One tensor chunk as fixed-size binary, sharing its value bytes (no copy)."""
    storage = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
    n = storage.type.list_size
    values = storage.values
    if values.null_count and storage.flatten().null_count:
        raise DataError(
            f"The tensor column {where} has null elements inside its tensors; stored tensors "
            "hold numbers only. Fix: fill them (e.g. with NaN or 0) before writing, or make "
            "the whole tensor null."
        )
    itemsize = values.type.bit_width // 8
    data = values.buffers()[1]
    if data is None:  # an empty child
        data = pa.py_buffer(b"")
    data = data.slice(values.offset * itemsize)
    width = n * itemsize
    validity = storage.buffers()[0] if storage.null_count else None
    return pa.Array.from_buffers(
        pa.binary(width), len(storage), [validity, data], storage.null_count, storage.offset
    )


def encode_table(table: pa.Table, stored: pa.Schema) -> pa.Table:
    """``table``'s tensor columns as fixed-size binary (``stored`` = :func:`encode_schema`).

    Examples
    --------
    >>> t = pa.table({"v": pa.array([[1, 2], [3, 4]], pa.list_(pa.int16(), 2))})
    >>> encode_table(t, encode_schema(t.schema))["v"].to_pylist()
    [b'\\x01\\x00\\x02\\x00', b'\\x03\\x00\\x04\\x00']
    """
    columns = []
    for f, column in zip(table.schema, table.columns, strict=True):
        if is_tensor_type(f.type):
            where = repr(f.name)
            column = pa.chunked_array(
                [_encode_chunk(c, where) for c in column.chunks], encoded_type(f.type)
            )
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=stored)


def _bad(field: pa.Field, reason: str) -> SchemaError:
    return SchemaError(
        f"The column {field.name!r} carries a {TENSOR_KEY.decode()} description that "
        f"{reason}. The file was damaged or written by something else. Fix: re-run the "
        "write that produced it, or read the column as plain binary (drop that metadata)."
    )


def logical_type(field: pa.Field) -> pa.DataType | None:
    """The tensor type a stored field holds (from its metadata), or ``None`` for others.

    Examples
    --------
    >>> kind = pa.fixed_shape_tensor(pa.int32(), [2, 2], dim_names=["a", "b"])
    >>> logical_type(encode_schema(pa.schema({"t": kind})).field("t")) == kind
    True
    """
    meta = field.metadata or {}
    if TENSOR_KEY not in meta:
        return None
    try:
        doc = json.loads(meta[TENSOR_KEY])
        value = pa.from_numpy_dtype(np.dtype(str(doc["value_type"])))
        shape = [int(d) for d in doc["shape"]]
        kind_name = doc["type"]
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise _bad(field, f"cannot be parsed ({str(exc)[:100]})") from None
    if not _value_ok(value) or not 0 < len(shape) <= _MAX_DIMS or min(shape) < 0:
        raise _bad(field, f"names an unsupported value type or shape {shape}")
    if int(np.prod(shape, dtype=np.float64)) > _MAX_ELEMENTS:
        raise _bad(field, f"claims {shape} elements per row")
    try:
        if kind_name == _TENSOR:
            kind: pa.DataType = pa.fixed_shape_tensor(
                value, shape, dim_names=doc.get("dim_names"), permutation=doc.get("permutation")
            )
        elif kind_name == _LIST and len(shape) == 1:
            item = pa.field(str(doc.get("value_field", "item")), value,
                            bool(doc.get("value_nullable", True)))  # fmt: skip
            kind = pa.list_(item, shape[0])
        else:
            raise _bad(field, f"names the unknown type {str(kind_name)[:40]!r}")
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise _bad(field, f"is inconsistent ({str(exc)[:100]})") from None
    if field.type != encoded_type(kind):
        raise _bad(field, f"does not fit the stored type {field.type} ({kind} expected)")
    return kind


def logical_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as read from a file with its tensor columns typed as written.

    Examples
    --------
    >>> kind = pa.list_(pa.float64(), 3)
    >>> logical_schema(encode_schema(pa.schema({"v": kind}))).field("v").type == kind
    True
    """
    fields = []
    for f in schema:
        kind = logical_type(f)
        if kind is not None:
            meta = {k: v for k, v in (f.metadata or {}).items() if k != TENSOR_KEY}
            f = pa.field(f.name, kind, f.nullable, meta or None)
        fields.append(f)
    return pa.schema(fields, schema.metadata)


def decode_array(array: pa.Array | pa.ChunkedArray, kind: pa.DataType) -> Any:
    """A stored fixed-size binary column as the tensor type ``kind``, sharing its bytes.

    Examples
    --------
    >>> kind = pa.fixed_shape_tensor(pa.uint8(), [2])
    >>> stored = pa.array([b"\\x01\\x02", b"\\x03\\x04"], pa.binary(2))
    >>> decode_array(stored, kind).to_numpy_ndarray().tolist()
    [[1, 2], [3, 4]]
    """
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([decode_array(c, kind) for c in array.chunks], kind)
    value, shape = _parts(kind)  # type: ignore[misc]
    n = int(np.prod(shape, dtype=np.int64))
    storage_type = kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind
    data = array.buffers()[1] or pa.py_buffer(b"")
    total = (array.offset + len(array)) * n
    values = pa.Array.from_buffers(value, total, [None, data])
    storage = pa.Array.from_buffers(
        storage_type, len(array), [array.buffers()[0]], array.null_count, array.offset,
        children=[values],
    )  # fmt: skip
    if isinstance(kind, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(kind, storage)
    return storage


def decode_batch(batch: pa.RecordBatch, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """``batch`` (as read from a file) with its stored tensor columns decoded.

    The tensor type comes from ``schema`` (a manifest's) when it has the column, else from
    the field's metadata. Returns ``batch`` itself when it holds no stored tensor.

    Examples
    --------
    >>> kind = pa.list_(pa.int8(), 2)
    >>> stored = pa.record_batch([pa.array([b"\\x01\\x02"], pa.binary(2))],
    ...                          schema=encode_schema(pa.schema({"v": kind})))
    >>> decode_batch(stored).column("v").to_pylist()
    [[1, 2]]
    """
    arrays: list[Any] = []
    fields: list[pa.Field] = []
    changed = False
    for f, column in zip(batch.schema, batch.columns, strict=True):
        kind = _wanted(f, schema)
        if kind is not None:
            column, f, changed = decode_array(column, kind), _logical_field(f, kind), True
        arrays.append(column)
        fields.append(f)
    if not changed:
        return batch
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, batch.schema.metadata))


def _wanted(field: pa.Field, schema: pa.Schema | None) -> pa.DataType | None:
    if not pa.types.is_fixed_size_binary(field.type):
        return None
    if schema is not None and schema.get_field_index(field.name) >= 0:
        kind = schema.field(field.name).type
        if is_tensor_type(kind) and encoded_type(kind) == field.type:
            return kind
        return None
    return logical_type(field)


def _logical_field(field: pa.Field, kind: pa.DataType) -> pa.Field:
    meta = {k: v for k, v in (field.metadata or {}).items() if k != TENSOR_KEY}
    return pa.field(field.name, kind, field.nullable, meta or None)


@dataclass(frozen=True)
class TensorStorage:
    """How a shard writer stores a schema: tensor columns as fixed-size binary, ``PLAIN``.

    Tensor columns get no dictionary and no min/max statistics (kilobytes per value, never
    used to skip data), and are compressed only where the codec pays on a sample of the first
    row group (``MIN_SAVING``): random-looking values (noise, float features, most raw pixels
    with a fast codec) decode several times faster uncompressed. Every other column is
    stored exactly as before.

    Examples
    --------
    >>> t = pa.table({"v": pa.array([[1.5, 2.5]] * 4, pa.list_(pa.float32(), 2)), "k": [1] * 4})
    >>> storage = TensorStorage.plan(t.schema, "zstd", t)
    >>> storage.schema.types, storage.dictionary(["v", "k"]), storage.encoding
    ([FixedSizeBinaryType(fixed_size_binary[8]), DataType(int64)], ['k'], {'v': 'PLAIN'})
    """

    schema: pa.Schema
    tensors: tuple[str, ...]
    compression: str | dict[str, str]
    statistics: bool | list[str]
    encoding: dict[str, str] | None

    @classmethod
    def plan(cls, schema: pa.Schema, compression: str, sample: pa.Table | None) -> TensorStorage:
        """The storage of ``schema`` with ``compression``, judged on ``sample`` (its rows)."""
        tensors = tuple(tensor_columns(schema))
        if not tensors:
            return cls(schema, (), compression, True, None)
        per_column: dict[str, str] = dict.fromkeys(schema.names, compression)
        for name in tensors:
            if not _pays(sample, name, compression):
                per_column[name] = "none"
        others = [n for n in schema.names if n not in tensors]
        return cls(encode_schema(schema), tensors, per_column, others,
                   dict.fromkeys(tensors, "PLAIN"))  # fmt: skip

    def dictionary(self, columns: list[str]) -> list[str]:
        """``columns`` (to dictionary encode) without the tensor columns."""
        return [c for c in columns if c not in self.tensors]

    def encode(self, table: pa.Table) -> pa.Table:
        """``table`` as stored (:func:`encode_table`); unchanged without tensor columns."""
        return encode_table(table, self.schema) if self.tensors else table


def _pays(sample: pa.Table | None, name: str, compression: str) -> bool:
    """Whether ``compression`` saves ``MIN_SAVING`` of a sample of column ``name``'s bytes."""
    if compression in (None, "none", "uncompressed") or sample is None or not sample.num_rows:
        return False
    chunk = next(c for c in sample.column(name).chunks if len(c))
    stored = _encode_chunk(chunk, repr(name))
    width = stored.type.byte_width
    rows = max(1, min(len(stored), SAMPLE_BYTES // max(1, width)))
    raw = stored.buffers()[1].slice(stored.offset * width, rows * width)
    try:
        packed = pa.compress(raw, codec=compression, asbytes=True)
    except (pa.ArrowException, ValueError, TypeError):  # a codec pyarrow cannot run here
        return True
    return len(packed) <= (1 - MIN_SAVING) * raw.size
