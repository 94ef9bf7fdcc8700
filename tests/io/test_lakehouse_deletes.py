"""Deleted row positions dropped while a data file is read (feedline.io.lakehouse.deletes):
the right rows across row groups and batches, with row groups pruned by a filter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from feedline.io.lakehouse import deletes
from feedline.io.lakehouse.deletes import RowDeletes, scan_live_rows
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import resolve


def test_positions_across_row_groups_batches_and_pruning(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "data.parquet"
    table = pa.table({"id": pa.array(range(100), pa.int64()), "v": [f"r{i}" for i in range(100)]})
    pq.write_table(table, path, row_group_size=10)
    monkeypatch.setattr(deletes, "SCAN_BATCH_ROWS", 4)  # batches inside row groups too
    # a position delete file naming rows of this file and of another one
    delete_file = tmp_path / "deletes.parquet"
    pq.write_table(
        pa.table({"file_path": ["x", "data", "data"], "pos": pa.array([3, 56, 57], pa.int64())}),
        delete_file,
    )
    found = RowDeletes(positions=(99, 0, 15, 16, 55), files=(resolve(str(delete_file)),),
                       data_path="data")  # fmt: skip
    deleted = found.load()
    assert deleted.tolist() == [0, 15, 16, 55, 56, 57, 99]
    fragment = pads.ParquetFileFormat().make_fragment(str(path), filesystem=pafs.LocalFileSystem())
    report = ExecutionReport()
    got = pa.Table.from_batches(
        scan_live_rows(fragment, table.schema, ["v"], pc.field("id") >= 50, deleted, report)
    )
    want = [f"r{i}" for i in range(50, 100) if i not in set(deleted.tolist())]
    assert got.column_names == ["v"] and got["v"].to_pylist() == want
    assert (report.row_groups_total, report.row_groups_read) == (10, 5)
    everything = scan_live_rows(fragment, table.schema, None, None, np.array([], np.int64), report)
    assert pa.Table.from_batches(everything).equals(table)
    assert RowDeletes(positions=(1,)).fingerprint() != RowDeletes(positions=(2,)).fingerprint()
