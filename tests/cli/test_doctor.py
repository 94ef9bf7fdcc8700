"""``feedline doctor PATH``: the verdict, the stage table and the chart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import feedline as fl
from feedline.cli.main import main


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "ds"
    fl.range(2000).write(path)
    return path


def test_doctor_names_a_slow_transform_and_writes_a_chart(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    (tmp_path / "slow_fns.py").write_text(
        "import time\n"
        "def decode(sample, rng):\n"
        "    time.sleep(0.002)\n"
        "    return {'id': sample['id']}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "slow_fns", raising=False)
    chart = tmp_path / "stages.png"
    code = main(["doctor", str(dataset), "--step-ms", "5", "--transform", "slow_fns:decode",
                 "--batch-size", "8", "--seconds", "1", "--chart", str(chart)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "transform" in out and "num_workers=" in out and "ms/sample" in out
    assert chart.stat().st_size > 1000


def test_doctor_refuses_a_transform_it_cannot_import(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", str(dataset), "--transform", "no_such_module_h28:fn"]) == 2
    assert "Fix:" in capsys.readouterr().err
    assert main(["doctor", str(dataset), "--transform", "nocolon"]) == 2
