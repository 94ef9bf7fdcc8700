"""Progress bars (``ui/progress.py``): when they show, that they count to the end, and silence."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from rich.console import Console

import feedline as fl
from feedline.ui import progress


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """A fake terminal as ``fl.config.console``; bars show at once (no delay)."""
    out = io.StringIO()
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    fl.config.console = Console(file=out, force_terminal=True, no_color=True, width=160)
    try:
        yield out
    finally:
        fl.config.console = None
        fl.config.progress = None


def final_lines(out: io.StringIO) -> list[str]:
    """The lines the terminal shows at the end (each redraw starts after a carriage return)."""
    return [line.split("\r")[-1].replace("\x1b[2K", "") for line in out.getvalue().split("\n")]


def test_explicit_setting_wins_then_config_then_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fl.config.progress is None
    assert progress.enabled() is False  # pytest captures stderr: not a terminal
    assert progress.enabled(True) is True
    fl.config.console = Console(file=io.StringIO(), force_terminal=True)
    try:
        assert progress.interactive() is True
        assert progress.enabled() is True  # auto follows the console: a terminal
        assert progress.enabled(False) is False
        fl.config.progress = False
        assert progress.enabled() is False
        assert progress.enabled(True) is True
        fl.config.console = Console(file=io.StringIO(), force_terminal=False)
        fl.config.progress = None
        assert progress.enabled() is False  # a pipe or a file: silent
    finally:
        fl.config.console = None
        fl.config.progress = None


def test_a_call_setting_is_inherited_by_the_calls_it_makes() -> None:
    fl.config.progress = True
    try:
        with progress.scope(False):
            assert progress.enabled() is False
            with progress.bar("inner") as advance:
                assert advance is progress.noop
        assert progress.enabled() is True
    finally:
        fl.config.progress = None


def test_config_rejects_anything_but_a_bool_or_none() -> None:
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.config.progress = "yes"  # type: ignore[assignment]
    assert fl.config.progress is None


def test_write_bar_counts_every_row(screen: io.StringIO, tmp_path) -> None:
    info = fl.range(10_000).write(tmp_path / "ds", rows_per_shard=3_000, progress=True)
    assert info.shards == 4
    last = [line for line in final_lines(screen) if "write" in line][-1]
    assert str(tmp_path / "ds") in last and "100%" in last and "10,000/10,000 rows" in last


def test_to_arrow_and_to_pandas_bars(screen: io.StringIO) -> None:
    assert fl.range(5_000).to_pandas(progress=True).shape == (5_000, 1)
    assert any("collect rows" in x and "5,000/5,000 rows" in x for x in final_lines(screen))


def test_fit_bar_counts_the_rows_fitted_on(screen: io.StringIO) -> None:
    scaler = fl.StandardScaler("id").fit(fl.range(2_000), progress=True)
    assert scaler.is_fitted
    assert any("fit StandardScaler" in x and "2,000/2,000 rows" in x for x in final_lines(screen))


def test_chain_fit_passes_its_setting_to_every_step(screen: io.StringIO) -> None:
    chain = fl.Chain([fl.StandardScaler("id"), fl.MinMaxScaler("id")])
    chain.fit(fl.range(1_000), progress=True)
    shown = [x for x in final_lines(screen) if "1,000/1,000 rows" in x]
    assert any("StandardScaler" in x for x in shown) and any("MinMaxScaler" in x for x in shown)
    screen.truncate(0)
    screen.seek(0)
    chain.fit(fl.range(1_000), progress=False)
    assert screen.getvalue() == ""


def test_transform_fit_inside_write_shows_both_bars(screen: io.StringIO, tmp_path) -> None:
    ds = fl.range(1_000).transform(fl.StandardScaler("id"))
    ds.write(tmp_path / "ds", progress=True)
    lines = final_lines(screen)
    assert any("fit StandardScaler" in x and "1,000/1,000" in x for x in lines)
    assert any("write" in x and "1,000/1,000" in x for x in lines)


@pytest.mark.parametrize("cache", ["memory", "node"])
def test_loader_cache_fill_bar(screen: io.StringIO, tmp_path, cache: str) -> None:
    fl.range(4_000).write(tmp_path / "ds", rows_per_shard=1_000)
    fl.config.progress = True
    loader = fl.open(tmp_path / "ds").loader(
        batch_size=1_000, shuffle=False, cache=cache, cache_dir=tmp_path / "node", format="numpy"
    )
    assert sum(len(b["id"]) for b in loader) == 4_000
    assert any(
        f"fill the {cache} cache" in x and "4,000/4,000 rows" in x for x in final_lines(screen)
    )


def test_shard_download_bar(screen: io.StringIO, s3_bucket, tmp_path) -> None:
    url = f"{s3_bucket.url}/ds"
    fl.range(2_000).write(url, rows_per_shard=1_000, storage_options=s3_bucket.storage_options)
    ds = fl.open(url, storage_options=s3_bucket.storage_options)
    fl.config.progress = True
    loader = ds.loader(batch_size=500, shuffle=False, cache_dir=tmp_path / "c", format="numpy")
    assert sum(len(b["id"]) for b in loader) == 2_000
    for thread in threading.enumerate():
        if thread.name == "feedline-shard-prefetch":
            thread.join(timeout=10)
    shards = {s.path for s in ds.manifest.shards}
    downloads = [x for x in screen.getvalue().split("\r") if "download s3://" in x]
    assert {p for p in shards if any(p in x for x in downloads)} == shards


def test_silent_when_off(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    out = io.StringIO()
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    fl.config.console = Console(file=out, force_terminal=True)
    try:
        fl.range(1_000).write(tmp_path / "a", progress=False)
        fl.config.progress = False
        fl.range(1_000).write(tmp_path / "b")
        fl.StandardScaler("id").fit(fl.range(100))
        next(iter(fl.open(tmp_path / "b").loader(batch_size=10, cache="memory", format="numpy")))
        fl.config.progress = None
        fl.config.console = Console(file=out, force_terminal=False)  # not a terminal: auto is off
        fl.range(1_000).write(tmp_path / "c")
        fl.range(1_000).to_arrow()
    finally:
        fl.config.console = None
        fl.config.progress = None
    assert out.getvalue() == ""


def test_short_calls_draw_nothing(tmp_path) -> None:
    out = io.StringIO()
    fl.config.console = Console(file=out, force_terminal=True)
    try:
        fl.range(10).write(tmp_path / "ds", progress=True)  # done well within DELAY_SECONDS
    finally:
        fl.config.console = None
    assert out.getvalue() == ""


def test_disabled_advance_costs_nothing_measurable() -> None:
    import timeit

    with progress.bar("x", progress=False) as advance:
        per_call = min(timeit.repeat(lambda: advance(1), number=10_000, repeat=3)) / 10_000
    assert advance is progress.noop and per_call < 2e-6


def test_importing_feedline_prints_nothing_and_adds_no_root_handler() -> None:
    code = (
        "import logging; before = list(logging.getLogger().handlers); import feedline; "
        "assert logging.getLogger().handlers == before, logging.getLogger().handlers; "
        "hs = logging.getLogger('feedline').handlers; "
        "assert [type(h).__name__ for h in hs] == ['NullHandler'], hs; "
        "assert 'rich' not in __import__('sys').modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
