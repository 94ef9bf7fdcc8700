"""Packed wide tables: scalar columns of one dtype held row-major (one take per batch),
``stack=`` for one ``(batch, F)`` tensor, per-column views, and ``dtype=`` conversion."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import feedline as fl
from feedline.errors import ConfigurationError, SchemaError
from feedline.loader.data.columns import column_specs
from feedline.loader.data.packed_columns import gather_packed, plan_packing

FEATURES = [f"f{i}" for i in range(8)]


def wide_table(n: int) -> pa.Table:
    """8 float32 features (``f{i} = row + i / 10``), a float64 ``d`` and an int64 label."""
    rows = np.arange(n)
    columns = {name: (rows + i / 10).astype(np.float32) for i, name in enumerate(FEATURES)}
    return pa.table(columns | {"d": rows * 0.5, "label": rows % 5})


@pytest.fixture
def wide(tmp_path: Path) -> fl.Dataset:
    fl.from_arrow(wide_table(600)).write(tmp_path / "wide", rows_per_shard=200, row_group_rows=50)
    return fl.open(tmp_path / "wide")


def test_scalar_columns_of_one_dtype_are_held_in_one_block(wide) -> None:
    loader = wide.loader(batch_size=32, format="numpy")
    cache = loader._prepare().source
    blocks = {k: v.shape for k, v in cache.storage.items()}
    assert blocks == {"\x00packed:float32": (600, 8), "d": (600, 1), "label": (600, 1)}
    assert loader.stats()["cache_bytes"] == 600 * (8 * 4 + 8 + 8)


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_the_per_column_dict_holds_each_columns_values(wide, cache) -> None:
    seen = []
    for batch in wide.loader(batch_size=32, seed=3, format="numpy", cache=cache):
        assert list(batch) == [*FEATURES, "d", "label"]
        row = batch["d"] * 2  # d = row / 2
        for i, name in enumerate(FEATURES):
            assert np.array_equal(batch[name], (row + i / 10).astype(np.float32))
        assert np.array_equal(batch["label"], row.astype(np.int64) % 5)
        seen.append(row)
    rows = np.concatenate(seen)  # drop_last: 18 batches of distinct rows
    assert len(np.unique(rows)) == 576 and set(rows.tolist()) <= set(range(600))


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_stack_yields_one_contiguous_tensor_and_drops_its_columns(wide, cache) -> None:
    loader = wide.loader(batch_size=16, stack={"features": FEATURES}, cache=cache, seed=1)
    for batch in loader:
        assert list(batch) == ["d", "label", "features"]
        x = batch["features"]
        assert x.shape == (16, 8) and x.dtype == torch.float32 and x.is_contiguous()
        row = (batch["d"] * 2).numpy()
        expected = row[:, None] + np.arange(8) / 10
        assert np.array_equal(x.numpy(), expected.astype(np.float32))


def test_stacked_columns_asked_for_by_name_are_views_of_the_stack(wide) -> None:
    loader = wide.loader(batch_size=10, columns=["f1", "label"], stack={"x": ["f0", "f1", "d"]})
    batch = next(iter(loader))
    assert list(batch) == ["f1", "label", "x"]
    assert batch["x"].dtype == torch.float64  # the members' common dtype
    assert torch.equal(batch["f1"], batch["x"][:, 1])
    assert batch["f1"].data_ptr() == batch["x"][:, 1].data_ptr()  # a view, not a copy


def test_stack_and_per_column_outputs_agree_cached_and_streamed(wide) -> None:
    kwargs = {"batch_size": 25, "shuffle": False, "format": "numpy"}
    plain = list(wide.loader(**kwargs))
    for cache in ("memory", "none"):
        stacked = list(wide.loader(**kwargs, cache=cache, stack={"x": FEATURES}))
        for a, b in zip(plain, stacked, strict=True):
            assert np.array_equal(np.stack([a[n] for n in FEATURES], axis=1), b["x"])
            assert np.array_equal(a["label"], b["label"])


def test_streamed_batches_straddling_two_pools(wide) -> None:
    # windows of one row group (50 rows): batches of 40 cross pool boundaries
    loader = wide.loader(batch_size=40, cache="none", shuffle_window=1, format="numpy",
                         stack={"x": FEATURES[:3]}, seed=2)  # fmt: skip
    rows = []
    for batch in loader:
        row = batch["d"] * 2
        assert np.array_equal(batch["x"][:, 2], (row + 0.2).astype(np.float32))
        rows.append(row)
    assert len(np.unique(np.concatenate(rows))) == 600 // 40 * 40


def test_dtype_converts_a_family_or_named_columns(wide) -> None:
    batch = next(iter(wide.loader(batch_size=8, dtype=np.float32)))
    assert batch["d"].dtype == torch.float32 and batch["label"].dtype == torch.int64
    batch = next(iter(wide.loader(batch_size=8, dtype={"label": "int32", "d": np.float16})))
    assert batch["label"].dtype == torch.int32 and batch["d"].dtype == torch.float16
    batch = next(iter(wide.loader(batch_size=8, stack={"x": [*FEATURES, "d"]}, dtype="float32")))
    assert batch["x"].dtype == torch.float32 and batch["x"].shape == (8, 9)
    batch = next(iter(wide.loader(batch_size=8, stack={"x": FEATURES}, dtype={"x": "float64"})))
    assert batch["x"].dtype == torch.float64


def test_computed_datasets_pack_and_stack_too() -> None:
    ds = fl.from_arrow(wide_table(100)).filter(lambda b: np.ones(b.num_rows, dtype=bool))
    batch = next(iter(ds.loader(batch_size=10, shuffle=False, stack={"x": FEATURES[:2]})))
    assert batch["x"].tolist()[1] == pytest.approx([1.0, 1.1])


def test_kept_batches_are_never_overwritten(wide) -> None:
    kept = list(wide.loader(batch_size=8, seed=4, format="numpy"))  # buffers reused if free
    for batch in kept:
        row = batch["d"] * 2
        assert np.array_equal(batch["f7"], (row + 0.7).astype(np.float32))


def test_resume_is_exact_with_stacks(wide) -> None:
    kwargs = {"batch_size": 16, "seed": 9, "format": "numpy", "stack": {"x": FEATURES}}
    first = wide.loader(**kwargs)
    it = iter(first)
    head = [next(it)["x"].copy() for _ in range(5)]
    resumed = wide.loader(**kwargs)
    resumed.load_state_dict(first.state_dict())
    whole = [b["x"] for b in wide.loader(**kwargs)]
    tail = [b["x"] for b in resumed]
    assert all(np.array_equal(a, b) for a, b in zip(head + tail, whole, strict=True))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"stack": {"x": ["f0"], "y": ["f0"]}}, ConfigurationError, "two stacks"),
        ({"stack": {"label": ["f0"]}}, ConfigurationError, "also column names"),
        ({"stack": {"x": []}}, ConfigurationError, "non-empty list"),
        ({"stack": {"x": "f0"}}, ConfigurationError, "lists of columns"),
        ({"stack": ["f0"]}, ConfigurationError, "lists of columns"),
        ({"stack": {"x": ["nope"]}}, SchemaError, "not in the dataset"),
        ({"dtype": "datetime64[s]"}, ConfigurationError, "not a dtype the loader delivers"),
        ({"dtype": {"nope": "float32"}}, ConfigurationError, "not numeric loader columns"),
        ({"dtype": {"label": "uint32"}}, ConfigurationError, "as torch tensors"),
    ],
)
def test_bad_stacks_and_dtypes_say_what_to_fix(wide, kwargs, error, match) -> None:
    with pytest.raises(error, match=f"{match}.*Fix:"):
        next(iter(wide.loader(batch_size=4, **kwargs)))


def test_strings_cannot_be_stacked(tmp_path: Path) -> None:
    ds = fl.from_arrow(pa.table({"s": ["a", "b"], "v": [1.0, 2.0]}))
    with pytest.raises(SchemaError, match=r"stacks hold numeric columns.*Fix:"):
        next(iter(ds.loader(batch_size=1, strings="list", stack={"x": ["s", "v"]})))


def test_gather_fills_buffers_keyed_by_block_or_by_batch_key() -> None:
    schema = pa.schema({n: pa.float32() for n in ("a", "b", "c")} | {"y": pa.int64()})
    packing = plan_packing(column_specs(schema), stack={"ab": ["a", "b"]})
    storage = packing.allocate(6)
    storage["ab"][:] = np.arange(12).reshape(6, 2)
    storage["c"][:, 0], storage["y"][:, 0] = np.arange(6) * 10, np.arange(6) * 100
    idx = np.array([5, 0, 3])
    fresh = gather_packed(packing, storage, idx)
    by_block = {k: np.empty((3, *s), d) for k, (s, d) in packing.buffer_shapes().items()}
    by_key = {k: np.empty((3, *s), d) for k, (s, d) in packing.shapes().items()}
    for out in (by_block, by_key):
        got = gather_packed(packing, storage, idx, out, scratch={})
        for key, values in fresh.items():
            assert np.array_equal(got[key], values)
            if key in out:
                assert got[key] is out[key] or np.shares_memory(got[key], out[key])
    assert fresh["ab"].tolist() == [[10, 11], [0, 1], [6, 7]]
