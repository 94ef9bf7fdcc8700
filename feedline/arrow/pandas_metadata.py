"""Keeping the ``pandas`` schema metadata of a table true to its columns.

``pyarrow.Table.from_pandas`` stores how to rebuild the DataFrame (index, column dtypes such
as pandas' ``str``, ``Int64`` or time zones) under the schema metadata key ``b"pandas"``, and
``to_pandas`` / ``pandas.read_parquet`` obey it. Arrow operations carry schema metadata along
unchanged, so after a transform replaced a string column by token ids the metadata still says
``str``, and reading the result fails (``Unsupported cast from fixed_size_list<item: int32>[8]
to large_utf8``) or turns integers into strings.

:func:`valid_pandas_schema` keeps what is still true of the current columns and drops the rest:

- a column's entry stays when the column still exists with the pandas type its Arrow type
  gives (``pyarrow.pandas_compat.get_logical_type``), its time zone, decimal precision and
  scale are unchanged, and its pandas dtype still converts from the Arrow type;
- an index stored as a column stays while that column does (a range index is checked by
  pyarrow against the row count on read);
- if nothing useful remains, or the result still does not convert, the key is removed.

Writers apply it to the schema they store (shards and manifest); ``Dataset.to_arrow`` to the
table it returns.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

__all__ = ["PANDAS_KEY", "valid_pandas_schema"]

PANDAS_KEY = b"pandas"
_NUMPY_TYPES = frozenset(
    {"bool", "object", "float16", "float32", "float64", "int8", "int16", "int32", "int64"}
    | {"uint8", "uint16", "uint32", "uint64"}
)


def valid_pandas_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its ``pandas`` metadata pruned to what still describes its columns.

    Examples
    --------
    >>> import pandas as pd
    >>> schema = pa.Schema.from_pandas(pd.DataFrame({"a": ["x"], "b": [1]}), preserve_index=False)
    >>> tokens = schema.set(0, pa.field("a", pa.list_(pa.int32(), 2)))  # "a" was replaced
    >>> [c["name"] for c in valid_pandas_schema(tokens).pandas_metadata["columns"]]
    ['b']
    >>> valid_pandas_schema(schema).equals(schema, check_metadata=True)
    True
    """
    metadata = schema.metadata or {}
    if PANDAS_KEY not in metadata:
        return schema
    try:
        document = json.loads(metadata[PANDAS_KEY])
        kept = _pruned(document, schema)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        kept = None  # unreadable metadata: drop it
    if kept is not None and not _converts(schema, kept):
        kept = None
    if kept == document:
        return schema
    rest = {k: v for k, v in metadata.items() if k != PANDAS_KEY}
    if kept is not None:
        rest[PANDAS_KEY] = json.dumps(kept).encode()
    return schema.with_metadata(rest) if rest else schema.remove_metadata()


def _pruned(document: dict[str, Any], schema: pa.Schema) -> dict[str, Any] | None:
    """The pandas metadata ``document`` without its entries that ``schema`` contradicts."""
    columns = [c for c in document["columns"] if _entry_holds(c, schema)]
    kept_names = {c.get("field_name", c.get("name")) for c in columns}
    index = [i for i in document.get("index_columns", []) if isinstance(i, dict) or i in kept_names]
    stored_index = {i for i in index if isinstance(i, str)}
    if not index and not any(
        c.get("field_name", c.get("name")) not in stored_index for c in columns
    ):
        return None
    if len(columns) == len(document["columns"]) and index == document.get("index_columns", []):
        return document
    return document | {"columns": columns, "index_columns": index}


def _entry_holds(entry: dict[str, Any], schema: pa.Schema) -> bool:
    """True when the column entry ``entry`` still describes its column in ``schema``."""
    from pyarrow.pandas_compat import get_logical_type

    name = entry.get("field_name", entry.get("name"))
    if not isinstance(name, str) or schema.get_field_index(name) < 0:
        return False
    kind = schema.field(name).type
    if entry.get("pandas_type") != get_logical_type(kind):
        return False
    extra = entry.get("metadata") or {}
    if pa.types.is_timestamp(kind) and "timezone" in extra:
        return extra["timezone"] == kind.tz
    if pa.types.is_decimal(kind) and "precision" in extra:
        return (extra["precision"], extra.get("scale")) == (kind.precision, kind.scale)
    if entry.get("numpy_type") in _NUMPY_TYPES:
        return True  # a NumPy dtype: nothing to convert beyond what the pandas type says
    return _converts(pa.schema([schema.field(name)]), {"columns": [entry], "index_columns": []})


def _converts(schema: pa.Schema, document: dict[str, Any]) -> bool:
    """True when a row of nulls of ``schema`` with pandas metadata ``document`` converts.

    (A row, not an empty table: pandas skips the conversion of empty columns.)
    """
    document = {"column_indexes": [], **document}
    try:
        fields = [f.with_nullable(True) for f in schema]
        row = pa.Table.from_arrays(
            [pa.nulls(1, f.type) for f in fields],
            schema=pa.schema(fields, {PANDAS_KEY: json.dumps(document).encode()}),
        )
        row.to_pandas()
    except Exception:  # noqa: BLE001 - any failure means the metadata does not fit
        return False
    return True
