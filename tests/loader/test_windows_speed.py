"""The loader's faster paths give the very same windows and orders: windows copied one block
at a time, window starts without the binary search, the next epoch's order drawn early."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.loader.data.window_gather import strided_windows, window_blocks
from feedline.loader.data.windows import Windows, WindowSampler, window_starts
from feedline.loader.order.ahead import MIN_ROWS
from feedline.loader.order.sample_order import global_order


@pytest.mark.parametrize(
    ("shape", "dtype", "length"),
    [
        ((50, 3), np.float64, 7),
        ((40,), np.int16, 5),
        ((30, 2, 2), np.float32, 4),
        ((6, 8), np.int64, 6),
    ],
)
def test_window_blocks_copy_the_same_windows_as_the_strided_view(shape, dtype, length) -> None:
    values = np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)
    starts = np.random.default_rng(0).integers(0, len(values) - length + 1, 17)
    blocks = window_blocks(values, length)
    got = blocks[starts].view(dtype).reshape(len(starts), length, *shape[1:])
    np.testing.assert_array_equal(got, strided_windows(values, length)[starts])
    assert got.dtype == dtype and got.flags.c_contiguous
    assert len(blocks) == len(values) - length + 1
    with pytest.raises(ValueError, match="read-only"):
        blocks[0] = blocks[-1]


def test_window_blocks_of_too_few_rows_are_empty() -> None:
    assert len(window_blocks(np.zeros((3, 2), np.float32), 4)) == 0


def _sampler(lengths: list[int], stride: int) -> WindowSampler:
    series = np.repeat(np.arange(len(lengths)), lengths)
    table = pa.table({"s": series, "v": np.arange(len(series), dtype=np.float32)})
    windows = Windows(3, 2, stride=stride, by="s", features="v")
    return WindowSampler(fl.from_arrow(table).shard_source(), windows, layout=None,
                         widen_unsigned=False)  # fmt: skip


@pytest.mark.parametrize(
    ("lengths", "stride"),
    [([9, 9, 9, 9], 1), ([9, 9, 9], 2), ([10, 2, 7, 30, 5], 1), ([10, 2, 7, 30, 5], 3)],
)
def test_sampler_window_starts_are_the_pure_functions(lengths, stride) -> None:
    sampler = _sampler(lengths, stride)
    ids = np.random.default_rng(1).permutation(sampler.num_rows)
    expected = window_starts(ids, sampler.bounds, sampler.first_ids, stride)
    np.testing.assert_array_equal(sampler.window_starts(ids), expected)
    batch = sampler.gather(ids)  # every window inside its own series
    series = np.repeat(np.arange(len(lengths)), lengths)
    first = series[sampler.window_starts(ids)]
    assert (series[sampler.window_starts(ids) + 3 + 2 - 1] == first).all()
    values = np.arange(len(series), dtype=np.float32)
    np.testing.assert_array_equal(batch["inputs"], strided_windows(values, 3)[expected])


def test_the_next_epochs_order_is_drawn_from_the_second_batch_on() -> None:
    rows, size = 2 * MIN_ROWS, 1000
    wide = {"id": np.arange(rows)} | {f"c{i}": np.zeros(rows, np.float32) for i in range(16)}
    ds = fl.from_arrow(pa.table(wide))  # an order (8 bytes a row) within an eighth of the cache
    loader = ds.loader(batch_size=size, shuffle=True, seed=4, prefetch=0)
    it = iter(loader)
    next(it), next(it)  # 2 of 200 batches: far from half the epoch
    pending = loader._orders()._ahead
    assert pending is not None and pending[0] == (True, 4, 1, None)
    del it
    loader.set_epoch(1)
    got = np.concatenate([b["id"] for b in loader])
    expected = global_order(loader._prepare().sizes, shuffle=True, seed=4, epoch=1, window=None)
    np.testing.assert_array_equal(got, expected[: len(got)])


@pytest.mark.parametrize(
    ("most", "idle", "helpers_busy", "split"),
    [
        (2, 0.8, 0.0, True),  # a prefetching loader on an otherwise idle 2-CPU machine
        (2, 0.2, 0.6, True),  # ... already split: its own thread's CPU counts as spare
        (2, 0.0, 0.0, False),  # the loop computes on both CPUs, or another process does
        (2, 0.1, 0.5, False),  # split, but the extra thread only gets a contended half CPU
        (2, None, 0.0, False),  # unknown (no /proc/stat): no split
        (1, 8.0, 0.0, False),  # one CPU allowed: nothing to split across
    ],
)
def test_a_gather_splits_only_where_the_cpus_leave_room_for_the_extra_thread(
    monkeypatch: pytest.MonkeyPatch, most: int, idle: float | None, helpers_busy: float,
    split: bool,
) -> None:  # fmt: skip
    from feedline.loader.nodes import gather_threads as gt

    monkeypatch.setattr(gt, "gather_threads", lambda: most)
    want = most if split else 1
    assert gt.auto_threads(idle, helpers_busy) == want
