"""Properties of the loader's transforms (hypothesis): exact resume through map with thread
and process workers and random augmentation at any batch, epochs differ, the same seed gives
the same samples, and no worker thread or process leaks after 1,000 early breaks."""

from __future__ import annotations

import gc
import threading

import map_fns
import numpy as np
import psutil
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.loader import Loader

SETTINGS = settings(max_examples=20, deadline=None)
WORKERS = st.sampled_from([(0, "thread"), (2, "thread"), (2, "process")])


def dataset(n: int) -> fl.Dataset:
    ids = np.arange(n, dtype=np.int64)
    x = (ids[:, None] * 10 + np.arange(3)).astype(np.float32)
    return fl.from_arrow(pa.table({"id": ids, "x": pa.array(list(x), pa.list_(pa.float32(), 3))}))


def epoch_of(loader: Loader, epoch: int) -> list[dict[str, np.ndarray]]:
    loader.set_epoch(epoch)
    return list(loader)


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


@SETTINGS
@given(n=st.integers(1, 80), batch=st.integers(1, 12), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 5), drop_last=st.booleans(), workers=WORKERS,
       batched=st.booleans(), data=st.data())  # fmt: skip
def test_resume_through_map_at_any_batch_repeats_the_augmented_epoch(
    n: int, batch: int, seed: int, epoch: int, drop_last: bool, workers: tuple[int, str],
    batched: bool, data: st.DataObject,
) -> None:  # fmt: skip
    num_workers, worker_type = workers
    fn = map_fns.batch_augment if batched else map_fns.augment
    kwargs = {"batch_size": batch, "seed": seed, "drop_last": drop_last, "format": "numpy",
              "transform": fn, "batched": batched}  # fmt: skip
    ds = dataset(n)
    with Loader(ds, **kwargs) as reference:
        expected = epoch_of(reference, epoch)
    stop = data.draw(st.integers(0, len(expected)))
    with Loader(ds, **kwargs, num_workers=num_workers, worker_type=worker_type,
                prefetch=data.draw(st.integers(0, 3))) as first:  # fmt: skip
        first.set_epoch(epoch)
        iterator = iter(first)
        head = [next(iterator) for _ in range(stop)]
        state = first.state_dict()
        iterator.close()
    resumed = Loader(ds, **{**kwargs, "seed": None}, num_workers=num_workers,
                     worker_type=worker_type)  # fmt: skip
    with resumed:
        resumed.load_state_dict(state)
        resumed.set_epoch(epoch)
        tail = list(resumed) if stop < len(expected) else []
    assert same(head + tail, expected)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), workers=WORKERS)
def test_epochs_differ_and_the_same_seed_repeats_the_samples(
    seed: int, workers: tuple[int, str]
) -> None:
    num_workers, worker_type = workers
    ds = dataset(40)
    kwargs = {"batch_size": 8, "seed": seed, "format": "numpy", "transform": map_fns.augment,
              "num_workers": num_workers, "worker_type": worker_type}  # fmt: skip
    with Loader(ds, **kwargs) as a, Loader(ds, **kwargs) as b:
        first, second = epoch_of(a, 0), epoch_of(a, 1)
        assert same(first, epoch_of(b, 0)) and same(second, epoch_of(b, 1))
    by_id = [{int(i): v for bt in e for i, v in zip(bt["id"], bt["noisy"], strict=True)}
             for e in (first, second)]  # fmt: skip
    common = by_id[0].keys() & by_id[1].keys()
    assert common and all(not np.array_equal(by_id[0][i], by_id[1][i]) for i in common)


def test_no_worker_threads_or_processes_leak_after_1000_early_breaks() -> None:
    me = psutil.Process()
    ds = dataset(64)
    for worker_type in ("thread", "process"):
        before = set(threading.enumerate())
        loader = Loader(ds, batch_size=4, format="numpy", transform=map_fns.augment,
                        num_workers=2, worker_type=worker_type)  # fmt: skip
        next(iter(loader))  # workers started (once per loader)
        threads = threading.active_count()
        children = {p.pid for p in me.children(recursive=True)}  # forkserver's workers too
        pids = loader._workers.pids
        assert len(pids) == (2 if worker_type == "process" else 0)
        for _ in range(1000):
            for batch in loader:
                assert len(batch["id"]) == 4
                break
        del batch
        gc.collect()
        assert threading.active_count() == threads  # every prefetch thread stopped
        assert {p.pid for p in me.children(recursive=True)} == children  # the same workers
        assert loader._workers.pids == pids
        assert loader.state_dict()["batches"] > 0
        del loader
        gc.collect()  # the loader's finalizer stops its workers
        assert not [pid for pid in pids if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]  # fmt: skip
        assert not [t.name for t in set(threading.enumerate()) - before]  # no thread left
