"""``fl.Packing(equal_batches=True)``: every rank yields the same number of packed batches
(ranks whose rows run out yield empty rows), every token still once, exact resume, also on
another number of ranks."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError


def _corpus(n=60, seed=3):
    rng = np.random.default_rng(seed)
    # the first documents long, the rest short: the ranks pack very different row counts
    lengths = np.where(np.arange(n) < n // 3, rng.integers(20, 40, n), rng.integers(1, 4, n))
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 1
    docs = [list(range(int(s), int(s + k))) for s, k in zip(start, lengths, strict=True)]
    return fl.from_arrow(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})), docs


def _loader(ds, rank, world_size, equal=True, drop_last=False, **kw):
    pack = fl.Packing(seq_len=16, buffer_size=5, algorithm="greedy", max_docs=4,
                      equal_batches=equal)  # fmt: skip
    kw = {"batch_size": 2, "shuffle": False, "format": "numpy"} | kw
    return ds.loader(rank=rank, world_size=world_size, drop_last=drop_last, pack=pack, **kw)


def _key(batches):
    return [{k: v.tolist() for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_yields_the_most_batches_and_every_token_once(world_size, drop_last):
    ds, docs = _corpus()
    plain = [list(_loader(ds, r, world_size, equal=False, drop_last=drop_last))
             for r in range(world_size)]  # fmt: skip
    assert len({len(b) for b in plain}) > 1  # the counts differ without the option
    even = [list(_loader(ds, r, world_size, drop_last=drop_last)) for r in range(world_size)]
    most = max(len(b) for b in plain)
    assert [len(b) for b in even] == [most] * world_size
    for mine, theirs in zip(even, plain, strict=True):
        assert _key(mine[: len(theirs)]) == _key(theirs)  # the real batches unchanged
        for empty in mine[len(theirs) :]:  # then empty rows
            assert empty["input_ids"].shape == (2, 16) and not empty["input_ids"].any()
            assert empty["input_ids"].dtype == np.int32
            assert (empty["labels"] == -100).all() and not empty["num_docs"].any()
            assert empty["cu_seqlens"][:, :2].tolist() == [[0, 16]] * 2
    if not drop_last:
        tokens = [int(t) for b in even for x in b for t in x["input_ids"].ravel() if t]
        assert sorted(tokens) == sorted(t for d in docs for t in d)


def test_metrics_count_the_empty_batches():
    ds, _ = _corpus()
    plain = [len(list(_loader(ds, r, 3, equal=False))) for r in range(3)]
    loader = _loader(ds, int(np.argmin(plain)), 3)
    list(loader)
    m = loader.metrics()[0]
    assert m["batches"] == max(plain) and m["batches_empty"] == max(plain) - min(plain)
    assert m["padding_fraction"] == pytest.approx(1 - m["tokens"] / (m["rows"] * 16))


@pytest.mark.parametrize("k", [0, 1, 3, 5, 7, 9])
def test_resume_at_any_batch_is_exact_also_among_the_empty_ones(k):
    ds, _ = _corpus()
    plain = [len(list(_loader(ds, r, 3, equal=False))) for r in range(3)]
    rank = int(np.argmin(plain))  # the rank that pads most
    whole = _key(_loader(ds, rank, 3))
    first = _loader(ds, rank, 3)
    it = iter(first)
    head = [next(it) for _ in range(min(k, len(whole)))]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = _loader(ds, rank, 3)
    resumed.load_state_dict(state)
    assert _key(head) + _key(resumed) == whole


def test_next_epoch_recounts_and_a_bad_option_is_refused():
    ds, _ = _corpus()
    for seed in range(4):  # each epoch is planned again (another order)
        counts = []
        for rank in range(2):
            loader = _loader(ds, rank, 2, shuffle=True, seed=seed)
            counts.append([len(list(loader)) for _ in range(2)])
            assert [m["batches"] for m in loader.metrics()] == counts[-1]
        assert counts[0] == counts[1]
    with pytest.raises(ConfigurationError, match="equal_batches"):
        fl.Packing(seq_len=4, equal_batches=1)


@pytest.mark.parametrize(("old", "new", "steps"), [(2, 3, 2), (3, 2, 1), (3, 2, 4), (2, 3, 0)])
def test_elastic_resume_keeps_the_ranks_even_and_every_token_once(old, new, steps):
    ds, docs = _corpus(n=90)
    before, states = [], []
    for rank in range(old):  # synchronous ranks: each delivered `steps` batches
        loader = _loader(ds, rank, old)
        it = iter(loader)
        before += [next(it) for _ in range(steps)]
        states.append(json.loads(json.dumps(loader.state_dict())))
    after = []
    for rank in range(new):
        loader = _loader(ds, rank, new)
        loader.load_state_dict(states)
        it = iter(loader)
        head = [next(it)]
        state = loader.state_dict()  # a checkpoint of the resumed run, resumed again: exact
        again = _loader(ds, rank, new)
        again.load_state_dict(state)
        rest = list(again)
        assert _key(rest) == _key(list(it))
        after.append(head + rest)
    assert len({len(a) for a in after}) == 1  # every new rank as many batches
    assert any(not b["input_ids"].any() for a in after for b in a)  # some ranks padded
    tokens = [int(t) for b in before + [b for a in after for b in a]
              for t in b["input_ids"].ravel() if t]  # fmt: skip
    assert sorted(tokens) == sorted(t for d in docs for t in d)
