"""``sum`` of floats, ``mean`` and ``std`` in ``groupby().agg`` are exact: the correctly
rounded value of the exact sum (``std``: within one unit in the last place), whatever the
batching, the parallelism or the engine (feedline/plan/exact_aggregates.py).

The local engine's DuckDB summed in its own order before: 39 of these 40 group sums were
not the correctly rounded exact sum, and Spark and Ray summed in yet other orders, so a
split hashing the rows put other rows on each side (issue 24, item 14). The Spark and Ray
comparisons are in test_spark_relational.py / test_ray_relational.py (exact equality now)
and, on real 2-node clusters, in tests/engines/test_spark_cluster.py and
tests/engines/test_ray_cluster.py.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.plan.exact_aggregates import Partial, add_partials, finish, partial_column


def _data(n: int = 30_000, seed: int = 5) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.lognormal(0, 2.5, n) * rng.choice([-1.0, 1.0], n)
    return pa.table({"k": rng.integers(0, 40, n), "x": x, "i": rng.integers(-(2**62), 2**62, n)})


def _exact_std(values: list[Fraction]) -> float:
    n = len(values)
    mean = sum(values) / n
    return math.sqrt(float(sum((v - mean) ** 2 for v in values) / (n - 1)))


def test_sum_and_mean_are_the_correctly_rounded_exact_values() -> None:
    table = _data()
    out = (
        fl.from_arrow(table)
        .groupby("k")
        .agg(s=("x", "sum"), m=("x", "mean"), sd=("x", "std"), mi=("i", "mean"), si=("i", "std"))
    )
    rows = out.to_arrow().sort_by("k").to_pylist()
    keys, x, ints = (table[c].to_numpy() for c in ("k", "x", "i"))
    assert len(rows) == 40
    for row in rows:
        values = [Fraction(float(v)) for v in x[keys == row["k"]]]
        total = sum(values)
        assert row["s"] == float(total)  # DuckDB's own sum: 39 of 40 groups differed
        assert row["m"] == float(total / len(values))
        want = _exact_std(values)
        assert abs(row["sd"] - want) <= math.ulp(want)
        group = [int(v) for v in ints[keys == row["k"]]]  # beyond 2**53: exact integers
        assert row["mi"] == float(Fraction(sum(group), len(group)))
        want = _exact_std([Fraction(v) for v in group])
        assert abs(row["si"] - want) <= math.ulp(want)


def test_the_same_bits_for_any_files_batching_and_parallelism(tmp_path: Path) -> None:
    table = _data(12_000, seed=9)
    results = []
    for files, parallelism in ((1, 1), (7, 4), (13, 2)):
        folder = tmp_path / f"f{files}"
        folder.mkdir()
        for number, piece in enumerate(np.array_split(np.arange(table.num_rows), files)):
            part = table.take(pa.array(piece))
            pq.write_table(part, folder / f"p{number}.parquet", row_group_size=333)
        grouped = (
            fl.read_parquet(folder)
            .groupby("k")
            .agg(s=("x", "sum"), m=("x", "mean"), sd=("x", "std"))
        )
        engine = fl.LocalEngine(parallelism=parallelism, memory_budget="8MB")
        results.append(grouped.to_arrow(engine=engine).sort_by("k"))
    for other in results[1:]:
        assert other.equals(results[0])
        for name in ("s", "m", "sd"):  # bit for bit, not to a tolerance
            assert other[name].to_numpy().tobytes() == results[0][name].to_numpy().tobytes()


def test_partials_merge_to_the_same_value_in_any_order() -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.normal(1e6, 1e-3, 500), rng.lognormal(0, 40, 500), [5e-324]])
    batch = pa.record_batch({"x": values})
    parts = []
    for start in range(0, len(values), 37):
        piece = add_partials(batch.slice(start, 37), (), (("x", True),))
        parts.append(piece.column(partial_column("x"))[0].as_py())
    exact = sum(Fraction(float(v)) for v in values)
    orders = [parts, parts[::-1], random.Random(3).sample(parts, len(parts))]
    assert {finish(order, "sum") for order in orders} == {float(exact)}
    assert {finish(order, "mean") for order in orders} == {float(exact / len(values))}
    assert len({finish(order, "std") for order in orders}) == 1


def test_special_values_follow_sql() -> None:
    nan, inf = float("nan"), float("inf")
    table = pa.table(
        {
            "g": [1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 7],
            "x": [nan, 1.0, inf, 2.0, inf, -inf, -inf, 3.0, 4.0, None, 1e308, 1e308],
        }
    )
    out = (
        fl.from_arrow(table)
        .groupby("g")
        .agg(s=("x", "sum"), m=("x", "mean"), sd=("x", "std"), n=("x", "count"))
    )
    got = {r["g"]: r for r in out.to_arrow().to_pylist()}
    assert all(math.isnan(got[1][c]) for c in ("s", "m", "sd"))  # NaN wins
    assert got[2]["s"] == got[2]["m"] == inf and math.isnan(got[2]["sd"])
    assert math.isnan(got[3]["s"]) and math.isnan(got[3]["m"])  # inf - inf
    assert got[4]["s"] == got[4]["m"] == -inf
    assert got[5] == {"g": 5, "s": 4.0, "m": 4.0, "sd": None, "n": 1}  # std of one value
    assert got[6] == {"g": 6, "s": None, "m": None, "sd": None, "n": 0}  # no values
    assert got[7]["s"] == inf and got[7]["m"] == 1e308 and got[7]["sd"] == 0.0  # sum overflows
    empty = fl.from_arrow(table.slice(0, 0)).groupby([]).agg(s=("x", "sum"), m=("x", "mean"))
    assert empty.to_arrow().to_pylist() == [{"s": None, "m": None}]


def test_booleans_decimals_and_float32_take_the_exact_path() -> None:
    table = pa.table(
        {
            "k": ["a", "a", "a", "b"],
            "flag": [True, False, True, None],
            "price": pa.array([Decimal("0.10"), Decimal("0.20"), None, Decimal("1.50")]),
            "f": pa.array([0.1, 0.2, 0.3, 0.5], pa.float32()),
        }
    )
    out = (
        fl.from_arrow(table)
        .groupby("k")
        .agg(share=("flag", "mean"), avg=("price", "mean"), total=("f", "sum"))
    )
    got = {r["k"]: r for r in out.to_arrow().to_pylist()}
    f32 = [Fraction(float(np.float32(v))) for v in (0.1, 0.2, 0.3)]
    assert got["a"]["share"] == 2 / 3 and got["b"]["share"] is None
    assert got["a"]["avg"] == float((Fraction(0.1) + Fraction(0.2)) / 2) and got["b"]["avg"] == 1.5
    assert got["a"]["total"] == float(sum(f32))
    assert out.schema().field("total").type == pa.float64()


def test_a_partial_round_trips_and_refuses_another_version() -> None:
    part = Partial(n=3, nan=1, pos_inf=0, neg_inf=2, total=-(7 << 900), squares=11 << 2000)
    assert Partial.decode(part.encode()) == part
    with pytest.raises(ValueError, match="version"):
        Partial.decode(b"\x07" + part.encode()[1:])
