"""Checking ``read_csv``'s options before any file is opened."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from feedline.errors import ConfigurationError, SchemaError

__all__ = ["check_delimiter", "check_null_values", "with_types"]


def check_delimiter(delimiter: Any) -> None:
    """A ``ConfigurationError`` unless ``delimiter`` is one ASCII character pyarrow can split on.

    Examples
    --------
    >>> check_delimiter("::")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: delimiter='::' cannot be used to read CSV: ...
    """
    if (
        not isinstance(delimiter, str)
        or len(delimiter) != 1
        or not delimiter.isascii()
        or delimiter in '\r\n"'
    ):
        raise ConfigurationError(
            f"delimiter={delimiter!r} cannot be used to read CSV: it must be one ASCII "
            "character other than a quote or a line break. Fix: pass e.g. ',', ';', '|' or "
            "'\\t'; for a separator of several characters such as '::', rewrite the file with "
            "a single one first (e.g. sed 's/::/\\t/g') and read it with delimiter='\\t'."
        )


def check_null_values(values: Any) -> list[str] | None:
    """``null_values`` as a list of strings (one string is a list of one), or ``None``.

    Examples
    --------
    >>> check_null_values("NA"), check_null_values(None)
    (['NA'], None)
    """
    if values is None:
        return None
    items = [values] if isinstance(values, str) else list(values)
    if not all(isinstance(v, str) for v in items):
        raise ConfigurationError(
            f"null_values={values!r} must be a list of strings. Fix: e.g. null_values=['', 'NA']."
        )
    return items


def with_types(schema: pa.Schema, column_types: Mapping[str, pa.DataType]) -> pa.Schema:
    """``schema`` with the types of ``column_types`` put in (every name must be in it).

    Examples
    --------
    >>> with_types(pa.schema({"a": pa.int64(), "b": pa.int64()}), {"b": pa.string()}).types
    [DataType(int64), DataType(string)]
    """
    unknown = [c for c in column_types if schema.get_field_index(c) < 0]
    if unknown:
        raise SchemaError(
            f"column_types names column(s) {unknown} that are not in the given schema (its "
            f"columns: {schema.names}). Fix: check the spelling, or drop them from column_types."
        )
    for name, kind in column_types.items():
        i = schema.get_field_index(name)
        schema = schema.set(i, schema.field(i).with_type(kind))
    return schema
