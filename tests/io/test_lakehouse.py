"""``fl.read_delta`` / ``fl.read_iceberg`` / ``fl.read_lance`` on tables their own libraries
wrote: the right rows at every version, deleted and superseded files never read, filters and
columns pushed down, the snapshot in the lineage, unsupported deletes refused."""

from __future__ import annotations

import json
import pickle
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lakehouse_tables import (
    delta_table,
    delta_table_with_deletion_vectors,
    iceberg_table,
    iceberg_table_with_position_deletes,
    lance_dataset,
)

import feedline as fl
from feedline.cli.main import main
from feedline.errors import ConfigurationError, DataError, FormatError, MissingDependencyError
from feedline.io.source import ExecutionReport


def ids(ds: fl.Dataset) -> list[int]:
    return sorted(ds.to_arrow()["id"].to_pylist())


def run_tasks(tasks) -> pa.Table:
    """Run read tasks after a cloudpickle round trip (as the Spark and Ray engines ship
    them)."""
    cloudpickle = pytest.importorskip("cloudpickle")
    shipped = cloudpickle.loads(cloudpickle.dumps(tasks))
    report = ExecutionReport()
    batches = [b for task in shipped for b in task.read(report)]
    return pa.Table.from_batches(batches) if batches else pa.table({})


# --- Delta -----------------------------------------------------------------------------------


