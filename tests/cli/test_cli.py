"""The ``feedline`` command: inspect, convert, verify."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import feedline as fl
from feedline.cli.main import main


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


# Data that would drive a terminal if printed raw: OSC (window title) ended by BEL, CSI
# (clear screen), NUL, a C1 CSI, a bidi override, and Rich markup.
HOSTILE = [
    "\x1b]0;pwned\x07title",
    "\x1b[2Jwipe",
    "nul\x00byte",
    "c1\x9b31m",
    "bidi\u202egnp.exe",
    "[bold red]markup[/]",
]


@pytest.fixture
def plain_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide output without colours, so every escape byte in it would come from the data."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "250")


def assert_inert(text: str, shown: list[str]) -> None:
    bad = sorted({c for c in text if not c.isprintable() and c != "\n"})
    assert not bad, f"control characters reached the terminal: {bad}"
    for value in shown:  # each hostile value is shown, escaped
        assert repr(value)[1:-1].replace("\\'", "'") in text, value


def test_safe_text_escapes_controls_and_markup() -> None:
    from feedline.ui.inert_text import safe_text

    assert safe_text("plain [b]x[/] ü 日本").plain == "plain [b]x[/] ü 日本"
    assert (
        safe_text("\x1b[2J\x07\x00\u202e\u2028\ufeff\t").plain
        == "\\x1b[2J\\x07\\x00\\u202e\\u2028\\ufeff\\t"
    )
    assert safe_text(3).plain == "3" and not safe_text("[bold]x[/]").spans


def test_inspect_stats_verify_escape_hostile_names_and_lineage(
    tmp_path, capsys, plain_console
) -> None:
    out = tmp_path / "ds"
    table = pa.table(
        {
            **{n: [1.0, 2.0, 4.0, 8.0] for n in HOSTILE},
            "cat": ["\x1b[31mred", "[blink]b[/]", "z\u202e", "\x07"],
        }
    )
    fl.from_arrow(table).write(out)
    path = out / "_feedline.json"
    manifest = json.loads(path.read_text())
    manifest["lineage"]["source"] = "\x1b]8;;http://evil\x07link\x1b]8;;\x07 [blink]s[/]"
    manifest["lineage"]["plan"] = ["\x1b[31mRead\u202e", "[link=http://x]Map[/link]\x00"]
    path.write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert_inert(
        text, [*HOSTILE, manifest["lineage"]["source"], " -> ".join(manifest["lineage"]["plan"])]
    )
    assert main(["stats", str(out), "--against", str(out), "--recompute"]) == 0
    text = capsys.readouterr().out
    assert_inert(text, [*HOSTILE[:3], "\x1b[31mred", "[blink]b[/]"])
    assert "No drift in 7 column(s)" in text
    assert main(["verify", str(out)]) == 0
    assert_inert(capsys.readouterr().out, [])


def test_convert_summary_and_errors_escape_paths(
    csv_folder, tmp_path, capsys, plain_console
) -> None:
    dst = tmp_path / "out\x1b]0;x\x07[red]y[/]\u202e"
    assert main(["convert", str(csv_folder), str(dst), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "Wrote 50 rows" in text
    assert_inert(text, ["out\x1b]0;x\x07[red]y[/]\u202e"])
    missing = tmp_path / "\x1b[2Jmissing[bold]x[/]"
    assert main(["inspect", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "does not exist" in err
    assert_inert(err, ["\x1b[2Jmissing[bold]x[/]"])


def test_history_lists_versions_as_table_and_json(tmp_path, capsys) -> None:
    out = tmp_path / "ds"
    fl.range(3).write(out)
    fl.range(4).write(out, mode="append")
    fl.range(2).write(out)
    capsys.readouterr()
    assert main(["history", str(out)]) == 0
    text = capsys.readouterr().out
    for expected in ("versions of", "write", "append", "overwrite", "yes"):
        assert expected in text, expected
    assert main(["history", str(out), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(v["version"], v["operation"], v["rows"], v["current"]) for v in listed] == [
        (1, "write", 3, False),
        (2, "append", 7, False),
        (3, "overwrite", 2, True),
    ]
    fl.vacuum(out, keep_versions=1)
    assert main(["history", str(out), "--json"]) == 0
    assert [v["version"] for v in json.loads(capsys.readouterr().out)] == [3]


def test_history_of_a_folder_without_dataset_is_an_error(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["history", str(tmp_path / "empty")]) == 2
    assert "FormatError" in capsys.readouterr().err
