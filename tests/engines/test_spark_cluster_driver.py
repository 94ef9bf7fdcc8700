"""What the Spark driver holds and ships (``local[2]``): results stream partition by
partition, and the user's own modules are found for shipping to cluster executors."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.engines.spark.cluster import missing_module_error, user_modules

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

needs_java = pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs a Java runtime",
)


def test_user_modules_are_found_and_libraries_are_not(tmp_path, monkeypatch):
    pytest.importorskip("pyspark")
    package = tmp_path / "mylib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text("def double(batch):\n    return batch\n")
    model = "class Model:\n    def __call__(self, b):\n        return b\n"
    (tmp_path / "helpers.py").write_text(model)
    monkeypatch.syspath_prepend(str(tmp_path))
    ops = importlib.import_module("mylib.ops")
    helpers = importlib.import_module("helpers")
    try:
        plan = fl.range(4).map_batches(ops.double).map_batches(helpers.Model, concurrency=1).plan
        assert user_modules(plan.ops) == ["helpers", "mylib"]
        assert user_modules(fl.range(4).map_batches(np.asarray).plan.ops) == []
    finally:
        for name in ("mylib.ops", "mylib", "helpers"):
            sys.modules.pop(name, None)


def test_a_missing_module_on_a_worker_names_the_fix():
    error = missing_module_error("PythonException: ModuleNotFoundError: No module named 'mylib'")
    assert isinstance(error, fl.errors.ConfigurationError)
    assert "'mylib'" in str(error) and "addPyFile" in str(error) and "Fix:" in str(error)


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


def with_value(batch: pa.RecordBatch) -> dict[str, Any]:
    return {"id": batch["id"], "v": batch["id"].to_numpy() * 0.5}


@needs_java
@pytest.mark.spark
def test_results_stream_one_partition_at_a_time(spark):
    """8 partitions of 8 MiB: the driver's peak (Python heap + Arrow pool) stays far below
    the 64 MiB result, where collecting it with ``toArrow`` held all of it at once."""
    from feedline.engines.spark.engine import SparkEngine

    rows = 4 << 20  # 16 bytes a row ("id" int64, "v" float64)
    ds = fl.range(rows, rows_per_task=rows // 8).map_batches(with_value)
    engine = SparkEngine(spark, partitions=8)
    total, peak, first = 0, 0, []
    tracemalloc.start()
    try:
        base_pool = pa.total_allocated_bytes()
        for batch in ds.iter_batches(engine=engine):
            total += batch.nbytes
            first.append(batch["id"][0].as_py())
            held = tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes() - base_pool
            peak = max(peak, held)
            del batch
    finally:
        tracemalloc.stop()
    assert total == rows * 16
    assert first == sorted(first)  # partition order
    assert peak < total * 0.45, (peak, total)


@needs_java
@pytest.mark.spark
def test_aggregate_after_a_limit_merges_every_partition(spark):
    """After a limit the stage reads DataFrame partitions: each is its own leaf of the tree."""
    from feedline.engines.spark.engine import SparkEngine

    ds = fl.range(10_000, rows_per_task=700).limit(2_345).map_batches(with_value)
    engine = SparkEngine(spark, partitions=4)
    count = ds.aggregate(lambda b: b.num_rows, lambda a, b: a + b, engine=engine)
    total = ds.aggregate(v_sum, float.__add__, engine=engine)
    assert count == 2_345
    assert total == ds.aggregate(v_sum, float.__add__) == sum(i * 0.5 for i in range(2_345))


def v_sum(batch: pa.RecordBatch) -> float:
    return float(pa.compute.sum(batch["v"]).as_py())
