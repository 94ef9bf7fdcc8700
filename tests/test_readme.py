"""The README's quickstart runs as written (a newcomer pastes it first)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import feedline as fl

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_code() -> str:
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md has no python block under '## Quickstart'"
    return match.group(1)


def test_quickstart_runs_and_writes_what_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(quickstart_code(), "README.md#quickstart", "exec"), scope)
    written = fl.open(tmp_path / "quickstart" / "train")
    assert written.count() == scope["ds"].count() > 9_900  # the filter drops only prices <= 1
    loader = scope["loader"]
    assert loader.epoch == 1
    assert set(scope["batch"]) == {"price", "category", "label"}
    assert scope["batch"]["category"].max() <= 2
