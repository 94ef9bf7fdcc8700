"""The Loader over the in-memory cache: order, sharding, formats, dtypes and errors."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

import feedline as fl
from feedline.errors import ConfigurationError, DataError, SchemaError
from feedline.loader import Loader
from feedline.loader.order.sample_order import epoch_permutation


def ids(loader: Loader) -> np.ndarray:
    return np.concatenate([np.asarray(b["id"]) for b in loader] or [np.zeros(0, np.int64)])


def test_cached_epoch_is_an_exact_permutation_and_rows_stay_whole(write, table_of) -> None:
    ds = write(1000)
    loader = ds.loader(batch_size=64, drop_last=False, return_padding_mask=True, seed=3)
    assert loader.stats()["cache"] == "memory"
    seen, padded = [], []
    for batch in loader:
        assert set(batch) == {"id", "x", "vec", "label", "_padded"}
        i = batch["id"].numpy()
        # every column of a batch comes from the same rows
        np.testing.assert_array_equal(batch["x"].numpy(), (i / 2).astype(np.float32))
        np.testing.assert_array_equal(batch["label"].numpy(), i % 7)
        assert batch["vec"].shape == (64, 2, 3) and batch["vec"].dtype == torch.float32
        np.testing.assert_array_equal(batch["vec"][:, 1, 2].numpy(), i + 5)
        seen.append(i)
        padded.append(batch["_padded"].numpy())
    order, pad = np.concatenate(seen), np.concatenate(padded)
    assert len(order) == 16 * 64 and pad.sum() == 1024 - 1000
    np.testing.assert_array_equal(order[~pad], epoch_permutation(1000, 3, 0))
    np.testing.assert_array_equal(np.sort(order[~pad]), np.arange(1000))


def test_epochs_differ_and_the_same_seed_and_epoch_repeat(write) -> None:
    ds = write(600)
    a, b = ds.loader(batch_size=50, seed=7), ds.loader(batch_size=50, seed=7, prefetch=0)
    first = ids(a)
    a.set_epoch(1)
    second = ids(a)
    b.set_epoch(1)
    np.testing.assert_array_equal(second, ids(b))
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(np.sort(first), np.sort(second))
    assert not np.array_equal(first, ids(ds.loader(batch_size=50, seed=8)))
    a.set_epoch(1)  # a complete epoch set again starts over: same order
    np.testing.assert_array_equal(ids(a), second)


def test_iterating_a_complete_epoch_starts_the_next(write) -> None:
    loader = write(200).loader(batch_size=50, format="numpy")
    first = ids(loader)
    assert loader.epoch == 0
    second = ids(loader)
    assert loader.epoch == 1 and not np.array_equal(first, second)


@pytest.mark.parametrize(("batch_size", "world"), [(64, 1), (16, 4)])
def test_a_batch_larger_than_the_epoch_with_drop_last_warns(
    write, caplog: pytest.LogCaptureFixture, batch_size: int, world: int
) -> None:
    """Issue 23.22: ``batch_size`` over the rows with ``drop_last=True`` silently gave 0
    batches; it still does (as ``drop_last`` says), but a warning and a log line say why."""
    ds = write(50)
    with caplog.at_level("WARNING", logger="feedline"), pytest.warns(UserWarning) as caught:
        loader = ds.loader(batch_size=batch_size, world_size=world, rank=0, format="numpy")
        assert len(loader) == 0 and list(loader) == []
    said = [str(w.message) for w in caught if "drop_last" in str(w.message)]
    assert len(said) == 1  # once per loader
    assert f"batch_size={batch_size}" in said[0] and "50 samples" in said[0]
    assert "0 batches" in said[0] and "Fix: pass a smaller batch_size" in said[0]
    assert any("drop_last=True drops" in r.getMessage() for r in caplog.records)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warn
        assert len(ds.loader(batch_size=batch_size, drop_last=False, world_size=world, rank=0)) == 1
        assert len(ds.loader(batch_size=50 // world, world_size=world, rank=0)) == 1
        assert len(fl.from_arrow(pa.table({"id": pa.array([], pa.int64())})).loader()) == 0


def test_shuffle_false_keeps_the_stored_order(write) -> None:
    loader = write(300).loader(batch_size=100, shuffle=False, format="numpy")
    np.testing.assert_array_equal(ids(loader), np.arange(300))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_are_disjoint_equal_and_cover_the_epoch(write, world: int, drop_last: bool) -> None:
    ds, n, bs = write(1003), 1003, 32
    loaders = [
        ds.loader(batch_size=bs, rank=r, world_size=world, drop_last=drop_last,
                  return_padding_mask=True, format="numpy", seed=5)
        for r in range(world)
    ]  # fmt: skip
    shares = []
    for loader in loaders:
        batches = list(loader)
        assert len(batches) == len(loader)
        assert all(len(b["id"]) == bs for b in batches)
        ids_ = np.concatenate([b["id"] for b in batches])
        shares.append(ids_[~np.concatenate([b["_padded"] for b in batches])])
    assert len({len(loader) for loader in loaders}) == 1
    real = np.concatenate(shares)
    assert len(np.unique(real)) == len(real)  # disjoint, no repeats
    if drop_last:
        assert len(real) == n - n % (world * bs)
    else:
        np.testing.assert_array_equal(np.sort(real), np.arange(n))


@pytest.mark.parametrize("stop", [0, 1, 3, 7])
def test_mid_epoch_resume_is_exact_with_batches_in_flight(write, stop: int) -> None:
    ds = write(800)
    loader = ds.loader(batch_size=32, prefetch=4, seed=11, format="numpy")
    loader.set_epoch(2)
    iterator, first = iter(loader), []
    for _ in range(stop):
        first.append(next(iterator)["id"])
    state = json.loads(json.dumps(loader.state_dict()))  # JSON-safe
    assert state["batches"] == stop and state["epoch"] == 2
    assert len(json.dumps(state)) < 500  # tiny
    del iterator
    resumed = ds.loader(batch_size=32, prefetch=4, format="numpy")  # seed=None: the state's
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the restored epoch keeps its position
    rest = ids(resumed)
    full = ids(_epoch(ds, 2))
    got = np.concatenate([*first, rest]) if first else rest
    np.testing.assert_array_equal(got, full)  # same batches, same order, no duplicates
    assert resumed.epoch == 2


def _epoch(ds: fl.Dataset, epoch: int) -> Loader:
    loader = ds.loader(batch_size=32, seed=11, format="numpy")
    loader.set_epoch(epoch)
    return loader


def test_resume_counts_only_batches_the_caller_received(write) -> None:
    ds = write(640)
    loader = ds.loader(batch_size=32, prefetch=8, format="numpy")
    iterator = iter(loader)
    next(iterator)
    import time

    time.sleep(0.2)  # let the prefetch thread run ahead
    assert loader.state_dict()["batches"] == 1
    iterator.close()


def test_elastic_resume_from_two_ranks_to_three(write) -> None:
    ds, bs = write(1000), 16
    old = [ds.loader(batch_size=bs, rank=r, world_size=2, seed=1, format="numpy") for r in (0, 1)]
    seen = []
    for loader in old:
        iterator = iter(loader)
        seen += [next(iterator)["id"] for _ in range(9)]
        iterator.close()
    state = old[0].state_dict()
    new = [
        ds.loader(batch_size=bs, rank=r, world_size=3, seed=1, format="numpy",
                  drop_last=False, return_padding_mask=True)
        for r in range(3)
    ]  # fmt: skip
    rest = []
    for loader in new:
        loader.load_state_dict(state)
        batches = list(loader)
        assert len(batches) == len(loader)
        rest += [b["id"][~b["_padded"]] for b in batches]
    assert len({len(loader) for loader in new}) == 1
    everything = np.concatenate(seen + rest)
    assert len(np.unique(everything)) == len(everything)  # nothing repeated
    np.testing.assert_array_equal(np.sort(everything), np.arange(1000))  # nothing lost
    # a checkpoint inside the resumed epoch resumes the resumed epoch again
    mid = new[1]
    mid.load_state_dict(state)
    iterator = iter(mid)
    head = [next(iterator)["id"] for _ in range(2)]
    iterator.close()
    again = ds.loader(batch_size=bs, rank=1, world_size=3, seed=1, format="numpy", drop_last=False)
    again.load_state_dict(json.loads(json.dumps(mid.state_dict())))
    tail = ids(again)
    whole = ds.loader(batch_size=bs, rank=1, world_size=3, seed=1, format="numpy", drop_last=False)
    whole.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate([*head, tail]), ids(whole))


def test_elastic_resume_with_unequal_rank_progress(write) -> None:
    ds, bs = write(500), 10
    old = [ds.loader(batch_size=bs, rank=r, world_size=2, format="numpy") for r in (0, 1)]
    seen, states = [], []
    for loader, k in zip(old, (4, 6), strict=True):
        iterator = iter(loader)
        seen += [next(iterator)["id"] for _ in range(k)]
        iterator.close()
        states.append(loader.state_dict())
    new = ds.loader(batch_size=bs, world_size=1, format="numpy", drop_last=False)
    new.load_state_dict(states)
    everything = np.concatenate([*seen, ids(new)])
    np.testing.assert_array_equal(np.sort(everything), np.arange(500))


def test_load_state_dict_rejects_foreign_states(write) -> None:
    a, b = write(100).loader(batch_size=10), write(120).loader(batch_size=10)
    with pytest.raises(ConfigurationError, match="100 samples"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ConfigurationError, match="state_dict"):
        b.load_state_dict({"epoch": 1})


def test_torch_batches_share_memory_with_the_gathered_arrays() -> None:
    from feedline.loader.adapters.torch import to_torch

    arrays = {"x": np.arange(12, dtype=np.float32).reshape(4, 3), "m": np.ones(4, dtype=bool)}
    tensors = to_torch(arrays)
    for name, array in arrays.items():
        assert tensors[name].data_ptr() == array.ctypes.data  # no copy
    assert tensors["m"].dtype == torch.bool


def test_dtype_mapping_for_torch_and_numpy(write) -> None:
    n = 64
    table = pa.table(
        {
            "b": pa.array(np.arange(n) % 2 == 0),
            "u8": pa.array(np.arange(n, dtype=np.uint8)),
            "u16": pa.array(np.arange(n, dtype=np.uint16)),
            "u32": pa.array(np.arange(n, dtype=np.uint32)),
            "f16": pa.array(np.arange(n, dtype=np.float16)),
            "fsl": pa.array([[i, i] for i in range(n)], pa.list_(pa.int16(), 2)),
        }
    )
    ds = write(table=table, rows_per_shard=None, row_group_rows=16)
    batch = next(iter(ds.loader(batch_size=8, shuffle=False)))
    dtypes = {k: v.dtype for k, v in batch.items()}
    assert dtypes == {
        "b": torch.bool, "u8": torch.uint8, "u16": torch.int32, "u32": torch.int64,
        "f16": torch.float16, "fsl": torch.int16,
    }  # fmt: skip
    assert batch["fsl"].shape == (8, 2)
    np.testing.assert_array_equal(batch["u32"].numpy(), np.arange(8))
    raw = next(iter(ds.loader(batch_size=8, shuffle=False, format="numpy")))
    assert raw["u16"].dtype == np.uint16 and raw["u32"].dtype == np.uint32
    big = write(table=pa.table({"u64": pa.array(np.arange(8, dtype=np.uint64))}))
    with pytest.raises(SchemaError, match=r"uint64.*int64"):
        len(big.loader(batch_size=2))
    assert len(big.loader(batch_size=2, format="numpy")) == 4


def test_string_columns_are_refused_unless_asked_for_as_lists(write) -> None:
    table = pa.table({"id": np.arange(20), "name": [f"n{i}" for i in range(20)]})
    ds = write(table=table)
    with pytest.raises(SchemaError) as info:
        next(iter(ds.loader(batch_size=4)))
    message = str(info.value)
    assert "'name'" in message and "string" in message and "strings='list'" in message
    batch = next(iter(ds.loader(batch_size=4, strings="list")))
    assert batch["name"] == [f"n{i}" for i in batch["id"].tolist()]
    only = next(iter(ds.loader(batch_size=4, columns=["id"])))
    assert set(only) == {"id"}


def test_nulls_are_refused_naming_the_column(write) -> None:
    ds = write(table=pa.table({"v": pa.array([1.0, None, 3.0, 4.0])}))
    with pytest.raises(DataError, match=r"'v'.*null"):
        len(ds.loader(batch_size=2))


def test_only_requested_columns_are_cached(write) -> None:
    loader = write(500).loader(batch_size=10, columns=["id", "x"])
    assert loader.stats()["cache_bytes"] == 500 * (8 + 4)
    assert set(next(iter(loader))) == {"id", "x"}


def test_computed_datasets_are_cached_through_iter_batches() -> None:
    ds = fl.range(300).map_batches(lambda b: {"id": b["id"], "sq": pa.compute.multiply(b["id"], 2)})
    loader = ds.loader(batch_size=25, format="numpy", seed=2)
    batches = list(loader)
    got = np.concatenate([b["id"] for b in batches])
    np.testing.assert_array_equal(np.sort(got), np.arange(300))
    assert all((b["sq"] == 2 * b["id"]).all() for b in batches)
    with pytest.raises(ConfigurationError, match=r"ds\.write"):
        len(ds.loader(cache="none"))
    with pytest.raises(ConfigurationError, match="memory budget"):
        len(ds.loader(batch_size=10, memory_budget=1000))  # a batch fits, the cache not


def test_arrow_tables_and_paths_load(write, tmp_path) -> None:
    table = pa.table({"id": np.arange(40)})
    assert len(fl.from_arrow(table).loader(batch_size=8)) == 5
    write(100)
    path = tmp_path / "ds0"
    assert Loader(str(path), batch_size=10).num_samples == 100


def test_bad_arguments_say_what_to_fix(write) -> None:
    ds = write(10)
    for kwargs, fragment in [
        ({"batch_size": 0}, "batch_size"),
        ({"rank": 2, "world_size": 2}, "rank=2"),
        ({"format": "jax"}, "format"),
        ({"cache": "disk"}, "cache"),
        ({"prefetch": -1}, "prefetch"),
        ({"memory_budget": "lots"}, "size"),
    ]:
        with pytest.raises(ConfigurationError, match=fragment):
            ds.loader(**kwargs)


def test_pin_memory_warns_without_cuda(write) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = write(20).loader(batch_size=4, pin_memory=True)
    assert loader.pin_memory is torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert any("pin_memory" in str(w.message) for w in caught)


def test_gathering_into_preallocated_tensors(write, monkeypatch) -> None:
    # The pin_memory path with unpinned buffers: the same batches, gathered in place.
    import feedline.loader.adapters.torch as fltorch

    monkeypatch.setattr(fltorch, "pin_supported", lambda: True)
    real = fltorch.batch_buffers
    monkeypatch.setattr(fltorch, "batch_buffers", lambda s, r, pin: real(s, r, pin=False))
    ds = write(200)
    direct = ds.loader(batch_size=20, pin_memory=True, return_padding_mask=True)
    plain = ds.loader(batch_size=20)
    for a, b in zip(direct, plain, strict=True):
        assert set(a) == set(b) | {"_padded"}
        for key in b:
            assert torch.equal(a[key], b[key])


def test_tf_is_reported_missing_when_absent(write, monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("no tensorflow")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(fl.MissingDependencyError, match=r"feedline\[tf\]"):
        write(10).loader(batch_size=2).to_tf_dataset()
