"""loader.profile(): per-stage accounting of the node pipeline (feedline.loader.profiling)."""

from __future__ import annotations

import sys

import map_fns
import numpy as np
import pytest

import feedline as fl
from feedline.loader.nodes.node import Batch
from feedline.loader.profiling.stages import Meter, StageMeters, StageStats


def test_every_stage_counts_the_batches_and_samples_that_pass() -> None:
    loader = fl.range(1000).loader(batch_size=10, format="numpy", transform=map_fns.ident,
                                   num_workers=2, seed=0)  # fmt: skip
    delivered = sum(len(b["id"]) for b in loader)
    p = loader.profile()
    assert [row.name for row in p.stages] == ["prefetch", "format", "transform", "gather", "order"]
    assert p.samples == delivered == 1000
    for row in p.stages:
        assert (row.batches, row.samples) == (100, 1000), row
    threads = {row.name: row.thread for row in p.stages}
    assert threads == {"prefetch": "loop", "format": "prefetch", "transform": "prefetch",
                       "gather": "prefetch", "order": "prefetch"}  # fmt: skip
    transform = p.stage("transform")
    assert transform is not None and transform.workers == 2 and transform.worker_type == "thread"
    assert transform.busy_s > 0 and 0 < transform.utilisation <= 1
    gather = p.stage("gather")
    assert gather is not None and gather.bytes > 0


def test_a_slow_transform_takes_the_work_and_the_stages_after_it_wait() -> None:
    loader = fl.range(160).loader(batch_size=8, format="numpy", transform=map_fns.sleepy,
                                  prefetch=0)  # fmt: skip
    _ = list(loader)
    p = loader.profile()
    transform, fmt, gather = p.stage("transform"), p.stage("format"), p.stage("gather")
    assert transform is not None and fmt is not None and gather is not None
    assert p.busiest is transform
    # 2 ms x 160 samples of sleep at least, all in the transform's own work
    assert transform.work_s >= 0.3 and transform.work_s > 10 * gather.work_s
    assert fmt.input_wait_s >= transform.work_s  # the format waits for the transform
    assert all(row.thread == "loop" for row in p.stages)  # prefetch=0: one thread


def test_the_prefetch_queue_occupancy_is_reported() -> None:
    loader = fl.range(400).loader(batch_size=4, format="numpy", transform=map_fns.ident,
                                  prefetch=4)  # fmt: skip
    for _ in loader:
        pass
    row = loader.profile().stage("prefetch")
    assert row is not None and row.queue_occupancy is not None
    assert 0.0 <= row.queue_occupancy <= 1.0


def test_process_workers_report_their_busy_time() -> None:
    loader = fl.range(64).loader(batch_size=8, format="numpy", transform=map_fns.half_ms,
                                 num_workers=2, worker_type="process")  # fmt: skip
    with loader:
        _ = list(loader)
    row = loader.profile().stage("transform")
    assert row is not None and row.worker_type == "process"
    assert row.busy_s >= 64 * 0.0005 * 0.9  # the workers' own clock, sent back with each chunk


def test_the_views_show_the_stages_and_escape_names() -> None:
    loader = fl.range(100).loader(batch_size=10, format="numpy")
    _ = list(loader)
    p = loader.profile()
    text, html = str(p), p._repr_html_()
    assert "gather" in text and "samples/s" in text and "<table>" in html
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(p)
    assert "gather" in console.export_text()
    # a user's node named with markup and controls: shown inert
    meters = StageMeters()
    node = meters.instrument(loader.source_node())
    _ = list(node)
    stats = next(iter(meters.stages.values()))
    stats.name = "<b>x</b>\x1b[2J"
    from feedline.loader.profiling.report import build_profile

    shown = build_profile(list(meters.stages.values()), [], 10)
    assert "<b>x</b>" not in shown._repr_html_() and "\x1b" not in str(shown)


def test_meters_can_be_turned_off_and_change_no_batch() -> None:
    on = fl.range(500).loader(batch_size=16, format="numpy", seed=3)
    off = fl.range(500).loader(batch_size=16, format="numpy", seed=3)
    off._stages.enabled = False
    assert [b["id"].tolist() for b in on] == [b["id"].tolist() for b in off]
    assert off.profile().stages == [] and on.profile().stages


def test_state_and_resume_stay_exact_through_the_meters() -> None:
    loader = fl.range(100).loader(batch_size=10, format="numpy", seed=1,
                                  transform=map_fns.ident)  # fmt: skip
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(3)]
    state = loader.state_dict()
    resumed = fl.range(100).loader(batch_size=10, format="numpy", transform=map_fns.ident)
    resumed.load_state_dict(state)
    whole = [b["id"].tolist() for b in fl.range(100).loader(batch_size=10, format="numpy",
                                                            seed=1)]  # fmt: skip
    assert head + [b["id"].tolist() for b in resumed] == whole


@pytest.mark.skipif("torch" not in sys.modules and not __import__("importlib").util.find_spec(
    "torch"), reason="needs torch")  # fmt: skip
def test_stages_appear_in_the_torch_profiler() -> None:
    import torch

    loader = fl.range(64).loader(batch_size=8, format="numpy", prefetch=0,
                                 transform=map_fns.ident)  # fmt: skip
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _ = list(loader)
    names = {event.name for event in prof.events()}
    assert {"feedline.transform", "feedline.gather", "feedline.order"} <= names
    # and without an active profiler no range is opened
    _ = list(fl.range(64).loader(batch_size=8, format="numpy", prefetch=0))


def test_group_samples_are_exact_also_when_a_group_breaks_the_full_batches_rule() -> None:
    full = [Batch(0, k, np.arange(8 if k < 3 else 5)) for k in range(4)]  # the last short
    odd = [Batch(0, k, np.arange(8 if k != 1 else 3)) for k in range(4)]  # a short one inside

    class Groups:
        def __init__(self, groups: list[list[Batch]]) -> None:
            self.groups = iter(groups)

        def next_group(self) -> list[Batch]:
            return next(self.groups)

    for groups, exact in (([full] * 40, False), ([odd] * 40, True)):
        meter = Meter(Groups(groups), StageStats("gather", "Gather", 1))  # type: ignore[arg-type]
        for _ in groups:
            meter.next_group()
        assert meter.stats.samples == sum(len(b.indices) for g in groups for b in g)
        assert meter.stats.batches == 4 * len(groups)
        assert meter._exact is exact
