"""Contiguous windows for recurrent models: ``Windows(contiguous=True)`` (a batch of
consecutive windows from a random start) and ``Windows(stream_batches=K)`` (truncated BPTT:
each row of a batch continues the same row of the batch before), deterministic, sharded
equally, covering, and resumed exactly like every other loader order."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader import Windows

PROPS = settings(max_examples=30, deadline=None)
STEP = 1000  # v = series * STEP + time step: a window's first value names it


def series_ds(lengths: list[int]) -> fl.Dataset:
    """Series ``k`` of ``lengths[k]`` steps, rows stored in reverse (the loader sorts)."""
    sid = np.concatenate([np.full(n, k) for k, n in enumerate(lengths)] + [np.zeros(0)])
    t = np.concatenate([np.arange(n) for n in lengths] + [np.zeros(0)])
    table = pa.table({"s": sid.astype(np.int64), "t": t.astype(np.int64),
                      "v": (sid * STEP + t).astype(np.float64)})  # fmt: skip
    return fl.from_arrow(table.take(np.arange(len(t))[::-1]))


def firsts(batch: dict) -> list[int]:
    """The first step of each window of a batch (series * STEP + time)."""
    return [int(v) for v in batch["inputs"][:, 0]]


def all_windows(lengths: list[int], size: int, horizon: int, stride: int) -> set[int]:
    return {k * STEP + t for k, n in enumerate(lengths)
            for t in range(0, n - size - horizon + 1, stride)}  # fmt: skip


def rank_batches(ds: fl.Dataset, windows: Windows, world: int, epoch: int,
                 **kwargs: object) -> list[list[list[int]]]:  # fmt: skip
    out = []
    for rank in range(world):
        loader = ds.loader(windows=windows, rank=rank, world_size=world, format="numpy",
                           **kwargs)  # fmt: skip
        loader.set_epoch(epoch)
        out.append([firsts(b) for b in loader])
        assert len(out[-1]) == len(loader)
    return out


layouts = st.fixed_dictionaries({
    "lengths": st.lists(st.integers(0, 60), min_size=1, max_size=5),
    "size": st.integers(1, 4),
    "horizon": st.integers(0, 2),
    "stride": st.integers(1, 3),
    "batch": st.integers(1, 6),
    "world": st.integers(1, 3),
    "seed": st.integers(0, 2**31),
    "epoch": st.integers(0, 20),
})  # fmt: skip


def _counts(layout: dict) -> list[int]:
    """The windows of each series; a layout without any is left out (no batch, no error)."""
    size, horizon, stride = layout["size"], layout["horizon"], layout["stride"]
    counts = [max(0, (n - size - horizon) // stride + 1) for n in layout["lengths"]]
    assume(sum(counts) > 0)
    return counts


def _ok(layout: dict, runs_of: int) -> bool:
    """Whether some series holds a run of ``runs_of`` windows (else the loader refuses)."""
    return max(_counts(layout)) >= runs_of


@PROPS
@given(layout=layouts, drop_last=st.booleans())
def test_contiguous_batches_are_runs_of_one_series_disjoint_and_equal_per_rank(
    layout: dict, drop_last: bool
) -> None:
    size, horizon, stride, batch = (layout[k] for k in ("size", "horizon", "stride", "batch"))
    ds = series_ds(layout["lengths"])
    windows = Windows(size, horizon, stride=stride, by="s", order_by="t", features="v",
                      contiguous=True)  # fmt: skip
    if not _ok(layout, batch):
        with pytest.raises(ConfigurationError, match="no batch can be made"):
            ds.loader(windows=windows, batch_size=batch).num_samples  # noqa: B018
        return
    ranks = rank_batches(ds, windows, layout["world"], layout["epoch"], batch_size=batch,
                         seed=layout["seed"], drop_last=drop_last)  # fmt: skip
    assert len({len(r) for r in ranks}) == 1  # every rank: as many batches
    # drop_last=False: a rank past the last run gets a last batch of one repeated window
    # (never an empty batch: every rank keeps len(loader) steps for DDP)
    everything = [w for r in ranks for b in r for w in b]
    fillers = [r[-1] for r in ranks if not drop_last and len(r[-1]) == 1
               and everything.count(r[-1][0]) > 1]  # fmt: skip
    seen = [w for r in ranks for b in r if not any(b is f for f in fillers) for w in b]
    assert len(seen) == len(set(seen))  # no window twice in an epoch
    assert all(f[0] in seen for f in fillers)  # a filler repeats a window of the epoch
    assert len(fillers) < layout["world"]  # at least one rank's last batch is real
    assert set(seen) <= all_windows(layout["lengths"], size, horizon, stride)
    for r in ranks:
        for b in r[:-1] if not drop_last else r:
            assert len(b) == batch
        for b in r:  # one series, consecutive windows, in time order; never empty
            assert b
            assert len({w // STEP for w in b}) == 1
            assert all(y - x == stride for x, y in itertools.pairwise(b))


@PROPS
@given(layout=layouts)
def test_one_rank_covers_every_window_but_fewer_than_a_batch_at_each_series_end(
    layout: dict,
) -> None:
    size, horizon, stride, batch = (layout[k] for k in ("size", "horizon", "stride", "batch"))
    if not _ok(layout, batch):
        return
    windows = Windows(size, horizon, stride=stride, by="s", order_by="t", features="v",
                      contiguous=True)  # fmt: skip
    (got,) = rank_batches(series_ds(layout["lengths"]), windows, 1, layout["epoch"],
                          batch_size=batch, seed=layout["seed"], drop_last=False)  # fmt: skip
    seen = {w for b in got for w in b}
    for k, n in enumerate(layout["lengths"]):
        mine = sorted(t for t in range(0, n - size - horizon + 1, stride))
        covered = [t for t in mine if k * STEP + t in seen]
        runs = len(mine) // batch
        assert len(covered) == runs * batch
        if covered:  # one block of whole runs, starting within the leftover
            first = mine.index(covered[0])
            assert covered == mine[first : first + runs * batch]
            assert first <= len(mine) - runs * batch


@PROPS
@given(layout=layouts, k=st.integers(1, 4))
def test_streams_continue_row_by_row_for_stream_batches_batches(layout: dict, k: int) -> None:
    size, horizon, stride, batch = (layout[x] for x in ("size", "horizon", "stride", "batch"))
    world = layout["world"]
    counts = _counts(layout)
    streams = sum(c // k for c in counts)
    windows = Windows(size, horizon, stride=stride, by="s", order_by="t", features="v",
                      stream_batches=k)  # fmt: skip
    ds = series_ds(layout["lengths"])
    if streams < world * batch:
        with pytest.raises(ConfigurationError, match="no batch can be made"):
            ds.loader(windows=windows, batch_size=batch, world_size=world).num_samples  # noqa: B018
        return
    ranks = rank_batches(ds, windows, world, layout["epoch"], batch_size=batch,
                         seed=layout["seed"])  # fmt: skip
    groups = streams // (world * batch)
    seen = [w for r in ranks for b in r for w in b]
    assert len(seen) == len(set(seen)) == groups * world * batch * k  # every full group
    for r in ranks:
        assert len(r) == groups * k and all(len(b) == batch for b in r)
        for n, (a, b) in enumerate(itertools.pairwise(r)):
            if n % k != k - 1:  # within a stream: each row goes on where it stopped
                assert all(y - x == stride and x // STEP == y // STEP
                           for x, y in zip(a, b, strict=True))  # fmt: skip


@PROPS
@given(layout=layouts, streams=st.booleans(), data=st.data())
def test_contiguous_windows_resume_exactly_at_any_batch(
    layout: dict, streams: bool, data: st.DataObject
) -> None:
    size, horizon, stride, batch = (layout[x] for x in ("size", "horizon", "stride", "batch"))
    world = layout["world"]
    k = data.draw(st.integers(1, 3))
    counts = _counts(layout)
    possible = (sum(c // k for c in counts) >= world * batch) if streams else max(counts) >= batch
    if not possible:
        return
    extra = {"stream_batches": k} if streams else {"contiguous": True}
    windows = Windows(size, horizon, stride=stride, by="s", order_by="t", features="v", **extra)
    ds = series_ds(layout["lengths"])
    rank = data.draw(st.integers(0, world - 1))
    kwargs = {"windows": windows, "batch_size": batch, "rank": rank, "world_size": world,
              "seed": layout["seed"], "format": "numpy",
              "drop_last": data.draw(st.booleans())}  # fmt: skip
    full = ds.loader(**kwargs, prefetch=0)
    full.set_epoch(layout["epoch"])
    expected = [b["inputs"] for b in full]
    cut = data.draw(st.integers(0, len(expected)))
    first = ds.loader(**kwargs, prefetch=data.draw(st.integers(0, 2)))
    first.set_epoch(layout["epoch"])
    iterator = iter(first)
    head = [next(iterator)["inputs"] for _ in range(cut)]
    iterator.close()
    second = ds.loader(**{**kwargs, "seed": None})  # the seed comes from the state
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    second.set_epoch(layout["epoch"])
    tail = [b["inputs"] for b in second] if cut < len(expected) else []
    assert len(head) + len(tail) == len(expected)
    for got, want in zip(head + tail, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_run_starts_move_from_epoch_to_epoch_so_every_window_gets_its_turn() -> None:
    ds = series_ds([23, 17])  # 21 and 15 windows of size 3: leftovers of 1 and 3
    windows = Windows(3, 0, by="s", order_by="t", features="v", contiguous=True)
    loader = ds.loader(windows=windows, batch_size=4, seed=0, format="numpy")
    covered: set[int] = set()
    starts = set()
    for epoch in range(20):
        loader.set_epoch(epoch)
        batches = [firsts(b) for b in loader]
        covered |= {w for b in batches for w in b}
        starts.add(min(b[0] for b in batches if b[0] < STEP))
    assert covered == all_windows([23, 17], 3, 0, 1)
    assert len(starts) > 1  # the first run of series 0 does not always start at step 0
    again = [firsts(b) for b in ds.loader(windows=windows, batch_size=4, seed=0, format="numpy")]
    loader.set_epoch(0)
    assert again == [firsts(b) for b in loader]  # a pure function of (seed, epoch)


def test_without_shuffle_runs_come_in_stored_order_from_the_first_window() -> None:
    windows = Windows(2, 1, by="s", order_by="t", features="v", contiguous=True)
    loader = series_ds([9, 6]).loader(windows=windows, batch_size=3, shuffle=False,
                                      format="numpy")  # fmt: skip
    assert [firsts(b) for b in loader] == [[0, 1, 2], [3, 4, 5], [1000, 1001, 1002]]


def test_contiguous_resume_on_another_world_size_loses_and_repeats_nothing() -> None:
    ds = series_ds([50, 41, 37])
    windows = Windows(4, 1, by="s", order_by="t", features="v", contiguous=True)
    common = {"windows": windows, "batch_size": 3, "seed": 4, "format": "numpy",
              "drop_last": False}  # fmt: skip
    old = [ds.loader(**common, rank=r, world_size=2) for r in range(2)]
    seen = []
    for loader in old:
        iterator = iter(loader)
        seen += [firsts(next(iterator)) for _ in range(4)]
        iterator.close()
    rest = []
    for r in range(3):
        loader = ds.loader(**common, rank=r, world_size=3)
        loader.load_state_dict(old[0].state_dict())
        rest += [firsts(b) for b in loader]
    everything = [w for b in seen + rest for w in b]
    assert len(everything) == len(set(everything)) == ds.loader(**common).num_samples
    for b in rest:  # still runs of consecutive windows
        assert all(y - x == 1 for x, y in itertools.pairwise(b))


def test_a_resume_with_another_run_layout_is_refused() -> None:
    ds = series_ds([40, 40])
    for extra, change in (({"contiguous": True}, {"batch_size": 5}),
                          ({"stream_batches": 2}, {"world_size": 2})):  # fmt: skip
        windows = Windows(3, 1, by="s", order_by="t", features="v", **extra)
        first = ds.loader(windows=windows, batch_size=4, seed=1, format="numpy")
        next(iter(first))
        other = ds.loader(windows=windows, **{"batch_size": 4, **change}, format="numpy")
        with pytest.raises(ConfigurationError, match="resume only with the checkpoint's"):
            other.load_state_dict(first.state_dict())


def test_windows_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="one of them"):
        Windows(3, 1, contiguous=True, stream_batches=2)
    with pytest.raises(ConfigurationError, match="stream_batches must be"):
        Windows(3, 1, stream_batches=0)
    with pytest.raises(ConfigurationError, match="contiguous must be"):
        Windows(3, 1, contiguous="yes")  # type: ignore[arg-type]
