"""Per-sample randomness (feedline.loader.order.rng): a pure function of (seed, epoch, index)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline.errors import ConfigurationError
from feedline.loader.order.rng import sample_rng, sample_rngs, sample_uniforms
from feedline.loader.order.sample_order import epoch_permutation

KEYS = st.tuples(st.integers(0, 2**63), st.integers(0, 10_000), st.integers(0, 2**40))


@settings(max_examples=50, deadline=None)
@given(KEYS)
def test_same_key_same_draws_other_epoch_seed_or_index_differ(key):
    seed, epoch, index = key
    draws = sample_rng(seed, epoch, index).integers(0, 2**62, 4)
    assert (draws == sample_rng(seed, epoch, index).integers(0, 2**62, 4)).all()
    for other in ((seed, epoch + 1, index), (seed + 1, epoch, index), (seed, epoch, index + 1)):
        assert not (draws == sample_rng(*other).integers(0, 2**62, 4)).all(), other


def test_sample_rng_is_seedsequence_of_the_three_words():
    got = sample_rng(3, 1, 4).random(3)
    want = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [3, 1, 4], spawn_key=(0x53414D50,)))).random(3)  # fmt: skip
    assert (got == want).all()
    numpy_ints = sample_rng(np.int64(3), np.uint32(1), np.int16(4)).random(3)
    assert (numpy_ints == got).all()


def test_draws_are_independent_of_the_shuffle_stream():
    # order.py keys the epoch permutation with SeedSequence([seed, epoch, 0]); index 0's
    # generator must not be that stream
    perm = epoch_permutation(1000, seed=0, epoch=0)
    assert not (sample_rng(0, 0, 0).permutation(1000) == perm).all()
    assert not (
        sample_rng(0, 0, 0).integers(0, 2**62, 4)
        == np.random.Generator(np.random.PCG64(np.random.SeedSequence([0, 0, 0]))).integers(
            0, 2**62, 4
        )
    ).all()


def test_sample_rngs_equal_sample_rng_per_index():
    indices = np.array([9, 0, 123456789, 9])
    for rng, i in zip(sample_rngs(7, 2, indices), indices, strict=True):
        assert rng.random() == sample_rng(7, 2, int(i)).random()
    assert sample_rngs(7, 2, []) == []


@settings(max_examples=40, deadline=None)
@given(KEYS, st.lists(st.integers(0, 2**40), min_size=1, max_size=30), st.integers(1, 8))
def test_uniforms_depend_only_on_the_sample_not_the_batch(key, others, draws):
    seed, epoch, index = key
    alone = sample_uniforms(seed, epoch, [index], draws)
    batch = sample_uniforms(seed, epoch, [*others, index], draws + 3)
    assert (batch[-1, :draws] == alone[0]).all()  # same row in any batch; a prefix of wider
    assert ((batch >= 0) & (batch < 1)).all()
    assert not (sample_uniforms(seed, epoch + 1, [index], draws) == alone).all()


def test_uniforms_look_uniform_and_independent():
    u = sample_uniforms(0, 0, np.arange(200_000), draws=3)
    assert u.shape == (200_000, 3) and u.dtype == np.float64
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    expected = u.size / 20
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 60  # 19 degrees of freedom: p < 1e-5 above ~50
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.01  # columns
    assert abs(np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]) < 0.01  # neighbouring indices
    flips = u[:, 0] < 0.5
    assert 0.49 < flips.mean() < 0.51


@pytest.mark.parametrize("call", [
    lambda: sample_rng(-1, 0, 0), lambda: sample_rng(0, 0, 1.5), lambda: sample_rng(0, True, 0),
    lambda: sample_rngs(0, 0, [[1, 2]]), lambda: sample_uniforms(0, 0, [-3]),
    lambda: sample_uniforms(0, 0, [1.0, 2.0]), lambda: sample_uniforms(0, 0, [1], draws=-1),
])  # fmt: skip
def test_bad_keys_say_how_to_fix(call):
    with pytest.raises(ConfigurationError, match="Fix:"):
        call()
