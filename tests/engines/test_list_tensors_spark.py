"""Spark ``ArrayType`` columns written by ``df.write.parquet`` load as tensors (issue 16.1)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import feedline as fl
from feedline.errors import DataError

pytest.importorskip("pyspark")

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Spark needs a Java runtime",
    ),
]

ROWS = 300


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession for the module (SPARK_LOCAL_IP set by spark_session)."""
    from feedline.engines.spark.engine import spark_session

    session = spark_session("local[2]", spark_sql_shuffle_partitions=2)
    session.sparkContext.setLogLevel("FATAL")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def arrays(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A Spark-written folder: id, ArrayType(FloatType) of 12, ArrayType(ArrayType(Double))
    of 3 x 4, ArrayType(IntegerType) of 5 (values by id)."""
    from pyspark.sql import types as T

    rng = np.random.default_rng(0)
    ref = {
        "vec": rng.normal(size=(ROWS, 12)).astype(np.float32),
        "mat": rng.normal(size=(ROWS, 3, 4)),
        "pix": rng.integers(0, 256, (ROWS, 5)).astype(np.int32),
    }
    schema = T.StructType([
        T.StructField("id", T.LongType()),
        T.StructField("vec", T.ArrayType(T.FloatType())),
        T.StructField("mat", T.ArrayType(T.ArrayType(T.DoubleType()))),
        T.StructField("pix", T.ArrayType(T.IntegerType())),
    ])  # fmt: skip
    rows = [
        (i, ref["vec"][i].tolist(), ref["mat"][i].tolist(), ref["pix"][i].tolist())
        for i in range(ROWS)
    ]
    out = tmp_path_factory.mktemp("spark") / "arrays"
    spark.createDataFrame(rows, schema).repartition(3).write.parquet(str(out))
    return out, ref


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_spark_array_columns_load_as_tensors(arrays: tuple[Path, dict], cache: str) -> None:
    folder, ref = arrays
    loader = fl.read_parquet(folder).loader(
        batch_size=32, seed=1, format="numpy", cache=cache, shuffle_window=2,
        shapes={"pix": (5,)},
    )  # fmt: skip
    batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert len(set(ids.tolist())) == len(ids) == (ROWS // 32) * 32
    for name in ("vec", "mat", "pix"):
        got = np.concatenate([b[name] for b in batches])
        assert got.dtype == ref[name].dtype and got.shape[1:] == ref[name].shape[1:]
        np.testing.assert_array_equal(got, ref[name][ids])


def test_spark_arrays_through_a_feedline_write(arrays: tuple[Path, dict], tmp_path: Path) -> None:
    folder, ref = arrays
    out = tmp_path / "ds"
    fl.read_parquet(folder).transform(fl.ListToTensor("mat", shape=(3, 4))).write(out)
    got = next(iter(fl.open(out).loader(batch_size=ROWS, shuffle=False, format="numpy")))
    np.testing.assert_array_equal(got["mat"], ref["mat"][got["id"]])
    np.testing.assert_array_equal(got["vec"], ref["vec"][got["id"]])


def test_spark_ragged_array_is_named(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import types as T

    rows = [(i, [float(i)] * (3 if i != 7 else 2)) for i in range(10)]
    schema = T.StructType([T.StructField("id", T.LongType()),
                           T.StructField("v", T.ArrayType(T.FloatType()))])  # fmt: skip
    out = tmp_path / "ragged"
    spark.createDataFrame(rows, schema).coalesce(1).write.parquet(str(out))
    loader = fl.read_parquet(out).loader(batch_size=5, shuffle=False, format="numpy")
    with pytest.raises(DataError, match=r"'v': a row has length 2 at row 7 .*length 3.*Fix:"):
        list(loader)
    padded = fl.read_parquet(out).loader(
        batch_size=10, shuffle=False, format="numpy", shapes={"v": (3,)}, ragged="pad",
        pad_value=-1.0,
    )  # fmt: skip
    assert next(iter(padded))["v"][7].tolist() == [7.0, 7.0, -1.0]
