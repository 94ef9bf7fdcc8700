"""Relational operators on the local engine (DuckDB) against a Polars reference."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, FeedlineError, SchemaError


def _table(n: int = 2000, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    keys = rng.choice(["a", "b", "c", None], n, p=[0.7, 0.15, 0.1, 0.05])  # skewed, nulls
    x = rng.normal(size=n)
    x[rng.random(n) < 0.05] = np.nan
    return pa.table(
        {
            "k": pa.array(keys.tolist(), pa.string()),
            "g": pa.array(rng.integers(0, 5, n)),
            "x": pa.array(x, mask=rng.random(n) < 0.1),
            "i": pa.array(rng.integers(-50, 50, n), pa.int32(), mask=rng.random(n) < 0.1),
        }
    )


def _rows(table: pa.Table, by: list[str]) -> list[dict]:
    return pl.from_arrow(table).sort(by, nulls_last=True).to_dicts()


def _close(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for key in ra:
            va, vb = ra[key], rb[key]
            if isinstance(va, float) and isinstance(vb, float):
                assert (math.isnan(va) and math.isnan(vb)) or va == pytest.approx(vb), key
            else:
                assert va == vb, (key, va, vb)


@pytest.mark.parametrize("nulls_last", [True, False])
def test_multi_key_sort_matches_polars(nulls_last: bool) -> None:
    t = _table()
    out = fl.from_arrow(t).sort(["k", "i"], descending=[False, True], nulls_last=nulls_last)
    got = out.to_arrow().select(["k", "i"])
    ref = (
        pl.from_arrow(t)
        .sort(["k", "i"], descending=[False, True], nulls_last=nulls_last)
        .select(["k", "i"])
        .to_arrow()
    )
    assert got.to_pylist() == ref.to_pylist()
    assert out.schema() == got.schema.remove_metadata() or out.schema().names == [
        "k",
        "g",
        "x",
        "i",
    ]


def test_sort_floats_with_nan_and_null_like_polars() -> None:
    t = pa.table({"x": pa.array([1.5, float("nan"), None, -2.0, 0.0])})
    got = fl.from_arrow(t).sort("x", descending=True).to_arrow()["x"].to_pylist()
    ref = pl.from_arrow(t).sort("x", descending=True, nulls_last=True)["x"].to_list()
    assert str(got) == str(ref)


_POLARS_AGG = {
    "count": lambda c: pl.col(c).count(),
    "sum": lambda c: pl.when(pl.col(c).count() > 0).then(pl.col(c).sum()),
    "mean": lambda c: pl.col(c).mean(),
    "min": lambda c: pl.col(c).min(),
    "max": lambda c: pl.col(c).nan_max(),  # NaN is the largest value, as in sort
    "std": lambda c: pl.col(c).std(ddof=1),
    "n_unique": lambda c: pl.col(c).drop_nulls().n_unique(),
}


@pytest.mark.parametrize("fn", sorted(_POLARS_AGG))
@pytest.mark.parametrize("column", ["x", "i"])
def test_every_agg_fn_matches_polars(fn: str, column: str) -> None:
    t = _table()
    got = fl.from_arrow(t).groupby(["k", "g"]).agg(out=(column, fn)).to_arrow()
    ref = pl.from_arrow(t).group_by(["k", "g"]).agg(_POLARS_AGG[fn](column).alias("out"))
    if fn == "sum" and column == "i":
        ref = ref.with_columns(pl.col("out").cast(pl.Int64))
    _close(_rows(got, ["k", "g"]), _rows(ref.to_arrow(), ["k", "g"]))


def test_count_rows_first_and_list() -> None:
    t = _table(500)
    out = fl.from_arrow(t).groupby("k").agg(n=("*", "count"), f=("i", "first"), l=("i", "list"))
    got = {r["k"]: r for r in out.to_arrow().to_pylist()}
    for key, group in pl.from_arrow(t).group_by("k"):
        rows = group.to_dicts()
        mine = got[key[0]]
        assert mine["n"] == len(rows)
        assert sorted(mine["l"], key=str) == sorted([r["i"] for r in rows], key=str)
        assert mine["f"] in {r["i"] for r in rows if r["i"] is not None}
    assert out.schema().field("l").type == pa.list_(pa.int32())


def test_groupby_on_empty_input_and_global_aggregate() -> None:
    empty = fl.from_arrow(_table().slice(0, 0))
    assert empty.groupby("k").agg(n=("*", "count")).to_arrow().num_rows == 0
    total = empty.groupby([]).agg(n=("*", "count"), s=("x", "sum")).to_arrow().to_pylist()
    assert total == [{"n": 0, "s": None}]


@pytest.mark.parametrize("how", ["inner", "left", "outer", "semi", "anti"])
def test_every_join_type_matches_polars(how: str) -> None:
    left = _table(300, seed=1).select(["k", "g", "x"])
    right = _table(200, seed=2).select(["k", "g", "i"]).rename_columns(["k", "g", "x"])
    got = fl.from_arrow(left).join(fl.from_arrow(right), on=["k", "g"], how=how)
    polars_how = {"outer": "full"}.get(how, how)
    kwargs = {"coalesce": True} if how == "outer" else {}
    ref = pl.from_arrow(left).join(
        pl.from_arrow(right), on=["k", "g"], how=polars_how, suffix="_right", **kwargs
    )
    table = got.to_arrow()
    assert table.schema.names == ref.columns == got.schema().names
    by = table.schema.names
    _close(_rows(table, by), _rows(ref.to_arrow().cast(table.schema), by))


def test_join_on_empty_side() -> None:
    left = fl.from_arrow(_table(50))
    right = fl.from_arrow(_table(50).slice(0, 0).select(["k", "x"]))
    assert left.join(right, on="k").count() == 0
    assert left.join(right, on="k", how="left").count() == 50


def test_union_reorders_columns_and_keeps_duplicates() -> None:
    t = _table(100)
    other = fl.from_arrow(t.select(["i", "x", "g", "k"]))
    out = fl.from_arrow(t).union(other, fl.from_arrow(t.slice(0, 0)))
    got = out.to_arrow()
    assert got.schema.names == t.schema.names
    _close(_rows(got, ["k", "g", "i", "x"]), _rows(pa.concat_tables([t, t]), ["k", "g", "i", "x"]))


def test_unique_matches_polars() -> None:
    t = _table(1000).select(["k", "g"])
    got = fl.from_arrow(t).unique().to_arrow()
    assert _rows(got, ["k", "g"]) == _rows(pl.from_arrow(t).unique().to_arrow(), ["k", "g"])
    per_key = fl.from_arrow(_table(1000)).unique(subset="k").to_arrow()
    assert sorted(per_key["k"].to_pylist(), key=str) == sorted(["a", "b", "c", None], key=str)


def test_repartition_cuts_near_equal_batches() -> None:
    sizes = [b.num_rows for b in fl.range(1001).repartition(4).iter_batches()]
    assert sorted(sizes, reverse=True) == [251, 250, 250, 250]
    assert fl.range(1001).repartition(4).count() == 1001


def test_remaining_operators_run_after_the_relational_one() -> None:
    ds = fl.from_arrow(_table(300)).sort("i").filter(pc.field("g") > 1).select(["i"]).limit(5)
    got = ds.to_arrow()["i"].to_pylist()
    ref = (
        pl.from_arrow(_table(300))
        .sort("i", nulls_last=True)
        .filter(pl.col("g") > 1)["i"]
        .head(5)
        .to_list()
    )
    assert got == ref


def test_nested_relational_operators_and_map_batches() -> None:
    t = _table(400)
    ds = (
        fl.from_arrow(t)
        .map_batches(lambda b: b.append_column("y", pc.multiply(b["g"], 2)))
        .groupby("k")
        .agg(s=("y", "sum"))
        .join(fl.from_arrow(t).groupby("k").agg(n=("*", "count")), on="k")
        .sort("k")
    )
    ref = (
        pl.from_arrow(t)
        .group_by("k")
        .agg((pl.col("g") * 2).sum().alias("s"), pl.len().alias("n"))
        .sort("k", nulls_last=True)
        .with_columns(pl.col("n").cast(pl.Int64))
        .filter(pl.col("k").is_not_null())  # null keys never match in the join
    )
    assert ds.to_arrow().to_pylist() == ref.to_dicts()
    assert "join(" in ds.explain() and "input 1:" in ds.explain()


def test_fixed_shape_tensor_survives_a_sort() -> None:
    tensors = pa.FixedShapeTensorArray.from_numpy_ndarray(
        np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    )
    t = pa.table({"id": [3, 1, 2], "t": tensors})
    out = fl.from_arrow(t).sort("id").to_arrow()
    assert out.schema.field("t").type == tensors.type
    assert out["t"].combine_chunks().to_numpy_ndarray()[0].tolist() == [[4.0, 5.0], [6.0, 7.0]]


def test_errors_are_feedline_errors_with_a_fix() -> None:
    ds = fl.from_arrow(_table(10))
    cases = [
        lambda: ds.sort("nope"),
        lambda: ds.groupby("nope").agg(n=("*", "count")),
        lambda: ds.groupby("k").agg(n=("x", "median")),
        lambda: ds.groupby("k").agg(n=("k", "mean")),
        lambda: ds.join(ds, on="k", how="cross"),
        lambda: ds.join(ds, on="missing"),
        lambda: ds.join(ds.cast({"g": "int32"}), on="g"),
        lambda: ds.union(fl.range(3)),
        lambda: ds.union(ds.cast({"g": "int32"})),
        lambda: ds.unique("nope"),
        lambda: ds.repartition(0),
        lambda: ds.sort("k", descending=[True, False]),
        lambda: ds.join(_table(3), on="k"),
    ]
    for case in cases:
        with pytest.raises(FeedlineError, match="Fix:"):
            case()
    with pytest.raises(ConfigurationError):
        ds.join(ds, on="k", how="cross")
    with pytest.raises(SchemaError):
        ds.union(fl.range(3))


def test_unknown_column_after_a_user_function_fails_on_execution() -> None:
    ds = fl.from_arrow(_table(10)).map_batches(lambda b: b).sort("nope")  # not checked eagerly
    with pytest.raises(SchemaError, match="Fix:"):
        ds.to_arrow()


def _fails(batch: pa.RecordBatch) -> pa.RecordBatch:
    raise ValueError("broken row")


def test_an_input_failure_keeps_its_feedline_error() -> None:
    ds = fl.from_arrow(_table(10)).map_batches(_fails, output_schema=_table(1).schema).sort("k")
    with pytest.raises(fl.UserFunctionError, match="broken row"):
        ds.to_arrow()


def test_an_unusable_spill_directory_says_how_to_fix_it() -> None:
    from feedline.engines.local.engine import LocalEngine

    engine = LocalEngine(relational_memory="16MB", spill_directory="/dev/null/no-spill")
    big = fl.range(3_000_000).with_columns(s=pc.field("id").cast(pa.string()))
    with pytest.raises(ConfigurationError, match=r"spill directory.*Fix:"):
        big.groupby("s").agg(n=("*", "count")).count(engine=engine)


def test_sorted_dataset_writes_and_inputs_preprocessors_get_fitted(tmp_path) -> None:
    t = pa.table({"id": [3, 1, 2, 0], "x": [1.0, 2.0, 3.0, 4.0]})
    ds = fl.from_arrow(t).transform(fl.StandardScaler("x")).sort("id")
    info = ds.write(tmp_path / "out")
    got = fl.open(tmp_path / "out").to_arrow()
    assert info.rows == 4 and got["id"].to_pylist() == [0, 1, 2, 3]
    x = np.array([4.0, 2.0, 3.0, 1.0])
    assert np.allclose(got["x"].to_numpy(), (x - x.mean()) / x.std())
