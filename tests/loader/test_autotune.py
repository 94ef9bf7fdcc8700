"""num_workers="auto" / prefetch="auto": the tuner's decisions (a slow transform gets workers,
a trivial one does not, uneven batches get a deeper queue within the memory budget) and what
it never changes (the batches, their order, exact resume, with threads and processes)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import map_fns
import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader.nodes.worker_pools import ThreadWorkers
from feedline.loader.profiling import autotune

#: what the scripted tuner sets, in turn, every two batches
SCRIPT = [("num_workers", 3), ("prefetch", 5), ("num_workers", 1), ("prefetch", 1),
          ("num_workers", 2), ("prefetch", 3)]  # fmt: skip


def dataset(n: int = 200) -> fl.Dataset:
    ids = np.arange(n, dtype=np.int64)
    x = (ids[:, None] + np.arange(3)).astype(np.float32)
    return fl.from_arrow(pa.table({"id": ids, "x": pa.array(list(x), pa.list_(pa.float32(), 3))}))


def arrays(batches: Iterable[dict[str, Any]]) -> list[tuple[list[int], bytes, list[bool]]]:
    return [(np.asarray(b["id"]).tolist(), np.asarray(b["noisy"]).tobytes(),
             np.asarray(b["flip"]).tolist()) for b in batches]  # fmt: skip


def take(loader: fl.Loader, k: int) -> list[dict[str, Any]]:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == k:
            break
    return out


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuner that resizes the workers and the queue every two batches, up and down, as
    :data:`SCRIPT` says (the real policy decides the same kind of changes, on timings)."""
    for name, value in (("WINDOW_BATCHES", 2), ("WINDOW_S", 0.0), ("SETTLE_BATCHES", 0),
                        ("SETTLE_S", 0.0)):  # fmt: skip
        monkeypatch.setattr(autotune, name, value)

    def decide(self: autotune.Autotuner, now: float) -> None:
        knob, value = SCRIPT[len(self.history) % len(SCRIPT)]
        self._change(knob, value, "scripted")
        self._start(now)

    monkeypatch.setattr(autotune.Autotuner, "_decide", decide)


def tuned(ds: fl.Dataset, seed: int, worker_type: str) -> fl.Loader:
    return ds.loader(batch_size=8, seed=seed, format="numpy", transform=map_fns.slow_augment,
                     num_workers="auto", prefetch="auto", worker_type=worker_type)  # fmt: skip


def fixed(ds: fl.Dataset, seed: int, worker_type: str = "thread") -> fl.Loader:
    return ds.loader(batch_size=8, seed=seed, format="numpy", transform=map_fns.augment,
                     num_workers=2, prefetch=2, worker_type=worker_type)  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("worker_type", "seed"), [("thread", 0), ("thread", 3), ("thread", 11), ("process", 5)]
)
def test_resizing_workers_and_prefetch_mid_epoch_never_changes_the_batches(
    scripted: None, worker_type: str, seed: int
) -> None:
    ds = dataset()
    with tuned(ds, seed, worker_type) as auto, fixed(ds, seed) as reference:
        for epoch in range(2):
            auto.set_epoch(epoch)
            reference.set_epoch(epoch)
            assert arrays(auto) == arrays(reference)
        history = auto.stats()["autotune"]["history"]
    assert len(history) >= 20  # the workers and the queue really changed, many times
    assert {d["new"] for d in history if d["knob"] == "num_workers"} == {1, 2, 3}
    assert {d["new"] for d in history if d["knob"] == "prefetch"} == {1, 3, 5}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_tuned_run_resumes_exactly_in_an_untuned_loader_and_back(
    scripted: None, worker_type: str
) -> None:
    ds = dataset()
    with fixed(ds, 7) as whole:
        expected = arrays(whole)
    with tuned(ds, 7, worker_type) as auto:
        head = take(auto, 9)
        state = auto.state_dict()
        assert auto.stats()["autotune"]["history"]  # it was tuning when the state was taken
    with fixed(ds, 7, worker_type) as untuned:
        untuned.load_state_dict(state)
        assert arrays(head) + arrays(untuned) == expected
    with fixed(ds, 7, worker_type) as untuned:
        head = take(untuned, 13)
        state = untuned.state_dict()
    with tuned(ds, 7, worker_type) as auto:
        auto.load_state_dict(state)
        assert arrays(head) + arrays(auto) == expected
        assert auto.stats()["autotune"]["history"]


