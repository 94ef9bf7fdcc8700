"""The ``feedline`` command: inspect, convert, verify."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import feedline as fl
from feedline.cli import main


@pytest.fixture
def csv_folder(tmp_path):
    folder = tmp_path / "csv"
    folder.mkdir()
    for i in range(5):
        table = pa.table(
            {"id": list(range(i * 10, i * 10 + 10)), "name": [f"n{j}" for j in range(10)]}
        )
        pacsv.write_csv(table, folder / f"part{i}.csv")
    return folder


def test_convert_many_small_csv_files_into_one_shard(csv_folder, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["convert", str(csv_folder), str(out), "--quiet"]) == 0
    ds = fl.open(out)
    assert ds.count() == 50
    assert len(ds.manifest.shards) == 1
    assert sorted(ds.to_arrow()["id"].to_pylist()) == list(range(50))
    assert "Wrote 50 rows" in capsys.readouterr().out


def test_convert_rows_per_shard(csv_folder, tmp_path) -> None:
    out = tmp_path / "out"
    assert main(["convert", str(csv_folder), str(out), "--rows-per-shard", "20", "--quiet"]) == 0
    assert [s.rows for s in fl.open(out).manifest.shards] == [20, 20, 10]


def test_inspect_shows_schema_rows_and_lineage(csv_folder, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    fl.read_csv(csv_folder).write(out)
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    for expected in ("50", "id", "int64", "name", "part-00000-", "lineage.source", "csv"):
        assert expected in text, expected


def test_verify_ok_then_detects_corruption(csv_folder, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    fl.read_csv(csv_folder).write(out)
    assert main(["verify", str(out), "--quiet"]) == 0
    (shard,) = out.glob("part-00000-*.parquet")  # part-NNNNN-<write id>.parquet
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "IntegrityError" in err and shard.name in err


def test_errors_are_reported_not_raised(tmp_path, capsys) -> None:
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_console_script_entry_point(csv_folder, tmp_path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "feedline", "convert", str(csv_folder), str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert fl.open(out).count() == 50
