"""Column edits (with_columns, rename, drop, cast) run unchanged on Spark and Ray."""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import feedline as fl


def _edited() -> fl.Dataset:
    table = pa.table({"a": list(range(20)), "b": [str(i) for i in range(20)]})
    return (
        fl.from_arrow(table)
        .with_columns(c=pc.field("a") * 2)
        .rename({"b": "name"})
        .drop("a")
        .cast({"c": "float32"})
    )


@pytest.mark.spark
@pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"), reason="needs Java"
)
def test_column_edits_on_spark_equal_local(spark) -> None:
    pytest.importorskip("pyspark")
    from feedline.engines.spark.engine import SparkEngine

    local = _edited().to_arrow()
    on_spark = _edited().to_arrow(engine=SparkEngine(spark))
    assert on_spark.schema == local.schema
    assert on_spark.sort_by("name").equals(local.sort_by("name"))


@pytest.mark.ray
def test_column_edits_on_ray_equal_local(ray_engine) -> None:
    local = _edited().to_arrow()
    on_ray = _edited().to_arrow(engine=ray_engine)
    assert on_ray.schema == local.schema
    assert on_ray.sort_by("name").equals(local.sort_by("name"))
