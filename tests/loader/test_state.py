"""The loader checkpoint is validated field by field and refused on another dataset.

A damaged or foreign state must raise :class:`ConfigurationError` naming the field, never
another exception and never resume at a position that replays or skips samples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader import Loader
from feedline.loader.order.sample_order import samples_seen
from feedline.loader.order.state import MAX_WORLD_SIZE, real_samples

N = 200
PLAIN = {"batch_size": 8, "world_size": 2, "rank": 1, "seed": 3}
ELASTIC = {"batch_size": 5, "world_size": 3, "rank": 0, "drop_last": False}


def _table(n: int, scale: float = 1.0) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    return pa.table({"id": ids, "x": (ids * scale).astype(np.float32)})


def _write(path: Path, table: pa.Table) -> fl.Dataset:
    fl.from_arrow(table).write(path, rows_per_shard=100, row_group_rows=25)
    return fl.open(path)


def _loader(ds: fl.Dataset, kwargs: dict[str, Any]) -> Loader:
    return ds.loader(**kwargs, format="numpy", prefetch=0)


def _take(loader: Loader, k: int) -> list[np.ndarray]:
    iterator = iter(loader)
    out = [next(iterator)["id"] for _ in range(k)]
    iterator.close()
    return out


def _ids(loader: Loader) -> list[int]:
    return [int(i) for b in loader for i in b["id"]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[fl.Dataset, dict[str, Any]]:
    """A written dataset and two valid states: mid-epoch, and after an elastic resume."""
    ds = _write(tmp_path_factory.mktemp("state") / "ds", _table(N))
    first = _loader(ds, PLAIN)
    _take(first, 4)
    plain = first.state_dict()
    resumed = _loader(ds, ELASTIC)
    resumed.load_state_dict(plain)
    _take(resumed, 2)
    elastic = resumed.state_dict()
    assert elastic["history"]  # the second state carries a finished segment
    states = {}
    for name, state, kwargs in (("plain", plain, PLAIN), ("elastic", elastic, ELASTIC)):
        probe = _loader(ds, kwargs)
        probe.load_state_dict(state)
        states[name] = (state, kwargs, len(probe))  # batches per rank this layout allows
    return ds, states


def test_the_state_is_tiny_json_safe_and_names_the_dataset(saved) -> None:
    ds, states = saved
    state = states["plain"][0]
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 500
    assert state["fingerprint"] == fl.tracking.dataset_digest(ds.manifest)
    # data never written is named by its values (issue 23.21: it used to be None)
    memory = fl.range(10).loader(batch_size=2).state_dict()["fingerprint"]
    assert memory.startswith("content:")
    assert memory == fl.range(10).loader(batch_size=5).state_dict()["fingerprint"]
    assert (
        memory
        != fl.range(10)
        .map_batches(lambda b: {"id": pa.compute.add(b["id"], 1)})
        .loader(batch_size=2)
        .state_dict()["fingerprint"]
    )


@pytest.mark.parametrize("name", ["plain", "elastic"])
def test_valid_states_resume_exactly(saved, name: str) -> None:
    ds, states = saved
    state, kwargs, _ = states[name]
    resumed = _loader(ds, kwargs)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    again = _loader(ds, kwargs)
    again.load_state_dict(state)
    assert _ids(resumed) == _ids(again) and resumed.state_dict()["batches"] == len(resumed)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("batches", -5, "'batches' is -5"),  # used to replay 5 batches silently
        ("world_size", 0, "'world_size' is 0"),  # used to raise IndexError
        ("rank", 2, "'rank' is 2"),  # rank >= world_size
        ("batches", 13, "'batches' is 13, but an epoch of this layout"),  # past the epoch
        ("batch_size", 8.0, "'batch_size' is 8.0 (float); expected an int"),
        ("drop_last", 1, "'drop_last' is 1 (int); expected true or false"),
        ("version", 99, "version 99 is not supported"),
        ("history", [{"world_size": 2}], "segment (history[0])"),
    ],
)
def test_a_bad_field_is_named_with_its_value(saved, field: str, value: Any, says: str) -> None:
    ds, states = saved
    state, kwargs, _ = states["plain"]
    loader = _loader(ds, kwargs)
    with pytest.raises(ConfigurationError, match="Fix:") as info:
        loader.load_state_dict({**state, field: value})
    assert says in str(info.value)


def test_missing_and_extra_keys_are_named(saved) -> None:
    ds, states = saved
    state, kwargs, _ = states["plain"]
    loader = _loader(ds, kwargs)
    with pytest.raises(ConfigurationError, match=r"missing keys \['seed'\], unexpected keys "
                                                 r"\['sed'\]"):  # fmt: skip
        loader.load_state_dict({**{k: v for k, v in state.items() if k != "seed"}, "sed": 3})


def test_a_state_of_another_dataset_of_the_same_size_is_refused(saved, tmp_path) -> None:
    ds, states = saved
    state, kwargs, _ = states["plain"]
    other = _write(tmp_path / "other", _table(N, scale=2.0))
    loader = _loader(other, kwargs)
    with pytest.raises(ConfigurationError) as info:
        loader.load_state_dict(state)
    message = str(info.value)
    assert "'fingerprint'" in message and state["fingerprint"] in message
    assert loader._fingerprint in message and "Fix:" in message
    # the same data opened again is the same dataset
    _loader(fl.open(ds.plan.source.target.url), kwargs).load_state_dict(state)


def test_a_state_without_a_fingerprint_resumes_only_when_asked_to(saved) -> None:
    """Issue 23.21: a version-1 state (or a null fingerprint) names no dataset: refused,
    unless ``check_dataset=False`` says it was taken on this data (then it resumes exactly)."""
    ds, states = saved
    state, kwargs, _ = states["plain"]
    old = {k: v for k, v in state.items() if k != "fingerprint"} | {"version": 1}
    for unnamed in (old, {**state, "fingerprint": None}):
        with pytest.raises(ConfigurationError, match=r"'fingerprint' is missing.*check_dataset"):
            _loader(ds, kwargs).load_state_dict(unnamed)
        a, b = _loader(ds, kwargs), _loader(ds, kwargs)
        a.load_state_dict(unnamed, check_dataset=False)
        b.load_state_dict(state)
        assert _ids(a) == _ids(b)


def test_a_state_of_unwritten_data_is_refused_on_other_data_of_the_same_size(
    saved, tmp_path: Path
) -> None:
    """Issue 23.21: in-memory data, a computed plan and a plain Parquet folder each have a
    fingerprint now; an earlier state with ``None`` is refused on a written dataset."""
    ds = saved[0]
    kwargs = {"batch_size": 8, "seed": 3}
    memory = fl.from_arrow(_table(N))
    first = _loader(memory, kwargs)
    _take(first, 2)
    state = first.state_dict()
    again = _loader(fl.from_arrow(_table(N)), kwargs)  # the same values: the same data
    again.load_state_dict(state)
    assert again.state_dict() == state
    for other in (fl.from_arrow(_table(N, scale=2.0)), ds):  # the same size, other data
        with pytest.raises(ConfigurationError, match="'fingerprint' differs"):
            _loader(other, kwargs).load_state_dict(state)
    with pytest.raises(ConfigurationError, match="'fingerprint' is missing"):
        _loader(ds, kwargs).load_state_dict({**state, "fingerprint": None})  # as it used to be
    folders = []
    for i, scale in enumerate((1.0, 2.0)):
        folder = tmp_path / f"parquet{i}"
        folder.mkdir()
        pq.write_table(_table(N, scale), folder / "part-0.parquet", row_group_size=50)
        folders.append(fl.read_parquet(folder))
    plain = _loader(folders[0], kwargs)
    _take(plain, 1)
    state = plain.state_dict()
    assert state["fingerprint"].startswith("parquet:")
    _loader(folders[0], kwargs).load_state_dict(state)
    with pytest.raises(ConfigurationError, match="'fingerprint' differs"):
        _loader(folders[1], kwargs).load_state_dict(state)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"seed": 4}, "seed"),
        ({"shuffle": False}, "shuffle"),
        ({"shuffle_window": 2}, "shuffle_window"),
    ],
)
def test_explicit_order_options_that_conflict_with_the_state_are_refused_alike(
    saved, given: dict[str, Any], field: str
) -> None:
    """Issue 23.21: an explicit ``shuffle=`` was silently overridden by the state's while an
    explicit other ``seed=`` was refused; now each is refused, and unset ones are adopted."""
    ds, states = saved
    state, kwargs, _ = states["plain"]
    layout = {k: v for k, v in kwargs.items() if k != "seed"}
    with pytest.raises(ConfigurationError, match=f"'{field}' differs.*Fix: build the loader"):
        _loader(ds, {**layout, **given}).load_state_dict(state)
    same = {"seed": state["seed"], "shuffle": state["shuffle"]}
    explicit, adopted = _loader(ds, {**layout, **same}), _loader(ds, layout)
    explicit.load_state_dict(state)
    adopted.load_state_dict(state)
    assert _ids(explicit) == _ids(adopted)


def test_epoch_and_batch_counts_are_bounded(saved) -> None:
    """Issue 23.21: ``epoch=10**20`` was accepted (in a state and by set_epoch)."""
    ds, states = saved
    state, kwargs, _ = states["plain"]
    loader = _loader(ds, kwargs)
    for field in ("epoch", "batches", "num_samples"):
        with pytest.raises(ConfigurationError, match=f"'{field}' is 100000000000000000000"):
            loader.load_state_dict({**state, field: 10**20})
    loader.load_state_dict({**state, "epoch": 2**62 - 1})  # the largest epoch
    assert loader.epoch == 2**62 - 1
    with pytest.raises(ConfigurationError, match="epoch must be an int <= "):
        loader.set_epoch(2**62)
    with pytest.raises(ConfigurationError, match="batch_size must be an int <= "):
        _loader(ds, {"batch_size": 10**20})


def test_a_refused_state_leaves_the_loader_where_it_was(saved) -> None:
    ds, states = saved
    state, kwargs, _ = states["plain"]
    loader = _loader(ds, kwargs)
    head = _take(loader, 2)
    before = loader.state_dict()
    with pytest.raises(ConfigurationError):
        loader.load_state_dict({**state, "batches": -1})
    assert loader.state_dict() == before
    whole = _loader(ds, kwargs)
    assert [int(i) for b in head for i in b] + _ids(loader) == _ids(whole)


def test_a_huge_padded_layout_is_recorded_by_its_real_samples(saved) -> None:
    """A closed segment keeps only samples that exist: memory never scales with padding."""
    ds, states = saved
    state = {**states["plain"][0], "world_size": 4, "rank": 0, "batch_size": 10**12,
             "drop_last": False, "batches": 1}  # fmt: skip
    loader = _loader(ds, {"batch_size": 8})
    loader.load_state_dict(state)
    assert loader.state_dict()["history"][0]["consumed"] == [N, 0, 0, 0]
    assert _ids(loader) == []  # every sample was yielded (rank 0's one batch held them all)


def _train(loader: Loader, start: int, stop: int, *, stop_after: int | None = None) -> Any:
    """The typical loop: ``for epoch in range(start, stop): set_epoch(epoch); for b in loader``.

    Returns ``(batches seen as (epoch, ids), the state saved at the end of each epoch or
    after ``stop_after`` batches of the first epoch)``.
    """
    seen, state = [], None
    for epoch in range(start, stop):
        loader.set_epoch(epoch)
        for k, batch in enumerate(loader):
            seen.append((epoch, batch["id"].tolist()))
            if stop_after is not None and k + 1 == stop_after:
                return seen, loader.state_dict()
        state = loader.state_dict()
    return seen, state


@pytest.mark.parametrize("resume_at", ["saved", "next"])
@pytest.mark.parametrize("where", ["memory", "written"])
def test_a_state_taken_at_the_end_of_an_epoch_never_replays_it(
    saved, where: str, resume_at: str
) -> None:
    """Issue 23.20: a checkpoint at the end of epoch 1, loaded, then ``set_epoch(1)`` replayed
    an epoch. The state records epoch 1 complete; a loop resuming at ``state["epoch"]`` gets
    nothing for it, one resuming at ``state["epoch"] + 1`` starts epoch 2: never a replay."""
    ds = saved[0] if where == "written" else fl.from_arrow(_table(N))
    kwargs = {"batch_size": 16, "seed": 5}
    whole, _ = _train(_loader(ds, kwargs), 0, 4)
    head, state = _train(_loader(ds, kwargs), 0, 2)  # ... saved after epoch 1, then killed
    assert (state["epoch"], state["batches"]) == (1, len(_loader(ds, kwargs)))
    resumed = _loader(ds, kwargs)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    start = state["epoch"] + (resume_at == "next")
    tail, _ = _train(resumed, start, 4)
    assert head + tail == whole  # every epoch's batches once, in order, labelled rightly
    assert resumed.state_dict()["epoch"] == 3


def test_a_mid_epoch_state_resumes_the_typical_loop_exactly(saved) -> None:
    ds = saved[0]
    kwargs = {"batch_size": 16, "seed": 5}
    whole, _ = _train(_loader(ds, kwargs), 0, 3)
    head, _ = _train(_loader(ds, kwargs), 0, 1)
    more, state = _train(_loader(ds, kwargs), 1, 2, stop_after=4)
    resumed = _loader(ds, kwargs)
    resumed.load_state_dict(state)
    tail, _ = _train(resumed, state["epoch"], 3)
    assert head + more + tail == whole


def test_a_restored_complete_epoch_moves_on_after_its_empty_iteration(saved) -> None:
    """Without set_epoch: one empty iteration (the restored epoch is done), then epoch 2."""
    ds = saved[0]
    kwargs = {"batch_size": 16, "seed": 5}
    _, state = _train(_loader(ds, kwargs), 0, 2)
    resumed = _loader(ds, kwargs)
    resumed.load_state_dict(state)
    assert list(resumed) == [] and resumed.epoch == 1
    epoch2 = _loader(ds, kwargs)
    epoch2.set_epoch(2)
    assert _ids(resumed) == _ids(epoch2) and resumed.epoch == 2


# --------------------------------------------------------------------------- corruptions

NOT_INT = st.one_of(
    st.text(max_size=4), st.floats(allow_nan=True), st.booleans(), st.none(),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers()),
)  # fmt: skip
NOT_BOOL = st.one_of(
    st.integers(), st.text(max_size=4), st.floats(), st.none(), st.lists(st.booleans(), max_size=2)
)
NEGATIVE = st.integers(max_value=-1)


def _bad_values(state: dict[str, Any], limit: int) -> dict[str, st.SearchStrategy]:
    """Per top-level field: values that no valid state of this loader can hold."""
    world, rank = state["world_size"], state["rank"]
    return {
        "version": st.one_of(st.integers().filter(lambda v: v not in (1, 2)), NOT_INT),
        "seed": st.one_of(NEGATIVE, NOT_INT),
        "epoch": st.one_of(NEGATIVE, NOT_INT),
        "batches": st.one_of(NEGATIVE, st.integers(min_value=limit + 1), NOT_INT),
        "rank": st.one_of(NEGATIVE, st.integers(min_value=world), NOT_INT),
        "world_size": st.one_of(st.integers(max_value=rank), st.integers(min_value=MAX_WORLD_SIZE
                                                                         + 1), NOT_INT),
        "batch_size": st.one_of(st.integers(max_value=0), NOT_INT),
        "drop_last": NOT_BOOL,
        "shuffle": NOT_BOOL,
        "shuffle_window": st.one_of(st.integers(max_value=0), NOT_INT.filter(lambda v: v is not
                                                                             None)),
        "num_samples": st.one_of(st.integers().filter(lambda v: v != N), NOT_INT),
        "history": st.one_of(st.text(max_size=3), st.integers(), st.dictionaries(
            st.text(max_size=2), st.integers(), max_size=1), st.lists(NOT_INT, min_size=1,
                                                                      max_size=2)),
        "fingerprint": st.one_of(st.text(max_size=20).filter(lambda v: v != state["fingerprint"]),
                                 st.integers(), st.floats(), st.booleans(), st.lists(st.text())),
    }  # fmt: skip


def _bad_segment_values(segment: dict[str, Any]) -> dict[str, st.SearchStrategy]:
    world = segment["world_size"]
    return {
        "world_size": st.one_of(st.integers().filter(lambda v: v != world), NOT_INT),
        "batch_size": st.one_of(st.integers(max_value=0), NOT_INT),
        "drop_last": NOT_BOOL,
        "consumed": st.one_of(
            NOT_INT.filter(lambda v: not isinstance(v, list) or len(v) != world),
            st.lists(st.integers(0, 5), min_size=world + 1, max_size=world + 2),
            st.integers(0, world - 1).flatmap(lambda r: st.one_of(NEGATIVE, NOT_INT, st.integers(
                min_value=N + 1)).map(lambda v, r=r: [*segment["consumed"][:r], v,
                                                      *segment["consumed"][r + 1 :]])),
        ),
    }  # fmt: skip


@st.composite
def corruptions(draw: st.DrawFn, state: dict[str, Any], limit: int) -> dict[str, Any]:
    """``state`` with one thing wrong: a key dropped or added, or one field's value."""
    doc = json.loads(json.dumps(state))
    target = doc
    if doc["history"] and draw(st.booleans()):  # inside the finished segment
        target = doc["history"][0]
        bad = _bad_segment_values(target)
    else:
        bad = _bad_values(doc, limit)
    kind = draw(st.sampled_from(["drop", "add", "value"]))
    if kind == "drop":  # a state without dataset_version is one taken before versions: valid
        del target[draw(st.sampled_from(sorted(k for k in target if k != "dataset_version")))]
    elif kind == "add":
        target[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in target))] = draw(
            st.one_of(st.integers(), st.none(), st.text(max_size=3))
        )
    else:
        key = draw(st.sampled_from(sorted(bad)))
        target[key] = draw(bad[key])
    return doc


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_corruption_of_a_valid_state_is_refused(saved, data: st.DataObject) -> None:
    ds, states = saved
    state, kwargs, limit = states[data.draw(st.sampled_from(sorted(states)))]
    corrupted = data.draw(corruptions(state, limit))
    loader = _loader(ds, kwargs)
    before = loader.state_dict()
    with pytest.raises(ConfigurationError, match="Fix:"):  # nothing else, and no resume
        loader.load_state_dict(corrupted)
    assert loader.state_dict() == before


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 200), world=st.integers(1, 6), batch=st.integers(1, 40),
    drop_last=st.booleans(), data=st.data(),
)  # fmt: skip
def test_real_samples_counts_what_samples_seen_yields(
    n: int, world: int, batch: int, drop_last: bool, data: st.DataObject
) -> None:
    share = (n // (world * batch) if drop_last else -(-n // (world * batch))) * batch
    counts = [data.draw(st.integers(0, share)) for _ in range(world)]
    seen = samples_seen(np.arange(n), consumed_per_rank=counts, world_size=world,
                        batch_size=batch, drop_last=drop_last)  # fmt: skip
    assert sum(real_samples(n, r, c, world, batch) for r, c in enumerate(counts)) == len(seen)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 120), old=st.tuples(st.integers(1, 4), st.integers(1, 12), st.booleans()),
    new=st.tuples(st.integers(1, 4), st.integers(1, 12)), data=st.data(),
)  # fmt: skip
def test_elastic_resume_from_any_point_of_any_layout_repeats_and_loses_nothing(
    n: int, old: tuple[int, int, bool], new: tuple[int, int], data: st.DataObject
) -> None:
    """Including a complete padded epoch resumed with ``drop_last=True`` (refused before)."""
    ds = fl.from_arrow(_table(n))
    world, batch, drop_last = old
    loaders = [Loader(ds, batch_size=batch, rank=r, world_size=world, drop_last=drop_last,
                      seed=1, format="numpy", prefetch=0, return_padding_mask=True)
               for r in range(world)]  # fmt: skip
    k = data.draw(st.integers(0, len(loaders[0])))  # up to the complete epoch
    seen = []
    for loader in loaders:
        iterator = iter(loader)
        for _ in range(k):
            batch_ = next(iterator)
            seen += batch_["id"][~batch_["_padded"]].tolist()
        iterator.close()
    rest = []
    for r in range(new[0]):
        loader = Loader(ds, batch_size=new[1], rank=r, world_size=new[0], drop_last=True,
                        format="numpy", prefetch=0)  # fmt: skip
        loader.load_state_dict(loaders[0].state_dict())
        batches = iter(loader)  # a restored complete epoch (same layout) moves on: not counted
        rest += [int(i) for b in batches for i in b["id"]] if loader.epoch == 0 else []
    assert len(set(seen)) == len(seen) and len(set(rest)) == len(rest)  # no repeats
    assert not set(seen) & set(rest)
    assert n - len(seen) - len(rest) < new[0] * new[1]  # drop_last=True drops less than a step
