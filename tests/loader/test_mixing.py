"""fl.mix: weighted mixing, deterministic and exactly resumable (also on another world_size)."""

from __future__ import annotations

import json
from collections import Counter
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import feedline as fl
import feedline.loader.mixing.schedule as schedule_module
from feedline.errors import ConfigurationError
from feedline.loader.mixing.schedule import MixSchedule, window_counts

SIZES = {"a": 13, "b": 5, "c": 8}


def _mix(weights=None, *, seed=0, stop="all_exhausted", window=8, sizes=SIZES):
    # each source's ids are offset by 1000 * its code, so a sample names its source
    sources = {n: fl.from_dict({"id": np.arange(k) + 1000 * i}) for i, (n, k) in
               enumerate(sizes.items())}  # fmt: skip
    return fl.mix(sources, weights or dict.fromkeys(sizes, 1.0), seed=seed, stop=stop,
                  window=window)  # fmt: skip


def _rows(batches):
    return [(int(s), int(i)) for b in batches for s, i in zip(b["source"], b["id"], strict=True)]


def _take(loader, n):
    out = []
    if n == 0:
        return out
    for batch in loader:
        out.append({k: np.asarray(v).copy() for k, v in batch.items()})
        if len(out) == n:
            break
    return out


weights_st = st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(lambda w: sum(w) > 0)


@settings(max_examples=200, deadline=None)
@given(weights=weights_st, window=st.integers(1, 40), seed=st.integers(0, 2**31),
       windows=st.integers(1, 6))  # fmt: skip
def test_proportions_per_window_within_one_sample(weights, window, seed, windows):
    """Tolerance: each window of W positions holds W*w_s/sum(w) samples of source s, +-1."""
    s = MixSchedule([13, 5, 8], [(0, weights)], window=window, seed=seed, epoch=0)
    codes = s.sources(0, window * windows)
    want = window * np.asarray(weights) / sum(weights)
    for k in range(windows):
        got = np.bincount(codes[k * window : (k + 1) * window], minlength=3)
        assert np.all(np.abs(got - want) < 1), (got, want)
        assert got.sum() == window
    assert window_counts(weights, window).tolist() == np.bincount(
        codes[:window], minlength=3).tolist()  # fmt: skip


@settings(max_examples=15, deadline=None)
@given(weights=weights_st, seed=st.integers(0, 1000), batch=st.integers(1, 7))
def test_no_sample_repeats_within_a_source_pass(weights, seed, batch):
    """Each source's draws, cut into passes of its size, are permutations of its samples, across
    epochs too (a small source reshuffles and goes on)."""
    loader = _mix(dict(zip(SIZES, weights, strict=True)), seed=seed).loader(
        batch, format="numpy", drop_last=False, prefetch=0)  # fmt: skip
    rows = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        rows += _rows(list(loader))
    for code, (name, n) in enumerate(SIZES.items()):
        ids = [i for s, i in rows if s == code]
        assert all(i // 1000 == code for i in ids)
        for start in range(0, len(ids) - n + 1, n):
            assert sorted(ids[start : start + n]) == [1000 * code + j for j in range(n)], name
        tail = ids[len(ids) - len(ids) % n :]
        assert len(set(tail)) == len(tail)


def test_all_exhausted_reads_every_sample_and_first_exhausted_stops_early():
    rows = _rows(list(_mix(stop="all_exhausted").loader(3, format="numpy", drop_last=False)))
    for code, n in enumerate(SIZES.values()):
        assert {i for s, i in rows if s == code} == {1000 * code + j for j in range(n)}
    first = _rows(list(_mix(stop="first_exhausted").loader(1, format="numpy")))
    counts = np.bincount([s for s, _ in first], minlength=3)
    assert counts[1] == SIZES["b"] and counts[0] < SIZES["a"] and counts[2] < SIZES["c"]
    assert [s for s, _ in first][-1] == 1  # the epoch ends at b's last sample
    assert len(_rows(list(_mix(stop=10).loader(1, format="numpy")))) == 10


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), batch=st.integers(1, 5), at=st.integers(0, 12),
       drop_last=st.booleans())  # fmt: skip
