"""Streaming mode (two-level shuffle, bounded memory), prefetch threads and error delivery."""

from __future__ import annotations

import os
import threading
import time
import traceback

import numpy as np
import pytest

from feedline.errors import DataError
from feedline.loader import Loader
from feedline.loader.nodes.background import Prefetcher
from feedline.loader.order.sample_order import block_shuffle_order, block_shuffle_pools


def ids(loader: Loader) -> np.ndarray:
    return np.concatenate([np.asarray(b["id"]) for b in loader])


def feedline_threads() -> list[threading.Thread]:
    # the loader's own threads; DecodeImages keeps one process-wide decode pool on purpose
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("feedline") and not t.name.startswith("feedline-decode")
    ]


def test_streaming_yields_the_two_level_permutation_with_bounded_pools(write) -> None:
    ds = write(1000, rows_per_shard=250, row_group_rows=50)  # 20 row groups of 50 rows
    sizes = ds.manifest.row_group_sizes
    loader = ds.loader(batch_size=40, cache="none", shuffle_window=3, drop_last=False,
                       return_padding_mask=True, format="numpy", seed=4)  # fmt: skip
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        batches = list(loader)
        order = np.concatenate([b["id"] for b in batches])
        pad = np.concatenate([b["_padded"] for b in batches])
        np.testing.assert_array_equal(order[~pad], block_shuffle_order(sizes, 4, epoch, 3))
        stats = loader.stats()
        assert stats["cache"] == "none" and stats["cache_bytes"] == 0
        assert stats["max_pool_rows"] == 3 * 50  # a pool is `window` row groups
        assert stats["max_resident_rows"] <= 2 * 3 * 50  # at most the two pools a batch spans
        # every row group read once per epoch (plus pool 0 again for the padding)
        assert stats["row_groups_read"] <= len(sizes) + 3
        assert stats["pools_loaded"] <= len(block_shuffle_pools(sizes, 4, epoch, 3)) + 1
    rows = [b["x"] for b in loader]
    assert all(r.dtype == np.float32 for r in rows)


def test_a_stream_reuses_its_pool_arrays_within_an_epoch(write, monkeypatch) -> None:
    """A pool's arrays fill the next pool once it is dropped (the gathers copy out of it):
    an epoch allocates pool storage about once per pool held at a time, not once per pool,
    so no dropped pool lingers in a thread's malloc heap; the batches are unchanged."""
    from feedline.loader.data.packed_columns import Packing

    ds = write(1000, rows_per_shard=250, row_group_rows=50)  # 20 row groups: 7 pools of 3
    expected = ids(ds.loader(batch_size=40, cache="none", shuffle_window=3, format="numpy",
                             seed=4, prefetch=0))  # fmt: skip
    made = []
    allocate = Packing.allocate

    def counted(self, rows, *args, **kwargs):
        made.append(rows)
        return allocate(self, rows, *args, **kwargs)

    monkeypatch.setattr(Packing, "allocate", counted)
    loader = ds.loader(batch_size=40, cache="none", shuffle_window=3, format="numpy", seed=4,
                       prefetch=0)  # fmt: skip
    np.testing.assert_array_equal(ids(loader), expected)
    pools = loader.stats()["pools_loaded"]
    assert pools >= 7
    assert 1 <= len([r for r in made if r >= 150]) <= 3 < pools, made  # not one per pool


def test_streaming_is_deterministic_resumable_and_sharded(write) -> None:
    ds = write(600, rows_per_shard=200, row_group_rows=40)
    kwargs = {"batch_size": 20, "cache": "none", "shuffle_window": 2, "format": "numpy"}
    full = ids(ds.loader(**kwargs))
    np.testing.assert_array_equal(full, ids(ds.loader(**kwargs)))
    loader = ds.loader(**kwargs, prefetch=3)
    iterator = iter(loader)
    head = [next(iterator)["id"] for _ in range(5)]
    state = loader.state_dict()
    iterator.close()
    resumed = ds.loader(**kwargs)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate([*head, ids(resumed)]), full)
    shares = [ids(ds.loader(**kwargs, rank=r, world_size=3)) for r in range(3)]
    assert len({len(s) for s in shares}) == 1
    assert len(np.unique(np.concatenate(shares))) == sum(len(s) for s in shares)


def test_auto_streams_when_the_estimate_exceeds_the_budget(write, tmp_path) -> None:
    ds = write(1000)  # id 8 + x 4 + vec 24 + label 8 = 44 bytes a row
    assert ds.loader(memory_budget=44_000).stats()["cache"] == "memory"
    # shuffled, auto stages the epochs instead (issue 25; see test_staged_epochs.py)
    assert ds.loader(memory_budget=43_999, cache_dir=tmp_path).stats()["cache"] == "staged"
    small = ds.loader(memory_budget=43_999, batch_size=10, shuffle=False)
    stats = small.stats()
    # the window is derived from the budget: 3 pools of it fit, at 50 rows * 44 bytes a group
    assert stats["cache"] == "none" and stats["shuffle_window"] == 43_999 // (3 * 50 * 44)
    assert len(np.unique(ids(small))) == 1000


