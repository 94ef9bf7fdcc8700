"""Delta Lake tables at a version or a time, through the ``deltalake`` library (delta-rs).

delta-rs reads the transaction log on the driver: the add actions of the chosen version are
the live files (files removed by a delete, an update or an overwrite are not among them),
with their partition values and statistics. Deletion vectors (rows deleted without rewriting
the file, written by Spark and Databricks) are decoded by delta-rs on the driver and their
rows dropped by position when each file is read; column mapping (physical column names) is
refused with a clear error rather than read wrongly.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, FormatError, MissingDependencyError
from feedline.io.lakehouse.deletes import RowDeletes
from feedline.io.lakehouse.table_files import TableFile, TableSource, all_of, exact_range
from feedline.io.storage.paths import Location, resolve

__all__ = ["delta_source", "deltalake_library"]


def deltalake_library(purpose: str = "fl.read_delta") -> Any:
    """The ``deltalake`` module, or a :class:`MissingDependencyError` naming the extra."""
    try:
        import deltalake
    except ImportError as exc:
        raise MissingDependencyError("deltalake", "delta", purpose) from exc
    return deltalake


def delta_source(
    path: str | os.PathLike[str],
    *,
    version: int | None = None,
    as_of: datetime | str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> TableSource:
    """Plan the live files of the Delta table at ``path`` (latest, ``version`` or ``as_of``).

    Examples
    --------
    >>> import pyarrow as pa, tempfile, deltalake
    >>> root = tempfile.mkdtemp() + "/t"
    >>> deltalake.write_deltalake(root, pa.table({"x": [1, 2]}))
    >>> delta_source(root).snapshot
    'version 0'
    """
    deltalake = deltalake_library()
    if version is not None and as_of is not None:
        raise ConfigurationError(
            f"read_delta({os.fspath(path)!r}) got both version={version!r} and "
            f"as_of={as_of!r}. Fix: pass one of them."
        )
    url = os.fspath(path)
    options = {k: str(v) for k, v in (storage_options or {}).items() if k != "retry"}
    try:
        table = deltalake.DeltaTable(url, storage_options=options or None)
        if version is not None:
            table.load_as_version(int(version))
        elif as_of is not None:
            table.load_as_version(as_of)
    except (deltalake.exceptions.DeltaError, OSError, ValueError) as exc:
        raise FormatError(
            f"Cannot open the Delta table {url!r}"
            + (f" at version {version}" if version is not None else "")
            + (f" as of {as_of}" if as_of is not None else "")
            + f": {exc}. Fix: check the path (a folder holding _delta_log/) and that the "
            "version is still retained (not removed by log cleanup)."
        ) from exc
    pinned = table.version()
    where = f"the Delta table {url!r} at version {pinned}"
    _refuse_unsupported(table, where)
    schema = pa.schema(table.schema().to_arrow())
    base = resolve(url, storage_options)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    deleted = _deleted_positions(table, [row["path"] for row in actions], where)
    files = [_table_file(base, schema, row, deleted.get(row["path"], ())) for row in actions]
    return TableSource("delta", url, f"version {pinned}", schema, files)


def _refuse_unsupported(table: Any, where: str) -> None:
    """Column mapping: refused, never read wrongly."""
    config = table.metadata().configuration or {}
    mode = config.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise FormatError(
            f"{where} uses column mapping (delta.columnMapping.mode={mode!r}): its files store "
            "physical column names feedline does not map. Fix: rewrite the table without "
            "column mapping, or read it with Spark and write Parquet."
        )


def _deleted_positions(table: Any, paths: list[str], where: str) -> dict[str, tuple[int, ...]]:
    """Add-action path -> the row positions its deletion vector deletes (files without one
    are absent). Every deletion vector must name a live file: one that names no file is
    refused rather than ignored."""
    features = table.protocol().reader_features or []
    if "deletionVectors" not in features:
        return {}
    try:
        marked = pa.table(table.deletion_vectors())
    except Exception as exc:  # delta-rs raises its own and Arrow's errors here
        raise FormatError(
            f"{where} has deletion vectors that cannot be read: {exc}. Without them deleted "
            "rows would be read. Fix: check that the table's deletion_vector_*.bin files are "
            "in place, or purge them (Spark: REORG TABLE t APPLY (PURGE)) and read again."
        ) from exc
    root = unquote(table.table_uri).rstrip("/") + "/"
    by_name = {unquote(p): p for p in paths}
    deleted: dict[str, tuple[int, ...]] = {}
    vectors = marked.column("selection_vector").combine_chunks()
    for i, filepath in enumerate(marked.column("filepath").to_pylist()):
        name = unquote(filepath)
        name = name[len(root) :] if name.startswith(root) else name
        path = by_name.get(name)
        if path is None:
            raise FormatError(
                f"{where} has a deletion vector for {filepath!r}, which is not one "
                "of the version's files as feedline named them; it refuses rather than read "
                "deleted rows. Fix: purge the deletion vectors (Spark: REORG TABLE t APPLY "
                "(PURGE)) and read again."
            )
        keep = vectors[i].values.to_numpy(zero_copy_only=False)
        positions = np.flatnonzero(~keep)
        if positions.size:
            deleted[path] = tuple(positions.tolist())
    return deleted


def _table_file(
    base: Location, schema: pa.Schema, row: dict[str, Any], deleted: tuple[int, ...]
) -> TableFile:
    """One add action as a :class:`TableFile`: partition values and exact bounds as its
    guarantee, the positions its deletion vector deletes."""
    rel = row["path"]
    location = resolve(rel) if "://" in rel or rel.startswith("/") else base.child(*rel.split("/"))
    parts: list[pc.Expression | None] = []
    for field in schema:
        key = f"partition.{field.name}"
        if key in row:
            value = row[key]
            column = pc.field(field.name)
            parts.append(
                column.is_null() if value is None else column == pa.scalar(value, field.type)
            )
            continue
        parts.append(
            exact_range(
                field,
                row.get(f"min.{field.name}"),
                row.get(f"max.{field.name}"),
                row.get(f"null_count.{field.name}"),
            )
        )
    records = row.get("num_records")
    return TableFile(
        location=location,
        rows=records - len(deleted) if records is not None else None,
        size=row.get("size_bytes"),
        guarantee=all_of(parts),
        deletes=RowDeletes(positions=deleted),
    )
