"""``fl.read_petastorm`` on the Spark (``local[2]``) and Ray engines: the same rows, tensors and
skip counts as the local engine, on the dataset Petastorm wrote (tests/fixtures/petastorm/) with
one value truncated."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]

DATASET = Path(__file__).parents[1] / "fixtures" / "petastorm" / "dataset"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the fixture whose last file has one truncated ``packed`` (npz) value."""
    root = shutil.copytree(DATASET, tmp_path / "ds")
    last = sorted(root.glob("part-*.parquet"))[-1]
    table = pq.read_table(last)
    values = table["packed"].to_pylist()
    row = next(i for i, v in enumerate(values) if v is not None)
    values[row] = values[row][:40]
    index = table.schema.get_field_index("packed")
    table = table.set_column(index, table.schema.field("packed"), pa.array(values, pa.binary()))
    pq.write_table(table, last, row_group_size=2)
    return root


def compare(engine, root: Path, out: Path) -> None:
    ds = fl.read_petastorm(root, on_error="skip")
    local = ds.write(out / "local")
    info = ds.write(out / "engine", engine=engine)
    want, got = fl.open(out / "local").to_arrow(), fl.open(out / "engine").to_arrow()
    assert got.num_rows == want.num_rows == 35
    assert got.sort_by("id").equals(want.sort_by("id"))
    assert isinstance(got.schema.field("image_png").type, pa.FixedShapeTensorType)
    assert got.schema.field("points").type == pa.list_(pa.list_(pa.float32()))
    assert info.report["records_skipped"] == local.report["records_skipped"] == 1


@pytest.mark.spark
@pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                    reason="Spark needs a Java runtime")  # fmt: skip
def test_spark_engine_reads_the_same_rows(spark, root, tmp_path) -> None:
    pytest.importorskip("pyspark")
    from feedline.engines.spark.engine import SparkEngine

    compare(SparkEngine(spark), root, tmp_path)


@pytest.mark.ray
def test_ray_engine_reads_the_same_rows(ray_engine, root, tmp_path) -> None:
    pytest.importorskip("ray")
    compare(ray_engine, root, tmp_path)
