"""Arrow ↔ Spark types for the Spark engine.

Spark exchanges record batches with Python in its own Arrow dialect: every Spark type has
one Arrow type. feedline's schemas are richer, so crossing the boundary is a cast both ways:

========================================  ==============================  ====================
feedline (Arrow)                          Spark                           back to feedline
========================================  ==============================  ====================
``arrow.fixed_shape_tensor`` (extension)  ``ArrayType`` of the values     storage cast, then
                                                                          the extension type
                                                                          is re-applied
``fixed_size_list`` / ``large_list``      ``ArrayType``                   cast
``uint8`` / ``uint16`` / ``uint32``       ``ShortType`` / ``IntegerType``  cast
                                          / ``LongType`` (widened)
``uint64``                                ``DecimalType(20, 0)``          cast
``large_string`` / ``large_binary``       ``StringType`` / ``BinaryType`` cast
``dictionary<values=T>``                  T                               cast (decoded)
``timestamp`` with / without a zone       ``TimestampType`` / ``…NTZ``    cast
========================================  ==============================  ====================

The expected feedline schema always travels with the data, so whatever Spark makes of a
column, :func:`from_spark_batch` restores the exact Arrow type (a tensor column comes back
as a tensor column).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from feedline.errors import SchemaError

__all__ = ["from_spark_batch", "spark_arrow_schema", "to_spark_batch", "to_spark_schema"]


def _spark_type(kind: pa.DataType, where: str) -> Any:
    from pyspark.sql import types as T

    if isinstance(kind, pa.BaseExtensionType):
        return _spark_type(kind.storage_type, where)
    if pa.types.is_dictionary(kind):
        return _spark_type(kind.value_type, where)
    simple = {
        pa.null(): T.NullType(),
        pa.bool_(): T.BooleanType(),
        pa.int8(): T.ByteType(),
        pa.int16(): T.ShortType(),
        pa.int32(): T.IntegerType(),
        pa.int64(): T.LongType(),
        pa.uint8(): T.ShortType(),
        pa.uint16(): T.IntegerType(),
        pa.uint32(): T.LongType(),
        pa.uint64(): T.DecimalType(20, 0),
        pa.float16(): T.FloatType(),
        pa.float32(): T.FloatType(),
        pa.float64(): T.DoubleType(),
        pa.date32(): T.DateType(),
        pa.date64(): T.DateType(),
    }
    if kind in simple:
        return simple[kind]
    t = pa.types
    if t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind):
        return T.StringType()
    if t.is_binary(kind) or t.is_large_binary(kind) or t.is_fixed_size_binary(kind):
        return T.BinaryType()
    if t.is_binary_view(kind):
        return T.BinaryType()
    if t.is_decimal(kind) and kind.precision <= 38:
        return T.DecimalType(kind.precision, kind.scale)
    if t.is_timestamp(kind):
        return T.TimestampType() if kind.tz else T.TimestampNTZType()
    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind):
        value = kind.value_field
        return T.ArrayType(_spark_type(value.type, where), value.nullable)
    if t.is_struct(kind):
        return T.StructType(
            [T.StructField(f.name, _spark_type(f.type, where), f.nullable) for f in kind]
        )
    if t.is_map(kind):
        return T.MapType(
            _spark_type(kind.key_type, where),
            _spark_type(kind.item_type, where),
            kind.item_field.nullable,
        )
    raise SchemaError(
        f"The column {where} has the Arrow type {kind}, which Spark cannot hold. Fix: cast it "
        "(e.g. time/duration to int64) in a map_batches before running on Spark, or use "
        "engine='local'."
    )


def to_spark_schema(schema: pa.Schema) -> Any:
    """The Spark ``StructType`` that carries ``schema`` (see the module's table).

    Examples
    --------
    >>> import numpy as np
    >>> tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((1, 2, 2), np.float32))
    >>> to_spark_schema(pa.schema({"x": tensor.type, "n": pa.uint8()})).simpleString()
    'struct<x:array<float>,n:smallint>'
    """
    from pyspark.sql import types as T

    return T.StructType(
        [T.StructField(f.name, _spark_type(f.type, repr(f.name)), True) for f in schema]
    )


def spark_arrow_schema(schema: pa.Schema, timezone: str = "UTC") -> pa.Schema:
    """The Arrow schema in which Spark exchanges rows of ``schema`` with Python workers."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(to_spark_schema(schema), timezone=timezone)


def to_spark_batch(batch: pa.RecordBatch, target: pa.Schema, where: str) -> pa.RecordBatch:
    """Cast a feedline batch to Spark's Arrow dialect ``target`` (from :func:`spark_arrow_schema`).

    Raises :class:`SchemaError` naming the column when a batch does not fit the schema that
    was inferred on the driver (a user function returned other columns or types).
    """
    if batch.schema.names != target.names:
        raise SchemaError(
            f"A batch from {where} has columns {batch.schema.names}, but the schema inferred on "
            f"the driver has {target.names}. Fix: make map_batches return the same columns for "
            "every batch, or pass output_schema= to map_batches."
        )
    arrays = []
    for column, field in zip(batch.columns, target, strict=True):
        if isinstance(column.type, pa.BaseExtensionType):
            column = column.storage
        arrays.append(_cast(column, field, where))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def from_spark_batch(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """Cast a batch in Spark's Arrow dialect back to the feedline ``schema`` (exact types)."""
    arrays = []
    for field in schema:
        column = batch.column(field.name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if isinstance(field.type, pa.BaseExtensionType):
            storage = _cast(column, pa.field(field.name, field.type.storage_type), where)
            arrays.append(pa.ExtensionArray.from_storage(field.type, storage))
        else:
            arrays.append(_cast(column, field, where))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _cast(column: pa.Array, field: pa.Field, where: str) -> pa.Array:
    if column.type == field.type:
        return column
    try:
        return column.cast(field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaError(
            f"The column {field.name!r} from {where} has type {column.type}, which does not "
            f"convert to {field.type} ({exc}). Fix: return one type per column from every "
            "batch, or pass output_schema= to map_batches."
        ) from exc
