"""Fitted state and rows are bit-identical on the local and Spark engines, however the read
tasks are split into partitions: partials merge in the fixed tree of
:mod:`feedline.engines.batch.partials`. Everything is compared as bytes (JSON text, float bits),
never with a tolerance."""

from __future__ import annotations

import itertools
import json
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
from feedline.engines.batch.partials import TreeMerger, fold
from feedline.preprocess.scalers import merge_moments, moments

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

needs_java = pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs a Java runtime",
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """11 Parquet files of uneven sizes, several row groups each, values of wide range."""
    folder = tmp_path_factory.mktemp("bits")
    rng = np.random.default_rng(3)
    for i in range(11):
        n = 150 + 61 * i
        x = rng.lognormal(3.0, 2.5, n) * rng.choice([-1.0, 1.0], n) + 1e-7 * rng.random(n)
        y = np.where(rng.random(n) < 0.1, np.nan, rng.normal(1e6, 1e-3, n))
        table = pa.table(
            {
                "id": np.arange(i * 10_000, i * 10_000 + n, dtype=np.int64),
                "x": x,
                "y": y,
                "c": rng.choice([f"k{j}" for j in range(40)], n),
            }
        )
        pq.write_table(table, folder / f"part-{i:02d}.parquet", row_group_size=64)
    return folder


def double(batch: pa.RecordBatch) -> dict[str, Any]:
    z = pc.multiply(batch["x"], 0.7)
    return {"id": batch["id"], "x": batch["x"], "y": batch["y"], "z": z, "c": batch["c"]}


def dataset(folder: Path) -> fl.Dataset:
    return fl.read_parquet(folder).filter(pc.field("x") > -5000.0).map_batches(double)


def makers() -> list[Any]:
    return [
        fl.StandardScaler(["x", "y", "z"]),
        fl.MinMaxScaler(["x", "z"]),
        fl.RobustScaler(["x"]),
        fl.Imputer(["y"]),
        fl.StringIndexer("c"),
        fl.OneHotEncoder("c"),
        fl.QuantileDiscretizer("x", 7),
    ]


def state_bytes(preprocessor: Any) -> str:
    return json.dumps(preprocessor.state, sort_keys=True)


def stats_bytes(ds: fl.Dataset, engine: Any) -> str:
    return json.dumps(fl.stats(ds, engine=engine).to_dict(), sort_keys=True, default=repr)


# ----------------------------------------------------------------------------- the tree


def test_tree_result_does_not_depend_on_partitioning():
    """Chan's moment merge is not associative in floating point; the fixed tree makes
    every split of the tasks into ranges give the same bits."""
    rng = np.random.default_rng(0)
    leaves = [moments(rng.lognormal(0, 3, rng.integers(1, 50))) for _ in range(23)]
    whole = TreeMerger(merge_moments)
    for i, leaf in enumerate(leaves):
        whole.push(0, i, leaf)
    expected = whole.result().tobytes()
    sequential = fold(leaves, merge_moments).tobytes()
    differs = False
    for cuts in ([5, 11, 17], [1, 2, 3, 20], [8, 16], [22], [3, 7, 12, 13, 19]):
        bounds = [0, *cuts, len(leaves)]
        blocks = []
        for a, b in itertools.pairwise(bounds):
            part = TreeMerger(merge_moments)
            for i in range(a, b):
                part.push(0, i, leaves[i])
            blocks += part.blocks()
        driver = TreeMerger(merge_moments)
        for block in sorted(blocks, key=lambda b: b[1] << b[0]):
            driver.push(*block)
        assert driver.result().tobytes() == expected
        # what the engines did before: fold each range, then fold the ranges
        ranges = [fold(leaves[a:b], merge_moments) for a, b in itertools.pairwise(bounds)]
        old = fold(ranges, merge_moments)
        differs |= old.tobytes() != sequential
    assert differs  # the data is one where merge order shows in the bits


@pytest.mark.parametrize("parallelism", [1, 2, 5])
def test_local_engine_state_is_the_same_for_any_parallelism(inputs, parallelism):
    ds = dataset(inputs)
    reference = [state_bytes(m.fit(ds, engine=fl.LocalEngine(parallelism=3))) for m in makers()]
    engine = fl.LocalEngine(parallelism=parallelism, memory_budget="1MB")
    assert [state_bytes(m.fit(ds, engine=engine)) for m in makers()] == reference


# ----------------------------------------------------------------------------- Spark


@pytest.fixture(scope="module")
def spark(request) -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from pyspark import cloudpickle

    from feedline.engines.spark.engine import spark_session

    cloudpickle.register_pickle_by_value(request.module)
    session = spark_session("local[2]", spark_sql_shuffle_partitions=2)
    yield session
    session.stop()
    cloudpickle.unregister_pickle_by_value(request.module)


@pytest.mark.spark
@needs_java
@pytest.mark.parametrize(("case", "partitions"), [(0, 2), *((c, 5) for c in range(7))])
def test_fitted_state_is_byte_equal_on_spark(spark, inputs, partitions, case):
    from feedline.engines.spark.engine import SparkEngine

    ds = dataset(inputs)
    local = state_bytes(makers()[case].fit(ds))
    engine = SparkEngine(spark, partitions=partitions)
    assert state_bytes(makers()[case].fit(ds, engine=engine)) == local


@pytest.mark.spark
@needs_java
def test_stats_and_scaled_rows_are_byte_equal_on_spark(spark, inputs, tmp_path):
    from feedline.engines.spark.engine import SparkEngine

    engine = SparkEngine(spark, partitions=3)
    ds = dataset(inputs)
    assert stats_bytes(ds, engine) == stats_bytes(ds, "local")

    def scaled() -> fl.Dataset:
        return ds.transform(fl.StandardScaler(["x", "y", "z"])).transform(fl.Imputer(["y"]))

    scaled().write(tmp_path / "spark", engine=engine)
    scaled().write(tmp_path / "local")
    a, b = fl.open(tmp_path / "spark"), fl.open(tmp_path / "local")
    assert json.dumps(a.manifest.preprocessors) == json.dumps(b.manifest.preprocessors)
    rows_a, rows_b = a.to_arrow(), b.to_arrow()
    for name in ("x", "y", "z"):
        bits_a = rows_a[name].combine_chunks().to_numpy(zero_copy_only=False).tobytes()
        assert bits_a == rows_b[name].combine_chunks().to_numpy(zero_copy_only=False).tobytes()
