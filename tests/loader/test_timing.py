"""``Loader.timeline()`` and ``Loader.metrics()``: consumer-side timing of the training loop."""

from __future__ import annotations

import time

import pytest

import feedline as fl
from feedline.loader.timing import Timing


def _run(loader: fl.Loader, epochs: int, step_s: float = 0.0) -> None:
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for _ in loader:
            if step_s:
                time.sleep(step_s)


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_timeline_and_metrics_are_consistent(write, cache: str) -> None:
    ds = write(1000)
    loader = ds.loader(batch_size=64, format="numpy", cache=cache, columns=["id", "x"])
    _run(loader, 2)
    timeline, metrics = loader.timeline(), loader.metrics()
    per_epoch = len(loader)
    assert len(timeline) == 2 * per_epoch and [m["epoch"] for m in metrics] == [0, 1]
    for m in metrics:
        mine = [t for t in timeline if t["epoch"] == m["epoch"]]
        assert [t["batch"] for t in mine] == list(range(per_epoch))
        assert sum(t["samples"] for t in mine) == m["samples"] == per_epoch * 64
        assert m["batches"] == per_epoch
        assert mine[0]["step_s"] == 0.0  # nothing stepped before an epoch's first batch
        assert all(t["wait_s"] >= 0 and t["step_s"] >= 0 for t in mine)
        spent = sum(t["wait_s"] + t["step_s"] for t in mine)
        assert m["seconds"] >= spent > 0  # plus the step after the last batch
        assert m["samples_per_s"] == pytest.approx(m["samples"] / m["seconds"])
        assert 0 <= m["data_wait_fraction"] <= 1
        wait = sum(t["wait_s"] for t in mine)
        assert m["data_wait_fraction"] == pytest.approx(wait / m["seconds"])
    times = [t["time"] for t in timeline]
    assert times == sorted(times) and times[0] > 0


def test_a_slow_step_waits_less_for_data_than_a_fast_one(write) -> None:
    ds = write(2000)
    fast = ds.loader(batch_size=100, format="numpy", prefetch=2)
    slow = ds.loader(batch_size=100, format="numpy", prefetch=2)
    _run(fast, 1)
    _run(slow, 1, step_s=0.003)
    (f,), (s,) = fast.metrics(), slow.metrics()
    assert s["data_wait_fraction"] < f["data_wait_fraction"]
    assert s["samples_per_s"] < f["samples_per_s"]
    steps = [t["step_s"] for t in slow.timeline()[1:]]
    assert min(steps) >= 0.003  # the consumer's sleep is measured as step time


def test_resumed_iteration_continues_the_epoch(write) -> None:
    loader = write(1000).loader(batch_size=100, format="numpy")
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert len(loader.timeline()) == 4 and loader.metrics()[0]["batches"] == 4
    rest = list(loader)
    assert len(rest) == 6
    timeline = loader.timeline()
    assert [t["batch"] for t in timeline] == list(range(10))
    assert timeline[4]["step_s"] == 0.0  # a new iteration's first batch
    (m,) = loader.metrics()
    assert m["batches"] == 10 and m["samples"] == 1000


def test_an_epoch_iterated_again_is_measured_afresh(write) -> None:
    loader = write(500).loader(batch_size=100, format="numpy")
    _run(loader, 1)
    _run(loader, 1)  # set_epoch(0) again
    (m,) = loader.metrics()
    assert m["batches"] == 5 and len(loader.timeline()) == 10


def test_timeline_memory_is_bounded_and_epoch_totals_stay_exact() -> None:
    timing = Timing(batch_size=8, maxlen=3)
    timing.begin(0.0)
    run = timing.start_run(0, reset=True)
    previous = None
    for k in range(10):  # each batch: asked at k, got at k + 0.25
        timing.rows.append((run, k, float(k), k + 0.25, previous))
        previous = k + 0.25
        timing.trim()
    assert len(timing.rows) == 3
    assert [t["batch"] for t in timing.timeline()] == [7, 8, 9]
    (live,) = timing.metrics()  # in progress: folded sums plus the rows held
    assert live["batches"] == 10 and live["samples"] == 80
    assert timing.end_run(run, tail_step=0.75) == 9
    (m,) = timing.metrics()
    assert m["batches"] == 10 and m["seconds"] == pytest.approx(10 * 0.25 + 10 * 0.75)
    assert m["data_wait_fraction"] == pytest.approx(0.25)


def test_a_long_epoch_past_the_timeline_bound(write) -> None:
    loader = write(1000).loader(batch_size=10, format="numpy")
    loader._timing.maxlen = loader._timing.limit = 7  # a small bound, the real code path
    assert len(list(loader)) == 100
    assert len(loader.timeline()) == 7 and len(loader._timing.rows) < 7 + 64 + 1
    (m,) = loader.metrics()
    assert m["batches"] == 100 and m["samples"] == 1000


def test_no_metrics_before_iterating() -> None:
    loader = fl.range(10).loader(batch_size=5, format="numpy")
    assert loader.timeline() == [] and loader.metrics() == []
