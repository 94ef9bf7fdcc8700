"""A fit on ``fraction=`` reads the same row groups on Spark as on the local engine (they are
chosen from metadata on the driver) and gives a byte-equal fitted state."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from test_fit_sample import GROUP, SHARD, damage_unsampled, table  # tests/ is on sys.path

import feedline as fl

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Spark needs a Java runtime",
    ),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from feedline.engines.spark.engine import spark_session

    session = spark_session("local[2]", spark_sql_shuffle_partitions=2)
    yield session
    session.stop()


def test_fraction_fit_is_byte_equal_on_spark_and_reads_only_sampled_row_groups(spark, tmp_path):
    from feedline.engines.spark.engine import SparkEngine

    out = tmp_path / "ds"
    fl.from_arrow(table()).write(out, rows_per_shard=SHARD, row_group_rows=GROUP)
    damage_unsampled(out, 0.15, seed=4)  # a read of any other row group would raise
    chain = fl.Chain(
        [fl.StandardScaler("x"), fl.RobustScaler("x", output="r"), fl.StringIndexer("c")]
    )
    local = chain.fit(fl.open(out), fraction=0.15, seed=4)
    remote = chain.fit(fl.open(out), fraction=0.15, seed=4, engine=SparkEngine(spark, partitions=3))
    assert json.dumps(remote.state, sort_keys=True) == json.dumps(local.state, sort_keys=True)
    assert local.steps[0].fitted["count"]["x"] == 600


def test_a_clustered_sample_grows_the_same_on_spark(spark, tmp_path):
    """The spread check runs in the engine's partials: Spark measures the same moments,
    settles on the same row groups and fits the same state as the local engine."""
    import numpy as np
    import pyarrow as pa

    from feedline.engines.spark.engine import SparkEngine

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(m, 1.0, 2_000) for m in rng.normal(0, 0.5, 40)])
    out = tmp_path / "series"
    fl.from_arrow(pa.table({"x": x})).write(out, rows_per_shard=20_000, row_group_rows=2_000)
    scaler = fl.StandardScaler("x")
    with pytest.warns(UserWarning, match="row groups differ"):
        local = scaler.fit(fl.open(out), fraction=0.05, seed=1)
    with pytest.warns(UserWarning, match="row groups differ"):
        remote = scaler.fit(fl.open(out), fraction=0.05, seed=1, engine=SparkEngine(spark))
    assert json.dumps(remote.state, sort_keys=True) == json.dumps(local.state, sort_keys=True)
    assert abs(local.fitted["mean"]["x"] - x.mean()) < 0.02 * x.std()
