"""Time-series windows: correct against a naive reference, never crossing a series, shuffled,
sharded and resumed per window, in memory O(data + batch)."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.errors import ConfigurationError, SchemaError
from feedline.loader import Windows
from feedline.loader.data.window_gather import gather_windows
from feedline.loader.data.windows import window_counts, window_starts
from feedline.loader.order.sample_order import epoch_permutation


def series_table(seed: int = 0) -> pa.Table:
    """Three series of different lengths, rows shuffled; value = series * 1000 + time."""
    rng = np.random.default_rng(seed)
    lengths = {"a": 23, "b": 5, "c": 40}
    sid = np.concatenate([[k] * n for k, n in lengths.items()])
    ts = np.concatenate([rng.permutation(n) * 10 for n in lengths.values()])  # time stamps
    code = np.array([ord(s) - ord("a") for s in sid])
    base = code * 1000.0 + ts / 10
    perm = rng.permutation(len(sid))
    return pa.table(
        {
            "sid": pa.array(sid[perm]),
            "ts": pa.array(ts[perm].astype(np.int64)),
            "v": pa.array(base[perm].astype(np.float32)),
            "w": pa.array((-base[perm]).astype(np.float64)),
        }
    )


def naive_windows(table: pa.Table, size: int, horizon: int, stride: int) -> set[tuple]:
    """Every (inputs, targets) window, built with Python loops."""
    rows = sorted(zip(*(table[c].to_pylist() for c in ("sid", "ts", "v", "w")), strict=True))
    out = set()
    for s in sorted({r[0] for r in rows}):
        series = [r for r in rows if r[0] == s]
        for start in range(0, len(series) - size - horizon + 1, stride):
            inputs = tuple((r[2], r[3]) for r in series[start : start + size])
            targets = tuple(r[2] for r in series[start + size : start + size + horizon])
            out.add((inputs, targets))
    return out


@pytest.mark.parametrize(("size", "horizon", "stride"), [(4, 2, 1), (6, 1, 3), (1, 3, 2)])
def test_windows_match_a_naive_reference(write, size: int, horizon: int, stride: int) -> None:
    table = series_table()
    ds = write(table=table, rows_per_shard=30, row_group_rows=10)
    windows = Windows(size, horizon, stride=stride, by="sid", order_by="ts",
                         features=["v", "w"], targets="v")  # fmt: skip
    loader = ds.loader(windows=windows, batch_size=4, drop_last=False,
                       return_padding_mask=True, format="numpy", seed=1)  # fmt: skip
    got = []
    for batch in loader:
        assert batch["inputs"].shape == (4, size, 2) and batch["targets"].shape == (4, horizon)
        assert batch["inputs"].dtype == np.float64  # float32 and float64 promoted
        for inputs, targets, pad in zip(
            batch["inputs"], batch["targets"], batch["_padded"], strict=True
        ):
            if not pad:
                key = tuple(map(tuple, inputs.tolist())), tuple(targets.tolist())
                got.append(key)
    expected = naive_windows(table, size, horizon, stride)
    assert len(got) == len(set(got)) == len(expected) == loader.num_samples
    assert set(got) == expected
    for inputs, targets in got:  # never crosses a series: one series id (thousands) per window
        assert len({int(v // 1000) for v, _ in inputs} | {int(t // 1000) for t in targets}) == 1


def test_windows_are_shuffled_sharded_and_resumable(write) -> None:
    ds = write(table=series_table(), rows_per_shard=None, row_group_rows=16)
    w = Windows(size=3, horizon=1, by="sid", order_by="ts", features="v")
    first = [b["inputs"][:, 0] for b in ds.loader(windows=w, batch_size=5, format="numpy")]
    again = ds.loader(windows=w, batch_size=5, format="numpy")
    again.set_epoch(1)
    second = [b["inputs"][:, 0] for b in again]
    assert not np.array_equal(np.concatenate(first), np.concatenate(second))
    shares = [
        np.concatenate([b["inputs"][:, 0] for b in
                        ds.loader(windows=w, batch_size=5, rank=r, world_size=2, format="numpy")])
        for r in (0, 1)
    ]  # fmt: skip
    assert len(shares[0]) == len(shares[1])
    assert not set(shares[0].tolist()) & set(shares[1].tolist())
    loader = ds.loader(windows=w, batch_size=5, format="torch", prefetch=2)
    iterator = iter(loader)
    head = [next(iterator)["inputs"] for _ in range(3)]
    resumed = ds.loader(windows=w, batch_size=5, format="torch")
    resumed.load_state_dict(loader.state_dict())
    iterator.close()
    rest = [b["inputs"] for b in resumed]
    full = [b["inputs"] for b in ds.loader(windows=w, batch_size=5, format="torch")]
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full, strict=True):
        assert (a == b).all()
    assert head[0].shape == (5, 3)


def test_windows_without_series_or_time_columns(write) -> None:
    ds = write(table=pa.table({"v": np.arange(10, dtype=np.float32)}))
    batches = list(ds.loader(windows=Windows(3, 2), batch_size=2, shuffle=False,
                             drop_last=False, format="numpy"))  # fmt: skip
    inputs = np.concatenate([b["inputs"] for b in batches])[:6]
    np.testing.assert_array_equal(inputs[:, :, 0], [np.arange(i, i + 3) for i in range(6)])
    targets = np.concatenate([b["targets"] for b in batches])[:6]
    np.testing.assert_array_equal(targets[:, :, 0], [np.arange(i + 3, i + 5) for i in range(6)])


def test_windows_errors_say_what_to_fix(write) -> None:
    ds = write(table=series_table())
    with pytest.raises(ConfigurationError, match="size"):
        Windows(size=0, horizon=1)
    with pytest.raises(SchemaError, match="order_by"):
        len(ds.loader(windows=Windows(2, 1, order_by="time")))
    with pytest.raises(SchemaError, match="'sid'"):
        len(ds.loader(windows=Windows(2, 1, features=["sid"])))
    with pytest.raises(SchemaError, match="features="):
        len(ds.select(["sid", "ts"]).loader(windows=Windows(2, 1, by="sid", order_by="ts")))
    with pytest.raises(ConfigurationError, match="columns="):
        ds.loader(windows=Windows(2, 1), columns=["v"])
    with pytest.raises(ConfigurationError, match="cache='none'"):
        len(ds.loader(windows=Windows(2, 1, by="sid"), cache="none"))


# ---------------------------------------------------------------- windows at scale (Loader v2)

PROPS = settings(max_examples=25, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


def coded_series(lengths: list[int], *, string_ids: bool) -> pa.Table:
    """Series ``k`` has ``lengths[k]`` rows; ``v = k * 1000 + step`` names every row."""
    k = np.repeat(np.arange(len(lengths)), lengths).astype(np.int64)
    step = np.concatenate([np.arange(n) for n in lengths] or [np.zeros(0, int)]).astype(np.int64)
    sid = pa.array([f"s{i}" for i in k], pa.string()) if string_ids else pa.array(k)
    v = (k * 1000 + step).astype(np.float64)
    return pa.table({"sid": sid, "ts": step * 10, "v": v, "w": -v})


def reference(lengths: list[int], size: int, horizon: int, stride: int) -> list[float]:
    """The ``v`` of each window's first row, series after series (the window ids' order)."""
    span = size + horizon
    return [k * 1000.0 + s for k, n in enumerate(lengths) for s in range(0, n - span + 1, stride)]


@PROPS
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=5),
    size=st.integers(1, 5),
    horizon=st.integers(0, 3),
    stride=st.integers(1, 3),
    rows=st.sampled_from(["sorted", "shuffled", "groups reversed"]),
    row_group_rows=st.integers(1, 17),
    string_ids=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_windows_never_cross_a_series_in_any_layout(
    tmp_path, lengths: list[int], size: int, horizon: int, stride: int, rows: str,
    row_group_rows: int, string_ids: bool, seed: int,
) -> None:  # fmt: skip
    table = coded_series(lengths, string_ids=string_ids)
    n = table.num_rows
    if rows == "shuffled":
        table = table.take(np.random.default_rng(seed).permutation(n))
    elif rows == "groups reversed":  # each row group sorted, the groups out of order
        groups = [np.arange(i, min(i + row_group_rows, n)) for i in range(0, n, row_group_rows)]
        table = table.take(np.concatenate(groups[::-1] or [np.zeros(0, int)]))
    path = tmp_path / f"ds-{seed}-{rows}-{n}-{row_group_rows}"
    fl.from_arrow(table).write(path, rows_per_shard=max(1, n // 2), row_group_rows=row_group_rows)
    w = Windows(size, horizon, stride=stride, by="sid", order_by="ts", features=["v", "w"],
                targets="v")  # fmt: skip
    loader = fl.open(path).loader(windows=w, batch_size=3, drop_last=False, shuffle=False,
                                  return_padding_mask=True, format="numpy")  # fmt: skip
    expected = reference(lengths, size, horizon, stride)
    assert loader.num_samples == len(expected)
    in_order = np.array_equal(pc.sort_indices(table, [("sid", "ascending"), ("ts", "ascending")]),
                              np.arange(n))  # fmt: skip
    stats = loader.stats()  # rows stored in order are only checked, never sorted again
    assert stats["rows_resorted"] == (not in_order)
    assert stats["num_series"] == sum(1 for x in lengths if x)
    got = []
    for batch in loader:
        assert ("targets" in batch) == (horizon > 0)
        targets = batch.get("targets", np.zeros((len(batch["inputs"]), 0)))
        for inputs, target, pad in zip(batch["inputs"], targets, batch["_padded"], strict=True):
            if not pad:
                got.append(float(inputs[0, 0]))
                seq = np.concatenate([inputs[:, 0], target])  # the window then its target
                assert np.array_equal(np.diff(seq), np.ones(size + horizon - 1))
                assert np.array_equal(inputs[:, 1], -inputs[:, 0])
    assert got == expected  # unshuffled: window ids in series order, time order within each


@pytest.fixture(scope="module")
def series_ds(tmp_path_factory) -> fl.Dataset:
    """Seven series of 3..40 rows written sorted, 4 shards of 13-row groups."""
    lengths = [40, 3, 25, 0, 31, 12, 38]
    path = tmp_path_factory.mktemp("series") / "ds"
    fl.from_arrow(coded_series(lengths, string_ids=False)).write(
        path, rows_per_shard=40, row_group_rows=13
    )
    return fl.open(path)


SERIES_LENGTHS = [40, 3, 25, 0, 31, 12, 38]


@settings(max_examples=30, deadline=None)
@given(
    world=st.integers(1, 4),
    batch=st.integers(1, 9),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 20),
    drop_last=st.booleans(),
)
def test_window_shuffle_is_the_exact_permutation_split_over_equal_disjoint_ranks(
    series_ds, world: int, batch: int, seed: int, epoch: int, drop_last: bool
) -> None:
    size, horizon = 4, 2
    w = Windows(size, horizon, by="sid", order_by="ts", features="v")
    first_v = np.array(reference(SERIES_LENGTHS, size, horizon, 1))  # by window id
    n = len(first_v)
    perm = epoch_permutation(n, seed, epoch)
    shares = []
    for rank in range(world):
        loader = series_ds.loader(windows=w, batch_size=batch, rank=rank, world_size=world,
                                  seed=seed, drop_last=drop_last, pad_last=True,
                                  format="numpy")  # fmt: skip
        loader.set_epoch(epoch)
        batches = [b["inputs"][:, 0] for b in loader]
        assert len(batches) == len(loader)
        assert all(len(b) == batch for b in batches)
        shares.append(np.concatenate(batches) if batches else np.zeros(0))
    assert len({len(s) for s in shares}) == 1  # equal shares
    # batch k of rank r is positions [(k * world + r) * batch, ...) of the epoch's permutation
    steps = len(shares[0]) // batch
    interleaved = np.stack([s.reshape(steps, batch) for s in shares], axis=1).reshape(-1)
    covered = min(len(interleaved), n)
    np.testing.assert_array_equal(interleaved[:covered], first_v[perm[:covered]])
    if drop_last:  # disjoint ranks; together all windows but fewer than world * batch
        assert len(set(interleaved.tolist())) == len(interleaved) > n - world * batch
    else:  # every window at least once, padding repeats from the start of the order
        assert set(interleaved.tolist()) == set(first_v.tolist())


@settings(max_examples=25, deadline=None)
@given(
    world=st.integers(1, 3),
    batch=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 3),
    prefetch=st.integers(0, 3),
    data=st.data(),
)
def test_windows_resume_exactly_at_any_batch(
    series_ds, world: int, batch: int, seed: int, epoch: int, prefetch: int, data
) -> None:
    w = Windows(5, 3, stride=2, by="sid", order_by="ts", features=["v", "w"])
    rank = data.draw(st.integers(0, world - 1))
    kwargs = {"windows": w, "batch_size": batch, "rank": rank, "world_size": world,
              "seed": seed, "format": "numpy"}  # fmt: skip
    full = series_ds.loader(**kwargs, prefetch=0)
    full.set_epoch(epoch)
    expected = [(b["inputs"], b["targets"]) for b in full]
    k = data.draw(st.integers(0, len(expected)))
    first = series_ds.loader(**kwargs, prefetch=prefetch)
    first.set_epoch(epoch)
    iterator = iter(first)
    head = [(b["inputs"].copy(), b["targets"].copy()) for b in (next(iterator) for _ in range(k))]
    iterator.close()
    resumed = series_ds.loader(**kwargs)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    resumed.set_epoch(epoch)
    tail = [(b["inputs"], b["targets"]) for b in resumed] if k < len(expected) else []
    assert len(head) + len(tail) == len(expected)
    for (x, y), (x0, y0) in zip(head + tail, expected, strict=True):
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(y, y0)


@pytest.mark.parametrize("rows", ["sorted", "shuffled"])
def test_windows_memory_is_data_plus_batches_never_every_window(tmp_path, rows: str) -> None:
    """tracemalloc sees NumPy's allocations: loading and 40 batches stay near the data size."""
    n, features, size = 200_000, 4, 32
    rng = np.random.default_rng(0)
    columns = {"sid": np.repeat(np.arange(4), n // 4), "ts": np.tile(np.arange(n // 4), 4)}
    columns |= {f"f{j}": rng.standard_normal(n, dtype=np.float32) for j in range(features)}
    table = pa.table(columns)
    if rows == "shuffled":
        table = table.take(rng.permutation(n))
    fl.from_arrow(table).write(tmp_path / "ds", rows_per_shard=n // 2, row_group_rows=n // 8)
    w = Windows(size, 4, by="sid", order_by="ts", features=[f"f{j}" for j in range(features)])
    data_bytes = n * features * 4  # 3.2 MB
    every_window = (n - 4 * (size + 3)) * size * features * 4  # the (windows, size, F) tensor
    assert every_window > 30 * data_bytes
    tracemalloc.start()
    try:
        loader = fl.open(tmp_path / "ds").loader(windows=w, batch_size=64, prefetch=0,
                                                 format="numpy")  # fmt: skip
        iterator = iter(loader)
        for _ in range(40):
            assert next(iterator)["inputs"].shape == (64, size, features)
        iterator.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loader.stats()["cache_bytes"] < 1.01 * data_bytes  # targets share the inputs' array
    # data, the epoch's permutation (8 bytes a window), a column while sorting, batch buffers
    assert peak < data_bytes + 8 * n + data_bytes / features + 4 * 2**20, peak


def test_windows_gather_packed_tensor_columns_with_scalars(write) -> None:
    n = 30
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    table = pa.table({
        "x": pa.FixedShapeTensorArray.from_numpy_ndarray(x),
        "y": np.arange(n, dtype=np.float32) * -1,
        "t": np.arange(n)[::-1].copy(),  # rows written newest first
    })  # fmt: skip
    ds = write(table=table, rows_per_shard=None, row_group_rows=7)
    packed = Windows(4, 2, order_by="t", features="x")
    batch = next(iter(ds.loader(windows=packed, batch_size=5, shuffle=False, format="numpy")))
    assert batch["inputs"].shape == (5, 4, 3) and batch["targets"].shape == (5, 2, 3)
    ordered = x[::-1]  # sorted by t
    np.testing.assert_array_equal(batch["inputs"][2], ordered[2:6])
    np.testing.assert_array_equal(batch["targets"][2], ordered[6:8])
    both = Windows(4, 1, order_by="t", features=["x", "y"], targets=["y"])
    batch = next(iter(ds.loader(windows=both, batch_size=5, shuffle=False, format="torch")))
    assert tuple(batch["inputs"].shape) == (5, 4, 4) and tuple(batch["targets"].shape) == (5, 1, 1)
    np.testing.assert_array_equal(batch["inputs"][1, :, :3].numpy(), ordered[1:5])
    np.testing.assert_array_equal(batch["inputs"][1, :, 3].numpy(), -(n - 1 - np.arange(1, 5)))


def test_gather_windows_copies_only_the_windows_asked_for() -> None:
    values = np.arange(40.0).reshape(20, 2)
    out = np.full((3, 4, 2), -1.0)
    got = gather_windows(values, np.array([16, 0, 5]), 4, out)
    assert got is out
    for row, start in zip(out, [16, 0, 5], strict=True):
        np.testing.assert_array_equal(row, values[start : start + 4])
    bounds = np.array([0, 9, 9, 20])
    counts = window_counts(bounds, span=5, stride=2)
    first_ids = np.concatenate([[0], np.cumsum(counts)])
    starts = window_starts(np.arange(first_ids[-1]), bounds, first_ids, stride=2)
    assert counts.tolist() == [3, 0, 4] and starts.tolist() == [0, 2, 4, 9, 11, 13, 15]


def test_dtype_converts_window_features_and_targets() -> None:
    """``dtype=`` applies to windows too (it was silently ignored: float64 came out)."""
    series = np.repeat(np.arange(3), 50)
    values = np.arange(150, dtype=np.float64)
    ds = fl.from_arrow(pa.table({"s": series, "v": values, "w": values * 2}))
    windows = fl.Windows(8, 2, by="s", features=["v", "w"], targets="v")
    loader = ds.loader(batch_size=4, windows=windows, dtype=np.float32, format="numpy",
                       shuffle=False)  # fmt: skip
    batch = next(iter(loader))
    assert batch["inputs"].dtype == np.float32 and batch["targets"].dtype == np.float32
    np.testing.assert_array_equal(batch["inputs"][0, :, 0], np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(batch["targets"][0], np.array([8, 9], dtype=np.float32))
    with pytest.raises(fl.ConfigurationError, match="zz"):
        next(iter(ds.loader(batch_size=4, windows=windows, dtype={"zz": np.float32})))
