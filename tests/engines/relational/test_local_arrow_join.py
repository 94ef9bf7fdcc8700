"""Joins of in-memory Arrow tables run in Arrow's hash join (Acero) and give DuckDB's rows."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import feedline as fl
from feedline.engines.local.engine import LocalEngine

ARROW = "joins_in_arrow"


def _tables(n: int = 400, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """Two tables sharing keys k (string, nulls, skewed) and g (int), with a column of every
    type the Arrow path takes; the right one has duplicate keys and a colliding name."""
    rng = np.random.default_rng(seed)

    def side(rows: int) -> pa.Table:
        keys = rng.choice(["a", "b", "c", None], rows, p=[0.6, 0.2, 0.15, 0.05]).tolist()
        start = datetime.date(2024, 1, 1)
        days = [start + datetime.timedelta(int(v)) for v in rng.integers(0, 9, rows)]
        tenths = [decimal.Decimal(int(v)) / 10 for v in rng.integers(0, 99, rows)]
        return pa.table(
            {
                "k": pa.array(keys, pa.string()),
                "g": pa.array(rng.integers(0, 6, rows)),
                "x": pa.array(rng.normal(size=rows), mask=rng.random(rows) < 0.1),
                "b": pa.array(rng.random(rows) < 0.5),
                "i8": pa.array(rng.integers(-9, 9, rows), pa.int8()),
                "ls": pa.array([f"s{v}" for v in rng.integers(0, 50, rows)], pa.large_string()),
                "bin": pa.array([bytes([v]) for v in rng.integers(0, 9, rows)], pa.binary()),
                "dt": pa.array(days),
                "ts": pa.array(rng.integers(0, 10**12, rows), pa.timestamp("us", "UTC")),
                "dec": pa.array(tenths, pa.decimal128(6, 1)),
                "f32": pa.array(rng.normal(size=rows), pa.float32()),
            }
        )

    return side(n), side(n // 2).select(["k", "g", "x", "dt", "dec"])


def _sorted(table: pa.Table) -> list[dict]:
    return pl.from_arrow(table).sort(table.schema.names, nulls_last=True).to_dicts()


def _via_duckdb(ds: fl.Dataset) -> fl.Dataset:
    """``ds`` as an input the Arrow path does not take (it runs through the engine)."""
    return ds.map_batches(lambda batch: batch)


@pytest.mark.parametrize("how", ["inner", "left", "semi", "anti"])
def test_in_memory_join_runs_in_arrow_with_duckdbs_rows(how: str) -> None:
    left, right = _tables()
    ds = fl.from_arrow(left).join(fl.from_arrow(right), on=["k", "g"], how=how, suffix="_r")
    reference = fl.from_arrow(left).join(
        _via_duckdb(fl.from_arrow(right)), on=["k", "g"], how=how, suffix="_r"
    )
    assert ds.analyze().counters.get(ARROW) == 1
    assert reference.analyze().counters.get(ARROW) is None
    got, want = ds.to_arrow(), reference.to_arrow()
    assert got.schema.remove_metadata() == want.schema.remove_metadata() == ds.schema()
    assert got.num_rows > 0 and _sorted(got) == _sorted(want)


def test_in_memory_join_of_selected_columns_in_any_order() -> None:
    left, right = _tables(200, seed=1)
    joined = fl.from_arrow(left).join(fl.from_arrow(right), on="k", how="left")
    got = joined.select(["x_right", "k", "ts"]).to_arrow()
    assert joined.select(["x_right", "k", "ts"]).analyze().counters.get(ARROW) == 1
    want = fl.from_arrow(left).join(_via_duckdb(fl.from_arrow(right)), on="k", how="left")
    assert got.schema.names == ["x_right", "k", "ts"]
    assert _sorted(got) == _sorted(want.select(["x_right", "k", "ts"]).to_arrow())
    filtered = joined.filter(pa.compute.field("g") == 2).select(["g", "dt_right"]).to_arrow()
    assert filtered.num_rows > 0 and set(filtered["g"].to_pylist()) == {2}


@pytest.mark.parametrize(
    "case",
    [
        "outer join",
        "float key",
        "list column",
        "right side over a quarter of relational_memory",
        "output over relational_memory",
    ],
)
def test_joins_arrow_does_not_take_run_in_duckdb(case: str) -> None:
    left = pa.table({"k": [1, 2, 2, None], "f": [1.0, 2.0, 2.0, -0.0], "l": [[1], [2], [], None]})
    right = pa.table({"k": [2, 3, None], "f": [2.0, 3.0, 0.0], "y": ["two", "three", "none"]})
    big = 2_000_000
    how, on, engine = "inner", "k", LocalEngine()
    if case == "outer join":
        how = "outer"
    elif case == "float key":
        on = "f"  # DuckDB matches -0.0 with 0.0
    elif case == "right side over a quarter of relational_memory":
        right = pa.table({"k": np.arange(big), "f": np.zeros(big), "y": pa.nulls(big, pa.string())})
        engine = LocalEngine(relational_memory=4 * right.nbytes - 1)
    elif case == "output over relational_memory":
        left = pa.table({"k": np.arange(big), "f": np.zeros(big)})
        engine = LocalEngine(relational_memory=left.nbytes)
    if case != "list column":
        left = left.drop_columns([c for c in left.schema.names if c == "l"])
    ds = fl.from_arrow(left).join(fl.from_arrow(right), on=on, how=how)
    assert ds.analyze(engine=engine).counters.get(ARROW) is None
    # the same join without what this case changed does run in Arrow
    control = fl.from_arrow(left.drop_columns([c for c in left.schema.names if c == "l"]))
    taken = control.join(fl.from_arrow(right), on="k", how="inner")
    assert taken.analyze(engine=LocalEngine(relational_memory="1GB")).counters.get(ARROW) == 1

    rows = ds.to_arrow(engine=engine).to_pylist()
    keys = sorted(r["k"] for r in rows if r["k"] is not None)
    expected = {
        "outer join": [1, 2, 2, 3],
        "float key": [2, 2],
        "list column": [2, 2],
        "output over relational_memory": [2, 3],
    }
    assert keys == expected.get(case, [1, 2, 2])
    assert len(rows) == {"outer join": 6, "float key": 3}.get(case, len(keys))
