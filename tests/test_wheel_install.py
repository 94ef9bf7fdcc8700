"""The wheel, installed into a fresh virtual environment, works there.

Packaging mistakes fail here rather than on a user's machine: a subpackage or module left
out of the wheel (checked file by file, and by importing it in the new environment), a
dependency missing from ``[project.dependencies]`` or from the ``images`` extra (the
environment holds only what the wheel's metadata asks for), a broken console script, and
a version that differs between the metadata and ``feedline.__version__``.

The build runs on a copy of the sources (``pip wheel`` writes ``build/`` and ``*.egg-info``
next to ``pyproject.toml``); packages come from the configured package index (or pip's
cache), never from this checkout.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import feedline

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(feedline.__file__).resolve().parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

#: the quickstart, run inside the new environment: no pandas, no torch, one light extra
QUICKSTART = """
import io, os, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from PIL import Image
import feedline as fl

assert os.path.realpath(fl.__file__).startswith(os.path.realpath(sys.prefix)), fl.__file__
os.makedirs("events")
rng = np.random.default_rng(0)
for i in range(3):                                    # a Parquet folder another tool wrote
    x = rng.normal(size=400)
    pq.write_table(pa.table({"id": np.arange(i * 400, (i + 1) * 400), "x": x}),
                   f"events/part-{i}.parquet")
ds = fl.read_parquet("events/").transform(fl.StandardScaler("x")).sort("id", descending=True)
info = ds.write("events-train", rows_per_shard=500)
assert (info.rows, info.shards) == (1200, 3), info
loader = fl.open("events-train").loader(batch_size=100, seed=0, format="numpy")
batches = list(loader)
assert len(batches) == 12 and isinstance(batches[0]["x"], np.ndarray), batches[0]
ids = np.concatenate([b["id"] for b in batches])
assert sorted(ids.tolist()) == list(range(1200)), "rows lost or repeated"
assert abs(np.concatenate([b["x"] for b in batches]).mean()) < 1e-6    # scaled

for label in ("a", "b"):                              # the images extra: Pillow decodes
    os.makedirs(f"photos/{label}")
    for i in range(3):
        Image.new("RGB", (20, 10), (9, 99, 199)).save(f"photos/{label}/{i}.png")
ds = fl.read_images("photos/").transform(fl.DecodeImages(size=8))
fl.open(ds.write("photos-train").path)
batch = next(iter(fl.open("photos-train").loader(batch_size=6, format="numpy",
                                                 strings="list")))
assert batch["bytes"].shape == (6, 8, 8, 3) and batch["bytes"][0, 4, 4].tolist() == [9, 99, 199]
assert sorted(batch["label"]) == ["a", "a", "a", "b", "b", "b"]
print("quickstart ok", fl.__version__)
"""


def _run(argv: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    result = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )
    assert result.returncode == 0, f"{argv[:4]} failed:\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(tmp_path: Path) -> Path:
    """A wheel built from a copy of this checkout's sources."""
    source = tmp_path / "source"
    shutil.copytree(
        PACKAGE, source / "feedline", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("feedline-*.whl")
    return wheel


def check_contents(wheel: Path) -> None:
    """Every file of the package is in the wheel, with the console script and metadata."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(archive.read(info))
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    files = {
        p.relative_to(PACKAGE.parent).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and not p.name.startswith(".")
        and p.suffix != ".pyc"
    }  # modules and package data (templates, demo files...)
    assert any(f.startswith("feedline/loader/nodes/") for f in files)
    assert not files - names, f"files missing from the wheel: {sorted(files - names)}"
    assert metadata["Version"] == feedline.__version__, "pyproject and _version.py disagree"
    assert "feedline = feedline.cli.main:_entry" in entry_points
    core = [r.split(";")[0] for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r]
    for package in ("pyarrow", "numpy", "fsspec", "rich", "duckdb"):  # imported by the core
        assert any(r.startswith(package) for r in core), f"{package} is not a core dependency"


def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_quickstart(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    check_contents(wheel)
    env = tmp_path / "env"
    venv.EnvBuilder(
        with_pip=True, system_site_packages=False, symlinks=os.name != "nt", clear=True
    ).create(env)
    bin_dir = env / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    _run([str(python), "-m", "pip", "install", "-q", f"{wheel}[images]"], cwd=tmp_path)
    work = tmp_path / "work"  # not the checkout: `import feedline` must find the wheel's copy
    work.mkdir()
    result = _run([str(python), "-c", QUICKSTART], cwd=work)
    assert result.stdout.split() == ["quickstart", "ok", feedline.__version__]
    result = _run([str(bin_dir / "feedline"), "--version"], cwd=work)
    assert result.stdout.strip() == f"feedline {feedline.__version__}"
    result = _run([str(bin_dir / "feedline"), "inspect", "events-train"], cwd=work, input="")
    assert "1,200" in result.stdout and "events" in result.stdout
    installed = _run([str(python), "-m", "pip", "list", "--format=freeze"], cwd=work).stdout
    for heavy in ("torch", "tensorflow", "pyspark", "ray", "pandas"):
        assert f"\n{heavy}==" not in f"\n{installed.lower()}", f"{heavy} came with [images]"
