"""The live Parquet files of a table snapshot, read as a :class:`~feedline.io.source.Source`.

Delta and Iceberg plan a snapshot's files on the driver (their libraries read the log or the
manifests); what reaches the engines is a list of :class:`TableFile` and a schema, so the read
tasks are plain Parquet reads that pickle and run anywhere. Each file carries a *guarantee*,
a pyarrow expression true of all its rows (partition values, exact min/max of integer columns
without nulls): Arrow drops the files a predicate rules out, fills partition columns that the
file does not store, casts stored types to the table's and fills columns a file lacks with
nulls (schema evolution by adding columns).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from feedline.errors import DataError, FormatError
from feedline.io.lakehouse.deletes import RowDeletes, scan_live_rows
from feedline.io.parquet import scan_fragment
from feedline.io.source import (
    ExecutionReport,
    ReadFn,
    ReadTask,
    Source,
    check_columns,
    fingerprint_of,
)
from feedline.io.storage.paths import Location

__all__ = ["TableFile", "TableSource", "exact_range"]

#: page checksums (CRC-32), where a file has them, are verified on every read
_FORMAT = pads.ParquetFileFormat(
    default_fragment_scan_options=pads.ParquetFragmentScanOptions(page_checksum_verification=True)
)
#: rows per batch handed downstream
SCAN_BATCH_ROWS = 64 * 1024
#: types whose min/max statistics are exact in Delta and Iceberg (strings and timestamps may
#: be truncated there, floats have NaN): only these become file guarantees
_EXACT_STATS = (pa.types.is_integer, pa.types.is_date)


@dataclass(frozen=True)
class TableFile:
    """One live data file of a snapshot.

    Attributes
    ----------
    location:
        Where the Parquet file is.
    rows:
        Its number of rows per the table's metadata, or ``None``.
    size:
        Its size in bytes per the table's metadata, or ``None``.
    guarantee:
        An expression true of every row of the file (partition values, exact bounds), or
        ``None``.
    deletes:
        Rows the snapshot deleted without rewriting the file (Delta deletion vectors,
        Iceberg position deletes), dropped by position when the file is read.
    """

    location: Location
    rows: int | None = None
    size: int | None = None
    guarantee: pc.Expression | None = None
    deletes: RowDeletes = dataclasses.field(default_factory=RowDeletes)


def exact_range(
    field: pa.Field, low: object, high: object, nulls: int | None
) -> pc.Expression | None:
    """``low <= field <= high`` when that is exact: an integer or date column, both bounds
    known and no nulls (``nulls == 0``); else ``None``.

    Examples
    --------
    >>> str(exact_range(pa.field("x", pa.int64()), 1, 5, 0))
    '((x >= 1) and (x <= 5))'
    >>> exact_range(pa.field("x", pa.int64()), 1, 5, None) is None
    True
    >>> exact_range(pa.field("s", pa.string()), "a", "b", 0) is None
    True
    """
    if nulls != 0 or low is None or high is None:
        return None
    if not any(check(field.type) for check in _EXACT_STATS):
        return None
    column = pc.field(field.name)
    return (column >= pa.scalar(low, field.type)) & (column <= pa.scalar(high, field.type))


def all_of(parts: Sequence[pc.Expression | None]) -> pc.Expression | None:
    """The conjunction of the non-``None`` ``parts`` (``None`` when there are none)."""
    kept = [p for p in parts if p is not None]
    if not kept:
        return None
    result = kept[0]
    for part in kept[1:]:
        result = result & part
    return result


class TableSource(Source):
    """The live files of one table snapshot, one read task per file.

    Parameters
    ----------
    kind:
        ``"delta"`` or ``"iceberg"`` (shown by ``explain()`` and in the lineage).
    table:
        The table as the user named it.
    snapshot:
        The pinned snapshot, e.g. ``"version 3"`` (part of :meth:`describe` and the
        fingerprint, so a written dataset's lineage names it).
    schema:
        The table's schema at that snapshot (Arrow types).
    files:
        The snapshot's live files.
    field_ids:
        Iceberg: column name -> field id; a file whose Parquet field ids name the column
        differently (a renamed column) is refused rather than read as nulls.
    """

    prunes_with_predicate = True

    def __init__(
        self,
        kind: str,
        table: str,
        snapshot: str,
        schema: pa.Schema,
        files: Sequence[TableFile],
        field_ids: Mapping[str, int] | None = None,
    ) -> None:
        self.kind = kind
        self._table = table
        self._snapshot = snapshot
        self._schema = schema.remove_metadata()
        self._schema = pa.schema([f.remove_metadata() for f in self._schema])
        self._files = list(files)
        self._field_ids = dict(field_ids) if field_ids is not None else None

    @property
    def snapshot(self) -> str:
        """The pinned snapshot, e.g. ``"version 3"`` or ``"snapshot 6214…"``."""
        return self._snapshot

    @property
    def files(self) -> list[TableFile]:
        """The snapshot's live files, in the table's order."""
        return list(self._files)

    def schema(self) -> pa.Schema:
        return self._schema

    def describe(self) -> str:
        return f"{self.kind}: {self._table} @ {self._snapshot} ({len(self._files):,} files)"

    def table_snapshot(self) -> dict[str, str] | None:
        return {"kind": self.kind, "table": self._table, "snapshot": self._snapshot}

    def fingerprint(self) -> str:
        return fingerprint_of(
            self.kind,
            self._table,
            self._snapshot,
            *[(f.location.url, f.size, f.rows, f.deletes.fingerprint()) for f in self._files],
        )

    def count_rows(self) -> int | None:
        rows = [f.rows for f in self._files]
        if any(r is None for r in rows):
            return None
        return int(sum(r for r in rows if r is not None))

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        if columns is not None:
            check_columns(self._schema, columns, f"the table {self.describe()}")
        files = self._files
        if predicate is not None and files:
            files = _pruned(files, self._schema, predicate)
        where = self.describe()
        return [
            ReadTask(
                label=f.location.url,
                read=_file_reader(f, self._schema, columns, predicate, self._field_ids, where),
                estimated_bytes=f.size,
            )
            for f in files
        ]


def _fragment(file: TableFile) -> pads.ParquetFileFragment:
    loc = file.location
    return _FORMAT.make_fragment(
        loc.path,
        filesystem=loc.arrow_filesystem(),
        partition_expression=file.guarantee if file.guarantee is not None else pc.scalar(True),
    )


def _pruned(
    files: Sequence[TableFile], schema: pa.Schema, predicate: pc.Expression
) -> list[TableFile]:
    """The files whose guarantee does not rule ``predicate`` out (Arrow's simplification,
    on fragments that are never opened)."""
    nowhere = pafs.LocalFileSystem()
    guarded = {
        f"/guarantee/{i}": _FORMAT.make_fragment(
            f"/guarantee/{i}", filesystem=nowhere, partition_expression=f.guarantee
        )
        for i, f in enumerate(files)
        if f.guarantee is not None
    }
    if not guarded:
        return list(files)
    dataset = pads.FileSystemDataset(list(guarded.values()), schema, _FORMAT, nowhere)
    kept = {fragment.path for fragment in dataset.get_fragments(filter=predicate)}
    return [f for i, f in enumerate(files) if f.guarantee is None or f"/guarantee/{i}" in kept]


def _check_field_ids(
    file_schema: pa.Schema, field_ids: Mapping[str, int], url: str, where: str
) -> None:
    """Refuse a file whose Parquet field ids name a table column differently (renamed)."""
    stored = {}
    for field in file_schema:
        raw = (field.metadata or {}).get(b"PARQUET:field_id")
        if raw is not None:
            stored[int(raw)] = field.name
    for name, field_id in field_ids.items():
        other = stored.get(field_id)
        if other is not None and other != name:
            raise FormatError(
                f"The data file {url!r} of {where} stores column {name!r} (field id "
                f"{field_id}) as {other!r}: the column was renamed, which feedline does not "
                "map. Fix: rewrite the table's data files (e.g. a full overwrite) or read a "
                "snapshot from before the rename."
            )


def _deleted_rows(file: TableFile, where: str) -> np.ndarray:
    """The positions deleted in ``file``: its deletion vector, its position delete files."""
    try:
        return file.deletes.load()
    except (OSError, KeyError, pa.ArrowException) as exc:
        names = [d.url for d in file.deletes.files]
        raise DataError(
            f"Cannot read the position delete files {names} of {where} (for the data file "
            f"{file.location.url!r}): {exc}. Without them deleted rows would be read. Fix: "
            "check that the table's delete files are in place and readable (or read another "
            "snapshot)."
        ) from exc


def _file_reader(
    file: TableFile,
    schema: pa.Schema,
    columns: Sequence[str] | None,
    predicate: pc.Expression | None,
    field_ids: Mapping[str, int] | None,
    where: str,
) -> ReadFn:
    """A read task's function: the file's rows, in the table's schema."""

    def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
        url = file.location.url
        try:
            fragment = _fragment(file)
            if field_ids is not None:
                _check_field_ids(fragment.physical_schema, field_ids, url, where)
            fragment.ensure_complete_metadata()
            if file.deletes:
                deleted = _deleted_rows(file, where)
                yield from scan_live_rows(fragment, schema, columns, predicate, deleted, report)
                return
            total = fragment.num_row_groups
            yield from scan_fragment(fragment, total, schema, columns, predicate, report)
        except FileNotFoundError as exc:
            raise DataError(
                f"The data file {url!r} of {where} is gone: {exc}. The snapshot's files were "
                "removed (a vacuum or expire_snapshots). Fix: read a retained snapshot, or "
                "keep the files while this read runs."
            ) from exc
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"Cannot read the data file {url!r} of {where}: {exc}. It is corrupt, "
                "truncated or not in the table's schema. Fix: repair the table (or read "
                "another snapshot)."
            ) from exc

    return read