def test_exact_resume_at_any_batch_and_same_seed_same_batches(seed, batch, at, drop_last):
    mix = _mix({"a": 3, "b": 1, "c": 2}, seed=seed)
    whole = [_rows([b]) for b in _mix({"a": 3, "b": 1, "c": 2}, seed=seed).loader(
        batch, format="numpy", drop_last=drop_last)]  # fmt: skip
    assert whole == [_rows([b]) for b in mix.loader(batch, format="numpy", drop_last=drop_last)]
    at = min(at, len(whole))
    first = mix.loader(batch, format="numpy", drop_last=drop_last)
    head = [_rows([b]) for b in _take(first, at)] if at else []
    state = json.loads(json.dumps(first.state_dict()))
    resumed = mix.loader(batch, format="numpy", drop_last=drop_last)
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])
    assert head + [_rows([b]) for b in resumed] == whole


def _global(mix, world, batch, steps=None, state=None):
    """Run ``world`` ranks in lock step: (their rows step-major in rank order, rank 0's state)."""
    loaders = [mix.loader(batch, rank=r, world_size=world, format="numpy", drop_last=False,
                          prefetch=0) for r in range(world)]  # fmt: skip
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    iters = [iter(loader) for loader in loaders]
    rows, step = [], 0
    while steps is None or step < steps:
        got = [next(it, None) for it in iters]
        if all(g is None for g in got):
            break
        rows += _rows([g for g in got if g is not None])
        step += 1
    states = [loader.state_dict() for loader in loaders]
    return rows, states


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2), (1, 4), (2, 2)])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), batch=st.integers(1, 4), steps=st.integers(0, 6))
def test_elastic_resume_delivers_the_global_stream_once(old, new, seed, batch, steps):
    mix = _mix({"a": 2, "b": 1, "c": 1}, seed=seed)
    reference = _rows(list(mix.loader(1, format="numpy", drop_last=False)))
    before, states = _global(mix, old, batch, steps)
    assert len({json.dumps(dict(s, rank=0)) for s in states}) == 1  # lock step: one position
    after, _ = _global(mix, new, batch + 1, state=states[0])
    _same_stream(before + after, reference, max(old, new))
    # every old rank's state, in a list, works too
    again, _ = _global(mix, new, batch, state=states)
    _same_stream(before + again, reference, max(old, new))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), batch=st.integers(1, 4), world=st.integers(2, 3),
       new=st.integers(1, 4),
       counts=st.lists(st.integers(0, 5), min_size=3, max_size=3))  # fmt: skip
def test_ranks_at_different_steps_resume_without_loss_or_repeat(seed, batch, world, new, counts):
    """Every old rank's state at its own step (as packing pulls blocks at its own pace): the
    resumed ranks deliver exactly what no old rank did, each position once."""
    mix = _mix({"a": 2, "b": 1, "c": 1}, seed=seed)
    reference = _rows(list(mix.loader(1, format="numpy", drop_last=False)))
    loaders = [mix.loader(batch, rank=r, world_size=world, format="numpy", drop_last=False,
                          prefetch=0) for r in range(world)]  # fmt: skip
    delivered = []
    for r, loader in enumerate(loaders):
        delivered += _rows(_take(loader, counts[r]))
    states = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
    after, _ = _global(mix, new, batch + 1, state=states)
    # nothing lost; repeats only where a rank had nothing left in a last step (lock step)
    real, want = Counter(delivered + after), Counter(reference)
    assert not want - real
    assert sum((real - want).values()) < world + new


