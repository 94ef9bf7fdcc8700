"""Relational operators on the Spark engine (``local[2]``) give the local engine's rows.

Every operator runs on Spark DataFrame operations (feedline/engines/spark/relational.py) and
is compared with the local engine on the same data: byte-equal tables after a sort on a
unique key and for ``random_shuffle``; equal sorted rows otherwise. The data has nulls in
every column, NaN, a skewed key (most rows share one value), decimals, time-zoned
timestamps, unsigned integers and lists, read from three Parquet files (several Spark
partitions).
"""

from __future__ import annotations

import decimal
import math
import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import feedline as fl

pytest.importorskip("pyspark")

from feedline.engines.spark.engine import SparkEngine
from feedline.plan.relational import split_bounds
from feedline.plan.rowhash import row_hash

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Spark needs a Java runtime",
    ),
]

ROWS = 600
FILES = 3


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Iterator[SparkEngine]:
    """One local[2] SparkSession for the module (stopped at its end)."""
    from pyspark import cloudpickle

    from feedline.engines.spark.engine import spark_session

    cloudpickle.register_pickle_by_value(request.module)
    session = spark_session("local[2]", spark_sql_shuffle_partitions=3)
    session.sparkContext.setLogLevel("FATAL")
    yield SparkEngine(session)
    session.stop()
    cloudpickle.unregister_pickle_by_value(request.module)


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    holes = lambda p: rng.random(rows) < p  # noqa: E731 - a null mask
    keys = rng.choice(["hot", "warm", "cold", "ünï"], rows, p=[0.7, 0.15, 0.1, 0.05])
    floats = rng.normal(size=rows)
    floats[rng.random(rows) < 0.03] = np.nan
    start = datetime(2024, 1, 1, tzinfo=UTC)
    tags = [
        None if rng.random() < 0.1 else [None if rng.random() < 0.1 else int(v) for v in t]
        for t in (rng.integers(0, 9, rng.integers(0, 4)) for _ in range(rows))
    ]
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "k": pa.array(keys, mask=holes(0.08)),
            "x": pa.array(rng.integers(0, 40, rows), pa.int32(), mask=holes(0.1)),
            "f": pa.array(floats, mask=holes(0.05)),
            "u": pa.array(rng.integers(0, 60_000, rows), pa.uint16(), mask=holes(0.05)),
            "d": pa.array(
                [decimal.Decimal(int(v)).scaleb(-3) for v in rng.integers(-(10**6), 10**6, rows)],
                pa.decimal128(12, 3),
                mask=holes(0.05),
            ),
            "ts": pa.array(
                [start + timedelta(microseconds=int(v)) for v in rng.integers(0, 10**12, rows)],
                pa.timestamp("us", tz="UTC"),
                mask=holes(0.05),
            ),
            "tags": pa.array(tags, pa.list_(pa.int32())),
            "b": pa.array(rng.random(rows) < 0.5, mask=holes(0.05)),
        }
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Any]:
    """``ds``: the main data (3 Parquet files, duplicated rows included); ``other``: a join
    partner (some ids, repeated and null keys, a clashing column); ``empty``."""
    root = tmp_path_factory.mktemp("relational")
    table = _table(ROWS, seed=0)
    table = pa.concat_tables([table, table.slice(0, 20)])  # 20 identical duplicate rows
    bounds = [len(table) * i // FILES for i in range(FILES + 1)]
    for i in range(FILES):
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), root / f"{i}.parquet")
    rng = np.random.default_rng(1)
    ids = rng.choice(np.arange(-20, ROWS + 20), 300)
    other = pa.table(
        {
            "id": pa.array(ids, pa.int64(), mask=rng.random(300) < 0.05),
            "x": pa.array(rng.normal(size=300)),  # clashes with the left "x"
            "label": pa.array(rng.choice(["p", "q"], 300)),
        }
    )
    ds = fl.read_parquet(sorted(str(p) for p in root.glob("*.parquet")))
    return {
        "ds": ds,
        "table": table,
        "other": fl.from_arrow(other),
        "empty": fl.from_arrow(table.slice(0, 0)),
    }


# ----------------------------------------------------------------------------- comparing