def test_delta_every_version_has_its_rows(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    path, live = delta_table(tmp_path)
    for version, want in live.items():
        ds = fl.read_delta(path, version=version)
        assert ids(ds) == want, version
        assert ds.count() == len(want)
    assert ids(fl.read_delta(path)) == live[3]  # latest
    rows = fl.read_delta(path, version=3).to_arrow().to_pylist()
    assert all(r["part"] == ("even" if r["id"] % 2 == 0 else "odd") for r in rows)
    assert all(r["score"] == pytest.approx(r["id"] / 10) for r in rows)


def test_delta_delete_rewrote_files_and_only_the_live_ones_are_read(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    path, live = delta_table(tmp_path)
    delete = deltalake.DeltaTable(path).history()[1]  # newest first: v3 append, v2 delete
    assert delete["operation"] == "DELETE"
    assert delete["operationMetrics"]["num_removed_files"] >= 1  # rewritten, no DVs
    assert delete["operationMetrics"]["num_copied_rows"] >= 1
    # the old way (the files in the folder) reads the deleted and superseded rows
    stale = fl.read_parquet(sorted(str(p) for p in Path(path).rglob("*.parquet"))).count()
    assert stale > len(live[2])
    assert ids(fl.read_delta(path, version=2)) == live[2]
    assert 2 not in ids(fl.read_delta(path)) and 7 not in ids(fl.read_delta(path))


def test_delta_as_of_a_time(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    path, live = delta_table(tmp_path)
    history = {h["version"]: h["timestamp"] for h in deltalake.DeltaTable(path).history()}
    at = datetime.fromtimestamp(history[1] / 1000, tz=timezone.utc)
    ds = fl.read_delta(path, as_of=at)
    assert ids(ds) == live[1]
    assert "@ version 1" in ds.plan.source.describe()
    with pytest.raises(ConfigurationError, match="one of them"):
        fl.read_delta(path, version=1, as_of=at)


def test_delta_filter_and_columns_pushed_down(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    path, live = delta_table(tmp_path)
    source = fl.read_delta(path).plan.source
    everything = source.read_tasks(None, None)
    odd = source.read_tasks(["id"], pc.field("part") == "odd")
    assert len(odd) < len(everything)  # files of the even partition never opened
    table = run_tasks(odd)
    assert table.column_names == ["id"]
    assert sorted(table["id"].to_pylist()) == [i for i in live[3] if i % 2 == 1]
    late = source.read_tasks(None, pc.field("id") >= 10)  # the v3 files by their id bounds
    assert len(late) < len(everything)
    assert sorted(run_tasks(late)["id"].to_pylist()) == [10, 11]
    # through the Dataset API: a partition column in the filter, a null test kept exact
    got = fl.read_delta(path).filter(pc.field("part") == "even").select(["id", "part"])
    assert ids(got) == [i for i in live[3] if i % 2 == 0]
    assert fl.read_delta(path).filter(pc.field("id").is_null()).count() == 0


def test_delta_version_in_the_written_lineage(tmp_path: Path, capsys) -> None:
    pytest.importorskip("deltalake")
    path, live = delta_table(tmp_path)
    out = tmp_path / "out"
    fl.read_delta(path, version=2).write(out)
    lineage = json.loads((out / "_feedline.json").read_text())["lineage"]
    assert f"delta: {path} @ version 2" in lineage["source"]
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # rich may wrap the long path
    assert "@ version 2" in shown
    assert ids(fl.open(out)) == live[2]
    v1 = fl.read_delta(path, version=1).plan.source.fingerprint()
    assert v1 != fl.read_delta(path, version=2).plan.source.fingerprint()


def test_delta_deletion_vectors_are_honoured_at_every_version(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    pytest.importorskip("pyroaring")
    path, live = delta_table_with_deletion_vectors(tmp_path)
    with pytest.raises(deltalake.exceptions.DeltaProtocolError):  # delta-rs's own reader
        deltalake.DeltaTable(path).to_pyarrow_table()
    for version, want in live.items():
        ds = fl.read_delta(path, version=version)
        assert ids(ds) == want, version
        assert ds.plan.source.count_rows() == len(want)
        rows = ds.to_arrow().to_pylist()
        assert all(r["part"] == ("even" if r["id"] % 2 == 0 else "odd") for r in rows)
    # the same files, other vectors: other fingerprints (a written dataset's lineage differs)
    prints = {fl.read_delta(path, version=v).plan.source.fingerprint() for v in live}
    assert len(prints) == len(live)
    # filter and columns after the deleted rows are dropped, on shipped tasks
    source = fl.read_delta(path).plan.source
    got = run_tasks(source.read_tasks(["id"], pc.field("id") >= 3))
    assert got.column_names == ["id"]
    assert sorted(got["id"].to_pylist()) == [i for i in live[2] if i >= 3]
    even = fl.read_delta(path).filter(pc.field("part") == "even").select(["id"])
    assert ids(even) == [i for i in live[2] if i % 2 == 0]


def test_delta_unreadable_deletion_vectors_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    pytest.importorskip("pyroaring")
    path, live = delta_table_with_deletion_vectors(tmp_path)
    assert ids(fl.read_delta(path, version=0)) == live[0]  # before any vector: readable
    for vector in Path(path).glob("deletion_vector_v2_*.bin"):
        vector.unlink()
    assert ids(fl.read_delta(path, version=1)) == live[1]
    with pytest.raises(FormatError, match=r"version 2 has deletion vectors that cannot be read"):
        fl.read_delta(path)


def test_delta_unmatched_deletion_vector_and_column_mapping_are_refused() -> None:
    from feedline.io.lakehouse.delta import _deleted_positions, _refuse_unsupported

    table = SimpleNamespace(
        table_uri="file:///t/",
        protocol=lambda: SimpleNamespace(reader_features=["deletionVectors"]),
        deletion_vectors=lambda: pa.table(
            {"filepath": ["file:///t/elsewhere.parquet"], "selection_vector": [[True, False]]}
        ),
    )
    with pytest.raises(FormatError, match=r"not one of the version's files.*PURGE"):
        _deleted_positions(table, ["part-0.parquet"], "the Delta table 't'")
    assert _deleted_positions(table, ["elsewhere.parquet"], "t") == {"elsewhere.parquet": (1,)}
    config = SimpleNamespace(configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(FormatError, match="column mapping"):
        _refuse_unsupported(SimpleNamespace(metadata=lambda: config), "t")


def test_delta_missing_table_and_missing_library(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("deltalake")
    with pytest.raises(FormatError, match="Cannot open the Delta table"):
        fl.read_delta(tmp_path / "nothing")
    path, _ = delta_table(tmp_path)
    with pytest.raises(FormatError, match="version 99"):
        fl.read_delta(path, version=99)
    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(MissingDependencyError, match=r"feedline\[delta\]"):
        fl.read_delta(path)


# --- Iceberg ---------------------------------------------------------------------------------


def test_iceberg_every_snapshot_has_its_rows(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    table, live = iceberg_table(tmp_path)
    assert len(live) == 3
    for snapshot_id, want in live.items():
        ds = fl.read_iceberg(table, snapshot_id=snapshot_id)
        assert ids(ds) == want, snapshot_id
        assert f"snapshot {snapshot_id}" in ds.plan.source.describe()
    assert ids(fl.read_iceberg(table)) == list(range(2, 8))
    # the metadata JSON alone (no catalog) reads the same
    assert ids(fl.read_iceberg(table.metadata_location)) == list(range(2, 8))
    assert fl.read_iceberg(table).schema().field("part").type == pa.string()


def test_iceberg_filter_columns_lineage_and_errors(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    table, live = iceberg_table(tmp_path)
    first = next(iter(live))
    source = fl.read_iceberg(table).plan.source
    everything = source.read_tasks(None, None)
    late = source.read_tasks(["id", "score"], pc.field("id") >= 5)
    assert len(late) < len(everything)  # the file of ids 2..4 skipped by its bounds
    got = run_tasks(late)
    assert got.column_names == ["id", "score"]
    assert sorted(got["id"].to_pylist()) == [5, 6, 7]
    out = tmp_path / "out"
    fl.read_iceberg(table, snapshot_id=first).write(out)
    lineage = json.loads((out / "_feedline.json").read_text())["lineage"]
    assert f"snapshot {first}" in lineage["source"]
    with pytest.raises(ConfigurationError, match="no snapshot 12345"):
        fl.read_iceberg(table, snapshot_id=12345)
    with pytest.raises(FormatError, match="Iceberg metadata"):
        fl.read_iceberg(tmp_path / "missing.metadata.json")


def test_iceberg_position_deletes_are_honoured_at_every_snapshot(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    table, live = iceberg_table_with_position_deletes(tmp_path)
    for snapshot_id, want in live.items():
        assert sorted(table.scan(snapshot_id=snapshot_id).to_arrow()["id"].to_pylist()) == want
        ds = fl.read_iceberg(table, snapshot_id=snapshot_id)
        assert ids(ds) == want, snapshot_id
        assert ds.count() == len(want)
    source = fl.read_iceberg(table).plan.source
    assert all(f.deletes for f in source.files)  # both data files have rows deleted
    got = run_tasks(source.read_tasks(["id", "part"], pc.field("id") >= 4))
    assert got.column_names == ["id", "part"]
    assert sorted(got["id"].to_pylist()) == [4, 5, 6, 7, 9]
    prints = {fl.read_iceberg(table, snapshot_id=s).plan.source.fingerprint() for s in live}
    assert len(prints) == len(live)


def test_iceberg_unsupported_or_missing_delete_files_are_refused(
    tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.table import DataScan

    from feedline.io.lakehouse.iceberg import _position_deletes

    def task(content: DataFileContent, file_format: FileFormat) -> SimpleNamespace:
        delete = SimpleNamespace(file_path="file:///t/d", content=content, file_format=file_format)
        return SimpleNamespace(file=SimpleNamespace(file_path="file:///t/a"), delete_files=[delete])

    puffin = task(DataFileContent.POSITION_DELETES, FileFormat.PUFFIN)
    with pytest.raises(FormatError, match=r"PUFFIN.*position delete.*rewrite_data_files"):
        _position_deletes(puffin, "the table", None)
    equality = task(DataFileContent.EQUALITY_DELETES, FileFormat.PARQUET)
    with pytest.raises(FormatError, match="position deletes only"):
        _position_deletes(equality, "the table", None)
    table, _ = iceberg_table_with_position_deletes(tmp_path)
    for deletes in tmp_path.glob("deletes-*.parquet"):
        deletes.unlink()
    with pytest.raises(DataError, match=r"position delete files .* deleted rows would be read"):
        fl.read_iceberg(table).to_arrow()

    def equality_deletes(self):
        raise ValueError("PyIceberg does not yet support equality deletes: https://...")

    monkeypatch.setattr(DataScan, "plan_files", equality_deletes)
    with pytest.raises(FormatError, match=r"equality delete files.*Fix: compact"):
        fl.read_iceberg(table)


# --- Lance -----------------------------------------------------------------------------------


def test_lance_every_version_has_its_rows(tmp_path: Path) -> None:
    pytest.importorskip("lance")
    path, live = lance_dataset(tmp_path)
    for version, want in live.items():
        ds = fl.read_lance(path, version=version)
        assert ids(ds) == want, version
        assert ds.count() == len(want)
        assert f"@ version {version}" in ds.plan.source.describe()
    assert ids(fl.read_lance(path)) == live[3]  # lance's deletion file honoured


def test_lance_one_task_per_fragment_with_pushdown_and_lineage(tmp_path: Path) -> None:
    pytest.importorskip("lance")
    path, live = lance_dataset(tmp_path)
    source = fl.read_lance(path).plan.source
    tasks = source.read_tasks(["id"], pc.field("score") > 0.35)
    assert len(tasks) == 2  # two appends, two fragments
    got = run_tasks(tasks)
    assert got.column_names == ["id"]
    assert sorted(got["id"].to_pylist()) == [4, 5, 6, 7]
    out = tmp_path / "out"
    fl.read_lance(path, version=2).write(out)
    lineage = json.loads((out / "_feedline.json").read_text())["lineage"]
    assert "@ version 2" in lineage["source"]
    assert ids(fl.open(out)) == live[2]
    with pytest.raises(FormatError, match="Cannot open the Lance dataset"):
        fl.read_lance(path, version=42)


def test_sources_pickle(tmp_path: Path) -> None:
    """The planned sources themselves pickle (the engines ship plans to workers)."""
    pytest.importorskip("deltalake")
    pytest.importorskip("lance")
    path, live = delta_table(tmp_path)
    source = pickle.loads(pickle.dumps(fl.read_delta(path, version=2).plan.source))
    assert sorted(run_tasks(source.read_tasks(["id"], None))["id"].to_pylist()) == live[2]
    lpath, llive = lance_dataset(tmp_path)
    lsource = pickle.loads(pickle.dumps(fl.read_lance(lpath, version=3).plan.source))
    assert sorted(run_tasks(lsource.read_tasks(None, None))["id"].to_pylist()) == llive[3]
