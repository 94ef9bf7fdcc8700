"""Delta, Iceberg and Lance tables written by their own libraries, with known rows per
version (shared by tests/io/test_lakehouse.py and tests/engines/test_lakehouse_engines.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa


def delta_table(root: Path) -> tuple[str, dict[int, list[int]]]:
    """A partitioned Delta table: v0 ids 0..5, v1 appends 6..9, v2 deletes ids 2 and 7
    (deltalake rewrites the files holding them, it writes no deletion vectors), v3 appends
    10..11. Returns its path and the
    live ``id`` values per version."""
    from deltalake import DeltaTable, write_deltalake

    path = str(root / "delta")
    write_deltalake(path, _rows(range(0, 6)), partition_by=["part"])
    write_deltalake(path, _rows(range(6, 10)), mode="append", partition_by=["part"])
    DeltaTable(path).delete("id = 2 OR id = 7")
    write_deltalake(path, _rows(range(10, 12)), mode="append", partition_by=["part"])
    return path, {
        0: list(range(6)),
        1: list(range(10)),
        2: [0, 1, 3, 4, 5, 6, 8, 9],
        3: [0, 1, 3, 4, 5, 6, 8, 9, 10, 11],
    }


def iceberg_table(root: Path) -> tuple[Any, dict[int, list[int]]]:
    """An Iceberg table in a SQLite-backed SqlCatalog: two appends, then a (copy-on-write)
    delete of the ids below 2. Returns the table and the live ``id`` values per snapshot
    id."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}")
    catalog.create_namespace("ns")
    schema = _rows(range(0)).schema
    table = catalog.create_table("ns.events", schema=schema)
    live: dict[int, list[int]] = {}
    table.append(_rows(range(0, 5)))
    live[table.current_snapshot().snapshot_id] = list(range(5))
    table.append(_rows(range(5, 8)))
    live[table.current_snapshot().snapshot_id] = list(range(8))
    table.delete("id < 2")
    table = catalog.load_table("ns.events")
    live[table.current_snapshot().snapshot_id] = list(range(2, 8))
    return table, live


def lance_dataset(root: Path) -> tuple[str, dict[int, list[int]]]:
    """A Lance dataset: v1 ids 0..4, v2 appends 5..7 (a second fragment), v3 deletes id 3
    (a deletion file). Returns its path and the live ``id`` values per version."""
    import lance

    path = str(root / "events.lance")
    lance.write_dataset(_rows(range(0, 5)), path)
    lance.write_dataset(_rows(range(5, 8)), path, mode="append")
    lance.dataset(path).delete("id = 3")
    return path, {1: list(range(5)), 2: list(range(8)), 3: [0, 1, 2, 4, 5, 6, 7]}


def _rows(ids: range) -> pa.Table:
    values = list(ids)
    return pa.table(
        {
            "id": pa.array(values, pa.int64()),
            "part": pa.array(["even" if i % 2 == 0 else "odd" for i in values], pa.string()),
            "score": pa.array([i / 10 for i in values], pa.float64()),
        }
    )
