"""``Dataset.write_delta`` / ``write_lance``: a round trip through the table's own library,
the modes (error, append, overwrite: a new version each, the old ones readable), an append of
other columns refused with a SchemaError naming them, the lineage (with the snapshot of a
table read in) in the commit."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lakehouse_tables import delta_table_with_deletion_vectors, iceberg_table_with_position_deletes

import feedline as fl
from feedline.errors import ConfigurationError, SchemaError


def ids(table: pa.Table) -> list[int]:
    return sorted(table["id"].to_pylist())


def test_write_delta_round_trip_modes_and_lineage(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    pytest.importorskip("pyroaring")
    source, live = delta_table_with_deletion_vectors(tmp_path)
    out = str(tmp_path / "out")
    info = fl.read_delta(source, version=1).write_delta(out, partition_by=["part"])
    assert (info.rows, info.report["table_version"]) == (len(live[1]), 0)
    assert info.shards == 2 and info.bytes > 0  # one file per partition
    table = deltalake.DeltaTable(out)
    assert ids(table.to_pyarrow_table()) == live[1]  # delta-rs reads what feedline wrote
    assert table.metadata().partition_columns == ["part"]
    lineage = json.loads(table.history()[0]["feedline.lineage"])
    assert f"delta: {source} @ version 1" in lineage["source"]
    assert lineage["engine"] == "local"

    with pytest.raises(ConfigurationError, match=r"exists \(version 0\).*mode='append'"):
        fl.read_delta(source).write_delta(out)
    more = fl.from_arrow(
        pa.table({"score": [2.0], "id": pa.array([20], pa.int64()), "part": ["even"]})
    )
    assert more.write_delta(out, mode="append").report["table_version"] == 1
    assert ids(fl.read_delta(out).to_arrow()) == [*live[1], 20]
    assert deltalake.DeltaTable(out).metadata().partition_columns == ["part"]  # kept

    wrong = fl.from_arrow(pa.table({"id": pa.array([1], pa.int32()), "extra": ["x"]}))
    with pytest.raises(SchemaError) as info_wrong:
        wrong.write_delta(out, mode="append")
    message = str(info_wrong.value)
    assert "missing: ['part', 'score']" in message and "not in the table: ['extra']" in message
    assert "id: int64 in the table, int32 in the rows" in message and "Fix:" in message
    assert deltalake.DeltaTable(out).version() == 1  # nothing committed

    info = wrong.write_delta(out, mode="overwrite")  # a new schema, a new version
    assert info.report["table_version"] == 2
    assert fl.read_delta(out).to_arrow().to_pylist() == [{"id": 1, "extra": "x"}]
    assert ids(fl.read_delta(out, version=1).to_arrow()) == [*live[1], 20]  # time travel
    with pytest.raises(ConfigurationError, match="not a write mode"):
        wrong.write_delta(out, mode="upsert")


def test_write_lance_round_trip_modes_and_lineage(tmp_path: Path) -> None:
    lance = pytest.importorskip("lance")
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    table, live = iceberg_table_with_position_deletes(tmp_path)
    snapshot, want = list(live.items())[2]
    out = str(tmp_path / "out.lance")
    ds = fl.read_iceberg(table, snapshot_id=snapshot).filter(pc.field("id") >= 2)
    info = ds.write_lance(out)
    assert info.rows == len([i for i in want if i >= 2])
    dataset = lance.dataset(out)
    assert ids(dataset.to_table()) == [i for i in want if i >= 2]
    properties = dataset.read_transaction(dataset.version).transaction_properties
    assert f"snapshot {snapshot}" in json.loads(properties["feedline.lineage"])["source"]

    with pytest.raises(ConfigurationError, match="exists"):
        ds.write_lance(out)
    ds.write_lance(out, mode="append")
    assert fl.read_lance(out).count() == 2 * info.rows
    with pytest.raises(SchemaError, match=r"not in the table: \['extra'\]"):
        ds.with_columns(extra=pc.field("id")).write_lance(out, mode="append")
    assert lance.dataset(out).version == 2
    overwritten = fl.range(3).write_lance(out, mode="overwrite")
    assert overwritten.report["table_version"] == 3 and overwritten.shards == 1
    assert fl.read_lance(out).to_arrow()["id"].to_pylist() == [0, 1, 2]
    assert fl.read_lance(out, version=2).count() == 2 * info.rows
