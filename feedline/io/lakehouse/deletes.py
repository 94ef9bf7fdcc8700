"""Rows deleted without rewriting their data file, removed by row position while it is read.

Delta deletion vectors are decoded on the driver (delta-rs reads them with the log) and
travel with the read task as the deleted positions; Iceberg position delete files are named
by the plan and read by the task on the worker (they can be large, and one may serve many
data files). Either way a data file with deletes is read row group by row group in file
order, so each row's position is known: the deleted positions are dropped first, then the
filter and the column list are applied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location

__all__ = ["RowDeletes", "scan_live_rows"]

#: rows per batch handed downstream
SCAN_BATCH_ROWS = 64 * 1024


@dataclass(frozen=True)
class RowDeletes:
    """The rows of one data file that a snapshot deleted without rewriting it.

    Attributes
    ----------
    positions:
        Deleted row positions (0-based, in file order) known when planning (Delta deletion
        vectors).
    files:
        Iceberg position delete files (Parquet, columns ``file_path`` and ``pos``) that may
        name rows of this data file.
    data_path:
        The data file's path as the delete files name it in ``file_path``.

    Examples
    --------
    >>> deletes = RowDeletes(positions=(3, 1))
    >>> bool(deletes), deletes.load().tolist()
    (True, [1, 3])
    >>> bool(RowDeletes())
    False
    """

    positions: tuple[int, ...] = ()
    files: tuple[Location, ...] = ()
    data_path: str = ""

    def __bool__(self) -> bool:
        return bool(self.positions or self.files)

    def fingerprint(self) -> str:
        """A digest of what is deleted (the same file reads other rows under other deletes)."""
        digest = hashlib.sha256()
        digest.update(np.asarray(sorted(self.positions), dtype=np.int64).tobytes())
        for location in self.files:
            digest.update(location.url.encode() + b"\0")
        return digest.hexdigest()[:16]

    def load(self) -> np.ndarray:
        """The deleted positions, sorted and unique (reads the position delete files)."""
        parts = [np.asarray(self.positions, dtype=np.int64)]
        for location in self.files:
            table = pq.read_table(
                location.path,
                filesystem=location.arrow_filesystem(),
                columns=["pos"],
                filters=pc.field("file_path") == self.data_path,
            )
            parts.append(table.column("pos").to_numpy().astype(np.int64, copy=False))
        return np.unique(np.concatenate(parts))


def scan_live_rows(
    fragment: pads.ParquetFileFragment,
    schema: pa.Schema,
    columns: Sequence[str] | None,
    predicate: pc.Expression | None,
    deleted: np.ndarray,
    report: ExecutionReport,
) -> Iterator[pa.RecordBatch]:
    """The rows of ``fragment`` whose positions are not in ``deleted`` (sorted), then
    filtered by ``predicate`` and projected to ``columns``.

    Row groups that the statistics rule out are skipped (their positions are known from the
    footer). Arrow's errors pass through: the caller says what the file is.
    """
    groups = fragment.row_groups
    starts: dict[int, int] = {}
    offset = 0
    for group in groups:
        starts[group.id] = offset
        offset += group.num_rows
    kept = groups
    if predicate is not None:
        kept = fragment.subset(filter=predicate, schema=schema).row_groups
    report.add(
        files_read=1,
        row_groups_total=len(groups),
        row_groups_read=len(kept),
        row_groups_skipped=len(groups) - len(kept),
    )
    for group in kept:
        start = starts[group.id]
        piece = fragment.subset(row_group_ids=[group.id])
        for batch in piece.to_batches(schema=schema, batch_size=SCAN_BATCH_ROWS, use_threads=False):
            report.add(rows_read=batch.num_rows, bytes_read=batch.nbytes)
            live = _without(batch, start, deleted)
            start += batch.num_rows
            table = pa.Table.from_batches([live], schema=schema)
            if predicate is not None:
                table = table.filter(predicate)
            if columns is not None:
                table = table.select(list(columns))
            yield from table.to_batches()


def _without(batch: pa.RecordBatch, start: int, deleted: np.ndarray) -> pa.RecordBatch:
    """``batch`` (rows ``start`` .. ``start + len``) less the rows at ``deleted``."""
    low, high = np.searchsorted(deleted, [start, start + batch.num_rows])
    if low == high:
        return batch
    keep = np.ones(batch.num_rows, dtype=bool)
    keep[deleted[low:high] - start] = False
    return batch.filter(pa.array(keep))