@pytest.fixture(autouse=True)
def short_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 0.1 s (not 0.5 s: these tests' timings are sleeps, not noisy work)."""
    monkeypatch.setattr(autotune, "WINDOW_S", 0.1)


def run(loader: fl.Loader, batches: int, step_s: float = 0.0,
        until: Any = None) -> dict[str, Any]:  # fmt: skip
    """Take up to ``batches`` batches (epoch after epoch) with a training step of ``step_s``;
    stop early once ``until(report)`` holds. Returns ``stats()["autotune"]``."""
    taken = 0
    with loader:
        while taken < batches:
            for _ in loader:
                taken += 1
                if step_s:
                    time.sleep(step_s)
                if taken >= batches or (until and until(loader.stats()["autotune"])):
                    return loader.stats()["autotune"]
    return loader.stats()["autotune"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_slow_transform_gets_workers_up_to_the_cpus_allowed(
    monkeypatch: pytest.MonkeyPatch, worker_type: str
) -> None:
    monkeypatch.setattr(autotune, "cpus_available", lambda: 3)  # a 3-CPU host (or cgroup)
    loader = fl.range(8000).loader(batch_size=8, format="numpy", transform=map_fns.two_ms,
                                   num_workers="auto", worker_type=worker_type)  # fmt: skip
    report = run(loader, 600, until=lambda r: r["num_workers"] == 3 and "kept" in
                 r["history"][-1]["reason"])  # fmt: skip
    counts = [d["new"] for d in report["history"] if d["knob"] == "num_workers"]
    assert report["max_workers"] == 3
    assert report["num_workers"] == 3, report["history"]  # sleeps: every worker pays
    assert max(counts) <= 3  # never more workers than CPUs
    assert report["prefetch"] is None  # not "auto": never touched


@pytest.mark.timeout(120)
def test_a_trivial_transform_keeps_one_worker_when_the_step_is_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(autotune, "cpus_available", lambda: 4)
    loader = fl.range(4000).loader(batch_size=8, format="numpy", num_workers="auto",
                                   transform=lambda s, rng: {"id": s["id"]})  # fmt: skip
    report = run(loader, 200, step_s=0.002)
    assert report["batches_seen"] == 200
    assert report["num_workers"] == 1
    assert not [d for d in report["history"] if d["knob"] == "num_workers"], report["history"]


@pytest.mark.timeout(120)
def test_uneven_batches_get_a_deeper_prefetch() -> None:
    loader = fl.range(12000).loader(batch_size=8, shuffle=False, format="numpy",
                                    transform=map_fns.uneven, num_workers=1,
                                    prefetch="auto")  # fmt: skip
    report = run(loader, 500, step_s=0.003, until=lambda r: r["prefetch"] >= 8)
    assert report["prefetch"] >= 4, report["history"]
    assert all(d["reason"].startswith("uneven") for d in report["history"])
    assert report["num_workers"] is None  # a fixed count: never touched
    row = loader.profile().stage("prefetch")  # its fill is a share of the depth of the time
    assert row is not None and row.queue_occupancy is not None
    assert 0.0 <= row.queue_occupancy <= 1.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("budget", [8_000_000, 2_000_000])
def test_the_prefetch_stays_within_the_memory_budget(budget: int) -> None:
    loader = fl.range(12000).loader(batch_size=8, shuffle=False, format="numpy",
                                    transform=map_fns.uneven_big, num_workers=1,
                                    prefetch="auto", memory_budget=budget)  # fmt: skip
    room = (budget - 8 * 12000) // 2  # half of what the cache (8-byte ids) leaves

    def bound_of(r: dict[str, Any]) -> int:
        return max(1, room // r["batch_bytes"] - autotune.IN_FLIGHT)

    # until the queue reached its bound (each doubling waits out windows of >= 0.1 s: 400
    # batches were not always enough on a busy machine)
    report = run(loader, 2000, step_s=0.003,
                 until=lambda r: r["batch_bytes"] and r["prefetch"] == bound_of(r))  # fmt: skip
    assert report["batch_bytes"] >= 8 * 64 * 1024  # 8 samples of 64 KiB
    bound = bound_of(report)
    assert report["max_prefetch"] == bound
    assert report["prefetch"] <= bound
    assert max(d["new"] for d in report["history"]) <= bound
    if bound == 1:  # the start (2) did not fit: lowered, saying why
        assert report["history"][0]["new"] == 1
        assert "memory budget" in report["history"][0]["reason"]
    else:
        assert report["prefetch"] == bound, report["history"]  # grown as far as it may


def test_thread_workers_grow_and_retire_between_chunks() -> None:
    pool = ThreadWorkers(map_fns.augment, 1)
    columns = {"id": np.arange(4), "x": np.zeros((4, 3), np.float32)}

    def chunk() -> None:
        pool.submit(columns, np.arange(4), batched=False, seed=0, epoch=0).result()

    try:
        chunk()
        pool.resize(3)
        chunk()
        assert len(pool._threads) == 3
        pool.resize(1)
        deadline = time.monotonic() + 10
        while len(pool._threads) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(pool._threads) == 1 and pool.num_workers == 1
        chunk()  # the one left still works
    finally:
        pool.close()


def test_auto_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="prefetch must be an int >= 0 or 'auto'"):
        fl.range(4).loader(prefetch="Auto")
    with pytest.raises(ConfigurationError, match="or 'auto'"):
        fl.range(4).loader(num_workers="many", transform=map_fns.augment)
    loader = fl.range(4).loader(2, num_workers="auto", transform=map_fns.half_ms, timeout=5)
    assert loader.stats()["num_workers"] == 1  # "auto" starts with one
    assert "autotune" not in fl.range(4).loader(2).stats()
    assert fl.range(4).loader(2, prefetch="auto").stats()["autotune"]["num_workers"] is None


def test_the_profile_names_the_tuned_values() -> None:
    loader = fl.range(64).loader(batch_size=8, format="numpy", prefetch="auto")
    _ = list(loader)
    profile = loader.profile()  # small batches, no transform: one group ready at a time
    assert profile.autotune is not None and profile.autotune["prefetch"] == 1
    assert profile.autotune["batches_per_prefetch"] > 1
    assert "autotuned to prefetch=1" in str(profile)


@pytest.mark.timeout(120)
def test_a_mix_tuned_mid_epoch_gives_the_batches_of_fixed_settings(scripted: None) -> None:
    """fl.mix(...).loader(num_workers="auto", prefetch="auto"): the same tuner, the same
    batches as a fixed setting, and a state that resumes in a fixed-setting mix."""
    sources = {"a": dataset(120), "b": dataset(80)}

    def mixed(**options: Any) -> Any:
        return fl.mix(sources, seed=4, window=8).loader(8, format="numpy", **options)

    auto = mixed(transform=map_fns.slow_augment, num_workers="auto", prefetch="auto")
    reference = mixed(transform=map_fns.augment, num_workers=2, prefetch=2)
    with auto, reference:
        for epoch in range(2):
            auto.set_epoch(epoch)
            reference.set_epoch(epoch)
            assert arrays(auto) == arrays(reference)
        report = auto.stats()["autotune"]
        head = take(auto, 5)
        resumed = mixed(transform=map_fns.augment, num_workers=1)
        resumed.load_state_dict(auto.state_dict())
        reference.set_epoch(2)  # the epoch after the two compared
        assert arrays(head) + arrays(resumed) == arrays(reference)
        resumed.close()
    assert {d["new"] for d in report["history"] if d["knob"] == "num_workers"} == {1, 2, 3}
    assert {d["new"] for d in report["history"] if d["knob"] == "prefetch"} == {1, 3, 5}
    with pytest.raises(ConfigurationError, match="prefetch must be an int >= 0 or 'auto'"):
        mixed(prefetch="soon")


@pytest.mark.timeout(120)
def test_a_mix_keeps_its_tuned_prefetch_within_the_memory_budget() -> None:
    """The mix's tuner, like one dataset's, bounds the queue by half of what memory_budget
    leaves beside the sources' caches (8-byte ids here)."""
    budget = 2_000_000
    sources = {"a": fl.range(6000), "b": fl.range(6000)}
    loader = fl.mix(sources, seed=0, stop="all_exhausted").loader(
        8, format="numpy", transform=map_fns.uneven_big, num_workers=1, prefetch="auto",
        memory_budget=budget)  # fmt: skip
    report = run(loader, 400, step_s=0.003)
    room = (budget - 8 * 12000) // 2
    assert report["batch_bytes"] >= 8 * 64 * 1024
    bound = max(1, room // report["batch_bytes"] - autotune.IN_FLIGHT)
    assert report["max_prefetch"] == bound
    assert max([report["prefetch"], *(d["new"] for d in report["history"])]) <= bound
