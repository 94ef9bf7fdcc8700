"""The README's quickstart and "first ten minutes" run as written (a newcomer pastes them
first); its install section names every extra; its links lead somewhere."""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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


def section(heading: str) -> str:
    """The text under ``heading`` (a ``##`` or ``###`` line) up to the next heading."""
    text = README.read_text()
    match = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#+ |\Z)", text, re.S | re.M)
    assert match, f"README.md has no section {heading!r}"
    return match.group(1)


def block(heading: str, language: str = "python") -> str:
    match = re.search(rf"```{language}\n(.*?)```", section(heading), re.S)
    assert match, f"README.md has no {language} block under {heading!r}"
    return match.group(1)


def run_block(heading: str) -> dict:
    code = block(heading)
    assert len(code.splitlines()) < 20, f"{heading!r} is {len(code.splitlines())} lines"
    scope: dict = {}
    exec(compile(code, f"README.md#{heading}", "exec"), scope)
    return scope


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_first_ten_minutes_from_a_folder_of_images(in_tmp: Path) -> None:
    image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for label, suffix, tint in (("cat", "jpg", (200, 60, 40)), ("dog", "png", (40, 60, 200))):
        (in_tmp / "photos" / label).mkdir(parents=True)
        for i in range(12):
            pixels = np.clip(rng.normal(tint, 30, (48 + i, 64, 3)), 0, 255).astype(np.uint8)
            image.fromarray(pixels).save(in_tmp / "photos" / label / f"{i}.{suffix}")
    scope = run_block("A folder of images")
    written = fl.open(in_tmp / "photos-train")
    assert written.count() == 24
    assert sorted(set(written.to_arrow()["label"].to_pylist())) == [0, 1]
    batch = scope["batch"]
    assert (
        tuple(batch["bytes"].shape) == (8, 3, 64, 64)
        and str(batch["bytes"].dtype) == "torch.float32"
    )
    assert set(batch["label"].tolist()) <= {0, 1} and scope["epoch"] == 2
    assert math.isfinite(scope["loss"].item())


def test_first_ten_minutes_from_a_pandas_dataframe(in_tmp: Path) -> None:
    pytest.importorskip("pandas")
    scope = run_block("A pandas DataFrame")
    assert fl.open(in_tmp / "people-train").count() == 1_000
    batch = scope["batch"]
    assert tuple(batch["x"].shape) == (64, 5) and str(batch["x"].dtype) == "torch.float32"
    assert scope["loss"].item() < 0.5  # learnt: chance is log(2) = 0.69


def test_first_ten_minutes_from_a_parquet_folder(in_tmp: Path) -> None:
    rng = np.random.default_rng(0)
    (in_tmp / "events").mkdir()
    for i in range(3):  # written by pyarrow, as any other tool would
        x = rng.normal(size=(2_000, 6)).astype(np.float32)
        columns = {f"f{j}": x[:, j] for j in range(6)}
        columns["label"] = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
        pq.write_table(pa.table(columns), in_tmp / "events" / f"part-{i}.parquet")
    scope = run_block("A Parquet folder")
    assert fl.open(in_tmp / "events-train").count() == 6_000
    assert tuple(scope["batch"]["x"].shape) == (256, 6)
    assert scope["loss"].item() < 0.6  # learnt: chance is log(2) = 0.69


def test_install_section_names_every_extra_and_pins_torch() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((README.parent / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    install = section("Install")
    rows = re.findall(r"^\| (.*?) \|", install, re.M)
    listed = {name for row in rows for name in re.findall(r"`([a-z0-9-]+)`", row)}
    assert set(extras) <= listed, f"extras missing from the README: {set(extras) - listed}"
    assert 'pip install "feedline[torch,images,text]"' in install
    assert extras["torch"] == ["torch==2.13.0"] and '"torch==2.13.0"' in install


def test_check_the_install_commands_run() -> None:
    lines = block_after("Check the install:").splitlines()
    version_line, python_line = lines
    command, _, comment = version_line.partition("#")
    assert command.split() == ["feedline", "--version"]
    result = subprocess.run(
        [sys.executable, "-m", "feedline", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.strip() == comment.strip() == f"feedline {fl.__version__}"
    argv = shlex.split(python_line)
    assert argv[0] == "python"
    result = subprocess.run(
        [sys.executable, *argv[1:]], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == [fl.__version__, "3"]


def block_after(text: str) -> str:
    readme = README.read_text()
    match = re.search(rf"{re.escape(text)}\n\n```bash\n(.*?)```", readme, re.S)
    assert match, f"no bash block after {text!r}"
    return match.group(1)


def test_links_lead_to_files_and_headings() -> None:
    text = README.read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", text, re.M)
    }
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert "docs/index.md" in links and "DESIGN.md" not in text
    for link in links:
        if link.startswith("#"):
            assert link[1:] in headings, link
        elif "://" not in link:
            assert (README.parent / link).exists(), link
