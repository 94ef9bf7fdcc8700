"""``fl.read_delta`` / ``fl.read_iceberg`` / ``fl.read_lance`` on the Spark (``local[2]``) and
Ray engines: the file lists planned on the driver, the read tasks on the workers, the same
rows per version as the local engine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from lakehouse_tables import (
    delta_table,
    delta_table_with_deletion_vectors,
    iceberg_table,
    iceberg_table_with_position_deletes,
    lance_dataset,
)

import feedline as fl

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
    pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning"),
]


def check_all(engine: Any, tmp_path: Path) -> None:
    """Every version of each table, written through ``engine``, has the right rows: deleted
    rows (Delta deletes that rewrite files and deletion vectors, Iceberg copy-on-write and
    position deletes, Lance deletion files) are never read."""
    pytest.importorskip("deltalake")
    pytest.importorskip("pyroaring")
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("lance")
    cases: list[tuple[str, fl.Dataset, list[int]]] = []
    path, live = delta_table(tmp_path / "d")
    cases += [(f"delta-{v}", fl.read_delta(path, version=v), want) for v, want in live.items()]
    dv_path, dv_live = delta_table_with_deletion_vectors(tmp_path / "d")
    cases += [(f"delta-dv-{v}", fl.read_delta(dv_path, version=v), w) for v, w in dv_live.items()]
    (tmp_path / "i").mkdir()
    table, snapshots = iceberg_table(tmp_path / "i")
    cases += [
        (f"iceberg-{n}", fl.read_iceberg(table, snapshot_id=s), want)
        for n, (s, want) in enumerate(snapshots.items())
    ]
    (tmp_path / "p").mkdir()
    moR, moR_live = iceberg_table_with_position_deletes(tmp_path / "p")
    cases += [
        (f"iceberg-pos-{n}", fl.read_iceberg(moR, snapshot_id=s), want)
        for n, (s, want) in enumerate(moR_live.items())
    ]
    lpath, llive = lance_dataset(tmp_path / "l")
    cases += [(f"lance-{v}", fl.read_lance(lpath, version=v), want) for v, want in llive.items()]
    # a pushed filter on a partition column (Delta), on bounds (Iceberg), into lance's scan
    cases.append(
        ("delta-odd", fl.read_delta(path).filter(pc.field("part") == "odd"), [1, 3, 5, 9, 11])
    )
    cases.append(("iceberg-late", fl.read_iceberg(table).filter(pc.field("id") >= 5), [5, 6, 7]))
    dv_high = fl.read_delta(dv_path).filter(pc.field("id") >= 3)
    cases.append(("delta-dv-high", dv_high, [3, 5, 6, 7]))
    high = fl.read_lance(lpath).filter(pc.field("score") > 0.35)
    cases.append(("lance-high", high, [4, 5, 6, 7]))
    for name, ds, want in cases:
        out = tmp_path / "out" / name
        ds.write(out, engine=engine)
        got = fl.open(out).to_arrow()
        assert sorted(got["id"].to_pylist()) == want, name
        rows = got.to_pylist()
        assert all(r["part"] == ("even" if r["id"] % 2 == 0 else "odd") for r in rows), name
    # out to a Delta table: the plan on the engine's workers, delta-rs on the driver
    target = tmp_path / "to-delta"
    fl.read_iceberg(moR).write_delta(target, engine=engine, partition_by=["part"])
    assert sorted(fl.read_delta(target).to_arrow()["id"].to_pylist()) == list(moR_live.values())[-1]


@pytest.mark.spark
@pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                    reason="Spark needs a Java runtime")  # fmt: skip
def test_spark_engine_reads_every_version(spark, tmp_path) -> None:
    pytest.importorskip("pyspark")
    from feedline.engines.spark.engine import SparkEngine

    check_all(SparkEngine(spark), tmp_path)


@pytest.mark.ray
def test_ray_engine_reads_every_version(ray_engine, tmp_path) -> None:
    pytest.importorskip("ray")
    check_all(ray_engine, tmp_path)
