"""loader.diagnose(): known bottlenecks built on CPU are named, and the suggested change helps.

Each slow stage sleeps (releasing the GIL), so the ratios hold on a loaded 2-core machine;
the ratios are of samples/s measured in one run, never absolute times.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import map_fns
import pytest
from faults import Fault, FaultPlan

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader.profiling.diagnose import run_against_step, twin

STEP_MS = 5.0


def samples_per_s(loader: Any, batches: int = 40, step_ms: float = STEP_MS) -> float:
    """The loop's samples/s against a ``step_ms`` step, the first batch left out."""
    run_against_step(loader, lambda b: time.sleep(step_ms / 1e3), seconds=None, batches=batches)
    rows = loader.timeline()[1:]
    return sum(r["samples"] for r in rows) / sum(r["wait_s"] + r["step_s"] for r in rows)


def helps(loader: Any, change: dict[str, Any], **run: Any) -> float:
    """samples/s with ``change`` over samples/s without, measured one after the other."""
    before = samples_per_s(twin(loader), **run)
    after = samples_per_s(twin(loader, **change), **run)
    return after / before


@pytest.mark.timeout(120)
def test_a_slow_transform_inline_gets_workers() -> None:
    loader = fl.range(4000).loader(batch_size=8, format="numpy", transform=map_fns.sleepy)
    d = loader.diagnose(step_ms=STEP_MS, seconds=1.0)
    assert d.waits and d.bound == "transform"
    assert d.change.get("num_workers", 0) >= 2 and "transform" in d.verdict
    assert helps(loader, d.change) >= 1.3


@pytest.mark.timeout(120)
def test_too_few_workers_get_more() -> None:
    loader = fl.range(4000).loader(batch_size=8, format="numpy", transform=map_fns.sleepy,
                                   num_workers=1)  # fmt: skip
    d = loader.diagnose(step_ms=STEP_MS, seconds=1.0, verify=True)
    assert d.waits and d.bound == "transform" and d.change["num_workers"] >= 2
    assert d.measured is not None and d.measured >= 1.3
    assert helps(loader, d.change) >= 1.3


@pytest.mark.timeout(120)
def test_no_prefetch_gets_prefetch() -> None:
    loader = fl.range(4000).loader(batch_size=8, format="numpy", transform=map_fns.half_ms,
                                   prefetch=0)  # fmt: skip
    d = loader.diagnose(step_ms=STEP_MS, seconds=1.0)
    assert d.waits and d.change == {"prefetch": 2} and "prefetch=0" in d.verdict
    assert helps(loader, d.change) >= 1.3


@pytest.mark.timeout(120)
def test_slow_storage_names_the_gather_and_a_cache(tmp_path: Path, table_of: Any) -> None:
    fl.from_arrow(table_of(2000)).write(tmp_path / "ds", rows_per_shard=500, row_group_rows=25)
    plan = FaultPlan([Fault("read", error="stall", times=None, stall_s=0.003)])
    url, options = plan.wrap(str(tmp_path / "ds"), None)
    slow = fl.open(url, storage_options=options)
    loader = slow.loader(batch_size=25, format="numpy", cache="none", cache_dir=False,
                         columns=["id", "x"])  # fmt: skip
    d = loader.diagnose(step_ms=2, seconds=1.0)
    assert plan.fired and d.waits and d.bound == "gather"
    assert d.change == {"cache": "memory"} and "storage" in d.verdict
    # two epochs (a streaming pool's rows come fast once read); the first batch, with the
    # memory cache's one-off fill, is left out
    assert helps(loader, d.change, batches=160, step_ms=2) >= 1.3


def test_a_fast_loader_is_not_blamed() -> None:
    d = fl.range(4000).loader(batch_size=16, format="numpy").diagnose(step_ms=2, batches=30)
    assert not d.waits and d.change == {} and d.bound == "step"
    assert "would not wait" in d.verdict


def test_the_loader_itself_does_not_move_and_the_chart_is_written(tmp_path: Path) -> None:
    loader = fl.range(100).loader(batch_size=10, format="numpy", seed=2,
                                  transform=map_fns.ident)  # fmt: skip
    d = loader.diagnose(step_ms=1, batches=5)
    assert loader.state_dict()["batches"] == 0 and loader.metrics() == []
    assert d.plot(tmp_path / "stages.png").stat().st_size > 1000


@pytest.mark.parametrize("bad", [dict(step_ms=-1), dict(seconds=0), dict(batches=1),
                                 dict(step_ms=float("nan"))])  # fmt: skip
def test_bad_bounds_are_refused(bad: dict[str, Any]) -> None:
    loader = fl.range(10).loader(batch_size=2)
    with pytest.raises(ConfigurationError, match="Fix:"):
        loader.diagnose(**bad)
