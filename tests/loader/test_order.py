"""Invariant tests for feedline.loader.order.sample_order (pure shuffle / shard functions)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline.errors import ConfigurationError
from feedline.loader.order.sample_order import (
    EpochPlan,
    block_shuffle_order,
    block_shuffle_pools,
    elastic_split,
    epoch_permutation,
    global_order,
    resume_order,
    samples_seen,
    sequential_order,
    shuffle_quality,
    split_for_rank,
)

SEEDS = st.integers(0, 2**63 - 1)
EPOCHS = st.integers(0, 10_000)
SIZES = st.lists(st.integers(0, 40), max_size=40)
FAST = settings(max_examples=150, deadline=None)


def _plans(order: np.ndarray, world: int, batch: int, drop_last: bool) -> list[EpochPlan]:
    return [
        split_for_rank(order, rank=r, world_size=world, batch_size=batch, drop_last=drop_last)
        for r in range(world)
    ]


def _group_of_rows(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


# --- global orders ---------------------------------------------------------------------------


@FAST
@given(n=st.integers(0, 3000), seed=SEEDS, epoch=EPOCHS)
def test_epoch_permutation_is_a_permutation(n: int, seed: int, epoch: int) -> None:
    p = epoch_permutation(n, seed, epoch)
    assert p.dtype == np.int64
    np.testing.assert_array_equal(np.sort(p), np.arange(n))


@FAST
@given(n=st.integers(20, 3000), seed=SEEDS, epoch=EPOCHS)
def test_epoch_permutation_is_deterministic_and_differs_per_epoch(
    n: int, seed: int, epoch: int
) -> None:
    np.testing.assert_array_equal(
        epoch_permutation(n, seed, epoch), epoch_permutation(n, seed, epoch)
    )
    assert not np.array_equal(
        epoch_permutation(n, seed, epoch), epoch_permutation(n, seed, epoch + 1)
    )
    assert not np.array_equal(
        epoch_permutation(n, seed, epoch), epoch_permutation(n, seed + 1, epoch)
    )


def test_orders_are_pinned() -> None:
    # Golden values: a change here breaks resume of every checkpoint taken before it.
    assert epoch_permutation(10, 0, 0).tolist() == [8, 0, 3, 7, 6, 4, 1, 5, 2, 9]
    assert epoch_permutation(10, 0, 1).tolist() == [1, 5, 6, 4, 8, 7, 9, 3, 2, 0]
    assert block_shuffle_order([3, 2, 0, 4], 7, 3, 2).tolist() == [7, 0, 2, 5, 6, 1, 8, 4, 3]


@FAST
@given(sizes=SIZES, seed=SEEDS, epoch=EPOCHS, window=st.integers(1, 50))
def test_block_shuffle_is_a_permutation(
    sizes: list[int], seed: int, epoch: int, window: int
) -> None:
    o = block_shuffle_order(sizes, seed, epoch, window)
    assert o.dtype == np.int64
    np.testing.assert_array_equal(np.sort(o), np.arange(sum(sizes)))


@FAST
@given(sizes=SIZES, seed=SEEDS, epoch=EPOCHS, window=st.integers(1, 10))
def test_block_shuffle_is_deterministic_and_differs_per_epoch(
    sizes: list[int], seed: int, epoch: int, window: int
) -> None:
    a = block_shuffle_order(sizes, seed, epoch, window)
    np.testing.assert_array_equal(a, block_shuffle_order(list(sizes), seed, epoch, window))
    if sum(sizes) >= 20:  # equal by chance with probability < 1e-6
        assert not np.array_equal(a, block_shuffle_order(sizes, seed, epoch + 1, window))


@FAST
@given(sizes=SIZES, seed=SEEDS, epoch=EPOCHS, window=st.integers(1, 10))
def test_block_shuffle_memory_locality(
    sizes: list[int], seed: int, epoch: int, window: int
) -> None:
    o = block_shuffle_order(sizes, seed, epoch, window)
    group = _group_of_rows(sizes)[o]
    # Helper-free bound: at no position are more than `window` row groups "open" (started but
    # not finished), so a streaming reader never holds more than `window` row groups.
    opened = np.zeros(o.size + 1, dtype=np.int64)
    for g in np.unique(group):
        where = np.flatnonzero(group == g)
        opened[where[0]] += 1
        opened[where[-1] + 1] -= 1
    assert o.size == 0 or np.cumsum(opened).max() <= window
    # Pool by pool: each output segment holds exactly the rows of that pool's row groups.
    pools = block_shuffle_pools(sizes, seed, epoch, window)
    assert all(len(p) <= window for p in pools)
    start = 0
    for pool in pools:
        stop = start + int(np.asarray(sizes, dtype=np.int64)[pool].sum())
        assert set(group[start:stop].tolist()) == {g for g in pool.tolist() if sizes[g] > 0}
        start = stop
    assert start == o.size


def test_window_one_keeps_row_groups_contiguous_and_large_window_mixes_them() -> None:
    sizes = [100] * 20
    group = _group_of_rows(sizes)
    o = block_shuffle_order(sizes, 3, 0, 1)
    assert np.count_nonzero(np.diff(group[o])) == 19  # one run per row group
    assert not np.array_equal(o[:100], np.sort(o[:100]))  # rows permuted inside the group
    whole = block_shuffle_order(sizes, 3, 0, 20)
    assert len(block_shuffle_pools(sizes, 3, 0, 20)) == 1
    assert np.count_nonzero(np.diff(group[whole])) > 1000  # groups interleaved row by row


@FAST
@given(sizes=SIZES, seed=SEEDS, epoch=EPOCHS, window=st.one_of(st.none(), st.integers(1, 8)))
def test_global_order_dispatch(sizes: list[int], seed: int, epoch: int, window: int | None) -> None:
    n = sum(sizes)
    seq = global_order(sizes, shuffle=False, seed=seed, epoch=epoch, window=window)
    np.testing.assert_array_equal(seq, sequential_order(n))
    got = global_order(sizes, shuffle=True, seed=seed, epoch=epoch, window=window)
    want = (
        epoch_permutation(n, seed, epoch)
        if window is None
        else block_shuffle_order(sizes, seed, epoch, window)
    )
    np.testing.assert_array_equal(got, want)


# --- splitting over ranks --------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 400),
    world=st.integers(1, 8),
    batch=st.integers(1, 16),
    drop_last=st.booleans(),
    seed=SEEDS,
)
def test_split_for_rank_invariants(
    n: int, world: int, batch: int, drop_last: bool, seed: int
) -> None:
    order = epoch_permutation(n, seed, 0) * 7 + 3  # row ids need not be positions
    plans = _plans(order, world, batch, drop_last)
    step = world * batch
    nb = plans[0].num_batches
    assert all(p.num_batches == nb and p.batch_size == batch for p in plans)
    assert all(p.indices.shape == p.padded.shape == (nb * batch,) for p in plans)
    real = np.concatenate([p.indices[~p.padded] for p in plans])
    assert real.size == np.unique(real).size  # ranks disjoint, nothing repeated
    if drop_last:
        assert nb * step <= n < (nb + 1) * step
        assert not any(p.padded.any() for p in plans)
        assert n - real.size < step
    else:
        assert set(real.tolist()) == set(order.tolist())
        pad = sum(int(p.padded.sum()) for p in plans)
        assert pad == nb * step - n
        assert 0 <= pad < step
    # Batch-granularity interleave: step k is rank 0's k-th batch, rank 1's k-th batch, ...
    stacked = np.stack([p.indices.reshape(nb, batch) for p in plans], axis=1).reshape(-1)
    mask = np.stack([p.padded.reshape(nb, batch) for p in plans], axis=1).reshape(-1)
    expected = order[: nb * step] if drop_last else np.resize(order, nb * step)
    np.testing.assert_array_equal(stacked, expected)
    np.testing.assert_array_equal(mask, np.arange(nb * step) >= n)


def test_split_for_rank_small_example() -> None:
    plan = split_for_rank(np.arange(10), rank=1, world_size=2, batch_size=2, drop_last=False)
    assert plan.indices.tolist() == [2, 3, 6, 7, 0, 1]
    assert plan.padded.tolist() == [False] * 4 + [True] * 2
    np.testing.assert_array_equal(plan.batch(1), [6, 7])
    with pytest.raises(IndexError):
        plan.batch(3)
    tiny = split_for_rank(np.arange(3), rank=3, world_size=4, batch_size=2, drop_last=False)
    assert tiny.indices.tolist() == [0, 1]  # padding wraps around cyclically
    assert tiny.padded.all()
    dropped = split_for_rank(np.arange(3), rank=0, world_size=4, batch_size=2, drop_last=True)
    assert dropped.num_batches == 0


# --- resume ----------------------------------------------------------------------------------


@FAST
@given(
    n=st.integers(0, 300),
    world=st.integers(1, 6),
    batch=st.integers(1, 10),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_resume_order_plus_seen_is_the_epoch(
    n: int, world: int, batch: int, drop_last: bool, data: st.DataObject
) -> None:
    order = epoch_permutation(n, 5, 2)
    nb = _plans(order, world, batch, drop_last)[0].num_batches
    k = data.draw(st.integers(0, nb), label="batches consumed per rank")
    seen = samples_seen(
        order,
        consumed_per_rank=[k * batch] * world,
        world_size=world,
        batch_size=batch,
        drop_last=drop_last,
    )
    rest = resume_order(order, consumed_global=k * world * batch)
    np.testing.assert_array_equal(np.concatenate([seen, rest]), order)
    if drop_last:  # resuming in the same world continues exactly where each rank stopped
        for r in range(world):
            again = split_for_rank(rest, rank=r, world_size=world, batch_size=batch, drop_last=True)
            full = split_for_rank(order, rank=r, world_size=world, batch_size=batch, drop_last=True)
            np.testing.assert_array_equal(again.indices, full.indices[k * batch :])


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 300),
    old_world=st.integers(1, 6),
    old_batch=st.integers(1, 8),
    new_world=st.integers(1, 6),
    new_batch=st.integers(1, 8),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_elastic_split_loses_and_repeats_nothing(
    n: int,
    old_world: int,
    old_batch: int,
    new_world: int,
    new_batch: int,
    drop_last: bool,
    data: st.DataObject,
) -> None:
    order = epoch_permutation(n, 11, 4) + 1000
    share = _plans(order, old_world, old_batch, drop_last)[0].indices.size
    consumed = data.draw(st.lists(st.integers(0, share), min_size=old_world, max_size=old_world))
    seen = samples_seen(
        order,
        consumed_per_rank=consumed,
        world_size=old_world,
        batch_size=old_batch,
        drop_last=drop_last,
    )
    new = [
        elastic_split(
            order,
            consumed_per_rank=consumed,
            old_world_size=old_world,
            old_batch_size=old_batch,
            new_rank=r,
            new_world_size=new_world,
            batch_size=new_batch,
            drop_last=drop_last,
        )
        for r in range(new_world)
    ]
    assert len({p.num_batches for p in new}) == 1
    fresh = np.concatenate([p.indices[~p.padded] for p in new])
    union = np.concatenate([seen, fresh])
    assert union.size == np.unique(union).size  # no sample seen twice
    if drop_last:
        assert n - union.size < new_world * new_batch
    else:
        assert set(union.tolist()) == set(order.tolist())  # no sample lost
        pads = np.concatenate([p.indices[p.padded] for p in new])
        assert set(pads.tolist()) <= set(fresh.tolist())  # padding repeats unseen samples only


@pytest.mark.parametrize(("old_world", "new_world"), [(4, 2), (2, 3), (1, 4), (3, 1), (4, 4)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_elastic_split_worlds(old_world: int, new_world: int, drop_last: bool) -> None:
    order = block_shuffle_order([97] * 11, 1, 0, 4)  # 1067 rows, not a multiple of anything
    batches_done = 5
    consumed = [batches_done * 8] * old_world
    seen = samples_seen(
        order, consumed_per_rank=consumed, world_size=old_world, batch_size=8, drop_last=drop_last
    )
    np.testing.assert_array_equal(seen, order[: batches_done * 8 * old_world])
    new = [
        elastic_split(
            order,
            consumed_per_rank=consumed,
            old_world_size=old_world,
            old_batch_size=8,
            new_rank=r,
            new_world_size=new_world,
            batch_size=16,
            drop_last=drop_last,
        )
        for r in range(new_world)
    ]
    fresh = np.concatenate([p.indices[~p.padded] for p in new])
    assert np.intersect1d(seen, fresh).size == 0
    covered = np.union1d(seen, fresh).size
    if drop_last:
        assert 0 <= order.size - covered < new_world * 16
    else:
        assert covered == order.size
    # the new ranks start where the old ones stopped
    assert new[0].batch(0).tolist() == order[seen.size : seen.size + 16].tolist()


# --- quality ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sorted_classes() -> tuple[list[int], np.ndarray]:
    sizes = [1000] * 64
    return sizes, np.arange(64_000) // 6400  # 10 classes, stored sorted


def test_shuffle_quality_exact_vs_sequential(sorted_classes: tuple[list[int], np.ndarray]) -> None:
    sizes, labels = sorted_classes
    exact = shuffle_quality(global_order(sizes, shuffle=True, seed=0, epoch=0, window=None), labels)
    seq = shuffle_quality(sequential_order(64_000), labels)
    assert 0.97 < exact["mean_jump"] < 1.03
    assert 0.95 < exact["batch_spread"] < 1.05
    assert exact["label_diversity"] > 0.99
    assert exact["label_tv"] < 0.12
    assert seq["mean_jump"] < 1e-3
    assert seq["batch_spread"] < 0.01
    assert seq["label_diversity"] < 0.11
    assert seq["label_tv"] > 0.85


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_level_quality_lies_between(
    sorted_classes: tuple[list[int], np.ndarray], seed: int
) -> None:
    sizes, labels = sorted_classes
    q = {w: shuffle_quality(block_shuffle_order(sizes, seed, 0, w), labels) for w in (1, 8, 64)}
    seq = shuffle_quality(sequential_order(64_000), labels)
    exact = shuffle_quality(epoch_permutation(64_000, seed, 0), labels)
    assert seq["label_diversity"] < q[1]["label_diversity"] < q[8]["label_diversity"]
    assert q[8]["label_diversity"] < exact["label_diversity"] - 0.1
    assert seq["label_tv"] > q[8]["label_tv"] > exact["label_tv"] + 0.1
    assert seq["mean_jump"] < q[8]["mean_jump"] < exact["mean_jump"]
    assert abs(q[64]["label_diversity"] - exact["label_diversity"]) < 0.02  # one pool = exact


@FAST
@given(n=st.integers(2000, 20_000), seed=SEEDS)
def test_shuffle_quality_of_random_permutations_is_near_one(n: int, seed: int) -> None:
    q = shuffle_quality(epoch_permutation(n, seed, 0), batch_size=128)
    assert 0.9 < q["mean_jump"] < 1.1
    assert 0.85 < q["batch_spread"] < 1.1
    assert set(q) == {"mean_jump", "batch_spread"}


def test_shuffle_quality_degenerate_inputs() -> None:
    assert all(np.isnan(v) for v in shuffle_quality(np.array([], dtype=np.int64)).values())
    assert np.isnan(shuffle_quality(np.array([4]))["mean_jump"])


# --- purity and errors -----------------------------------------------------------------------


def test_functions_are_pure() -> None:
    state = np.random.get_state()[1].copy()
    order = epoch_permutation(500, 1, 1)
    order.flags.writeable = False  # any in-place write would raise
    split_for_rank(order, rank=np.int64(1), world_size=np.int32(3), batch_size=7, drop_last=False)
    samples_seen(order, consumed_per_rank=[7, 7, 0], world_size=3, batch_size=7, drop_last=True)
    elastic_split(
        order,
        consumed_per_rank=[7, 7, 0],
        old_world_size=3,
        old_batch_size=7,
        new_rank=0,
        new_world_size=2,
        batch_size=5,
        drop_last=False,
    )
    resume_order(order, consumed_global=100)
    shuffle_quality(order, labels=np.arange(500) % 3, batch_size=16)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # global RNG untouched
    np.testing.assert_array_equal(order, epoch_permutation(500, 1, 1))


ORDER = np.arange(100)
BAD_CALLS = [
    (
        lambda: split_for_rank(ORDER, rank=4, world_size=4, batch_size=2, drop_last=True),
        ["split_for_rank", "rank=4", "world_size=4", "Fix"],
    ),
    (
        lambda: split_for_rank(ORDER, rank=-1, world_size=4, batch_size=2, drop_last=True),
        ["rank must be an int >= 0, got -1", "Fix"],
    ),
    (
        lambda: split_for_rank(ORDER, rank=0, world_size=0, batch_size=2, drop_last=True),
        ["world_size must be an int >= 1, got 0", "Fix"],
    ),
    (
        lambda: split_for_rank(ORDER, rank=0, world_size=2, batch_size=0, drop_last=True),
        ["batch_size must be an int >= 1, got 0", "Fix"],
    ),
    (
        lambda: split_for_rank(ORDER, rank=1.5, world_size=2, batch_size=2, drop_last=True),
        ["rank must be an int >= 0, got 1.5 (float)", "Fix"],
    ),
    (
        lambda: split_for_rank(ORDER, rank=True, world_size=2, batch_size=2, drop_last=True),
        ["rank must be an int >= 0, got True (bool)", "Fix"],
    ),
    (
        lambda: split_for_rank(
            ORDER.reshape(10, 10), rank=0, world_size=1, batch_size=2, drop_last=True
        ),
        ["1-D integer", "(10, 10)"],
    ),
    (
        lambda: split_for_rank(ORDER * 1.0, rank=0, world_size=1, batch_size=2, drop_last=True),
        ["1-D integer", "float64"],
    ),
    (
        lambda: epoch_permutation(10, -1, 0),
        ["epoch_permutation", "seed must be an int >= 0, got -1"],
    ),
    (lambda: epoch_permutation(-5, 0, 0), ["num_rows must be an int >= 0, got -5"]),
    (lambda: block_shuffle_order([5, 5], 0, 0, 0), ["window must be an int >= 1, got 0"]),
    (lambda: block_shuffle_order([5, -2], 0, 0, 1), ["row group sizes", "row group 1"]),
    (lambda: global_order([5], shuffle=True, seed=0, epoch=-3, window=None), ["epoch"]),
    (
        lambda: resume_order(ORDER, consumed_global=-1),
        ["consumed_global must be an int >= 0, got -1"],
    ),
    (
        lambda: samples_seen(
            ORDER, consumed_per_rank=[1, 2, 3], world_size=2, batch_size=4, drop_last=True
        ),
        ["3 entries", "2 ranks"],
    ),
    (
        lambda: samples_seen(
            ORDER, consumed_per_rank=[0, 60], world_size=2, batch_size=4, drop_last=True
        ),
        ["consumed_per_rank[1]=60", "share of 48"],
    ),
    (
        lambda: elastic_split(
            ORDER,
            consumed_per_rank=[4, 4],
            old_world_size=2,
            old_batch_size=4,
            new_rank=3,
            new_world_size=3,
            batch_size=4,
            drop_last=True,
        ),
        ["elastic_split", "rank=3", "world_size=3"],
    ),
    (lambda: shuffle_quality(ORDER, labels=np.zeros(10)), ["labels", "(10,)"]),
]


@pytest.mark.parametrize(("call", "fragments"), BAD_CALLS)
def test_bad_arguments_raise_configuration_error(
    call: Callable[[], object], fragments: list[str]
) -> None:
    with pytest.raises(ConfigurationError) as info:
        call()
    assert isinstance(info.value, ValueError)
    for fragment in fragments:
        assert fragment in str(info.value)
