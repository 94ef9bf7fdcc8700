"""fl.read_tfrecord on the Spark and Ray engines: the same rows and skip counts as locally.

Two TFRecord files (one GZIP) and a third with a corrupt record, read with
``on_error="skip"``; then ``write_tfrecord`` of the engine's output read back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl

SPEC = {
    "id": "int64",
    "vec": fl.tfrecord.FixedLen((2,), "float32"),
    "tokens": fl.tfrecord.VarLen("int32"),
    "text": "string",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tfrecords")
    rng = np.random.default_rng(0)
    for i, compression in enumerate((None, "GZIP", None)):
        ids = np.arange(i * 30, (i + 1) * 30)
        table = pa.table({
            "id": ids,
            "vec": pa.FixedShapeTensorArray.from_numpy_ndarray(rng.random((30, 2), np.float32)),
            "tokens": pa.array([list(range(j % 5)) for j in ids], pa.list_(pa.int32())),
            "text": [f"t{j}" for j in ids],
        })  # fmt: skip
        out = root / f"f{i}"
        fl.from_arrow(table).write_tfrecord(out, compression=compression)
        for part in out.iterdir():
            part.rename(root / f"f{i}-{part.name}")
        out.rmdir()
    broken = next(root.glob("f2-*"))
    data = bytearray(broken.read_bytes())
    data[40] ^= 0xFF  # inside the first record's data
    broken.write_bytes(bytes(data))
    return root


def _check(engine, files: Path, tmp_path: Path) -> None:
    ds = fl.read_tfrecord(files, features=SPEC, on_error="skip")
    local = ds.to_arrow().sort_by("id")
    assert local.num_rows == 89 and local["id"].to_pylist()[60] == 61
    other = ds.to_arrow(engine=engine).sort_by("id")
    assert other.equals(local)
    info = ds.write(tmp_path / "out", engine=engine)
    assert info.report["records_skipped"] == 1
    assert "f2-part-00000.tfrecord@0 (record 0)" in info.report["skipped"][0]["where"]
    written = fl.read_tfrecord(files, features=SPEC, on_error="skip").write_tfrecord(
        tmp_path / "tfr", engine=engine
    )
    assert written.rows == 89
    back = fl.read_tfrecord(tmp_path / "tfr", features=SPEC).to_arrow().sort_by("id")
    assert back.equals(local)


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
@pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs a Java runtime",
)
def test_spark_reads_the_same_rows_and_counts_the_same_skips(spark, files, tmp_path) -> None:
    pytest.importorskip("pyspark")
    from feedline.engines.spark.engine import SparkEngine

    _check(SparkEngine(spark), files, tmp_path)


@pytest.mark.ray
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")
def test_ray_reads_the_same_rows_and_counts_the_same_skips(ray_engine, files, tmp_path) -> None:
    _check(ray_engine, files, tmp_path)
