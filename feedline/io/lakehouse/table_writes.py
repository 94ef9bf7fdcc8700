"""What the Delta and Lance writers share: the write modes, the schema check of an append,
and the stream of batches handed to the table library (counted, in one schema).

The table libraries write from one Arrow stream on the driver: the plan's batches flow to
it from whichever engine ran them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from feedline.errors import ConfigurationError, SchemaError

__all__ = [
    "TABLE_WRITE_MODES",
    "CountedStream",
    "check_append_schema",
    "check_mode",
    "library_options",
    "refuse_existing",
]

#: ``error``: refuse if the table exists; ``append``: add rows (same columns); ``overwrite``:
#: replace the rows (and the schema) in a new version, the old ones kept for time travel
TABLE_WRITE_MODES = ("error", "append", "overwrite")


def check_mode(mode: str, what: str) -> None:
    """Refuse a ``mode`` that is not one of :data:`TABLE_WRITE_MODES`.

    Examples
    --------
    >>> check_mode("append", "write_delta")
    >>> try:
    ...     check_mode("upsert", "write_delta")
    ... except ConfigurationError as error:
    ...     print(str(error).split(".")[0])
    write_delta(mode='upsert') is not a write mode
    """
    if mode not in TABLE_WRITE_MODES:
        raise ConfigurationError(
            f"{what}(mode={mode!r}) is not a write mode. Fix: pass one of {TABLE_WRITE_MODES}."
        )


def library_options(storage_options: Mapping[str, Any] | None) -> dict[str, str] | None:
    """``storage_options`` as the table libraries take them: strings, without feedline's own
    ``retry`` (``None`` when nothing is left).

    Examples
    --------
    >>> library_options({"region": "eu-west-1", "retry": 3, "timeout": 5})
    {'region': 'eu-west-1', 'timeout': '5'}
    """
    return {k: str(v) for k, v in (storage_options or {}).items() if k != "retry"} or None


def refuse_existing(where: str, version: object) -> None:
    """Raise for ``mode="error"`` on a table that exists (at ``version``).

    Examples
    --------
    >>> refuse_existing("the Delta table 't'", 3)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: the Delta table 't' exists (version 3). Fix: ...
    """
    raise ConfigurationError(
        f"{where} exists (version {version}). Fix: pass mode='append' to add "
        "rows or mode='overwrite' to replace them in a new version."
    )


def _plain(kind: pa.DataType) -> pa.DataType:
    """A type with its large/view variants as the plain ones (what a table library may
    hand back for the type that was written)."""
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_large_list(kind) or pa.types.is_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(_plain(kind.value_type))
    if pa.types.is_struct(kind):
        return pa.struct(
            [kind.field(i).with_type(_plain(kind.field(i).type)) for i in range(kind.num_fields)]
        )
    return kind


def check_append_schema(table: pa.Schema, rows: pa.Schema, where: str) -> None:
    """Refuse to append ``rows`` to a table of schema ``table`` unless they have the same
    columns (in any order) of the same types (string vs large string and the like aside).

    Examples
    --------
    >>> table = pa.schema([("id", pa.int64()), ("s", pa.string())])
    >>> check_append_schema(table, pa.schema([("s", pa.large_string()), ("id", pa.int64())]), "t")
    >>> try:
    ...     check_append_schema(table, pa.schema([("id", pa.int32())]), "the table t")
    ... except SchemaError as error:
    ...     print(str(error).split(" (")[1].split(")")[0])
    missing: ['s']; other types: id: int64 in the table, int32 in the rows
    """
    missing = [f.name for f in table if f.name not in rows.names]
    extra = [f.name for f in rows if f.name not in table.names]
    other = [
        f"{f.name}: {f.type} in the table, {rows.field(f.name).type} in the rows"
        for f in table
        if f.name in rows.names and _plain(f.type) != _plain(rows.field(f.name).type)
    ]
    if not (missing or extra or other):
        return
    parts = [
        f"{label}: {value}"
        for label, value in (("missing", missing), ("not in the table", extra))
        if value
    ]
    if other:
        parts.append("other types: " + ", ".join(other))
    raise SchemaError(
        f"Cannot append to {where}: the columns differ ({'; '.join(parts)}). Fix: select and "
        "cast the columns to the table's schema (ds.select(...), ds.cast(...)) or write with "
        "mode='overwrite' to replace the table."
    )


@dataclass
class CountedStream:
    """The plan's batches as one Arrow stream in ``schema``, counting the rows handed out.

    Examples
    --------
    >>> batch = pa.record_batch({"x": [1, 2]})
    >>> stream = CountedStream(batch.schema, iter([batch, batch]))
    >>> stream.reader().read_all().num_rows, stream.rows
    (4, 4)
    """

    schema: pa.Schema
    batches: Iterable[pa.RecordBatch]
    rows: int = 0

    def reader(self) -> pa.RecordBatchReader:
        """A reader of the batches (each cast to :attr:`schema` where it differs)."""
        return pa.RecordBatchReader.from_batches(self.schema, self._counted())

    def _counted(self) -> Iterator[pa.RecordBatch]:
        for batch in self.batches:
            if not batch.schema.equals(self.schema):
                batch = batch.select(self.schema.names).cast(self.schema)
            self.rows += batch.num_rows
            yield batch
