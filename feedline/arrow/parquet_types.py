"""Which Arrow types Parquet stores as themselves, which it stores as another, and which not at all.

pyarrow writes the Arrow schema into every Parquet file (``ARROW:schema``) and restores most
types from it on read (large strings, dictionaries, durations, ``arrow.fixed_shape_tensor``,
time zones…). A few it cannot restore, because Parquet has no such unit; reading gives the
type Parquet stored instead, with the same values:

===============================  ==============================  ============================
written (Arrow)                  read back from the file          ``fl.open`` of a dataset
===============================  ==============================  ============================
``timestamp[s]`` (any tz)        ``timestamp[ms]`` (same tz)      ``timestamp[s]`` (cast back)
``date64``                       ``date32``                       ``date64`` (cast back)
``time32[s]``                    ``time32[ms]``                   ``time32[s]`` (cast back)
``dictionary<large_string>``     ``dictionary<string>``           as written (cast back)
(and ``large_binary``)           (``binary``)
``dictionary`` of other values   the values, decoded              as written (re-encoded)
the above inside lists, structs  the same, inside                 as written (cast back)
numeric ``fixed_shape_tensor``,  ``fixed_size_binary`` + a       as written (decoded, no copy)
``fixed_size_list`` (feedline's  ``feedline.tensor`` field
writer; see ``tensor_codec``)    description
===============================  ==============================  ============================

A feedline manifest records the schema the user wrote; the shards hold what Parquet stores.
Readers compare the two with :func:`same_stored_schema` (a file whose types differ otherwise
is schema drift) and :func:`restore_types` casts every batch back to the manifest's types, so
``fl.open`` gives back exactly the types that were written (the casts are exact: the values
came from those types). Other readers of the shards (pandas, Polars, Spark) get the middle
column. Arrow types Parquet cannot store at all (intervals, unions, run-end encoded) are
refused before anything is written (:func:`check_storable`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from feedline.arrow.tensor_codec import decode_array, encoded_type, is_tensor_type
from feedline.errors import SchemaError

__all__ = [
    "check_storable",
    "restore_types",
    "same_stored_schema",
    "stored_schema",
    "stored_type",
]


def stored_type(kind: pa.DataType) -> pa.DataType:
    """The type a pyarrow reader gets back for a column of ``kind`` written to Parquet.

    Examples
    --------
    >>> stored_type(pa.timestamp("s", tz="UTC"))
    TimestampType(timestamp[ms, tz=UTC])
    >>> stored_type(pa.list_(pa.date64()))
    ListType(list<item: date32[day]>)
    >>> stored_type(pa.int8())
    DataType(int8)
    """
    t = pa.types
    if t.is_timestamp(kind) and kind.unit == "s":
        return pa.timestamp("ms", kind.tz)
    if t.is_date64(kind):
        return pa.date32()
    if t.is_time32(kind) and kind.unit == "s":
        return pa.time32("ms")
    if is_tensor_type(kind):  # fixed-size binary (io/tensor_codec.py); older files: lists
        return encoded_type(kind)
    if isinstance(kind, pa.BaseExtensionType):
        return kind  # restored from ARROW:schema with its storage
    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind):
        value = kind.value_field.with_type(stored_type(kind.value_type))
        if t.is_fixed_size_list(kind):
            return pa.list_(value, kind.list_size)
        return pa.large_list(value) if t.is_large_list(kind) else pa.list_(value)
    if t.is_map(kind):
        return pa.map_(
            kind.key_field.with_type(stored_type(kind.key_type)),
            kind.item_field.with_type(stored_type(kind.item_type)),
            kind.keys_sorted,
        )
    if t.is_struct(kind):
        return pa.struct([f.with_type(stored_type(f.type)) for f in kind])
    if t.is_dictionary(kind):
        value = kind.value_type
        if t.is_string(value) or t.is_large_string(value):
            return pa.dictionary(kind.index_type, pa.string(), kind.ordered)
        if t.is_binary(value) or t.is_large_binary(value):
            return pa.dictionary(kind.index_type, pa.binary(), kind.ordered)
        return stored_type(value)  # other dictionaries are stored decoded
    return kind


def stored_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every type replaced by :func:`stored_type` (metadata dropped).

    Examples
    --------
    >>> stored_schema(pa.schema({"t": pa.time32("s"), "x": pa.float32()})).types
    [Time32Type(time32[ms]), DataType(float)]
    """
    return pa.schema([f.with_type(stored_type(f.type)).remove_metadata() for f in schema])


