"""Time-series windows: correct against a naive reference, never crossing a series."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl  # noqa: F401
from feedline.errors import ConfigurationError, SchemaError
from feedline.loader import Windows


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
    with pytest.raises(ConfigurationError, match="columns="):
        ds.loader(windows=Windows(2, 1), columns=["v"])
    with pytest.raises(ConfigurationError, match="cache='none'"):
        len(ds.loader(windows=Windows(2, 1, by="sid"), cache="none"))
