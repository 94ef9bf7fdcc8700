"""The loader's fast paths keep its contract: orders drawn ahead are the pure function's,
groups of batches handed over at once keep positions and resume exact, tensors made per
group are the rows asked for, and batches the caller keeps are never overwritten."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader import nodes
from feedline.loader.order.ahead import MIN_ROWS, OrderAhead
from feedline.loader.order.sample_order import epoch_permutation, global_order


def wide(n: int) -> fl.Dataset:
    """``id`` int64, ``a``/``b`` float32 (id + 0.5, id + 0.25) and ``vec`` float32[14]: 72
    bytes a row, so an order (8 bytes a row) may be drawn ahead (an eighth of the cache)."""
    ids = np.arange(n, dtype=np.int64)
    vec = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((n, 14), np.float32))
    return fl.from_arrow(pa.table({"id": ids, "a": (ids + 0.5).astype(np.float32),
                                   "b": (ids + 0.25).astype(np.float32), "vec": vec}))  # fmt: skip


def order_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "feedline-order"]


def test_an_order_drawn_ahead_is_the_pure_functions_order() -> None:
    sizes = [MIN_ROWS // 2, MIN_ROWS // 2 + 7]
    orders = OrderAhead(sizes)
    orders.ahead(shuffle=True, seed=5, epoch=3, window=None)
    assert orders._ahead is not None  # drawn in the background
    got = orders.get(shuffle=True, seed=5, epoch=3, window=None)
    assert np.array_equal(got, epoch_permutation(sum(sizes), 5, 3))
    assert orders._ahead is None  # handed over once
    # asked for another key: drawn on the spot; the two-level order too
    orders.ahead(shuffle=True, seed=5, epoch=4, window=None)
    other = orders.get(shuffle=True, seed=6, epoch=4, window=1)
    assert np.array_equal(other, global_order(sizes, shuffle=True, seed=6, epoch=4, window=1))
    assert orders._ahead is not None  # the mismatched draw is kept for its own epoch
    assert np.array_equal(orders.get(shuffle=True, seed=5, epoch=4, window=None),
                          epoch_permutation(sum(sizes), 5, 4))  # fmt: skip


def test_small_or_unshuffled_orders_start_no_thread_and_errors_reach_the_caller() -> None:
    before = len(order_threads())
    small = OrderAhead([1000])
    small.ahead(shuffle=True, seed=0, epoch=1, window=None)
    OrderAhead([MIN_ROWS]).ahead(shuffle=False, seed=0, epoch=1, window=None)
    assert small._ahead is None and len(order_threads()) == before
    large = OrderAhead([MIN_ROWS], max_bytes=8 * MIN_ROWS - 1)  # its order: over the cap
    large.ahead(shuffle=True, seed=0, epoch=1, window=None)
    assert large._ahead is None and len(order_threads()) == before
    bad = OrderAhead([MIN_ROWS])
    bad.ahead(shuffle=True, seed=-1, epoch=1, window=None)  # raises in the thread
    with pytest.raises(ConfigurationError, match="seed"):
        bad.get(shuffle=True, seed=-1, epoch=1, window=None)


def test_the_loader_draws_the_next_epochs_order_mid_epoch_and_uses_it() -> None:
    n = MIN_ROWS + 100  # 72 bytes a row: the order (8) is within an eighth of the cache
    ids = np.arange(n, dtype=np.int64)
    x = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((n, 16), np.float32))
    loader = fl.from_arrow(pa.table({"id": ids, "x": x})).loader(batch_size=4096, seed=7,
                                                                 format="numpy")  # fmt: skip
    first = np.concatenate([b["id"] for b in loader])  # epoch 0, whole
    ahead = loader._order_ahead._ahead
    assert ahead is not None and ahead[0] == (True, 7, 1, None)  # epoch 1, drawn mid-epoch 0
    second = np.concatenate([b["id"] for b in loader])  # the loop moved on to epoch 1
    assert np.shares_memory(loader._plan().indices, ahead[1].result())  # it took that order
    assert loader._order_ahead._ahead[0] == (True, 7, 2, None)  # and epoch 2's is drawn
    step = len(first)
    assert np.array_equal(first, epoch_permutation(n, 7, 0)[:step])
    assert np.array_equal(second, epoch_permutation(n, 7, 1)[:step])


@pytest.mark.parametrize("fmt", ["torch", "numpy"])
def test_kept_batches_of_grouped_gathers_are_never_overwritten(fmt: str) -> None:
    n = 3000
    loader = wide(n).loader(batch_size=16, seed=2, format=fmt, drop_last=False,
                            stack={"x": ["a", "b"]}, columns=["id", "a"])  # fmt: skip
    kept, plans = [], []
    for epoch in range(2):
        loader.set_epoch(epoch)
        plans.append(loader._plan().indices.copy())
        kept.append(list(loader))  # every batch kept while the pool is reused
    for plan, batches in zip(plans, kept, strict=True):
        assert len(batches) == -(-n // 16) and len(batches[-1]["id"]) == n % 16
        ids = np.concatenate([np.asarray(b["id"]) for b in batches])
        x = np.concatenate([np.asarray(b["x"]) for b in batches])
        a = np.concatenate([np.asarray(b["a"]) for b in batches])
        assert np.array_equal(ids, plan)
        assert np.array_equal(x, np.stack([plan + 0.5, plan + 0.25], axis=1).astype(np.float32))
        assert np.array_equal(a, (plan + 0.5).astype(np.float32))
        if fmt == "torch":
            assert all(isinstance(b["x"], torch.Tensor) and b["x"].shape[1] == 2
                       for b in batches)  # fmt: skip


def test_gather_makes_tensors_per_group_and_groups_keep_positions_and_resume() -> None:
    loader = wide(203).loader(batch_size=10, seed=1, drop_last=False, format="numpy")
    expected = [b.data["id"].tolist() for b in loader.source_node()]
    order = nodes.Order(loader._plan, epoch=0, batch=0)
    gather = nodes.Gather(order, loader._prepare(), shuffle=True, seed=1, group=4, fmt="torch")
    group = gather.next_group()
    assert [b.number for b in group] == [0, 1, 2, 3] and gather.get_state()["batches"] == 4
    assert all(isinstance(b.data["id"], torch.Tensor) for b in group)
    assert [b.data["id"].tolist() for b in group] == expected[:4]
    for k in range(len(expected) + 1):  # resume at every batch through a grouped prefetch
        node = nodes.Prefetch(nodes.Gather(nodes.Order(loader._plan), loader._prepare(),
                                           shuffle=True, seed=1, group=4, fmt="torch"),
                              depth=1, group=4)  # fmt: skip
        node.reset({"epoch": 0, "batch": k})
        assert [b.data["id"].tolist() for b in node] == expected[k:]
        assert node.get_state() == {"epoch": 0, "batches": len(expected)}
        node.close()
    with pytest.raises(ConfigurationError, match="fmt"):
        nodes.Gather(order, loader._prepare(), shuffle=True, seed=1, fmt="tf")


def test_loader_resume_is_exact_at_any_batch_with_groups_and_orders_drawn_ahead() -> None:
    n = MIN_ROWS + 3
    whole_loader = wide(n).loader(batch_size=2048, seed=3, drop_last=False)
    epochs = []
    for epoch in range(2):
        whole_loader.set_epoch(epoch)
        epochs.append([b["id"].tolist() for b in whole_loader])
    for k in (0, 1, len(epochs[0]) // 2 + 1, len(epochs[0]) - 1):
        first = wide(n).loader(batch_size=2048, seed=3, drop_last=False)
        it = iter(first)
        head = [next(it)["id"].tolist() for _ in range(k)]
        resumed = wide(n).loader(batch_size=2048, drop_last=False)
        resumed.load_state_dict(first.state_dict())
        rest = [b["id"].tolist() for b in resumed]
        assert head + rest == epochs[0]
        assert resumed._order_ahead._ahead[0] == (True, 3, 1, None)  # drawn ahead mid-epoch
        assert [b["id"].tolist() for b in resumed] == epochs[1]  # the next epoch too


# ---------------------------------------------------------------- windows


def series_dataset(series: int = 3, steps: int = 40) -> fl.Dataset:
    """``sid``, ``ts`` and ``v = 1000 * sid + ts`` (float32), ``w = -v``, written in order."""
    sid, ts = np.repeat(np.arange(series), steps), np.tile(np.arange(steps), series)
    v = (1000 * sid + ts).astype(np.float32)
    return fl.from_arrow(pa.table({"sid": sid, "ts": ts, "v": v, "w": -v}))


def test_window_batches_are_fresh_arrays_the_caller_may_keep() -> None:
    w = fl.Windows(5, 2, by="sid", order_by="ts", features=["v", "w"])
    loader = series_dataset().loader(windows=w, batch_size=4, seed=3, drop_last=False,
                                     format="torch")  # fmt: skip
    kept = list(loader)  # every batch kept: none is overwritten by a later gather
    sampler = loader._prepare().source
    starts = sampler.window_starts(loader._plan().indices)
    values = sampler.arrays["inputs"]
    inputs = torch.cat([b["inputs"] for b in kept]).numpy()
    targets = torch.cat([b["targets"] for b in kept]).numpy()
    assert len(inputs) == loader.num_samples == 3 * (40 - 7 + 1)
    for got_x, got_y, s in zip(inputs, targets, starts, strict=True):
        np.testing.assert_array_equal(got_x, values[s : s + 5])
        np.testing.assert_array_equal(got_y, values[s + 5 : s + 7])
        assert got_x[0, 0] // 1000 == got_y[-1, 0] // 1000  # never across a series
    assert all(b["inputs"].is_contiguous() and b["targets"].is_contiguous() for b in kept)
    # the gather passes no reused buffers to the sampler (fills_buffers = False) ...
    gather = nodes.Gather(nodes.Order(loader._plan), loader._prepare(), shuffle=True, seed=3,
                          group=2)  # fmt: skip
    assert gather._out(sampler, 8, 8) == ({}, {})
    # ... and into buffers given, the windows are taken row by row, without a temporary
    out = {"inputs": np.full((2, 5, 2), np.nan, np.float32),
           "targets": np.full((2, 2, 2), np.nan, np.float32)}  # fmt: skip
    got = sampler.gather(np.array([0, 40]), out)  # window 40: series 1's 7th, row 46
    assert got["inputs"] is out["inputs"] and got["targets"] is out["targets"]
    np.testing.assert_array_equal(got["inputs"][1], values[46:51])
    np.testing.assert_array_equal(got["targets"][0], values[5:7])


def test_gather_windows_into_a_buffer_refuses_windows_past_the_data() -> None:
    from feedline.loader.data.window_gather import gather_windows, strided_windows

    values = np.arange(20.0).reshape(10, 2)
    np.testing.assert_array_equal(strided_windows(values, 3)[[7]], values[None, 7:10])
    with pytest.raises(ConfigurationError, match="Fix:"):
        gather_windows(values, np.array([8]), 3, np.empty((1, 3, 2)))


def test_window_resume_is_exact_at_any_batch_through_grouped_gathers() -> None:
    w = fl.Windows(4, 1, by="sid", order_by="ts", features="v")
    ds = series_dataset(steps=30)

    def make() -> fl.Loader:
        return ds.loader(windows=w, batch_size=8, seed=11, drop_last=False, prefetch=3)

    whole = [b["inputs"].tolist() for b in make()]
    for k in range(len(whole)):  # (after the last batch a resumed loader starts epoch 1)
        first = make()
        it = iter(first)
        head = [next(it)["inputs"].tolist() for _ in range(k)]
        resumed = make()
        resumed.load_state_dict(first.state_dict())
        assert head + [b["inputs"].tolist() for b in resumed] == whole


def test_order_take_gives_the_batches_and_their_indices_as_one_view() -> None:
    node = nodes.Order.of([7, 6], batch_size=4, shuffle=True, seed=2, drop_last=False,
                          pad_last=False)  # fmt: skip
    whole = [b.indices.tolist() for b in node]
    node.reset({"epoch": 0, "batch": 1})
    batches, indices = node.take(5)  # only 3 batches are left
    assert [b.indices.tolist() for b in batches] == whole[1:]
    assert indices.tolist() == [i for b in whole[1:] for i in b]
    assert np.shares_memory(indices, node.plan.indices)
    assert node.get_state() == {"epoch": 0, "batches": 4}
    with pytest.raises(StopIteration):
        node.take(2)
