"""The ``Pack`` node (``feedline.loader.nodes.Pack``): the rows of ``ds.loader(pack=...)`` for
the same documents, and exact resume at any position, with its own state and with only
``{"epoch", "batches"}`` (through a node wrapped around it)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader import nodes


def _corpus(n=90, seed=0, high=40):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, high, size=n)  # empty documents too
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 1
    docs = [list(range(int(s), int(s + k))) for s, k in zip(start, lengths, strict=True)]
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())), "other": np.arange(n)})
    return fl.from_arrow(table), docs


def _packing(**kw):
    return fl.Packing(**({"seq_len": 16, "buffer_size": 10, "algorithm": "best_fit",
                          "max_docs": 4} | kw))  # fmt: skip


def _docs_loader(ds, packing, rank=0, world_size=1, seed=7):
    """The documents ``ds.loader(pack=packing)`` reads: ``buffer_size`` per batch."""
    return ds.loader(batch_size=packing.buffer_size, drop_last=False, seed=seed, rank=rank,
                     world_size=world_size, format="numpy", columns=[packing.column],
                     ragged={packing.column: "list"})  # fmt: skip


def _node(ds, packing, batch_size=3, drop_last=False, **kw):
    source = _docs_loader(ds, packing, **kw).source_node()
    return nodes.Pack(source, packing, batch_size=batch_size, drop_last=drop_last)


def _key(datas):
    return [{k: v.tolist() for k, v in d.items()} for d in datas]


@pytest.mark.parametrize("algorithm", ["greedy", "first_fit", "best_fit"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (1, 2)])
def test_same_batches_as_the_packing_loader(algorithm, drop_last, rank, world_size):
    ds, _ = _corpus()
    packing = _packing(algorithm=algorithm)
    loader = ds.loader(batch_size=3, seed=7, format="numpy", drop_last=drop_last, rank=rank,
                       world_size=world_size, pack=packing)  # fmt: skip
    expected = _key(list(loader))
    got = list(_node(ds, packing, drop_last=drop_last, rank=rank, world_size=world_size))
    assert expected and _key(b.data for b in got) == expected
    assert [b.number for b in got] == list(range(len(got)))
    assert [b.indices.tolist() for b in got] == [list(range(3 * i, 3 * i + len(b)))
                                                 for i, b in enumerate(got)]  # fmt: skip


def test_every_token_once_and_the_mask_boundaries():
    ds, docs = _corpus()
    packing = _packing(boundaries="mask", algorithm="greedy")
    got = list(_node(ds, packing, batch_size=4))
    tokens = [int(t) for b in got for t in b.data["input_ids"].ravel() if t != 0]
    assert sorted(tokens) == sorted(t for d in docs for t in d)
    assert all(b.data["attention_mask"].shape[1:] == (16, 16) for b in got)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 30), batch_size=st.integers(1, 5),
       algorithm=st.sampled_from(["greedy", "first_fit", "best_fit"]),
       buffer_size=st.integers(1, 12), seed=st.integers(0, 3))  # fmt: skip
# blocks that pack to no row right after a batch boundary (empty documents): the state the
# node reports and the one a replay reaches must name the same boundary
@example(k=30, batch_size=1, algorithm="greedy", buffer_size=1, seed=0)
def test_resume_at_any_position_is_exact(k, batch_size, algorithm, buffer_size, seed):
    ds, _ = _corpus(n=40, seed=seed)
    packing = _packing(algorithm=algorithm, buffer_size=buffer_size)
    whole = _key(b.data for b in _node(ds, packing, batch_size=batch_size))
    first = _node(ds, packing, batch_size=batch_size)
    head = [b.data for _, b in zip(range(k), first, strict=False)]
    state = json.loads(json.dumps(first.get_state()))
    assert set(state) == {"epoch", "batches", "blocks", "rows"}
    # exact from the node's own state, and from {"epoch", "batches"} alone (a replay)
    for given_state in (state, {"epoch": state["epoch"], "batches": state["batches"]}):
        resumed = _node(ds, packing, batch_size=batch_size)
        resumed.reset(given_state)
        assert resumed.get_state() == state
        rest = [b.data for b in resumed]
        assert _key(head) + _key(rest) == whole
    assert state["batches"] == min(k, len(whole))


@pytest.mark.parametrize("wrap", ["format", "prefetch"])
def test_resume_through_a_node_around_it(wrap):
    ds, _ = _corpus()
    packing = _packing()

    def pipeline():
        node = nodes.Format(_node(ds, packing), "numpy")
        return nodes.Prefetch(node, depth=3) if wrap == "prefetch" else node

    with pipeline() as outer:
        whole = _key(b.data for b in outer)
    with pipeline() as outer:
        head = [next(outer).data for _ in range(4)]
        state = outer.get_state()  # the consumer's position, whatever was read ahead
    assert state == {"epoch": 0, "batches": 4}
    with pipeline() as again:
        again.reset(state)
        assert _key(head) + _key(b.data for b in again) == whole


def test_reset_none_restarts_the_epoch_and_another_epoch_reshuffles():
    ds, _ = _corpus()
    packing = _packing()
    node = _node(ds, packing)
    first = _key(b.data for b in node)
    node.reset(None)
    assert _key(b.data for b in node) == first
    node.reset({"epoch": 1, "batches": 0})
    second = list(node)
    assert {b.epoch for b in second} == {1} and _key(b.data for b in second) != first
    loader = ds.loader(batch_size=3, seed=7, format="numpy", drop_last=False, pack=packing)
    loader.set_epoch(1)
    assert _key(b.data for b in second) == _key(list(loader))


def test_bad_arguments_and_states_are_refused():
    ds, _ = _corpus(n=10)
    packing = _packing()
    source = _docs_loader(ds, packing).source_node()
    with pytest.raises(ConfigurationError, match="batch_size"):
        nodes.Pack(source, packing, batch_size=0)
    with pytest.raises(ConfigurationError, match=r"fl\.Packing"):
        nodes.Pack(source, {"seq_len": 16}, batch_size=2)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="feedline node"):
        nodes.Pack([1, 2], packing, batch_size=2)  # type: ignore[arg-type]
    node = nodes.Pack(source, packing, batch_size=2)
    moved = _docs_loader(ds, packing).source_node()
    next(moved)
    with pytest.raises(ConfigurationError, match="epoch's start"):
        nodes.Pack(moved, packing, batch_size=2)
    for bad in ({"epoch": 0}, {"epoch": 0, "batches": 1, "blocks": 2},
                {"epoch": 0, "batches": 1, "blocks": -1, "rows": 0}):  # fmt: skip
        with pytest.raises(ConfigurationError, match="Fix:"):
            node.reset(bad)


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_rank_past_the_last_documents_repeats_no_token(world_size):
    # 25 documents, buffers of 10: a rank past the last step's documents gets one repeat
    # (marked padded, so it takes a training step): packing leaves it out, loader and node
    ds, docs = _corpus(n=25, seed=1)
    packing = _packing()
    expected = sorted(t for d in docs for t in d)
    by_loader, by_node = [], []
    for rank in range(world_size):
        loader = ds.loader(batch_size=3, seed=7, format="numpy", drop_last=False, rank=rank,
                           world_size=world_size, pack=packing)  # fmt: skip
        by_loader += list(loader)
        by_node += [b.data for b in _node(ds, packing, rank=rank, world_size=world_size)]
    for got in (by_loader, by_node):
        assert sorted(int(t) for b in got for t in b["input_ids"].ravel() if t != 0) == expected
