"""The ``feedline`` command's options: --version, help on every argument, bench-loader's
--columns/--storage-option, convert's --delimiter/--decode/--resize/--on-error, readable
numbers, lineage naming the input folder, and a fix in every bad-argument message."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.cli.main import build_parser, main


@pytest.fixture(autouse=True)
def wide_plain_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide output without colours, so table cells and paths are not wrapped."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "300")


def test_version_in_process_and_as_a_command(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"feedline {fl.__version__}"
    result = subprocess.run(
        [sys.executable, "-m", "feedline", "-V"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout.strip()) == (0, f"feedline {fl.__version__}")


def _parsers(parser: argparse.ArgumentParser, name: str = "feedline"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_argument_of_every_subcommand_has_help() -> None:
    found, missing = 0, []
    for name, parser in _parsers(build_parser()):
        for action in parser._actions:
            found += 1
            if not action.help or action.help == argparse.SUPPRESS or not action.help.strip():
                missing.append(f"{name}: {action.dest}")
        for choice in getattr(parser._subparsers, "_group_actions", []):
            for sub_action in getattr(choice, "_choices_actions", []):
                if not sub_action.help:
                    missing.append(f"{name}: subcommand {sub_action.dest}")
    assert found > 40 and not missing, f"arguments without help: {missing}"
    # and every help page renders
    for name, parser in _parsers(build_parser()):
        assert parser.format_help().count("\n") > 3, name


@pytest.fixture
def wide_dataset(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    table = pa.table({"a": rng.random(12_345), "b": rng.random(12_345), "c": rng.random(12_345)})
    fl.from_arrow(table).write(tmp_path / "ds", rows_per_shard=5_000)
    return tmp_path / "ds"


def _value(text: str, label: str) -> str:
    match = re.search(rf"│ {re.escape(label)}\s*│\s*(.*?)\s*│", text)
    assert match, f"{label!r} not in\n{text}"
    return match.group(1)


def test_bench_loader_columns_load_only_those(wide_dataset: Path, capsys) -> None:
    argv = ["bench-loader", str(wide_dataset), "--format", "numpy", "--batch-size", "1000"]
    assert main(argv) == 0
    every = _value(capsys.readouterr().out, "cache size")
    assert main([*argv, "--columns", "a, c"]) == 0
    text = capsys.readouterr().out
    assert every == "296.3 KB" and _value(text, "cache size") == "197.5 KB"  # 3 vs 2 x 8 B/row
    # human-readable figures: thousands separators, a percentage, sizes, durations
    assert _value(text, "samples") == "12,000"
    assert re.fullmatch(r"\d{1,3}(,\d{3})* samples/s", _value(text, "throughput over the run"))
    assert re.fullmatch(r"\d+\.\d%", _value(text, "data wait share of step time"))
    assert re.fullmatch(r"\d+\.\d{1,2} (KB|MB|GB)", _value(text, "peak memory (RSS)"))
    assert re.fullmatch(r"\d+\.\d+ (ms|s)", _value(text, "time to first batch"))
    assert main([*argv, "--columns", "a,nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_bench_loader_passes_storage_options(capsys) -> None:
    url = "memory://feedline-cli-options/bench"
    fl.range(3_000).write(url)
    argv = ["bench-loader", url, "--format", "numpy"]
    assert main([*argv, "--storage-option", 'retry={"attempts": 0}']) == 2
    assert "RetryPolicy(attempts=0)" in capsys.readouterr().err  # the option reached storage
    assert main([*argv, "--storage-option", "retry=2", "--columns", "id"]) == 0
    assert _value(capsys.readouterr().out, "samples") == "2,816"  # 11 full batches of 256


def test_inspect_prints_readable_numbers_and_names_the_input_folder(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "raw csv"
    folder.mkdir()
    for i in range(3):
        (folder / f"part{i}.csv").write_text(
            "x,y\n" + "".join(f"{j},{j % 7}\n" for j in range(5_000))
        )
    assert (
        main(["convert", str(folder), str(tmp_path / "ds"), "--quiet", "--rows-per-shard", "6000"])
        == 0
    )
    assert "Wrote 15,000 rows in 3 shard(s)" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "ds")]) == 0
    text = capsys.readouterr().out
    assert _value(text, "rows") == "15,000"
    assert re.fullmatch(r"\d+\.\d KB", _value(text, "size"))
    assert _value(text, "lineage.source") == f"csv: {folder} (3 files)"
    assert "part0.csv" not in text
    assert re.search(r"│\s*6,000 │\s*\d+\.\d KB │", text)  # a shard row: rows and size


def test_lineage_of_an_image_folder_names_the_folder(image_folder: Path, tmp_path: Path) -> None:
    fl.read_images(image_folder).write(tmp_path / "ds")
    lineage = fl.open(tmp_path / "ds").manifest.lineage
    assert lineage["source"] == f"images: {image_folder} (5 files)"


def _png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    pytest.importorskip("PIL")
    root = tmp_path / "images"
    for label, colors in {"red": [(255, 0, 0)] * 3, "blue": [(0, 0, 255)] * 2}.items():
        (root / label).mkdir(parents=True)
        for i, color in enumerate(colors):
            (root / label / f"{i}.png").write_bytes(_png(color))
    return root


def test_convert_decodes_and_resizes_images(image_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "decoded"
    assert main(["convert", str(image_folder), str(out), "--quiet", "--resize", "32x16"]) == 0
    table = fl.open(out).to_arrow()
    pixels = table["bytes"].combine_chunks().to_numpy_ndarray()
    assert pixels.shape == (5, 16, 32, 3) and pixels.dtype == np.uint8
    red = [i for i, label in enumerate(table["label"].to_pylist()) if label == "red"]
    assert pixels[red, 8, 16].tolist() == [[255, 0, 0]] * 3
    assert (
        main(
            [
                "convert",
                str(image_folder),
                str(tmp_path / "chw"),
                "--quiet",
                "--decode",
                "--layout",
                "CHW",
                "--image-mode",
                "L",
            ]
        )
        == 0
    )
    chw = fl.open(tmp_path / "chw").to_arrow()["bytes"].combine_chunks().to_numpy_ndarray()
    assert chw.shape == (5, 1, 224, 224)


def test_convert_on_error_skips_or_names_an_undecodable_image(
    image_folder: Path, tmp_path: Path, capsys
) -> None:
    (image_folder / "red" / "broken.png").write_bytes(_png((1, 2, 3))[:60])
    argv = ["convert", str(image_folder), "--quiet", "--resize", "8"]
    assert main([*argv, str(tmp_path / "a")]) == 2
    assert "broken.png" in capsys.readouterr().err
    assert main([*argv, str(tmp_path / "b"), "--on-error", "skip"]) == 0
    assert "1 record(s) skipped" in capsys.readouterr().out
    assert fl.open(tmp_path / "b").count() == 5


def test_convert_delimiter_and_csv_on_error(tmp_path: Path, capsys) -> None:
    path = tmp_path / "semi.csv"
    path.write_text("id;name\n1;a\n2;b;extra\n3;c\n")
    assert main(["convert", str(path), str(tmp_path / "a"), "--quiet", "--delimiter", ";"]) == 2
    assert "semi.csv" in capsys.readouterr().err  # the row of three fields, named
    assert (
        main(
            [
                "convert",
                str(path),
                str(tmp_path / "b"),
                "--quiet",
                "--delimiter",
                "semicolon",
                "--on-error",
                "skip",
            ]
        )
        == 0
    )
    table = fl.open(tmp_path / "b").to_arrow()
    assert table.column_names == ["id", "name"] and table["id"].to_pylist() == [1, 3]
    tsv = tmp_path / "t.tsv"
    tsv.write_text("id\tname\n1\ta\n")
    for argv in ([], ["--delimiter", "tab"], ["--delimiter", "\\t"]):
        out = tmp_path / f"tsv{len(argv)}{argv[-1:]}"
        assert main(["convert", str(tsv), str(out), "--quiet", *argv]) == 0
        assert fl.open(out).schema().names == ["id", "name"]


BAD = [
    (["convert", "src", "dst", "--resize", "wide"], "WIDTHxHEIGHT"),
    (["convert", "src", "dst", "--resize", "0x10"], "WIDTHxHEIGHT"),
    (["convert", "src", "dst", "--delimiter", "::"], "one ASCII character"),
    (["convert", "src", "dst", "--on-error", "ignore"], "invalid choice"),
    (["convert", "src", "dst", "--rows-per-shard", "-5"], "at least 1"),
    (["convert", "src", "dst", "--format", "xlsx"], "invalid choice"),
    (["convert", "src"], "required"),
    (["bench-loader", "ds", "--batch-size", "many"], "at least 1"),
    (["bench-loader", "ds", "--step-ms", "-1"], "at least 0"),
    (["bench-loader", "ds", "--columns", ","], "names no column"),
    (["bench-loader", "ds", "--format", "jax"], "invalid choice"),
    (["inspect", "ds", "--max-shards", "0"], "at least 1"),
    (["stats", "ds", "--columns", ""], "names no column"),
    (["demo", "--engine", "dask"], "invalid choice"),
    (["demo", "--rows", "ten"], "at least 1"),
    (["launch"], "invalid choice"),
    ([], "required"),
    (["inspect", "ds", "--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize(("argv", "what"), BAD, ids=[" ".join(a) or "nothing" for a, _ in BAD])
def test_a_bad_argument_says_what_and_how_to_fix(argv: list[str], what: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: ConfigurationError:" in err and what in err and "Fix:" in err, err


def test_options_that_do_not_apply_to_the_input_are_refused(
    image_folder: Path, tmp_path: Path, capsys
) -> None:
    csv = tmp_path / "a.csv"
    csv.write_text("x\n1\n")
    cases = [
        ([str(image_folder), "--delimiter", ";"], "--delimiter"),
        ([str(image_folder), "--on-error", "skip"], "add --decode"),
        ([str(csv), "--resize", "8x8"], "--resize"),
        ([str(csv), "--decode", "--layout", "CHW"], "--decode, --layout"),
        ([str(csv), "--format", "jsonl", "--on-error", "skip"], "--on-error"),
    ]
    for argv, what in cases:
        assert main(["convert", argv[0], str(tmp_path / "out"), *argv[1:]]) == 2
        err = capsys.readouterr().err
        assert "ConfigurationError" in err and what in err and "Fix:" in err, err
    assert not (tmp_path / "out").exists()


def test_arguments_found_wrong_only_when_used_carry_a_fix(tmp_path: Path, capsys) -> None:
    fl.range(500).write(tmp_path / "ds")
    (tmp_path / "file").write_text("")
    ds, under_a_file = str(tmp_path / "ds"), str(tmp_path / "file" / "out")
    cases = [
        ["stats", ds, "--json", under_a_file + ".json"],
        ["bench-loader", ds, "--format", "numpy", "--chart", under_a_file + ".png"],
        ["inspect", ds, "--storage-option", "novalue"],
        [
            "convert",
            ds,
            str(tmp_path / "out"),
            "--compression",
            "none",
            "--storage-option",
            "retry=0",
        ],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Fix:" in err, err
        assert "Traceback" not in err
