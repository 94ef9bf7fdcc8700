"""Sequence packing (``ds.loader(pack=fl.Packing(...))``): against brute-force references,
exact resume (also 2 -> 3 and 3 -> 2 ranks), determinism, and a model's loss."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.loader.packing.bins import plan_rows
from feedline.loader.packing.rows import row_arrays


def _reference(lengths, seq_len, algorithm, overlong, max_docs):
    """Brute force: the pieces, then the rows by scanning every row for each piece."""
    pieces, split, dropped = [], 0, 0
    for d, n in enumerate(lengths):
        if n > seq_len and overlong == "drop":
            dropped += 1
            continue
        if n > seq_len:
            split += 1
        pieces += [(d, s, min(s + seq_len, n)) for s in range(0, n, seq_len)]
    rows: list[list] = []
    if algorithm == "greedy":
        for p in pieces:
            if (
                not rows
                or sum(e - s for _, s, e in rows[-1]) + p[2] - p[1] > seq_len
                or len(rows[-1]) >= max_docs
            ):
                rows.append([])
            rows[-1].append(p)
        return rows, split, dropped
    for p in sorted(pieces, key=lambda p: -(p[2] - p[1])):  # stable: ties in order
        n = p[2] - p[1]
        fits = [
            r
            for r, row in enumerate(rows)
            if len(row) < max_docs and seq_len - sum(e - s for _, s, e in row) >= n
        ]
        if not fits:
            rows.append([p])
            continue
        if algorithm == "first_fit":
            r = fits[0]
        else:
            r = min(fits, key=lambda r: (seq_len - sum(e - s for _, s, e in rows[r]), r))
        rows[r].append(p)
    return rows, split, dropped


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), max_size=30),
    seq_len=st.integers(2, 24),
    algorithm=st.sampled_from(["greedy", "first_fit", "best_fit"]),
    overlong=st.sampled_from(["split", "drop"]),
    max_docs=st.integers(1, 5),
)
def test_rows_match_the_brute_force_reference(lengths, seq_len, algorithm, overlong, max_docs):
    packing = fl.Packing(seq_len=seq_len, algorithm=algorithm, overlong=overlong,
                         max_docs=max_docs)  # fmt: skip
    plan = plan_rows(lengths, packing)
    rows, split, dropped = _reference(lengths, seq_len, algorithm, overlong, max_docs)
    assert plan.rows == rows and (plan.split, plan.dropped) == (split, dropped)
    # every token of every kept document exactly once, no row over seq_len or max_docs
    covered = {}
    for row in plan.rows:
        assert sum(e - s for _, s, e in row) <= seq_len and len(row) <= max_docs
        for d, s, e in row:
            for t in range(s, e):
                assert (d, t) not in covered
                covered[d, t] = True
    kept = {(d, t) for d, n in enumerate(lengths) if n <= seq_len or overlong == "split"
            for t in range(n)}  # fmt: skip
    assert set(covered) == kept


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=12),
    seq_len=st.integers(2, 16),
    boundaries=st.sampled_from(["cu_seqlens", "mask"]),
)
def test_row_arrays_mark_every_boundary(lengths, seq_len, boundaries):
    packing = fl.Packing(seq_len=seq_len, max_docs=4, boundaries=boundaries, ignore_index=-7)
    docs = [np.arange(1000 * (d + 1), 1000 * (d + 1) + n, dtype=np.int32)
            for d, n in enumerate(lengths)]  # fmt: skip
    plan = plan_rows(lengths, packing)
    out = row_arrays(docs, plan.rows, packing)
    assert out["input_ids"].shape == (len(plan.rows), seq_len)  # exactly seq_len
    for r, row in enumerate(plan.rows):
        ids, labels, pos = out["input_ids"][r], out["labels"][r], out["position_ids"][r]
        at, ends = 0, [0]
        segment = np.full(seq_len, -1)
        for k, (d, s, e) in enumerate(row):
            n = e - s
            assert ids[at : at + n].tolist() == docs[d][s:e].tolist()
            assert pos[at : at + n].tolist() == list(range(n))
            assert labels[at : at + n - 1].tolist() == docs[d][s + 1 : e].tolist()
            assert labels[at + n - 1] == -7  # no next token across the boundary
            segment[at : at + n] = k
            at += n
            ends.append(at)
        assert (ids[at:] == 0).all() and (labels[at:] == -7).all()
        assert pos[at:].tolist() == list(range(seq_len - at))
        if boundaries == "cu_seqlens":
            expected = ends + [seq_len] * (packing.max_docs + 2 - len(ends))
            assert out["cu_seqlens"][r].tolist() == expected
            assert out["num_docs"][r] == len(row)
        else:
            same = segment[:, None] == segment[None, :]
            assert (out["attention_mask"][r] == same).all()


def _corpus(n=120, seed=0, low=1, high=40):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high, size=n)
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 1
    docs = [list(range(int(s), int(s + k))) for s, k in zip(start, lengths, strict=True)]
    return fl.from_arrow(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())),
                                   "other": np.arange(n)})), docs  # fmt: skip


def _loader(ds, rank=0, world_size=1, **kw):
    pack = fl.Packing(seq_len=kw.pop("seq_len", 16), buffer_size=kw.pop("buffer_size", 10),
                      algorithm=kw.pop("algorithm", "best_fit"), max_docs=4)  # fmt: skip
    kw = {"batch_size": 3, "seed": 7, "format": "numpy", "drop_last": False} | kw
    return ds.loader(rank=rank, world_size=world_size, pack=pack, **kw)


def _tokens(batches):
    return [int(t) for b in batches for t in b["input_ids"].ravel()
            if t != 0]  # fmt: skip


def _key(batches):
    return [{k: v.tolist() for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("algorithm", ["greedy", "first_fit", "best_fit"])
def test_a_packed_epoch_has_every_token_once(algorithm):
    ds, docs = _corpus()
    loader = _loader(ds, algorithm=algorithm)
    batches = list(loader)
    assert all(b["input_ids"].shape[1] == 16 for b in batches)
    assert sorted(_tokens(batches)) == sorted(t for d in docs for t in d)
    m = loader.metrics()[0]
    assert m["tokens"] == sum(map(len, docs)) and m["documents"] == len(docs)
    assert m["documents_split"] == sum(len(d) > 16 for d in docs)
    assert 0 < m["padding_fraction"] < 1
    assert m["padding_fraction"] == pytest.approx(1 - m["tokens"] / (m["rows"] * 16))


def test_same_seed_same_batches_and_another_seed_differs():
    ds, _ = _corpus()
    a, b, c = (_key(_loader(ds, seed=s)) for s in (3, 3, 4))
    assert a == b and a != c


@pytest.mark.parametrize("k", [0, 1, 2, 5, 9, 13])
def test_resume_at_any_batch_is_exact(k):
    ds, _ = _corpus()
    whole = _key(_loader(ds))
    first = _loader(ds)
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))  # JSON-safe
    assert len(json.dumps(state)) < 2000  # tiny: no token stored
    resumed = _loader(ds)
    resumed.load_state_dict(state)
    assert _key(head) + _key(resumed) == whole


def test_a_version_2_checkpoint_still_resumes_exactly():
    """Checkpoints written before ``ended`` (state version 2) resume: nothing had ended."""
    ds, _ = _corpus()
    whole = _key(_loader(ds))
    first = _loader(ds)
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = dict(first.state_dict(), version=2)
    assert state.pop("ended") is None
    resumed = _loader(ds)
    resumed.load_state_dict(state)
    assert _key(head) + _key(resumed) == whole


@pytest.mark.parametrize(("old", "new", "steps"), [(2, 3, (3, 5)), (3, 2, (2, 4, 1)),
                                                    (2, 3, (0, 7)), (3, 2, (6, 6, 6))])  # fmt: skip
def test_elastic_resume_delivers_every_token_once(old, new, steps):
    ds, docs = _corpus(n=150)
    before, states = [], []
    for rank in range(old):
        loader = _loader(ds, rank, old)
        it = iter(loader)
        before += [next(it) for _ in range(steps[rank])]
        states.append(json.loads(json.dumps(loader.state_dict())))
    after = []
    resumed_states = []
    for rank in range(new):
        loader = _loader(ds, rank, new)
        loader.load_state_dict(states)
        it = iter(loader)
        after += [next(it)]  # a checkpoint while the carried rows are delivered
        resumed_states.append(loader.state_dict())
        again = _loader(ds, rank, new)
        again.load_state_dict(resumed_states[-1])
        rest = list(again)
        assert _key(rest) == _key(list(loader))  # resumed again: exact
        after += rest
    assert sorted(_tokens(before + after)) == sorted(t for d in docs for t in d)


def test_a_state_of_another_packing_is_refused():
    ds, _ = _corpus()
    loader = _loader(ds)
    next(iter(loader))
    other = _loader(ds, seq_len=32)
    with pytest.raises(fl.ConfigurationError, match="Packing"):
        other.load_state_dict(loader.state_dict())


def test_len_is_unknown_but_list_works():
    ds, _ = _corpus(n=20)
    loader = _loader(ds)
    with pytest.raises(TypeError, match="not known ahead"):
        len(loader)
    assert list(loader)


def test_block_diagonal_loss_equals_documents_one_by_one():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    vocab, dim, seq_len = 50, 16, 24
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, vocab, size=int(n)).tolist() for n in rng.integers(2, 14, size=12)]
    ds = fl.from_arrow(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}))
    pack = fl.Packing(seq_len=seq_len, boundaries="mask", algorithm="first_fit", max_docs=8)
    batches = list(ds.loader(batch_size=4, shuffle=False, pack=pack, format="torch"))
    emb = torch.nn.Embedding(vocab, dim)
    pos = torch.nn.Embedding(seq_len, dim)
    layer = torch.nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.0, batch_first=True)
    head = torch.nn.Linear(dim, vocab)
    layer.eval()

    def logits(ids, position_ids, allowed):  # allowed: (B, S, S) True = may attend
        h = emb(ids.long()) + pos(position_ids)
        return head(layer(h, src_mask=(~allowed).repeat_interleave(2, 0)))

    loss = torch.nn.functional.cross_entropy
    with torch.no_grad():
        total, count = 0.0, 0
        for b in batches:
            causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
            out = logits(b["input_ids"], b["position_ids"], b["attention_mask"] & causal)
            total += loss(out.reshape(-1, vocab), b["labels"].reshape(-1), ignore_index=-100,
                          reduction="sum").item()  # fmt: skip
            count += int((b["labels"] != -100).sum())
        one_total, one_count = 0.0, 0
        for d in docs:
            ids = torch.tensor([d])
            n = len(d)
            out = logits(ids, torch.arange(n)[None], torch.ones(1, n, n, dtype=torch.bool).tril())
            one_total += loss(out[0, :-1], ids[0, 1:], reduction="sum").item()
            one_count += n - 1
    assert count == one_count
    assert total / count == pytest.approx(one_total / one_count, rel=1e-5)


def test_tokenize_without_padding_and_as_a_thread_transform(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"[PAD]": 0, "[UNK]": 1, "a": 2, "b": 3, "c": 4}
    tok = Tokenizer(models.WordLevel(words, "[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    texts = ["a b c", "c", "a a a a a b", "b c b"]
    written = fl.from_arrow(pa.table({"text": texts})).transform(
        fl.Tokenize("text", path, max_length=None)
    )
    table = written.to_arrow()
    assert table.schema.field("text").type == pa.list_(pa.int32())
    assert table["text"].to_pylist() == [[2, 3, 4], [4], [2, 2, 2, 2, 2, 3], [3, 4, 3]]
    # at load time: the tokenizer as a transform in thread workers, then packing
    loaded = Tokenizer.from_file(path)

    def tokenize(sample, rng):
        return {"input_ids": loaded.encode(sample["text"]).ids}  # ragged: a list

    ds = fl.from_arrow(pa.table({"text": texts}))
    pack = fl.Packing(seq_len=8, buffer_size=4)
    loader = ds.loader(batch_size=2, shuffle=False, format="numpy", transform=tokenize,
                       num_workers=2, worker_type="thread", pack=pack)  # fmt: skip
    got = [int(t) for b in loader for t in b["input_ids"].ravel() if t]
    assert sorted(got) == sorted(t for r in table["text"].to_pylist() for t in r)


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_elastic_resume_from_ranks_of_which_some_had_finished(old, new):
    """Rank 0 had packed its last row (its state names the next epoch), the others had rows
    left: the resume on another world_size puts rank 0 at the epoch's end and delivers the
    rest, every token once (the states of different epochs were refused before)."""
    ds, docs = _corpus(n=150)
    before, states = [], []
    for rank in range(old):
        loader = _loader(ds, rank, old)
        it = iter(loader)
        before += list(it) if rank == 0 else [next(it)]
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0]["epoch"] == 1 and states[0]["ended"] is not None
    assert all(s["epoch"] == 0 for s in states[1:])
    after = []
    for rank in range(new):
        loader = _loader(ds, rank, new)
        loader.load_state_dict(states)
        after += list(loader)
    assert sorted(_tokens(before + after)) == sorted(t for d in docs for t in d)