def _same_stream(delivered, reference, world):
    """``delivered`` is ``reference``, plus at most ``world - 1`` repeats of its last sample
    (ranks with no sample left in an epoch's last step get one again: lock step)."""
    extra = len(delivered) - len(reference)
    assert 0 <= extra < world
    assert delivered == reference + [reference[-1]] * extra


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), at=st.integers(0, 8))
def test_weights_changed_at_a_checkpoint_apply_from_there(seed, at):
    mix = _mix({"a": 1, "b": 1, "c": 1}, seed=seed, stop=60)
    first = mix.loader(2, format="numpy")
    head = _rows(_take(first, at)) if at else []
    state = first.state_dict()
    resumed = mix.loader(2, format="numpy")
    resumed.load_state_dict(state, weights={"a": 0, "b": 0, "c": 1})
    tail = _rows(list(resumed))
    assert head == _rows(list(mix.loader(2, format="numpy")))[: len(head)]  # nothing replayed
    assert tail and {s for s, _ in tail} == {2}
    assert len(head) + len(tail) == 60
    # the same change made in a running loader (set_weights) gives the same batches
    live = mix.loader(2, format="numpy")
    assert _rows(_take(live, at)) == head if at else True
    live.set_weights({"a": 0, "b": 0, "c": 1})
    assert _rows(list(live)) == tail
    # inside a running loop too (batches read ahead are gathered again)
    looped = mix.loader(2, format="numpy", prefetch=3)
    got = []
    for k, b in enumerate(looped):
        got.append(_rows([b]))
        if k + 1 == at:
            looped.set_weights({"a": 0, "b": 0, "c": 1})
    if at:
        assert [r for b in got for r in b] == head + tail
    # and the new weights survive the next checkpoint
    assert resumed.state_dict()["segments"][-1][1] == [0.0, 0.0, 1.0]


def test_batches_name_their_source_and_metrics_count_samples_and_tokens():
    web = fl.from_dict({"tokens": [[1, 2, 3], [4], [5, 6]]})
    code = fl.from_dict({"tokens": [[7, 8], [9, 10, 11, 12]]})
    loader = fl.mix(
        {"web": web, "code": code}, {"web": 1, "code": 1}, stop="all_exhausted", window=2
    ).loader(1, format="numpy", drop_last=False, ragged="list")
    rows = [(int(b["source"][0]), list(b["tokens"][0])) for b in loader]
    assert sorted(t for s, t in rows if s == 0)[:3] == [[1, 2, 3], [4], [5, 6]]
    per = loader.metrics()[0]["per_source"]
    assert per["web"]["samples"] == sum(1 for s, _ in rows if s == 0)
    assert per["code"]["samples"] == sum(1 for s, _ in rows if s == 1)
    assert per["web"]["tokens"] == sum(len(t) for s, t in rows if s == 0)
    assert per["code"]["tokens"] == sum(len(t) for s, t in rows if s == 1)
    assert loader.sources == ["web", "code"]


def test_transform_sees_the_source_and_runs_in_workers():
    def double(sample, rng):
        return {"id": sample["id"] * 2, "source": sample["source"]}

    mix = _mix(seed=3)
    plain = _rows(list(mix.loader(4, format="numpy")))
    mapped = mix.loader(4, format="numpy", transform=double, num_workers=2)
    assert _rows(list(mapped)) == [(s, 2 * i) for s, i in plain]


def test_state_is_tiny_and_json_safe():
    loader = _mix().loader(2, format="numpy")
    _take(loader, 3)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert len(json.dumps(state)) < 400


def test_mistakes_raise_configuration_errors_that_say_how_to_fix():
    with pytest.raises(ConfigurationError, match="unknown source"):
        _mix({"a": 1, "b": 1, "c": 1, "d": 1}).loader(2)
    with pytest.raises(ConfigurationError, match=r"seed= to fl\.mix"):
        _mix().loader(2, seed=3)
    with pytest.raises(ConfigurationError, match="stop="):
        _mix(stop="never")
    with pytest.raises(ConfigurationError, match="weight"):
        _mix({"a": -1, "b": 1, "c": 1}).loader(2)
    with pytest.raises(ConfigurationError, match="Fix:"):
        _mix().loader(2).load_state_dict({"epoch": 0})
    other = _mix(window=4).loader(2)
    with pytest.raises(ConfigurationError, match="window"):
        other.load_state_dict(_mix(window=8).loader(2).state_dict())
    a, b, c = (_mix().loader(2, rank=r, world_size=3, format="numpy") for r in range(3))
    _take(a, 1)
    with pytest.raises(ConfigurationError, match="all 3 ranks"):
        a.load_state_dict([a.state_dict(), b.state_dict()])
    b.set_epoch(1)
    with pytest.raises(ConfigurationError, match="different runs"):
        a.load_state_dict([a.state_dict(), b.state_dict(), c.state_dict()])


