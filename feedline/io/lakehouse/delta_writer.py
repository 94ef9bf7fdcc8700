"""Writing rows as a new version of a Delta table, through ``deltalake.write_deltalake``.

delta-rs writes the Parquet files and commits the version (its log's put-if-absent commit
makes one of two concurrent writers lose rather than both win); feedline hands it the plan's
batches as one Arrow stream and puts the write's lineage in the commit's metadata
(``feedline.lineage``, shown by ``DeltaTable.history()``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from feedline.errors import ConcurrentWriteError, FormatError, SchemaError
from feedline.io.lakehouse.delta import deltalake_library
from feedline.io.lakehouse.table_writes import (
    CountedStream,
    check_append_schema,
    check_mode,
    library_options,
    refuse_existing,
)

__all__ = ["TableWrite", "write_delta_table"]


@dataclass(frozen=True)
class TableWrite:
    """What a table write committed: its version, rows, new files and their bytes."""

    version: int
    rows: int
    files: int
    bytes: int


def write_delta_table(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    path: str | os.PathLike[str],
    *,
    mode: str = "error",
    partition_by: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    lineage: dict[str, Any] | None = None,
) -> TableWrite:
    """Write ``batches`` (of ``schema``) as a new version of the Delta table at ``path``.

    ``mode``: ``"error"`` (the table must not exist), ``"append"`` (same columns and types,
    else :class:`~feedline.errors.SchemaError`) or ``"overwrite"`` (a new version with only
    these rows and this schema; older versions stay readable until vacuumed).

    Examples
    --------
    >>> import tempfile
    >>> batch = pa.record_batch({"x": [1, 2, 3]})
    >>> root = tempfile.mkdtemp() + "/t"
    >>> write_delta_table([batch], batch.schema, root).rows
    3
    >>> write_delta_table([batch], batch.schema, root, mode="append").version
    1
    """
    deltalake = deltalake_library("Dataset.write_delta")
    check_mode(mode, "write_delta")
    url = os.fspath(path)
    options = library_options(storage_options)
    where = f"the Delta table {url!r}"
    before = _existing(deltalake, url, options)
    if before is not None and mode == "error":
        refuse_existing(where, before.version())
    if before is not None and mode == "append":
        existing = pa.schema(before.schema().to_arrow())
        check_append_schema(existing, schema, where)
        schema = pa.schema([schema.field(name) for name in existing.names])
        if partition_by is None:
            partition_by = before.metadata().partition_columns or None
    known = set() if before is None else _file_paths(before)
    stream = CountedStream(schema, batches)
    metadata = {"feedline.lineage": json.dumps(lineage, sort_keys=True)} if lineage else None
    try:
        deltalake.write_deltalake(
            url,
            stream.reader(),
            mode="error" if before is None else mode,
            partition_by=list(partition_by or ()),  # an overwrite: these columns, or none
            schema_mode="overwrite" if mode == "overwrite" and before is not None else None,
            storage_options=options,
            commit_properties=deltalake.CommitProperties(custom_metadata=metadata),
        )
    except deltalake.exceptions.SchemaMismatchError as exc:
        raise SchemaError(
            f"Cannot write the rows to {where}: {exc}. Fix: cast the columns to the table's "
            "types (ds.cast(...)) or write with mode='overwrite'."
        ) from exc
    except deltalake.exceptions.CommitFailedError as exc:
        raise ConcurrentWriteError(
            f"Another writer committed to {where} first: {exc}. Fix: write again (an append "
            "retries cleanly)."
        ) from exc
    except (deltalake.exceptions.DeltaError, OSError, ValueError, pa.ArrowException) as exc:
        raise FormatError(
            f"Cannot write {where}: {exc}. Fix: check the path and that the columns' types "
            "are ones Delta stores (no unsigned integers beyond int64, no extension types)."
        ) from exc
    after = deltalake.DeltaTable(url, storage_options=options)
    added = [
        row for row in pa.table(after.get_add_actions()).to_pylist() if row["path"] not in known
    ]
    return TableWrite(
        version=after.version(),
        rows=stream.rows,
        files=len(added),
        bytes=sum(int(row["size_bytes"]) for row in added),
    )


def _existing(deltalake: Any, url: str, options: dict[str, str] | None) -> Any:
    """The Delta table at ``url``, or ``None`` when there is none."""
    try:
        return deltalake.DeltaTable(url, storage_options=options)
    except deltalake.exceptions.TableNotFoundError:
        return None


def _file_paths(table: Any) -> set[str]:
    return set(pa.table(table.get_add_actions()).column("path").to_pylist())
