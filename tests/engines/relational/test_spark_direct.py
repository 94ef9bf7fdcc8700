"""On Spark, a relational operator over plain local Parquet files reads them with Spark's own
Parquet scan (feedline/plan/direct_inputs.py): same rows as the local engine, and the result
streamed to the driver comes in few partitions (adaptive coalescing kept when cached)."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl

pytest.importorskip("pyspark")

from feedline.engines.spark.engine import SparkEngine
from feedline.engines.spark.inputs import spark_reads_back
from feedline.io.source import ExecutionReport
from feedline.plan.direct_inputs import plain_parquet

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Spark needs a Java runtime",
    ),
]

ROWS = 900


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkEngine]:
    """A local[2] session with Spark's default 200 shuffle partitions."""
    from feedline.engines.spark.engine import spark_session

    session = spark_session("local[2]")
    session.sparkContext.setLogLevel("FATAL")
    yield SparkEngine(session)
    session.stop()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("direct")
    rng = np.random.default_rng(0)
    holes = lambda: rng.random(ROWS) < 0.05  # noqa: E731
    values = rng.standard_normal(ROWS)
    values[rng.random(ROWS) < 0.02] = np.nan
    days = rng.integers(0, 90, ROWS)
    table = pa.table(
        {
            "id": pa.array(np.arange(ROWS), pa.int64()),
            "k": pa.array(rng.integers(0, 40, ROWS), pa.int32(), mask=holes()),
            "small": pa.array(rng.integers(-100, 100, ROWS), pa.int8(), mask=holes()),
            "v": pa.array(values, mask=holes()),
            "f": pa.array(rng.random(ROWS), pa.float32()),
            "b": pa.array(rng.random(ROWS) < 0.5, mask=holes()),
            "s": pa.array([f"s{x}" for x in rng.integers(0, 300, ROWS)], mask=holes()),
            "day": pa.array(
                [dt.date(2026, 1, 1) + dt.timedelta(days=int(d)) for d in days], pa.date32()
            ),
        }
    )
    facts, dims = root / "facts", root / "dims"
    facts.mkdir()
    dims.mkdir()
    for part in range(3):
        pq.write_table(table.slice(part * 300, 300), facts / f"part-{part}.parquet")
    dim = pa.table({"k": pa.array(np.arange(0, 50, 2), pa.int32()), "d": np.arange(25) * 0.5})
    pq.write_table(dim, dims / "part-0.parquet")
    return facts, dims


def _rows(table: pa.Table) -> list[str]:
    return sorted(repr(row) for row in table.to_pylist())


def test_plain_parquet_inputs_run_on_spark_like_local(folders, engine: SparkEngine) -> None:
    facts, dims = fl.read_parquet(folders[0]), fl.read_parquet(folders[1])
    assert plain_parquet(facts.plan, spark_reads_back) is not None
    cases = [
        facts.groupby("k").agg(
            n=("*", "count"),
            s=("small", "sum"),
            u=("s", "n_unique"),
            lo=("day", "min"),
            hi=("f", "max"),
        ),
        facts.join(dims, on="k", how="inner"),
        facts.join(dims, on="k", how="outer"),
        facts.join(dims, on="k", how="semi"),
        facts.unique(["s"]).select(["s"]),
    ]
    for ds in cases:
        spark, local = ds.to_arrow(engine=engine), ds.to_arrow(engine="local")
        assert spark.schema.equals(local.schema)
        assert _rows(spark) == _rows(local)
    # a sort on a unique key: byte-equal, in order
    by = ["v", "id"]
    spark = facts.sort(by, descending=[True, False]).to_arrow(engine=engine)
    local = facts.sort(by, descending=[True, False]).to_arrow(engine="local")
    assert spark.schema.equals(local.schema) and repr(spark.to_pylist()) == repr(local.to_pylist())


def test_a_sorted_result_is_streamed_in_few_partitions(folders, engine: SparkEngine) -> None:
    # 200 shuffle partitions cached as they are would mean 200 fetch jobs and batches
    report = ExecutionReport()
    plan = fl.read_parquet(folders[0]).sort("v").plan
    batches = list(engine.execute(plan, report=report))
    assert sum(b.num_rows for b in batches) == ROWS
    assert len(batches) < 20
    # the read counts as feedline's own reader counts it
    streamed = ExecutionReport()
    plan = fl.read_parquet(folders[0]).map_batches(lambda b: b).sort("v").plan
    assert sum(b.num_rows for b in engine.execute(plan, report=streamed)) == ROWS
    assert (report.files_read, report.rows_read) == (3, streamed.rows_read)
    assert streamed.files_read == 3


def test_count_of_a_relational_plan_on_spark_counts_in_the_executors(
    folders, engine: SparkEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts, dims = fl.read_parquet(folders[0]), fl.read_parquet(folders[1])
    cases = [facts.groupby("k").agg(n=("*", "count")), facts.join(dims, on="k", how="inner"),
             facts.filter(lambda b: b["f"].to_numpy() > 0.5).unique(["s"])]  # fmt: skip
    want = [ds.count(engine="local") for ds in cases]
    assert want[0] == 41  # 40 keys and the null key

    def fetched(*_: object, **__: object) -> None:
        raise AssertionError("count() fetched the rows to the driver")

    monkeypatch.setattr(SparkEngine, "execute", fetched)
    assert [ds.count(engine=engine) for ds in cases] == want