#: layout 1 (feedline's first mixing release): sources(0, 64) of MixSchedule([13, 5, 8],
#: [(0, (0.5, 0.3, 0.2))], window=8, seed=3, epoch=1), as that release's code computed them
_LAYOUT_1_SOURCES = [2, 0, 0, 0, 2, 0, 1, 1, 0, 1, 2, 0, 2, 0, 0, 1, 1, 2, 0, 0, 2, 1, 0, 0, 0, 2,
                     2, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 2, 0, 2, 0, 0, 1, 0, 1, 2, 2, 0, 1, 2, 0, 1,
                     2, 0, 0, 0, 1, 0, 0, 2, 0, 1, 2, 0]  # fmt: skip
#: and the samples its first 16 positions read (chunk(0, 16)'s rows)
_LAYOUT_1_ROWS = [5, 10, 6, 9, 1, 5, 1, 3, 7, 0, 4, 2, 0, 11, 12, 4]


def test_a_layout_1_checkpoint_resumes_on_the_schedule_it_was_written_with():
    """States of version 1 (the first release's window layout) go on with that layout, exactly;
    new runs use layout 2. Both hold each window's counts exactly."""
    old = MixSchedule([13, 5, 8], [(0, (0.5, 0.3, 0.2))], window=8, seed=3, epoch=1, layout=1)
    assert old.sources(0, 64).tolist() == _LAYOUT_1_SOURCES
    assert old.chunk(0, 16)[1].tolist() == _LAYOUT_1_ROWS
    new = MixSchedule([13, 5, 8], [(0, (0.5, 0.3, 0.2))], window=8, seed=3, epoch=1)
    assert new.layout == 2 and new.sources(0, 64).tolist() != _LAYOUT_1_SOURCES
    for s in (old, new):
        per_window = np.apply_along_axis(np.bincount, 1, s.sources(0, 64).reshape(8, 8), None, 3)
        assert (per_window == window_counts((0.5, 0.3, 0.2), 8)).all()

    fresh = _mix(seed=3).loader(3, format="numpy", prefetch=0)
    state = dict(fresh.state_dict(), version=1)  # a first-release checkpoint at its start
    first = _mix(seed=3).loader(3, format="numpy", prefetch=0)
    first.load_state_dict(state)
    head = _take(first, 4)
    assert first.state_dict()["version"] == 1
    resumed = _mix(seed=3).loader(3, format="numpy", prefetch=0)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    rest = list(resumed)
    first.load_state_dict(state)
    assert _rows(head + rest) == _rows(list(first))
    reference = MixSchedule(list(SIZES.values()), [(0, (1.0, 1.0, 1.0))], window=8, seed=3,
                            epoch=0, layout=1)  # fmt: skip
    assert [s for s, _ in _rows(head)] == reference.sources(0, 12).tolist()
    with pytest.raises(ConfigurationError, match="version 7"):
        resumed.load_state_dict(dict(state, version=7))


