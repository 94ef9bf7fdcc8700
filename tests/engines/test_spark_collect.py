"""A plan ending at a relational operator is fetched on Spark as Spark's own Arrow
(feedline/engines/spark/collect.py): collected at once when Spark estimates it small,
streamed a window of partitions at a time otherwise, and cast back to the plan's exact
types. Every path gives the local engine's rows and schema."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import feedline as fl

pytest.importorskip("pyspark")

from feedline.engines.spark.collect import direct_frame
from feedline.engines.spark.engine import SparkEngine
from feedline.engines.spark.relational import prepare
from feedline.errors import UserFunctionError

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Spark needs a Java runtime",
    ),
]

LOGGER = "feedline.engines.spark.collect"
ROWS = 60


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """local[2] with a 2 MB ``spark.driver.maxResultSize`` (the collect's safety net)."""
    from pyspark import cloudpickle

    from feedline.engines.spark.engine import spark_session

    cloudpickle.register_pickle_by_value(request.module)
    session = spark_session(
        "local[2]",
        **{"spark.sql.shuffle.partitions": "4", "spark.driver.maxResultSize": "2m"},
    )
    session.sparkContext.setLogLevel("FATAL")
    yield session
    session.stop()
    cloudpickle.unregister_pickle_by_value(request.module)


def _typed_table(rows: int) -> pa.Table:
    """One column of every type feedline carries through Spark, nulls included."""
    rng = np.random.default_rng(0)
    holes = rng.random(rows) < 0.2
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(
        rng.random((rows, 2, 2)).astype(np.float32)
    )
    return pa.table(
        {
            "id": pa.array(np.arange(rows)[::-1].copy()),
            "i8": pa.array(rng.integers(-100, 100, rows), pa.int8(), mask=holes),
            "u16": pa.array(rng.integers(0, 65_535, rows), pa.uint16(), mask=holes),
            "u64": pa.array(rng.integers(0, 2**63, rows, dtype=np.uint64) * 2 + 1, pa.uint64()),
            "f32": pa.array(rng.random(rows).astype(np.float32)),
            "large": pa.array([f"s{i}" for i in range(rows)], pa.large_string()),
            "dict": pa.array([f"d{i % 3}" for i in range(rows)]).dictionary_encode(),
            "bin": pa.array([bytes([i % 256]) * 3 for i in range(rows)], pa.large_binary()),
            "fixed": pa.array([bytes([i % 256]) * 4 for i in range(rows)], pa.binary(4)),
            "dec": pa.array(
                [decimal.Decimal(i * 10**20).scaleb(-10) for i in range(rows)],
                pa.decimal128(38, 10),
            ),
            "day": pa.array(
                [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(rows)], pa.date64()
            ),
            "utc": pa.array(
                [start + dt.timedelta(seconds=977 * i) for i in range(rows)],
                pa.timestamp("us", tz="UTC"),
                mask=holes,
            ),
            "paris": pa.array(
                [start + dt.timedelta(seconds=977 * i) for i in range(rows)],
                pa.timestamp("us", tz="Europe/Paris"),
            ),
            "naive": pa.array(
                [dt.datetime(2024, 1, 1) + dt.timedelta(milliseconds=i) for i in range(rows)],
                pa.timestamp("ms"),
            ),
            "ints": pa.array([[i, None] for i in range(rows)], pa.list_(pa.int32())),
            "floats": pa.array([[float(i)] for i in range(rows)], pa.large_list(pa.float64())),
            "xyz": pa.array([[i, i, i] for i in range(rows)], pa.list_(pa.float32(), 3)),
            "tensor": tensor,
            "pair": pa.array(
                [{"a": i, "b": str(i)} for i in range(rows)],
                pa.struct([("a", pa.int32()), ("b", pa.string())]),
            ),
            "tags": pa.array([[("k", i)] for i in range(rows)], pa.map_(pa.string(), pa.int64())),
        }
    )


def _parquet(root: Path, rows: int, files: int = 4) -> fl.Dataset:
    """``rows`` facts (id, k, v) in ``files`` plain Parquet files (Spark reads them itself)."""
    rng = np.random.default_rng(1)
    table = pa.table(
        {
            "id": pa.array(np.arange(rows), pa.int64()),
            "k": pa.array(rng.integers(0, 50, rows), pa.int64()),
            "v": pa.array(rng.standard_normal(rows)),
        }
    )
    root.mkdir(parents=True, exist_ok=True)
    step = -(-rows // files)
    for part, begin in enumerate(range(0, rows, step)):
        pq.write_table(table.slice(begin, step), root / f"part-{part}.parquet")
    return fl.read_parquet(root)


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What spark_collect logged, each message up to its parenthesis."""
    return [r.getMessage().split(" (")[0] for r in caplog.records if r.name == LOGGER]


def _same(got: pa.Table, expected: pa.Table) -> None:
    assert got.schema.equals(expected.schema), (got.schema, expected.schema)
    assert got.equals(expected)


def test_every_type_comes_back_exactly_when_collected_and_when_streamed(spark):
    ds = fl.from_arrow(_typed_table(ROWS)).sort("id")
    local = ds.to_arrow(engine="local")
    prepared = prepare(spark, ds.plan, None)
    direct = direct_frame(prepared.plan)
    assert direct is not None
    try:
        collected = direct.collect()
        assert collected is not None
        streamed = list(direct.stream())
    finally:
        prepared.finish(None)
    for raw in (collected, streamed):
        _same(pa.Table.from_batches([direct.restore(b) for b in raw], direct.schema), local)
    # through the engine, on either path, in a session whose time zone is not UTC
    conf = spark.conf
    conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        for bound in (0, "1GB"):
            _same(ds.to_arrow(engine=SparkEngine(spark, collect_bytes=bound)), local)
    finally:
        conf.unset("spark.sql.session.timeZone")


def test_a_small_result_is_collected_in_one_job(spark, tmp_path, caplog):
    ds = _parquet(tmp_path / "facts", 3_000)
    engine = SparkEngine(spark)
    cases = [
        ds.groupby("k").agg(n=("*", "count"), s=("v", "sum")).sort("k"),
        ds.sort("v"),
        ds.sort("id").select(["v", "id"]).filter(pc.field("v") > 0),  # pushed after the sort
        ds.sort("id").filter(pc.field("v") > 0).select(["id"]),  # filters on a dropped column
    ]
    for case in cases:
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            caplog.clear()
            got = case.to_arrow(engine=engine)
        local = case.to_arrow(engine="local")
        if "s" in local.column_names:
            # an exact float sum runs through feedline's batch stage, whose output size Spark
            # cannot estimate: the result is streamed, still in one job (one partition)
            assert _said(caplog) in (
                ["Collected a Spark result"],
                ["Streaming a Spark result", "Fetched partitions 0-0 of 1 in one collect"],
            )
            assert got.equals(local)  # exact sums: the same bits as the local engine
        else:
            assert _said(caplog) == ["Collected a Spark result"]
            _same(got, local)


def test_a_large_result_is_streamed_a_window_at_a_time(spark, tmp_path, caplog):
    ds = _parquet(tmp_path / "facts", 8_000).sort("v")
    local = ds.to_arrow(engine="local")
    conf = spark.conf
    conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")  # 4 sorted partitions
    try:
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            batches = SparkEngine(spark, collect_bytes=0).execute(ds.plan)
            first = next(batches)
            fetched_before = [m for m in _said(caplog) if m.startswith("Fetched")]
            rest = list(batches)
    finally:
        conf.unset("spark.sql.adaptive.coalescePartitions.enabled")
    _same(pa.Table.from_batches([first, *rest]), local)
    windows = [m for m in _said(caplog) if m.startswith("Fetched")]
    assert _said(caplog)[0] == "Streaming a Spark result"
    # windows of defaultParallelism (2) partitions; the driver had at most two when the
    # first batch came out (the one consumed and the one prefetched), never all four
    assert windows == ["Fetched partitions 0-1 of 4", "Fetched partitions 2-3 of 4"]
    assert 1 <= len(fetched_before) <= 2 and len(rest) > 0


def test_an_input_whose_size_spark_cannot_estimate_is_streamed(spark, caplog):
    table = pa.table({"id": np.arange(500)[::-1].copy(), "x": np.arange(500) * 0.5})
    ds = fl.from_arrow(table).sort("id")  # read by feedline's tasks: no Spark statistics
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        got = ds.to_arrow(engine=SparkEngine(spark, collect_bytes="1GB"))
    assert _said(caplog)[0] == "Streaming a Spark result"
    _same(got, ds.to_arrow(engine="local"))


def test_a_collect_past_max_result_size_is_streamed_instead(spark, tmp_path, caplog):
    ds = _parquet(tmp_path / "facts", 400_000).sort("id", descending=True)  # ~9.6 MB > 2 MB
    conf = spark.conf
    conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")  # windows < 2 MB:
    conf.set("spark.sql.shuffle.partitions", "16")  # 16 partitions of ~0.6 MB
    try:
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            got = ds.to_arrow(engine=SparkEngine(spark, collect_bytes="1GB"))
    finally:
        conf.unset("spark.sql.adaptive.coalescePartitions.enabled")
        conf.set("spark.sql.shuffle.partitions", "4")
    said = _said(caplog)
    assert said[:2] == [
        "The Spark result outgrew spark.driver.maxResultSize: streaming it instead",
        "Streaming a Spark result",
    ]
    assert len([m for m in said if m.startswith("Fetched")]) > 1  # windows under the limit
    _same(got, ds.to_arrow(engine="local"))


def _boom(batch: pa.RecordBatch) -> pa.RecordBatch:
    raise ValueError("boom")


def test_a_failing_input_function_raises_its_feedline_error(spark):
    ds = fl.from_arrow(pa.table({"id": [3, 1, 2]})).map_batches(_boom).sort("id")
    with pytest.raises(UserFunctionError, match="_boom"):
        ds.to_arrow(engine=SparkEngine(spark, collect_bytes=0))


def test_plans_with_batch_stages_after_the_operator_keep_the_fused_stage(spark):
    ds = fl.from_arrow(pa.table({"id": [3, 1, 2]})).sort("id")
    assert direct_frame(prepare(spark, ds.plan, None).plan) is not None
    later = ds.map_batches(lambda b: b)
    assert direct_frame(prepare(spark, later.plan, None).plan) is None
    assert later.to_arrow(engine=SparkEngine(spark)).equals(later.to_arrow(engine="local"))


def test_a_parquet_scan_reads_the_known_schema_and_the_current_files(spark, tmp_path):
    from feedline.engines.spark.inputs import native_parquet

    ds = _parquet(tmp_path / "facts", 400, files=2)
    scan = native_parquet(spark, ds.select(["v", "id"]).plan, [])
    assert scan is not None and scan.columns == ["v", "id"]  # given, in the wanted order
    # a file rewritten with other rows: the next run reads the new rows (ids unique, so
    # the sort has no ties to order differently)
    path = tmp_path / "facts" / "part-1.parquet"
    pq.write_table(pa.table({"id": [1007, 1009], "k": [1, 2], "v": [0.5, -0.5]}), path)
    reread = fl.read_parquet(tmp_path / "facts")
    _same(reread.sort("id").to_arrow(engine=SparkEngine(spark)), reread.sort("id").to_arrow())
