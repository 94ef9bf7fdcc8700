"""Loader-level properties over many sizes, batch sizes, worlds and stopping points."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.loader import Loader

PROPS = settings(max_examples=40, deadline=None)


def _dataset(n: int) -> fl.Dataset:
    return fl.from_arrow(pa.table({"id": np.arange(n, dtype=np.int64)}))


def _take(loader: Loader, k: int) -> list[np.ndarray]:
    iterator = iter(loader)
    out = [next(iterator)["id"] for _ in range(k)]
    iterator.close()
    return out


@PROPS
@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 40),
    world=st.integers(1, 8),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    data=st.data(),
)
def test_resume_at_any_batch_equals_the_uninterrupted_epoch(
    n: int, batch: int, world: int, drop_last: bool, seed: int, epoch: int, data: st.DataObject
) -> None:
    ds = _dataset(n)
    rank = data.draw(st.integers(0, world - 1))
    kwargs = {"batch_size": batch, "rank": rank, "world_size": world, "drop_last": drop_last,
              "seed": seed, "format": "numpy"}  # fmt: skip
    full = Loader(ds, **kwargs, prefetch=0)
    full.set_epoch(epoch)
    expected = [b["id"] for b in full]
    assert len(expected) == len(full) == (n // (world * batch) if drop_last else
                                          -(-n // (world * batch)))  # fmt: skip
    k = data.draw(st.integers(0, len(expected)))
    first = Loader(ds, **kwargs, prefetch=data.draw(st.integers(0, 3)))
    first.set_epoch(epoch)
    head = _take(first, k)
    second = Loader(ds, **kwargs)
    second.load_state_dict(first.state_dict())
    second.set_epoch(epoch)  # keeps the restored position
    tail = [b["id"] for b in second]  # nothing after a complete epoch (issue 23.20)
    assert len(head) + len(tail) == len(expected)
    for got, want in zip(head + tail, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    if not expected:
        return
    # the epoch is complete now: iterating again goes on with the next epoch
    following = [b["id"] for b in second]
    assert second.epoch == epoch + 1
    full.set_epoch(epoch + 1)
    for got, want in zip(following, [b["id"] for b in full], strict=True):
        np.testing.assert_array_equal(got, want)


@PROPS
@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 20),
    old_world=st.integers(1, 6),
    new_world=st.integers(1, 6),
    new_batch=st.integers(1, 20),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_elastic_resume_loses_and_repeats_nothing(
    n: int, batch: int, old_world: int, new_world: int, new_batch: int, seed: int,
    data: st.DataObject,
) -> None:  # fmt: skip
    ds = _dataset(n)
    common = {"batch_size": batch, "world_size": old_world, "seed": seed, "drop_last": False}
    old = [Loader(ds, **common, rank=r, format="numpy", prefetch=0) for r in range(old_world)]
    k = data.draw(st.integers(0, len(old[0]) - 1))  # mid-epoch (a complete one moves on)
    seen = [ids for loader in old for ids in _take(loader, k)]
    state = old[0].state_dict()
    rest = []
    for r in range(new_world):
        loader = Loader(ds, batch_size=new_batch, rank=r, world_size=new_world, drop_last=False,
                        return_padding_mask=True, format="numpy")  # fmt: skip
        loader.load_state_dict(state)
        rest += [b["id"][~b["_padded"]] for b in loader]
    everything = np.concatenate([*seen, *rest]) if seen or rest else np.zeros(0, np.int64)
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))