@pytest.mark.parametrize(("counts", "arrangements", "bound"), [
    ((2, 1, 3), 60, 95),  # 59 degrees of freedom: p ~ 0.002 at 95
    ((2, 4), 15, 33),  # two sources (one comparison): 14 degrees of freedom, p ~ 0.003
])  # fmt: skip
def test_layout_2_arranges_a_window_uniformly(counts, arrangements, bound):
    """Every arrangement of a window's counts is equally likely (chi-square over 60,000
    windows; a fixed seed, so the check cannot flake)."""
    k = len(counts)
    s = MixSchedule([10] * k, [(0, counts)], window=6, seed=11, epoch=0)
    windows = s.sources(0, 6 * 60_000).reshape(-1, 6)
    assert (np.apply_along_axis(np.bincount, 1, windows, None, k) == counts).all()
    seen = Counter(map(tuple, windows.tolist()))
    assert len(seen) == arrangements
    expected = len(windows) / arrangements
    chi2 = sum((n - expected) ** 2 / expected for n in seen.values())
    assert chi2 < bound, chi2


def _token_mix():
    rng = np.random.default_rng(0)
    web = fl.from_dict({"tokens": [list(range(1, 1 + int(n))) for n in rng.integers(1, 12, 40)]})
    code = fl.from_dict({"tokens": [list(range(100, 100 + int(n))) for n in
                                    rng.integers(1, 12, 30)]})  # fmt: skip
    return fl.mix({"web": web, "code": code}, {"web": 2, "code": 1}, seed=0, window=6)


def test_packing_applies_to_the_mix_and_resumes_exactly():
    pack = fl.Packing(seq_len=16, buffer_size=8, column="tokens")
    whole = list(_token_mix().loader(4, format="numpy", pack=pack))
    assert whole and all(b["input_ids"].shape == (4, 16) for b in whole)
    # every token of the mixed documents is in exactly one packed row (pad_id 0, tokens >= 1)
    docs = [t for b in _token_mix().loader(8, format="numpy", drop_last=False, ragged="list")
            for d in b["tokens"] for t in d]  # fmt: skip
    kept = list(_token_mix().loader(4, format="numpy", pack=pack, drop_last=False))
    flat = np.concatenate([b["input_ids"].ravel() for b in kept])
    assert sorted(flat[flat > 0].tolist()) == sorted(docs)
    for at in (0, 2, 5):
        first = _token_mix().loader(4, format="numpy", pack=pack)
        _take(first, at)
        resumed = _token_mix().loader(4, format="numpy", pack=pack)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        rest = list(resumed)
        assert len(rest) == len(whole) - at
        for a, b in zip(whole[at:], rest, strict=True):
            assert np.array_equal(a["input_ids"], b["input_ids"])


def test_torch_batches():
    torch = pytest.importorskip("torch")
    batch = next(iter(_mix().loader(4)))
    assert isinstance(batch["source"], torch.Tensor) and batch["source"].shape == (4,)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), at=st.integers(0, 30), stop=st.sampled_from(
    ["first_exhausted", "all_exhausted", 7]))  # fmt: skip
def test_exact_resume_across_epochs(seed, at, stop):
    """A checkpoint in any epoch (the sources' draws carried over) resumes exactly, in a loop
    that calls set_epoch; len() counts what is left."""
    mix = _mix({"a": 1, "b": 2, "c": 1}, seed=seed, stop=stop)

    def run(loader, start=0):
        out = []
        for epoch in range(start, 3):
            loader.set_epoch(epoch)
            assert len(loader) == len(list(_peek(loader)))
            out += [_rows([b]) for b in loader]
        return out

    whole = run(mix.loader(2, format="numpy"))
    at = min(at, len(whole))
    first, done = mix.loader(2, format="numpy"), []
    for epoch in range(3):
        first.set_epoch(epoch)
        it = iter(first)
        while len(done) < at and (b := next(it, None)) is not None:
            done.append(_rows([b]))
        if len(done) == at:
            break
    state = first.state_dict()
    resumed = mix.loader(2, format="numpy")
    resumed.load_state_dict(state)
    assert done + run(resumed, state["epoch"]) == whole


def _peek(loader):
    """The batches left in ``loader``'s epoch, without moving it (a copy from its state)."""
    spans, k = [], loader._batches
    while (span := loader._span(k)) is not None:
        spans.append(span)
        k += 1
    return spans


