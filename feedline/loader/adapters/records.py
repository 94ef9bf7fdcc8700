"""Serving records as loader tensors: the loader's own conversion, applied to one record.

A record (a dict, e.g. from ``preprocessor.transform_record``) is turned into an Arrow batch
with the dataset's column types and then through exactly the functions the loader's cache
and streaming reader use (:func:`~feedline.loader.data.columns.column_specs`,
:func:`~feedline.loader.data.columns.chunk_to_numpy`,
:func:`~feedline.loader.data.memory_cache.take_rows`,
:func:`~feedline.loader.data.memory_cache.as_batch_value`,
:func:`~feedline.loader.adapters.formats.to_format`),
so a served row gets the dtypes, shapes and values a training batch row had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.loader.adapters.formats import FORMATS, to_format
from feedline.loader.data.columns import ColumnSpec, chunk_to_numpy, column_specs
from feedline.loader.data.memory_cache import as_batch_value, take_rows

__all__ = ["record_to_tensors"]


def _column(values: list[Any], field: pa.Field, spec: ColumnSpec) -> pa.Array:
    """``values`` (one per record) as an Arrow array of ``field``'s type."""
    kind = field.type
    storage = kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind
    if spec.kind != "tensor":
        return pa.array(values, type=storage)
    size = int(np.prod(spec.shape, dtype=np.int64))
    flat, nulls = [], []
    for i, value in enumerate(values):
        arr = np.zeros(size) if value is None else np.asarray(value)
        if arr.size != size:
            raise SchemaError(
                f"Record {i}: column {field.name!r} holds {arr.size} values (shape {arr.shape}); "
                f"the dataset stores {size} per row (shape {spec.shape}). Fix: pass the record "
                "the dataset's preprocessor returned (fl.open(path).preprocessor."
                "transform_record(raw))."
            )
        flat.append(arr.reshape(-1))
        nulls.append(value is None)
    joined = pa.array(np.concatenate(flat) if flat else np.zeros(0), type=storage.value_type)
    mask = pa.array(nulls, type=pa.bool_()) if any(nulls) else None
    return pa.FixedSizeListArray.from_arrays(joined, size, mask=mask)


def record_to_tensors(
    record: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    schema: pa.Schema,
    *,
    format: str = "torch",  # noqa: A002 - the loader's name for it
    columns: Sequence[str] | None = None,
    strings: str = "raise",
) -> dict[str, Any]:
    """A transformed record (or list of them) as the batch the loader would yield for it.

    The result is a batch of ``len(records)`` rows (one for a single record), keyed by
    column, with the dtypes and per-row shapes of ``Loader(..., format=format)``: row ``i``
    of it equals a loader batch's row for the same data. Tensor columns accept the flat list
    ``transform_record`` returns, nested lists or NumPy arrays of the right size.

    Parameters
    ----------
    record:
        A dict (or a list of dicts) of column values, e.g. from
        ``fl.open(path).preprocessor.transform_record(raw)``.
    schema:
        The dataset's schema (``fl.open(path).schema()``): it fixes every column's type.
    format:
        ``"torch"``, ``"numpy"`` or ``"tf"`` (the loader's ``format``).
    columns:
        Columns to convert (default: the schema's columns the record has; serving records
        usually lack the label). Keys the schema does not have are refused unless
        ``columns`` leaves them out.
    strings:
        As the loader's ``strings``: ``"raise"`` refuses string columns, ``"list"`` gives a
        Python list.

    Raises
    ------
    SchemaError
        A key not in the schema, a requested column missing from a record, a tensor of the
        wrong size, or a type the loader cannot turn into a tensor.
    DataError
        A null, or a value that does not fit the column's type.

    Examples
    --------
    >>> import pyarrow as pa
    >>> schema = pa.schema({"x": pa.float32(), "tokens": pa.list_(pa.int32(), 3)})
    >>> out = record_to_tensors({"x": 0.5, "tokens": [7, 8, 0]}, schema, format="numpy")
    >>> out["x"].dtype, out["tokens"].shape, out["tokens"].dtype
    (dtype('float32'), (1, 3), dtype('int32'))
    """
    if format not in FORMATS:
        raise ConfigurationError(
            f"record_to_tensors: format={format!r} is not one of {FORMATS}. Fix: pass the "
            "loader's format."
        )
    records = [record] if isinstance(record, Mapping) else list(record)
    if not all(isinstance(r, Mapping) for r in records):
        raise ConfigurationError(
            f"record_to_tensors takes a dict or a list of dicts, got {type(record).__name__}. "
            "Fix: pass the dict transform_record returned."
        )
    if columns is None:
        unknown = sorted({str(k) for r in records for k in r} - set(schema.names))
        if unknown:
            raise SchemaError(
                f"record_to_tensors: key(s) {unknown} are not columns of the dataset "
                f"({schema.names}). Fix: pass columns=[...] naming the ones to convert."
            )
        present = {k for r in records for k in r}
        columns = [name for name in schema.names if name in present]
    specs = column_specs(schema, columns, strings=strings, widen_unsigned=format == "torch")
    batch: dict[str, Any] = {}
    for spec in specs:
        missing = [i for i, r in enumerate(records) if spec.name not in r]
        if missing:
            raise SchemaError(
                f"record_to_tensors: record {missing[0]} has no {spec.name!r}. Fix: add it, or "
                "leave it out with columns=[...]."
            )
        field = schema.field(spec.name)
        where = f"the record's column {spec.name!r}"
        try:
            array = _column([r[spec.name] for r in records], field, spec)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise DataError(
                f"record_to_tensors: {where} does not fit the dataset's type {field.type}: "
                f"{exc}. Fix: pass the record the dataset's preprocessor returned."
            ) from exc
        values = chunk_to_numpy(array, spec, where)
        rows = np.arange(len(records))  # gathered like a batch: a fresh, writable array
        batch[spec.name] = as_batch_value(take_rows(values, rows, None, spec.name))
    return to_format(batch, format)
