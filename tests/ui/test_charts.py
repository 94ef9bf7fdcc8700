"""PNG charts of loader timelines: valid, sized, not blank; binning conserves samples and time."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import feedline as fl
from feedline.charts import DPI, FIGSIZE, bin_timeline, plot_loader_timeline
from feedline.cli.bench_loader import bench_loader
from feedline.cli.main import main

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

WIDTH, HEIGHT = int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", head[16:24])


def _assert_drawn(path: Path) -> None:
    assert _png_size(path) == (WIDTH, HEIGHT)
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
    assert pixels.std() > 10  # not blank
    # blue throughput bars and orange wait bars are both drawn
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    assert ((b > r + 40) & (b > g)).sum() > 1000
    assert ((r > b + 60) & (g > b)).sum() > 1000


@pytest.fixture(scope="module")
def timeline() -> list[dict]:
    loader = fl.range(20_000).loader(batch_size=100, format="numpy")
    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            if epoch == 1:
                time.sleep(0.0005)
    return loader.timeline()


def test_plot_writes_a_readable_png(timeline, tmp_path: Path) -> None:
    out = plot_loader_timeline(timeline, tmp_path / "sub" / "t.png", title="<two epochs>")
    assert out == tmp_path / "sub" / "t.png"
    _assert_drawn(out)


def test_binning_conserves_samples_and_time(timeline) -> None:
    binned = bin_timeline(timeline, bins=40)
    widths = np.diff(binned["edges"])
    total = sum(t["samples"] for t in timeline)
    assert (binned["samples_per_s"] * widths).sum() == pytest.approx(total)
    (whole,) = bin_timeline(timeline, bins=1)["wait_fraction"]
    wait = sum(t["wait_s"] for t in timeline)
    assert whole == pytest.approx(wait / sum(t["wait_s"] + t["step_s"] for t in timeline))
    fractions = binned["wait_fraction"][~np.isnan(binned["wait_fraction"])]
    assert ((fractions >= 0) & (fractions <= 1 + 1e-9)).all()
    # the sleeping epoch (1) waits for a smaller share of its time than the busy one (0)
    first_epoch_1 = next(t for t in timeline if t["epoch"] == 1)["time"]
    mids = (binned["edges"][1:] + binned["edges"][:-1]) / 2
    late = binned["wait_fraction"][(mids > first_epoch_1) & ~np.isnan(binned["wait_fraction"])]
    early = binned["wait_fraction"][(mids < first_epoch_1) & ~np.isnan(binned["wait_fraction"])]
    assert np.median(late) < np.median(early)


def test_bad_timelines_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(fl.ConfigurationError, match=r"empty.*Fix:"):
        plot_loader_timeline([], tmp_path / "x.png")
    with pytest.raises(fl.ConfigurationError, match=r"wait_s.*Fix:"):
        plot_loader_timeline([{"epoch": 0, "time": 1.0, "samples": 1}], tmp_path / "x.png")
    (tmp_path / "file").write_text("")
    with pytest.raises(fl.ConfigurationError, match=r"cannot write.*Fix:"):
        plot_loader_timeline([{"epoch": 0, "time": 1.0, "samples": 1, "wait_s": 0.5,
                               "step_s": 0.0}], tmp_path / "file" / "x.png")  # fmt: skip
    assert not list(tmp_path.glob("*.png"))


def test_bench_loader_and_cli_write_the_chart(tmp_path: Path) -> None:
    fl.range(5000).write(tmp_path / "ds")
    result = bench_loader(
        tmp_path / "ds", batch_size=100, epochs=2, chart=tmp_path / "b.png", format="numpy"
    )
    assert result["chart"] == str(tmp_path / "b.png")
    _assert_drawn(tmp_path / "b.png")
    argv = ["bench-loader", str(tmp_path / "ds"), "--batch-size", "50", "--chart"]
    assert main([*argv, str(tmp_path / "c.png")]) == 0
    _assert_drawn(tmp_path / "c.png")


def test_charts_never_touch_pyplot_or_the_global_backend(tmp_path: Path) -> None:
    code = (
        "import sys, matplotlib, feedline as fl\n"
        "from feedline.charts import plot_loader_timeline\n"
        "raw = lambda: dict.__getitem__(matplotlib.rcParams, 'backend')  # unresolved\n"
        "before = raw()\n"
        "loader = fl.range(1000).loader(batch_size=10, format='numpy')\n"
        "_ = list(loader)\n"
        f"plot_loader_timeline(loader.timeline(), {str(tmp_path / 'p.png')!r})\n"
        "print('matplotlib.pyplot' in sys.modules, raw() == before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    _assert_drawn(tmp_path / "p.png")


def test_without_matplotlib_the_error_names_the_extra(timeline, monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if it were not installed
    with pytest.raises(fl.MissingDependencyError, match=r"feedline\[plots\]"):
        plot_loader_timeline(timeline, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