def test_sources_of_other_layouts_are_gathered_one_by_one_with_the_same_order():
    """Sources whose caches differ (int32 vs int64 ids) are gathered per source; the batches
    are those of sources of one layout (one combined cache)."""
    same = {n: fl.from_dict({"id": np.arange(k) + 1000 * i}) for i, (n, k) in
            enumerate(SIZES.items())}  # fmt: skip
    mixed = dict(same, b=fl.from_numpy({"id": (np.arange(5) + 1000).astype(np.int32)}))
    one = fl.mix(same, dict.fromkeys(SIZES, 1.0), seed=4, window=8).loader(3, format="numpy")
    two = fl.mix(mixed, dict.fromkeys(SIZES, 1.0), seed=4, window=8).loader(3, format="numpy")
    assert one._combined is not None and two._combined is None
    assert _rows(list(one)) == _rows(list(two))


def test_a_column_missing_in_a_source_is_named():
    a = fl.from_dict({"id": np.arange(4), "x": np.arange(4)})
    b = fl.from_dict({"id": np.arange(4)})
    loader = fl.mix({"a": a, "b": b}, {"a": 1, "b": 1}, window=2).loader(2, format="numpy")
    with pytest.raises(ConfigurationError, match="'x' is not in every source"):
        list(loader)
    ok = fl.mix({"a": a, "b": b}, {"a": 1, "b": 1}, window=2, stop="all_exhausted").loader(
        2, format="numpy", columns=["id"])  # fmt: skip
    assert sorted(_rows(list(ok))) == [(s, i) for s in (0, 1) for i in range(4)]
    assert ok._combined is not None


@settings(max_examples=100, deadline=None)
@given(weights=st.lists(weights_st, min_size=1, max_size=3), window=st.integers(1, 20),
       cuts=st.lists(st.integers(1, 60), min_size=2, max_size=2), seed=st.integers(0, 99),
       start=st.integers(0, 150), length=st.integers(0, 150))  # fmt: skip
def test_draw_numbers_match_a_brute_force_count(weights, window, cuts, seed, start, length):
    """Each position's draw number is the count of earlier positions of its source (offsets
    added), across weight changes; drawn_before and position_of agree."""
    starts = [0, cuts[0], cuts[0] + cuts[1]][: len(weights)]
    offsets = [3, 0, 7]
    s = MixSchedule([13, 5, 8], list(zip(starts, weights, strict=True)), window=window,
                    seed=seed, epoch=1, offsets=offsets)  # fmt: skip
    codes, draws = s.draws(start, start + length)
    every = s.sources(0, start + length)
    assert codes.tolist() == every[start:].tolist()
    for k, (c, d) in enumerate(zip(codes.tolist(), draws.tolist(), strict=True)):
        p = start + k
        assert d == offsets[c] + int((every[:p] == c).sum())
        assert s.position_of(c, d - offsets[c]) == p
    assert s.drawn_before(start).tolist() == np.bincount(every[:start], minlength=3).tolist()
    # the vectorised chunk (what the loader reads) reads each draw's sample of its pass, with
    # the sources' first rows in a combined cache added, by either way of putting rows in place
    bases = np.array([0, 100, 1000])
    want = bases[codes] + np.array([s.rows(c, np.array([d]))[0] for c, d in
                                    zip(codes.tolist(), draws.tolist(), strict=True)])  # fmt: skip
    for few in (8, 0):
        with mock.patch.object(schedule_module, "_FEW", few):
            got_codes, got_rows = s.chunk(start, start + length, bases)
        assert got_codes.tolist() == codes.tolist()
        assert got_rows.tolist() == want.astype(np.int64).tolist()


def _doc_mix(seed, sizes=(23, 17), stop="first_exhausted"):
    """Two sources of documents whose tokens are unique (a token names its document)."""
    rng = np.random.default_rng(seed)
    sources = {}
    for s, n in enumerate(sizes):
        lengths = rng.integers(1, 12, n)
        sources[f"s{s}"] = fl.from_dict(
            {
                "tokens": [
                    [1 + 10_000 * s + 20 * d + t for t in range(int(k))]
                    for d, k in enumerate(lengths)
                ]
            }
        )
    return fl.mix(sources, {"s0": 2, "s1": 1}, seed=seed, window=6, stop=stop)