def _canon(value: Any) -> Any:
    """NaN by name (NaN != NaN would fail equal rows)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [_canon(v) for v in value]
    return value


def _rows(table: pa.Table, unordered: tuple[str, ...] = ("lx", "ltags")) -> list[str]:
    """The rows as sorted text; the lists of ``list`` aggregates (no order) sorted too."""
    rows = []
    for row in table.to_pylist():
        canon = {k: _canon(v) for k, v in row.items()}
        for name in unordered:
            if canon.get(name) is not None:
                canon[name] = sorted(canon[name], key=repr)
        rows.append(repr(canon))
    return sorted(rows)


def _identical(a: pa.Table, b: pa.Table) -> bool:
    """Same schema, same values in the same order (``Table.equals`` says NaN != NaN)."""
    ordered = lambda t: [repr({k: _canon(v) for k, v in r.items()}) for r in t.to_pylist()]  # noqa: E731
    return a.schema.equals(b.schema) and ordered(a) == ordered(b)


def _both(ds: fl.Dataset, engine: SparkEngine) -> tuple[pa.Table, pa.Table]:
    spark, local = ds.to_arrow(engine=engine), ds.to_arrow(engine="local")
    assert spark.schema.equals(local.schema), (spark.schema, local.schema)
    return spark, local


def _same_rows(ds: fl.Dataset, engine: SparkEngine) -> pa.Table:
    spark, local = _both(ds, engine)
    assert spark.num_rows == local.num_rows
    assert _rows(spark) == _rows(local)
    return spark


# ----------------------------------------------------------------------------- sort


def test_sort_on_a_unique_key_is_byte_equal(data, engine):
    ds = data["ds"].unique().sort(["k", "f", "id"], descending=[True, False, True])
    spark, local = _both(ds, engine)
    assert _identical(spark, local)
    assert spark.num_rows == ROWS
    assert spark.column("k").null_count > 0  # nulls went last


@pytest.mark.parametrize("nulls_last", [True, False])
def test_sort_with_ties_and_nulls_orders_the_keys_like_local(data, engine, nulls_last):
    ds = data["ds"].sort(["k", "x"], descending=[False, True], nulls_last=nulls_last)
    spark, local = _both(ds, engine)
    assert spark.select(["k", "x"]).equals(local.select(["k", "x"]))
    assert _rows(spark) == _rows(local)
    assert spark.column("k")[0 if not nulls_last else -1].as_py() is None


# ----------------------------------------------------------------------------- aggregate

AGGS = {
    "rows": ("*", "count"),
    "nx": ("x", "count"),
    "sx": ("x", "sum"),
    "su": ("u", "sum"),
    "sb": ("b", "sum"),
    "sd": ("d", "sum"),
    "lo": ("ts", "min"),
    "hi": ("k", "max"),
    "ux": ("x", "n_unique"),
    "lx": ("x", "list"),
    "ltags": ("tags", "list"),
}
FLOAT_AGGS = {"mf": ("f", "mean"), "sdf": ("f", "std"), "mx": ("x", "mean"), "sdx": ("x", "std")}


@pytest.mark.parametrize("keys", [["k"], ["k", "b"], []])
def test_aggregate_matches_local(data, engine, keys):
    ds = data["ds"].groupby(keys).agg(**AGGS, **FLOAT_AGGS, one=("x", "first"))
    spark, local = _both(ds, engine)
    exact = [*keys, *AGGS]
    assert _rows(spark.select(exact)) == _rows(local.select(exact))
    by_key = {repr(r[: len(keys)]): r for r in zip(*local.to_pydict().values(), strict=True)}
    names = local.column_names
    table = data["table"]
    for row in zip(*spark.to_pydict().values(), strict=True):
        expected = dict(zip(names, by_key[repr(row[: len(keys)])], strict=True))
        got = dict(zip(names, row, strict=True))
        for name in FLOAT_AGGS:  # exact sums (feedline.plan.exact_aggregates): the same bits
            a, b = got[name], expected[name]
            assert (a is None and b is None) or a == b or (math.isnan(a) and math.isnan(b))
        assert got["one"] in got["lx"] and (got["one"] is not None or got["nx"] == 0)
    assert spark.column("rows").to_pylist() and sum(spark.column("rows").to_pylist()) == len(table)


def test_aggregate_on_empty_input(data, engine):
    grouped = data["empty"].groupby("k").agg(n=("*", "count"), s=("x", "sum"), lx=("x", "list"))
    assert _same_rows(grouped, engine).num_rows == 0
    total = data["empty"].groupby([]).agg(n=("*", "count"), s=("f", "sum"), m=("x", "max"))
    assert _same_rows(total, engine).to_pylist() == [{"n": 0, "s": None, "m": None}]


# ----------------------------------------------------------------------------- join, union, unique


@pytest.mark.parametrize("how", ["inner", "left", "outer", "semi", "anti"])
def test_join_matches_local(data, engine, how):
    joined = data["ds"].join(data["other"], on="id", how=how, suffix="_r")
    spark = _same_rows(joined, engine)
    if how not in ("semi", "anti"):
        assert spark.column_names[:3] == ["id", "k", "x"] and "x_r" in spark.column_names
    else:
        assert spark.column_names == data["table"].column_names


def test_join_on_two_keys_with_an_empty_side(data, engine):
    left = data["ds"].select(["id", "k", "f"])
    right = data["ds"].select(["id", "k", "x"]).filter(pc.field("x") > 30)
    _same_rows(left.join(right, on=["id", "k"], how="outer"), engine)
    empty = data["empty"].select(["id", "k", "u"])
    assert _same_rows(left.join(empty, on=["id", "k"], how="left"), engine).num_rows == len(
        data["table"]
    )


def test_union_and_unique_match_local(data, engine):
    reordered = data["ds"].select(list(reversed(data["table"].column_names)))
    union = data["ds"].union(reordered, data["empty"])
    assert _same_rows(union, engine).num_rows == 2 * len(data["table"])
    assert _same_rows(data["ds"].unique(), engine).num_rows == ROWS
    by_key = data["ds"].unique(["k", "b"])  # which row per key is unspecified
    spark, local = _both(by_key, engine)
    assert _rows(spark.select(["k", "b"])) == _rows(local.select(["k", "b"]))
    rows = set(_rows(data["table"]))
    assert all(r in rows for r in _rows(spark))


# ----------------------------------------------------------------------------- shuffle, split


def _hash_order(table: pa.Table, seed: int) -> pa.Table:
    keys = row_hash(table, seed).to_numpy()
    return table.take(pa.array(np.argsort(keys, kind="stable")))


def test_random_shuffle_is_byte_equal_to_local_and_to_the_row_hash(data, engine):
    ds = data["ds"].random_shuffle(seed=7)
    spark, local = _both(ds, engine)
    assert _identical(spark, local)
    assert _identical(spark, _hash_order(data["table"], 7).cast(spark.schema))
    other_seed = data["ds"].random_shuffle(seed=8).to_arrow(engine="local")
    assert not _identical(spark, other_seed)
    empty = data["empty"].select(data["table"].column_names)
    assert _same_rows(empty.random_shuffle(seed=7), engine).num_rows == 0


@pytest.mark.parametrize("stratify", [None, "k"])
def test_split_gives_the_local_partition(data, engine, stratify):
    pieces = data["ds"].split([0.6, 0.3, 0.1], seed=3, stratify=stratify)
    got = [_same_rows(piece, engine) for piece in pieces]
    table = data["table"]
    assert sorted(row for piece in got for row in _rows(piece)) == _rows(table)
    # exact sizes: floor(hi * n) - floor(lo * n) in total (also when stratified)
    n = len(table)
    sizes = [math.floor(hi * n) - math.floor(lo * n) for lo, hi in split_bounds([0.6, 0.3, 0.1])]
    assert [p.num_rows for p in got] == sizes
    strata = [] if stratify is None else pc.unique(table.column(stratify)).to_pylist()
    for value in strata:  # each stratum: its share of each piece, within a few rows
        share = len(_stratum(table, value)) / n
        assert all(abs(len(_stratum(p, value)) - share * p.num_rows) < 3 for p in got)


def _stratum(table: pa.Table, value: Any) -> pa.Table:
    k = table.column("k")
    return table.filter(pc.is_null(k) if value is None else pc.fill_null(pc.equal(k, value), False))


def test_train_test_split_on_empty_input(data, engine):
    empty = data["empty"].select(data["table"].column_names)
    train, test = empty.train_test_split(test_size=0.25, seed=0, stratify="k")
    assert _same_rows(train, engine).num_rows == _same_rows(test, engine).num_rows == 0


# ----------------------------------------------------------------------------- plans, writes


def _double(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("n2", pc.multiply(batch.column("n"), 2))


def test_nested_plan_with_operators_after_it(data, engine):
    ds = (
        data["ds"]
        .join(data["other"], on="id", suffix="_r")
        .groupby(["k", "label"])
        .agg(n=("*", "count"), s=("x", "sum"))
        .filter(pc.field("n") > 1)
        .sort(["k", "label"])
        .map_batches(_double)  # its schema is learnt on rows streamed from Spark
    )
    spark, local = _both(ds, engine)
    assert _identical(spark, local)
    assert ds.count(engine=engine) == local.num_rows


def test_repartition_and_write_reopen(data, engine, tmp_path):
    spread = data["ds"].repartition(4)
    spark = _same_rows(spread, engine)
    assert _rows(spark) == _rows(data["table"])  # every type came back exactly
    ordered = data["ds"].repartition(2).sort("id", descending=True)
    info = ordered.write(str(tmp_path / "out"), engine=engine, rows_per_shard=100)
    assert info.engine == "spark"
    reopened = fl.open(str(tmp_path / "out")).to_arrow()
    assert _identical(reopened, ordered.to_arrow(engine="local"))
    # several sorted partitions stream in order (small data: adaptive coalescing off)
    conf = engine.spark.conf
    conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    try:
        batches = list(ordered.iter_batches(engine=engine))
    finally:
        conf.unset("spark.sql.adaptive.coalescePartitions.enabled")
    assert len(batches) > 1 and _identical(pa.Table.from_batches(batches), reopened)