def same_stored_schema(a: pa.Schema, b: pa.Schema) -> bool:
    """True when ``a`` and ``b`` are the same once written to Parquet (metadata ignored).

    Examples
    --------
    >>> seconds, millis = pa.timestamp("s"), pa.timestamp("ms")
    >>> same_stored_schema(pa.schema({"t": seconds}), pa.schema({"t": millis}))
    True
    >>> same_stored_schema(pa.schema({"x": pa.int32()}), pa.schema({"x": pa.int64()}))
    False
    """
    return stored_schema(a).equals(stored_schema(b), check_metadata=False)


def restore_types(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """``batch`` (as read from Parquet) with its columns cast to their types in ``schema``.

    Columns are matched by name (``batch`` may hold a projection). ``where`` names the file
    in the :class:`SchemaError` raised when a column cannot be cast back.

    Examples
    --------
    >>> read = pa.record_batch({"t": pa.array([1000], pa.timestamp("ms")), "k": [7]})
    >>> wanted = pa.schema({"t": pa.timestamp("s"), "k": pa.dictionary(pa.int8(), pa.int64())})
    >>> restore_types(read, wanted, "a.parquet").schema.types
    [TimestampType(timestamp[s]), DictionaryType(dictionary<values=int64, indices=int8, ordered=0>)]
    """
    arrays = []
    changed = False
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        wanted = schema.field(name).type
        if column.type != wanted:
            changed = True
            try:
                if is_tensor_type(wanted) and pa.types.is_fixed_size_binary(column.type):
                    arrays.append(decode_array(column, wanted))  # no copy
                    continue
                if pa.types.is_dictionary(wanted) and not pa.types.is_dictionary(column.type):
                    column = column.cast(wanted.value_type).dictionary_encode()
                column = column.cast(wanted)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SchemaError(
                    f"Column {name!r} of {where} holds {column.type}, which cannot be read back "
                    f"as the recorded {wanted}: {exc}. Fix: re-run the write that produced it."
                ) from exc
        arrays.append(column)
    if not changed:
        return batch
    return pa.RecordBatch.from_arrays(
        arrays, schema=pa.schema([schema.field(n) for n in batch.schema.names], schema.metadata)
    )


def _storable(schema: pa.Schema) -> bool:
    try:
        pq.ParquetWriter(pa.BufferOutputStream(), schema).close()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True


def check_storable(schema: pa.Schema, where: str = "the dataset") -> None:
    """Raise :class:`SchemaError` naming the columns of ``schema`` Parquet cannot store.

    Examples
    --------
    >>> check_storable(pa.schema({"x": pa.int64()}))
    >>> check_storable(pa.schema({"gap": pa.month_day_nano_interval()}), "the plan")
    Traceback (most recent call last):
    ...
    feedline.errors.SchemaError: Parquet cannot store the column(s)
    ['gap: month_day_nano_interval'] of the plan. Fix: ...
    """
    if _storable(schema):
        return
    bad = [f"{f.name}: {f.type}" for f in schema if not _storable(pa.schema([f]))]
    raise SchemaError(
        f"Parquet cannot store the column(s) {bad or list(schema.names)} of {where}. Fix: cast "
        "them to a type Parquet has (intervals to a struct or int64, unions to a struct, list "
        "views to lists) with map_batches, or drop them, before writing."
    )