def _packed_tokens(batches):
    return [t for b in batches for t in b["input_ids"][b["input_ids"] > 0].tolist()]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**20),
    hops=st.sampled_from([(2, 3), (3, 2), (2, 3, 2), (3, 2, 3)]),
    steps=st.lists(st.integers(0, 4), min_size=2, max_size=2),
    buffer=st.integers(1, 6),
    batch=st.integers(1, 3),
    seq_len=st.sampled_from([8, 16]),
)
# some ranks had packed their last row at the checkpoint, others had not
@example(seed=0, hops=(3, 2, 3), steps=[0, 4], buffer=5, batch=3, seq_len=16)
# a rank past the documents' end had a lock-step repeat
@example(seed=1, hops=(2, 3), steps=[3, 0], buffer=2, batch=1, seq_len=8)
def test_packed_mix_elastic_resume_delivers_every_document_once(seed, hops, steps, buffer,
                                                                batch, seq_len):  # fmt: skip
    """A packed mix checkpointed on one world_size and resumed on another (2 -> 3, 3 -> 2,
    and on again) delivers every token of the epoch's mixed documents exactly once: no
    document repeated, none lost (the lock-step repeats are marked and left out)."""
    pack = fl.Packing(seq_len=seq_len, buffer_size=buffer, column="tokens")
    want = [t for b in _doc_mix(seed).loader(8, format="numpy", drop_last=False, ragged="list")
            for d in b["tokens"] for t in d]  # fmt: skip

    def ranks(world):
        return [_doc_mix(seed).loader(batch, rank=r, world_size=world, format="numpy",
                                      pack=pack, drop_last=False)
                for r in range(world)]  # fmt: skip

    got, states = [], None
    for hop, world in enumerate(hops):
        if states is not None and all(s["epoch"] == 1 for s in states):
            break  # every rank had finished the epoch (a resume would start the next one)
        loaders = ranks(world)
        for loader in loaders:
            if states is not None:
                loader.load_state_dict(states)
        if hop + 1 < len(hops):  # a few lock-step batches, then a checkpoint
            iters = [iter(loader) for loader in loaders]
            for _ in range(steps[hop]):
                got += _packed_tokens(b for it in iters if (b := next(it, None)) is not None)
            states = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
        else:
            got += _packed_tokens(b for loader in loaders for b in loader)
    assert Counter(got) == Counter(want)
    assert len(set(want)) == len(want)


def test_packed_mix_leaves_out_the_lock_step_repeats():
    """A rank past the mixed stream's end gets a repeat (so ranks stay in lock step): marked
    in "_padded" (return_padding_mask=True) and never packed."""
    # 5 documents, 2 ranks, batches of 2: rank 1's second batch is a repeat
    m = _doc_mix(0, sizes=(3, 2), stop="all_exhausted")
    batches = [list(m.loader(2, rank=r, world_size=2, format="numpy", drop_last=False,
                             ragged="list", return_padding_mask=True))
               for r in range(2)]  # fmt: skip
    assert [len(b) for b in batches] == [2, 2]
    assert batches[1][-1]["_padded"].tolist() == [True]
    assert not any(b["_padded"].any() for b in batches[0] + batches[1][:-1])
    pack = fl.Packing(seq_len=8, buffer_size=2, column="tokens")
    got = _packed_tokens(b for r in range(2) for b in m.loader(
        1, rank=r, world_size=2, format="numpy", pack=pack, drop_last=False))  # fmt: skip
    want = [t for b in m.loader(8, format="numpy", drop_last=False, ragged="list")
            for d in b["tokens"] for t in d]  # fmt: skip
    assert Counter(got) == Counter(want)


def _docs(name, lengths, base):
    return fl.from_dict({"tokens": [list(range(base, base + int(n))) for n in lengths]})


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), budget=st.integers(1, 400), batch=st.integers(1, 5),
       at=st.integers(0, 12))  # fmt: skip
