"""The lazily evaluated permutation (issue 25.4): a bijection, reproducible, uniform, and the
same batches through the rank split as the drawn order, evaluated in memory for one share."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader.order import sample_order
from feedline.loader.order.lazy_block_order import LazyBlockOrder
from feedline.loader.order.lazy_permutation import LazyPermutation
from feedline.loader.order.resume import epoch_plan
from feedline.loader.order.sample_order import (
    block_shuffle_order,
    epoch_permutation,
    global_order,
    lazy_block_shuffle_order,
    samples_seen,
    seen_runs,
    shuffle_quality,
    split_for_rank,
)
from feedline.loader.order.stage_routes import StagePlan, lazy_routes, routes
from feedline.loader.order.state import Segment

SEEDS = st.integers(0, 2**63 - 1)
EPOCHS = st.integers(0, 10_000)
FAST = settings(max_examples=150, deadline=None)


@FAST
@given(n=st.integers(0, 3000), seed=SEEDS, epoch=EPOCHS)
def test_lazy_permutation_is_a_bijection(n: int, seed: int, epoch: int) -> None:
    p = np.asarray(LazyPermutation(n, seed, epoch))
    assert p.dtype == np.int64
    np.testing.assert_array_equal(np.sort(p), np.arange(n))


@FAST
@given(
    n=st.integers(1, 2**62),
    seed=SEEDS,
    epoch=EPOCHS,
    data=st.data(),
)
def test_lazy_permutation_at_any_size_is_injective_in_range_and_blockwise(
    n: int, seed: int, epoch: int, data: st.DataObject
) -> None:
    positions = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=50, unique=True))
    p = LazyPermutation(n, seed, epoch)
    values = p.take(positions)
    assert ((values >= 0) & (values < n)).all()
    assert len(set(values.tolist())) == len(positions)  # distinct positions, distinct rows
    one_by_one = [int(p.take([q])[0]) for q in positions]  # any block gives the same values
    assert values.tolist() == one_by_one


@FAST
@given(n=st.integers(20, 3000), seed=SEEDS, epoch=EPOCHS)
def test_lazy_permutation_is_deterministic_and_differs_per_epoch_and_seed(
    n: int, seed: int, epoch: int
) -> None:
    def draw(s: int, e: int) -> np.ndarray:
        return np.asarray(LazyPermutation(n, s, e))

    np.testing.assert_array_equal(draw(seed, epoch), draw(seed, epoch))
    assert not np.array_equal(draw(seed, epoch), draw(seed, epoch + 1))
    assert not np.array_equal(draw(seed, epoch), draw(seed + 1, epoch))


def test_lazy_permutation_is_pinned() -> None:
    # Golden values: a change here breaks resume of checkpoints of datasets over LAZY_ROWS.
    assert LazyPermutation(10, 0, 0).take(range(10)).tolist() == [7, 2, 9, 0, 5, 6, 8, 4, 3, 1]
    assert LazyPermutation(10**9, 5, 1).take([0, 1, 999_999_999]).tolist() == [
        557520788,
        837517847,
        122409481,
    ]


def test_lazy_permutation_refuses_positions_outside() -> None:
    p = LazyPermutation(10, 0, 0)
    for bad in ([10], [-1], [0.5]):
        with pytest.raises(ConfigurationError, match="Fix:"):
            p.take(bad)
    with pytest.raises(ConfigurationError, match="Fix:"):
        LazyPermutation(-1, 0, 0)


# --- quality: the tests today's drawn permutation passes (tests/loader/test_order.py) --------


def test_lazy_quality_matches_the_exact_shuffle() -> None:
    labels = np.arange(64_000) // 6400  # 10 classes, stored sorted
    lazy = shuffle_quality(np.asarray(LazyPermutation(64_000, 0, 0)), labels)
    drawn = shuffle_quality(epoch_permutation(64_000, 0, 0), labels)
    assert 0.97 < lazy["mean_jump"] < 1.03
    assert 0.95 < lazy["batch_spread"] < 1.05
    assert lazy["label_diversity"] > 0.99
    assert lazy["label_tv"] < 0.12
    assert abs(lazy["label_tv"] - drawn["label_tv"]) < 0.01


@FAST
@given(n=st.integers(2000, 20_000), seed=SEEDS)
def test_lazy_quality_of_random_permutations_is_near_one(n: int, seed: int) -> None:
    q = shuffle_quality(np.asarray(LazyPermutation(n, seed, 0)), batch_size=128)
    assert 0.9 < q["mean_jump"] < 1.1
    assert 0.85 < q["batch_spread"] < 1.1


def test_lazy_positions_are_uniform_over_seeds() -> None:
    # Where each row lands, over many seeds: uniform over the n positions (chi-square), and
    # the row at position 0 is uniform too; n = 12 is not a power of two (cycle walking).
    n, trials = 12, 6000
    firsts = np.empty(trials, dtype=np.int64)
    where_zero = np.empty(trials, dtype=np.int64)
    for s in range(trials):
        p = np.asarray(LazyPermutation(n, s, 0))
        firsts[s], where_zero[s] = p[0], int(np.flatnonzero(p == 0)[0])
    expected = trials / n
    for counts in (np.bincount(firsts, minlength=n), np.bincount(where_zero, minlength=n)):
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert chi2 < 40  # 11 degrees of freedom: p < 1e-4 above ~37


def test_lazy_batches_draw_deciles_like_an_exact_permutation() -> None:
    # The measure: chi-square of which decile each sample of a batch comes from,
    # averaged over batches: ~9 (degrees of freedom) for an exact permutation.
    n, batch = 1_000_000, 500
    p = LazyPermutation(n, 3, 0).take(np.arange(200 * batch)).reshape(200, batch)
    counts = np.stack([np.bincount(row * 10 // n, minlength=10) for row in p])
    chi2 = ((counts - batch / 10) ** 2 / (batch / 10)).sum(axis=1)
    assert 7 < chi2.mean() < 11
    assert (chi2 > 21.7).mean() < 0.05  # p < 0.01 fails for about 1% of batches


# --- integration: the same batches as the drawn order, without drawing it --------------------


@pytest.fixture
def lazy_above_100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sample_order, "LAZY_ROWS", 100)


def test_global_order_below_the_threshold_is_unchanged() -> None:
    order = global_order([10], shuffle=True, seed=0, epoch=0, window=None)
    assert np.asarray(order).tolist() == [8, 0, 3, 7, 6, 4, 1, 5, 2, 9]  # pinned in test_order
    assert sample_order.LAZY_ROWS == 1 << 26


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(101, 400),
    seed=SEEDS,
    world=st.integers(1, 4),
    batch=st.integers(1, 9),
    drop_last=st.booleans(),
    pad_last=st.booleans(),
)
def test_split_of_lazy_order_equals_split_of_drawn_order(
    lazy_above_100: None,
    n: int,
    seed: int,
    world: int,
    batch: int,
    drop_last: bool,
    pad_last: bool,
) -> None:
    order = global_order([n], shuffle=True, seed=seed, epoch=1, window=None)
    assert isinstance(order, LazyPermutation)
    drawn = np.asarray(order)
    for r in range(world):
        kw = {"rank": r, "world_size": world, "batch_size": batch, "drop_last": drop_last}
        lazy_plan = split_for_rank(order, pad_last=pad_last, **kw)
        plan = split_for_rank(drawn, pad_last=pad_last, **kw)
        assert lazy_plan.num_batches == plan.num_batches
        np.testing.assert_array_equal(lazy_plan.indices, plan.indices)
        np.testing.assert_array_equal(lazy_plan.padded, plan.padded)
    counts = [batch * 2] * world
    kw2 = {"world_size": world, "batch_size": batch, "drop_last": drop_last}
    if 2 * world * batch <= n:
        np.testing.assert_array_equal(
            samples_seen(order, consumed_per_rank=counts, **kw2),
            samples_seen(drawn, consumed_per_rank=counts, **kw2),
        )
        segment = Segment(world, batch, drop_last, tuple(counts))
        resumed = epoch_plan(order, [segment], rank=0, world_size=2, batch_size=3, drop_last=True)
        again = epoch_plan(drawn, [segment], rank=0, world_size=2, batch_size=3, drop_last=True)
        np.testing.assert_array_equal(resumed.indices, again.indices)


def test_one_rank_of_a_billion_rows_holds_only_its_batches() -> None:
    order = global_order([10**9], shuffle=True, seed=0, epoch=0, window=None)
    assert isinstance(order, LazyPermutation)
    # 800 ranks: one rank's share is 1.25M samples, evaluated without any N-long array
    plan = split_for_rank(order, rank=799, world_size=800, batch_size=256, drop_last=True)
    assert plan.num_batches == 10**9 // (800 * 256)
    first = plan.batch(0)
    pos = 799 * 256 + np.arange(256)
    np.testing.assert_array_equal(first, order.take(pos))


# --- the loader over LAZY_ROWS: the lazy order's batches, resumed exactly ---------------------


def test_loader_over_the_threshold_serves_the_lazy_order_and_resumes_it(
    lazy_above_100: None, tmp_path: Path
) -> None:
    ids = np.arange(500, dtype=np.int64)
    fl.from_arrow(pa.table({"id": ids})).write(tmp_path / "ds", row_group_rows=50)
    ds = fl.open(tmp_path / "ds")
    kw = {"batch_size": 8, "seed": 4, "world_size": 2, "rank": 1, "format": "numpy"}
    loader = ds.loader(**kw, prefetch=0, cache="memory")
    got = [b["id"] for b in loader]
    drawn = np.asarray(LazyPermutation(500, 4, 0))
    want = split_for_rank(drawn, rank=1, world_size=2, batch_size=8, drop_last=True)
    np.testing.assert_array_equal(np.concatenate(got), want.indices)
    assert not np.array_equal(want.indices[:8], split_for_rank(
        epoch_permutation(500, 4, 0), rank=1, world_size=2, batch_size=8, drop_last=True
    ).indices[:8])  # fmt: skip
    first = ds.loader(**kw, prefetch=0, cache="memory")
    it = iter(first)
    [next(it) for _ in range(5)]
    it.close()
    resumed = ds.loader(**{**kw, "world_size": 3, "rank": 0}, prefetch=0, cache="memory")
    resumed.load_state_dict(first.state_dict())  # elastic: 2 ranks -> 3
    seen = samples_seen(LazyPermutation(500, 4, 0), consumed_per_rank=[40, 40], world_size=2,
                        batch_size=8, drop_last=True)  # fmt: skip
    rest = np.concatenate([b["id"] for b in resumed])
    assert not set(rest.tolist()) & set(seen.tolist())


# --- elastic resume of a lazy order: the seen positions removed as runs ----------------------


@st.composite
def _segments(draw: st.DrawFn, n: int) -> list[Segment]:
    out, left = [], n
    for _ in range(draw(st.integers(1, 2))):
        world, batch = draw(st.integers(1, 4)), draw(st.integers(1, 7))
        drop = draw(st.booleans())
        share = (left // (world * batch) if drop else -(-left // (world * batch))) * batch
        counts = tuple(draw(st.integers(0, share)) for _ in range(world))
        out.append(Segment(world, batch, drop, counts))
        left -= min(left, sum(counts))
    return out


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 300), seed=SEEDS, data=st.data())
def test_elastic_plan_of_a_lazy_order_equals_the_drawn_one(
    n: int, seed: int, data: st.DataObject
) -> None:
    lazy = LazyPermutation(n, seed, 2)
    segments = data.draw(_segments(n))
    world, batch = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 6))
    drop, pad = data.draw(st.booleans()), data.draw(st.booleans())
    for r in range(world):
        kw = {"rank": r, "world_size": world, "batch_size": batch, "drop_last": drop}
        got = epoch_plan(lazy, segments, pad_last=pad, **kw)
        want = epoch_plan(np.asarray(lazy), segments, pad_last=pad, **kw)
        assert got.num_batches == want.num_batches
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.padded, want.padded)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 5), batch=st.integers(1, 7), data=st.data())
def test_seen_runs_cover_exactly_the_seen_positions(
    n: int, world: int, batch: int, data: st.DataObject
) -> None:
    drop = data.draw(st.booleans())
    share = (n // (world * batch) if drop else -(-n // (world * batch))) * batch
    counts = [data.draw(st.integers(0, share)) for _ in range(world)]
    kw = {"consumed_per_rank": counts, "world_size": world, "batch_size": batch, "drop_last": drop}
    runs = seen_runs(n, **kw)
    covered = sorted(p for s, length in runs for p in range(s, s + length) if p < n)
    assert covered == samples_seen(np.arange(n), **kw).tolist()  # identity order: positions
    if len(set(counts)) == 1 and counts[0] % batch == 0:  # lock-step: one run
        assert len(runs) <= 1


def test_elastic_resume_of_a_billion_rows_stays_small() -> None:
    order = global_order([10**9], shuffle=True, seed=0, epoch=0, window=None)
    segment = Segment(800, 256, True, (1000 * 256,) * 800)  # 800 ranks, 1000 batches each
    tracemalloc.start()
    try:
        plan = epoch_plan(order, [segment], rank=599, world_size=600, batch_size=256,
                          drop_last=True)  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.num_batches == (10**9 - 800 * 256_000) // (600 * 256)
    assert peak < 120 * 2**20  # the rank's share (13 MB of indices), not 8 GB of order
    first = np.asarray(plan.batch(0))
    pos = 800 * 256_000 + 599 * 256 + np.arange(256)  # the old world's positions, shifted
    np.testing.assert_array_equal(first, order.take(pos))


# --- the two-level shuffle's order, lazily: the same values pool by pool ---------------------


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=40),
    seed=SEEDS,
    epoch=EPOCHS,
    window=st.integers(1, 50),
    data=st.data(),
)
def test_lazy_block_order_is_the_block_shuffle_order(
    sizes: list[int], seed: int, epoch: int, window: int, data: st.DataObject
) -> None:
    whole = block_shuffle_order(sizes, seed, epoch, window)
    lazy = lazy_block_shuffle_order(sizes, seed, epoch, window)
    assert len(lazy) == whole.size
    np.testing.assert_array_equal(np.asarray(lazy), whole)
    if whole.size:
        pos = data.draw(st.lists(st.integers(0, whole.size - 1), max_size=30))
        np.testing.assert_array_equal(lazy.take(np.array(pos, dtype=np.int64)), whole[pos])


def test_streaming_orders_over_the_threshold_are_lazy_and_unchanged(lazy_above_100: None) -> None:
    sizes = [37] * 20  # 740 rows > 100
    order = global_order(sizes, shuffle=True, seed=5, epoch=1, window=3)
    assert isinstance(order, LazyBlockOrder)
    whole = block_shuffle_order(sizes, 5, 1, 3)
    for r in range(3):
        kw = {"rank": r, "world_size": 3, "batch_size": 16, "drop_last": False}
        np.testing.assert_array_equal(
            split_for_rank(order, **kw).indices, split_for_rank(whole, **kw).indices
        )
    segment = Segment(3, 16, False, (64, 64, 48))
    kw2 = {"rank": 1, "world_size": 2, "batch_size": 8, "drop_last": True}
    np.testing.assert_array_equal(
        epoch_plan(order, [segment], **kw2).indices, epoch_plan(whole, [segment], **kw2).indices
    )


def test_a_streaming_loader_serves_the_same_batches_from_the_lazy_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = np.arange(600, dtype=np.int64)
    fl.from_arrow(pa.table({"id": ids})).write(tmp_path / "ds", row_group_rows=40)
    ds = fl.open(tmp_path / "ds")
    kw = {"batch_size": 16, "seed": 2, "world_size": 2, "rank": 0, "format": "numpy"}

    def batches() -> list[np.ndarray]:
        loader = ds.loader(**kw, cache="none", shuffle_window=3, prefetch=0)
        return [b["id"] for b in loader]

    drawn = batches()
    monkeypatch.setattr(sample_order, "LAZY_ROWS", 100)
    lazy = batches()
    assert len(drawn) == len(lazy) and all((a == b).all() for a, b in zip(drawn, lazy, strict=True))


def test_an_earlier_state_of_a_lazy_sized_exact_shuffle_is_refused_mid_epoch(
    lazy_above_100: None, tmp_path: Path
) -> None:
    fl.from_arrow(pa.table({"id": np.arange(300, dtype=np.int64)})).write(tmp_path / "ds")
    ds = fl.open(tmp_path / "ds")
    kw = {"batch_size": 10, "seed": 1, "format": "numpy", "prefetch": 0, "cache": "memory"}
    loader = ds.loader(**kw)
    iterator = iter(loader)
    next(iterator)
    iterator.close()
    state = loader.state_dict()
    assert state["version"] == 3
    ds.loader(**kw).load_state_dict(state)  # this version's state resumes
    with pytest.raises(ConfigurationError, match=r"another \(lazily evaluated\) permutation"):
        ds.loader(**kw).load_state_dict({**state, "version": 2})
    boundary = {**state, "version": 2, "batches": 0, "epoch": 1}
    resumed = ds.loader(**kw)
    resumed.load_state_dict(boundary)  # at an epoch boundary the order is this version's
    assert len(list(resumed)) == 30


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 300),
    seed=SEEDS,
    world=st.integers(1, 5),
    batch=st.integers(1, 9),
    drop_last=st.booleans(),
    pad_last=st.booleans(),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_routes_by_the_inverse_equal_the_routes_of_the_drawn_plans(
    n: int, seed: int, world: int, batch: int, drop_last: bool, pad_last: bool,
    cut: tuple[float, float],
) -> None:  # fmt: skip
    """A node's destinations found by inverting the lazy order are those read off every
    rank's materialized plan (padding repeats and pad_last=False's cuts included)."""
    order = LazyPermutation(n, seed=seed, epoch=1)
    lo, hi = sorted(int(c * n) for c in cut)
    plans = [split_for_rank(order, rank=r, world_size=world, batch_size=batch,
                            drop_last=drop_last, pad_last=pad_last).indices
             for r in range(world)]  # fmt: skip
    want = routes(plans, lo, hi)
    got = lazy_routes(order, lo, hi, world_size=world, batch_size=batch, drop_last=drop_last,
                      pad_last=pad_last)  # fmt: skip
    for a, b in ((got.source, want.source), (got.rank, want.rank),
                 (got.position, want.position)):  # fmt: skip
        assert a.tolist() == b.tolist()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), seed=SEEDS, epoch=st.integers(0, 3))
def test_the_inverse_undoes_the_permutation(n: int, seed: int, epoch: int) -> None:
    p = LazyPermutation(n, seed=seed, epoch=epoch)
    rows = np.arange(n)
    assert (p.inverse(p.take(rows)) == rows).all()
    assert (p.take(p.inverse(rows)) == rows).all()
    with pytest.raises(ConfigurationError, match="rows of the dataset"):
        p.inverse([n])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 5), batch=st.integers(1, 9),
       drop_last=st.booleans(), pad_last=st.booleans())  # fmt: skip
def test_a_stage_plans_lengths_over_a_lazy_order_are_its_plans_lengths(
    n: int, world: int, batch: int, drop_last: bool, pad_last: bool
) -> None:
    """StagePlan.length(rank) over a lazy order is computed, not read off an evaluated plan."""
    plan = StagePlan(0, "k", LazyPermutation(n, seed=1, epoch=0), (), world, batch, drop_last,
                     pad_last)  # fmt: skip
    lengths = [plan.length(r) for r in range(world)]
    assert not plan._plans  # nothing evaluated
    assert lengths == [len(plan.plan(r)) for r in range(world)]