def test_falling_back_to_the_two_level_shuffle_is_logged_and_reported(write, caplog) -> None:
    """Issue 24.4: over ``memory_budget``, ``cache="auto"`` switched from the exact shuffle
    to the two-level stream silently; now an INFO line and ``stats()`` say so, and how to
    keep the exact shuffle. Since issue 25 ``"auto"`` stages the epochs (exact) where it can;
    it streams where it cannot: here two nodes (one rank each) and no ``stage_dir``."""
    ds = write(1000)  # 44 bytes a row
    with caplog.at_level("INFO", logger="feedline"):
        small = ds.loader(memory_budget=43_999, batch_size=10, world_size=2, rank=0,
                          ranks_per_node=1)  # fmt: skip
        stats = small.stats()
    records = [r for r in caplog.records if "two-level" in r.getMessage()]
    assert len(records) == 1 and records[0].name.startswith("feedline.")
    assert records[0].levelname == "INFO"
    said = [r.getMessage() for r in records]
    for text in (said[0], stats["shuffle_reason"]):
        assert "memory_budget=44.0 kB" in text and "cache='node'" in text
        assert "larger memory_budget" in text and "44.0 kB of columns" in text
        assert "2 nodes and no stage_dir" in text
    assert stats["shuffle_mode"] == "two-level" and stats["cache"] == "none"
    caplog.clear()
    with caplog.at_level("INFO", logger="feedline"):
        exact = ds.loader(memory_budget=44_000).stats()
        chosen = ds.loader(cache="none").stats()  # asked for: nothing to warn about
    assert not [r for r in caplog.records if "two-level" in r.getMessage()]
    assert exact["shuffle_mode"] == "exact" and "within memory_budget" in exact["shuffle_reason"]
    assert chosen["shuffle_mode"] == "two-level" and "cache='none'" in chosen["shuffle_reason"]
    assert ds.loader(shuffle=False, memory_budget=43_999).stats()["shuffle_mode"] == "none"


def test_a_checkpoint_of_an_exact_shuffle_does_not_resume_in_streaming(write) -> None:
    ds = write(200)
    state = ds.loader(batch_size=10).state_dict()
    streaming = ds.loader(batch_size=10, cache="none")
    with pytest.raises(Exception, match="cache='memory'"):
        streaming.load_state_dict(state)


def test_a_shard_deleted_mid_epoch_reaches_the_caller_with_its_traceback(write) -> None:
    ds = write(1000, rows_per_shard=250, row_group_rows=50)
    loader = ds.loader(batch_size=50, cache="none", shuffle_window=1, prefetch=2, shuffle=False)
    iterator = iter(loader)
    next(iterator)  # the thread is running and the first pool is read
    victim = ds.plan.source.files[-1]
    os.remove(victim.path)
    with pytest.raises(DataError) as info:
        for _ in iterator:
            pass
    assert victim.url.rsplit("/", 1)[-1] in str(info.value) and "removed" in str(info.value)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "iter_read" in frames and "_gather" in frames  # the prefetch thread's own frames
    assert not feedline_threads()


def test_a_shard_deleted_before_caching_names_the_shard(write) -> None:
    ds = write(400, rows_per_shard=200, row_group_rows=50)
    os.remove(ds.plan.source.files[1].path)
    with pytest.raises(DataError, match=r"part-00001-[0-9a-f]{12}\.parquet"):
        next(iter(ds.loader(batch_size=10)))


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_no_threads_leak_after_break_epochs_or_errors(write, cache: str) -> None:
    ds = write(500)
    baseline = set(threading.enumerate())
    loader = ds.loader(batch_size=10, cache=cache, prefetch=3)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert not feedline_threads()  # the abandoned iterator stopped its thread
    for _ in loader:  # a full pass
        pass
    iterator = iter(loader)
    next(iterator)
    assert len(feedline_threads()) == 1
    iterator2 = iter(loader)  # a new iteration stops the old one's thread
    next(iterator2)
    assert len(feedline_threads()) == 1
    loader.set_epoch(9)  # so does moving to another epoch
    assert not feedline_threads()
    del iterator, iterator2
    assert set(threading.enumerate()) <= baseline


def test_prefetcher_reraises_the_worker_exception_itself() -> None:
    def source():
        yield 1
        raise KeyError("boom")

    prefetcher = Prefetcher(source(), depth=2)
    assert next(prefetcher) == 1
    with pytest.raises(KeyError, match="boom") as info:
        next(prefetcher)
    assert "source" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert not feedline_threads()


def test_prefetcher_stops_a_blocked_producer_promptly() -> None:
    prefetcher = Prefetcher(iter(range(10**9)), depth=1)
    next(prefetcher)
    time.sleep(0.05)
    started = time.perf_counter()
    prefetcher.close()
    assert time.perf_counter() - started < 1.0
    assert not feedline_threads()