def test_a_token_stop_ends_the_epoch_at_the_sample_that_reaches_the_budget(seed, budget, batch,
                                                                           at):  # fmt: skip
    """stop={"tokens": n}: an epoch is the shortest run of the stream whose tokens reach n (its
    last sample included), over as many passes as it takes; it resumes exactly mid-epoch."""
    rng = np.random.default_rng(seed)
    web = _docs("web", rng.integers(0, 9, 11), 0)
    code = _docs("code", rng.integers(1, 6, 7), 100)
    mix = fl.mix({"web": web, "code": code}, {"web": 2, "code": 1}, seed=seed, window=6,
                 stop={"tokens": budget})  # fmt: skip
    loader = mix.loader(batch, format="numpy", drop_last=False, ragged="list", prefetch=0)
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = [{k: list(v) for k, v in b.items()} for b in loader]
        lengths = [len(t) for b in batches for t in b["tokens"]]
        assert sum(lengths) >= budget > sum(lengths[:-1])
    resumed = mix.loader(batch, format="numpy", drop_last=False, ragged="list", prefetch=0)
    resumed.set_epoch(1)
    head = []
    for b in resumed if at else ():
        head.append({k: list(v) for k, v in b.items()})
        if len(head) == at:
            break
    state = json.loads(json.dumps(resumed.state_dict()))
    again = mix.loader(batch, format="numpy", drop_last=False, ragged="list", prefetch=0)
    again.load_state_dict(state)
    rest = [{k: list(v) for k, v in b.items()} for b in again]
    flat = [(int(s), tuple(t)) for b in head + rest for s, t in zip(b["source"], b["tokens"],
                                                                     strict=True)]  # fmt: skip
    want = [(int(s), tuple(t)) for b in batches for s, t in zip(b["source"], b["tokens"],
                                                                strict=True)]  # fmt: skip
    assert flat == want


def test_token_stops_that_cannot_work_say_why():
    with pytest.raises(ConfigurationError, match="token budget"):
        _mix(stop={"tokens": 0})
    with pytest.raises(ConfigurationError, match="token budget"):
        _mix(stop={"tokens": 5, "samples": 3})
    with pytest.raises(ConfigurationError, match="no list column"):
        _mix(stop={"tokens": 10}).loader(2, format="numpy")
    empty = fl.from_arrow(pa.table({"tokens": pa.array([[]] * 4, pa.list_(pa.int32()))}))
    with pytest.raises(ConfigurationError, match="0 tokens"):
        fl.mix({"a": empty, "b": empty}, stop={"tokens": 10}).loader(2, format="numpy",
                                                                      ragged="list")  # fmt: skip


def test_a_token_stop_counts_the_same_tokens_in_sources_of_other_layouts():
    """Sources gathered one by one (no combined cache) count each sample's tokens alike."""
    rng = np.random.default_rng(5)
    lengths = {"web": rng.integers(0, 9, 11), "code": rng.integers(1, 6, 7)}

    def source(name, id_type):
        n = len(lengths[name])
        return fl.from_arrow(pa.table({
            "tokens": pa.array([list(range(int(k))) for k in lengths[name]], pa.list_(pa.int32())),
            "id": pa.array(np.arange(n), id_type)}))  # fmt: skip

    def batches(code_ids):
        mix = fl.mix({"web": source("web", pa.int64()), "code": source("code", code_ids)},
                     seed=2, window=6, stop={"tokens": 150})  # fmt: skip
        loader = mix.loader(4, format="numpy", drop_last=False, ragged="list", prefetch=0)
        got = [(int(s), int(i)) for b in loader for s, i in zip(b["source"], b["id"], strict=True)]
        return loader, got

    one, combined = batches(pa.int64())
    two, apart = batches(pa.int32())
    assert one._combined is not None and two._combined is None
    assert combined == apart
    assert sum(int(lengths[("web", "code")[s]][i]) for s, i in combined) >= 150
