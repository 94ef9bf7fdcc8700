"""Iceberg tables at a snapshot, through the ``pyiceberg`` library.

pyiceberg reads the table metadata and the snapshot's manifests on the driver: its
``plan_files`` lists the live data files (with the predicate pushed into manifest pruning
where feedline's own file guarantees allow) and, for each, the position delete files that
apply to it (merge-on-read deletes): the read task drops the rows they name. Equality
deletes and Puffin deletion vectors are refused with a clear error rather than read wrongly;
copy-on-write deletes and overwrites, which replace the data files, read exactly.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, FormatError, MissingDependencyError
from feedline.io.lakehouse.deletes import RowDeletes
from feedline.io.lakehouse.table_files import TableFile, TableSource, all_of, exact_range
from feedline.io.storage.paths import resolve

__all__ = ["iceberg_source"]


def _pyiceberg() -> Any:
    try:
        import pyiceberg.table
    except ImportError as exc:
        raise MissingDependencyError("pyiceberg", "iceberg", "fl.read_iceberg") from exc
    return pyiceberg


def iceberg_source(
    table: Any,
    *,
    snapshot_id: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> TableSource:
    """Plan the live data files of an Iceberg table (a pyiceberg ``Table``, or the path of a
    ``*.metadata.json``) at its current snapshot or ``snapshot_id``.

    Examples
    --------
    >>> import pyarrow as pa, tempfile
    >>> from pyiceberg.catalog.sql import SqlCatalog
    >>> root = tempfile.mkdtemp()
    >>> catalog = SqlCatalog("c", uri=f"sqlite:///{root}/c.db", warehouse=f"file://{root}")
    >>> catalog.create_namespace("ns")
    >>> t = catalog.create_table("ns.t", schema=pa.schema([("x", pa.int64())]))
    >>> t.append(pa.table({"x": [1, 2]}))
    >>> iceberg_source(t).count_rows()
    2
    """
    pyiceberg = _pyiceberg()
    loaded = _load(pyiceberg, table)
    name = _name(loaded, table)
    snapshot = (
        loaded.snapshot_by_id(int(snapshot_id))
        if snapshot_id is not None
        else loaded.current_snapshot()
    )
    if snapshot is None and snapshot_id is not None:
        known = [s.snapshot_id for s in loaded.snapshots()]
        raise ConfigurationError(
            f"The Iceberg table {name} has no snapshot {snapshot_id} (it has {known[-5:]}"
            f"{' …' if len(known) > 5 else ''}). Fix: pass one of its snapshot ids (expired "
            "snapshots cannot be read)."
        )
    schema_obj = loaded.schema()
    if snapshot is not None and snapshot.schema_id is not None:
        schema_obj = loaded.schemas().get(snapshot.schema_id, schema_obj)
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    schema = pa.schema([_narrow(f) for f in schema_to_pyarrow(schema_obj, include_field_ids=False)])
    field_ids = {f.name: f.field_id for f in schema_obj.fields}
    label = "no snapshot (empty)" if snapshot is None else f"snapshot {snapshot.snapshot_id}"
    where = f"the Iceberg table {name} at {label}"
    files: list[TableFile] = []
    if snapshot is not None:
        try:
            tasks = list(loaded.scan(snapshot_id=snapshot.snapshot_id).plan_files())
        except ValueError as exc:
            if "equality delete" not in str(exc):
                raise FormatError(
                    f"Cannot plan {where}: {exc}. Fix: check that its metadata and manifests "
                    "are readable."
                ) from exc
            raise FormatError(
                f"{where} has equality delete files (rows deleted by value, merge-on-read), "
                "which pyiceberg cannot plan and feedline does not apply; it refuses rather "
                "than read deleted rows. Fix: compact the table first (Spark: CALL "
                "system.rewrite_data_files(table => ..., options => map('delete-file-"
                "threshold', '1'))), or read a snapshot from before the deletes."
            ) from exc
        except OSError as exc:
            raise FormatError(
                f"Cannot plan {where}: {exc}. Fix: check that its metadata and manifests "
                "are readable."
            ) from exc
        files = [_table_file(task, schema, schema_obj, where, storage_options) for task in tasks]
    return TableSource("iceberg", name, label, schema, files, field_ids=field_ids)


def _load(pyiceberg: Any, table: Any) -> Any:
    """A pyiceberg table from a ``Table`` or the path of its metadata JSON."""
    if isinstance(table, pyiceberg.table.Table):
        return table
    if isinstance(table, str | os.PathLike):
        location = os.fspath(table)
        try:
            return pyiceberg.table.StaticTable.from_metadata(location)
        except (OSError, ValueError) as exc:
            raise FormatError(
                f"Cannot read the Iceberg metadata {location!r}: {exc}. Fix: pass the path "
                "of the table's current metadata JSON (metadata/NNNNN-….metadata.json) or a "
                "pyiceberg Table (catalog.load_table(...))."
            ) from exc
    raise ConfigurationError(
        f"read_iceberg got {type(table).__name__}. Fix: pass a pyiceberg Table "
        "(catalog.load_table('ns.table')) or the path of its metadata JSON."
    )


def _name(loaded: Any, given: Any) -> str:
    if isinstance(given, str | os.PathLike):
        return repr(os.fspath(given))
    return f"{'.'.join(loaded.name())!r} ({loaded.metadata_location})"


def _narrow(field: pa.Field) -> pa.Field:
    """Large string/binary/list types (pyiceberg's choice) as the plain ones Parquet reads."""
    kind = field.type
    if pa.types.is_large_string(kind):
        kind = pa.string()
    elif pa.types.is_large_binary(kind):
        kind = pa.binary()
    elif pa.types.is_large_list(kind) or pa.types.is_list(kind):
        kind = pa.list_(_narrow(kind.value_field))
    elif pa.types.is_struct(kind):
        kind = pa.struct([_narrow(kind.field(i)) for i in range(kind.num_fields)])
    return field.with_type(kind).remove_metadata()


def _table_file(
    task: Any,
    schema: pa.Schema,
    schema_obj: Any,
    where: str,
    storage_options: dict[str, Any] | None,
) -> TableFile:
    """One planned scan task as a :class:`TableFile`, with the position deletes it needs."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.manifest import FileFormat

    data = task.file
    deletes = _position_deletes(task, where, storage_options)
    if data.file_format != FileFormat.PARQUET:
        raise FormatError(
            f"{where} has a {data.file_format} data file {data.file_path!r}; feedline reads "
            "Iceberg Parquet data files only. Fix: rewrite the table as Parquet."
        )
    lower = data.lower_bounds or {}
    upper = data.upper_bounds or {}
    nulls = data.null_value_counts or {}
    parts: list[pc.Expression | None] = []
    for column in schema_obj.fields:
        fid = column.field_id
        if fid not in lower or fid not in upper:
            continue
        try:
            low = from_bytes(column.field_type, lower[fid])
            high = from_bytes(column.field_type, upper[fid])
            parts.append(exact_range(schema.field(column.name), low, high, nulls.get(fid)))
        except (ValueError, TypeError, KeyError, pa.ArrowException):
            continue  # a bound feedline cannot use: no guarantee from this column
    return TableFile(
        location=resolve(data.file_path, storage_options),
        rows=None if deletes else data.record_count,  # a delete file's count may span files
        size=data.file_size_in_bytes,
        guarantee=all_of(parts),
        deletes=deletes,
    )


def _position_deletes(task: Any, where: str, storage_options: dict[str, Any] | None) -> RowDeletes:
    """The Parquet position delete files that apply to the task's data file; Puffin
    deletion vectors (format v3) and other formats refused."""
    from pyiceberg.manifest import DataFileContent, FileFormat

    files = []
    for delete in sorted(task.delete_files, key=lambda d: d.file_path):
        if delete.content != DataFileContent.POSITION_DELETES:
            raise FormatError(
                f"{where} has a {delete.content} delete file {delete.file_path!r} for "
                f"{task.file.file_path!r}; feedline applies position deletes only and refuses "
                "rather than read deleted rows. Fix: compact the table (Spark: "
                "rewrite_data_files) first."
            )
        if delete.file_format != FileFormat.PARQUET:
            raise FormatError(
                f"{where} has a {delete.file_format} position delete file "
                f"{delete.file_path!r} (for {task.file.file_path!r}); feedline applies Parquet "
                "position delete files only (not Puffin deletion vectors of format v3) and "
                "refuses rather than read deleted rows. Fix: compact the table (Spark: "
                "rewrite_data_files, rewrite_position_delete_files) first."
            )
        files.append(resolve(delete.file_path, storage_options))
    return RowDeletes(files=tuple(files), data_path=task.file.file_path)
