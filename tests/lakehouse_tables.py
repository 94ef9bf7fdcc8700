"""Delta, Iceberg and Lance tables written by their own libraries, with known rows per
version (shared by tests/io/test_lakehouse.py and tests/engines/test_lakehouse_engines.py)."""

from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


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


def delta_table_with_deletion_vectors(root: Path) -> tuple[str, dict[int, list[int]]]:
    """A Delta table with deletion vectors, as Spark writes them: v0 ids 0..9 partitioned by
    parity (deltalake, with delta.enableDeletionVectors), v1 deletes ids 2 and 4 through a
    deletion vector on the even file, v2 deletes 8 and 9 (the even file's vector grows, the
    odd file gets one). delta-rs only ever rewrites files on delete, so the v1 and v2 commits
    are written here in the protocol's format (a RoaringBitmapArray in a deletion vector
    file, ``storageType`` ``"p"``). Returns its path and the live ``id`` values per version.
    """
    from deltalake import write_deltalake

    path = str(root / "delta-dv")
    write_deltalake(
        path,
        _rows(range(10)),
        partition_by=["part"],
        configuration={"delta.enableDeletionVectors": "true"},
    )
    _delete_with_vectors(path, 1, {2, 4})
    _delete_with_vectors(path, 2, {2, 4, 8, 9})
    return path, {
        0: list(range(10)),
        1: [0, 1, 3, 5, 6, 7, 8, 9],
        2: [0, 1, 3, 5, 6, 7],
    }


def _delete_with_vectors(path: str, version: int, ids: set[int]) -> None:
    """Commit ``version``: every file holding some of ``ids`` (all deleted so far) gets a
    deletion vector marking their positions."""
    from deltalake import DeltaTable

    table = DeltaTable(path)
    current: dict[str, Any] = {}  # path -> its deletion vector (a remove names it too)
    for entry in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                current[action["add"]["path"]] = action["add"].get("deletionVector")
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "DELETE", "operationParameters": {}}}
    ]
    for add in pa.table(table.get_add_actions(flatten=False)).to_pylist():
        held = pq.read_table(f"{path}/{add['path']}", columns=["id"])["id"].to_pylist()
        positions = [i for i, value in enumerate(held) if value in ids]
        if not positions:
            continue
        vector = _deletion_vector_file(path, version, add["path"], positions)
        partition = add["partition_values"] if "partition_values" in add else add["partition"]
        common = {"path": add["path"], "partitionValues": partition, "size": add["size_bytes"]}
        removed = {**common, "dataChange": True, "deletionTimestamp": now}
        if current.get(add["path"]):
            removed["deletionVector"] = current[add["path"]]
        actions.append({"remove": removed})
        stats = {"numRecords": len(held), "tightBounds": False}
        actions.append(
            {
                "add": {
                    **common,
                    "modificationTime": now,
                    "dataChange": True,
                    "stats": json.dumps(stats),
                    "deletionVector": vector,
                }
            }
        )
    log = Path(path) / "_delta_log" / f"{version:020d}.json"
    log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _deletion_vector_file(
    path: str, version: int, data_file: str, positions: list[int]
) -> dict[str, Any]:
    """Write a deletion vector file (format version 1, one RoaringBitmapArray of one 32-bit
    bitmap, its size and CRC-32 big-endian) and return the descriptor naming it."""
    from pyroaring import BitMap

    bitmap = BitMap(positions).serialize()
    data = struct.pack("<iqI", 1681511377, 1, 0) + bitmap  # magic, 1 bitmap, key 0
    blob = b"\x01" + struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    name = Path(path) / f"deletion_vector_v{version}_{data_file.replace('/', '_')}.bin"
    name.write_bytes(blob)
    return {
        "storageType": "p",
        "pathOrInlineDv": name.resolve().as_uri(),
        "offset": 1,
        "sizeInBytes": len(data),
        "cardinality": len(positions),
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


def iceberg_table_with_position_deletes(root: Path) -> tuple[Any, dict[int, list[int]]]:
    """An Iceberg table with merge-on-read position deletes: two appends (ids 0..4, 5..9,
    one data file each), then a snapshot adding a position delete file for ids 1, 3 and 8
    (rows of both data files), then one adding a second delete file for id 0. pyiceberg
    writes no position deletes (its ``delete`` copies on write), so the delete files are
    written here in the spec's layout (``file_path``, ``pos`` with their reserved field ids)
    and committed through pyiceberg's snapshot producer in a delete manifest. Returns the
    table and the live ``id`` values per snapshot id."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("p", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.moR", schema=_rows(range(0)).schema)
    live: dict[int, list[int]] = {}
    table.append(_rows(range(0, 5)))
    live[table.current_snapshot().snapshot_id] = list(range(5))
    table.append(_rows(range(5, 10)))
    live[table.current_snapshot().snapshot_id] = list(range(10))
    _commit_position_deletes(table, root / "deletes-1.parquet", {1, 3, 8})
    live[table.current_snapshot().snapshot_id] = [0, 2, 4, 5, 6, 7, 9]
    _commit_position_deletes(table, root / "deletes-2.parquet", {0})
    live[table.current_snapshot().snapshot_id] = [2, 4, 5, 6, 7, 9]
    return catalog.load_table("ns.moR"), live


def _commit_position_deletes(table: Any, path: Path, ids: set[int]) -> None:
    """Write one position delete file naming the rows of ``ids`` in the table's data files
    and commit it (a delete manifest) as a new snapshot."""
    from pyiceberg.manifest import (
        DataFile,
        DataFileContent,
        FileFormat,
        ManifestContent,
        ManifestWriterV2,
    )
    from pyiceberg.typedef import Record

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    rows: list[tuple[str, int]] = []
    for task in table.scan().plan_files():
        held = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["id"])
        rows += [(task.file.file_path, i) for i, v in enumerate(held["id"].to_pylist()) if v in ids]
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), False, {"PARQUET:field_id": "2147483546"}),
            pa.field("pos", pa.int64(), False, {"PARQUET:field_id": "2147483545"}),
        ]
    )
    deleted = pa.Table.from_pylist([{"file_path": f, "pos": p} for f, p in rows], schema)
    pq.write_table(deleted, path)
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path.as_uri(),
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(rows),
        file_size_in_bytes=path.stat().st_size,
    )
    delete.spec_id = table.spec().spec_id
    with (
        table.transaction() as transaction,
        transaction.update_snapshot().fast_append() as append,
    ):
        append.new_manifest_writer = lambda spec: DeleteManifestWriter(
            spec, append.schema(), append.new_manifest_output(), append._snapshot_id,
            append._compression,
        )  # fmt: skip
        append.append_data_file(delete)


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
