"""``fl.read_webdataset`` on the Spark (``local[2]``) and Ray engines: the same rows and the
same skip counts as the local engine, on shards written by WebDataset (one of them cut short)."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]


@pytest.fixture
def urls(tmp_path: Path) -> str:
    """Four shards of 6 samples (JPEG + class + caption); the third is cut inside a member."""
    from sklearn.datasets import load_sample_images

    photo = load_sample_images().images[0]
    with wds.ShardWriter(str(tmp_path / "s-%04d.tar"), maxcount=6, verbose=0) as sink:
        for i in range(24):
            buf = io.BytesIO()
            pixels = np.ascontiguousarray(photo[i * 10 : i * 10 + 32, :40])
            Image.fromarray(pixels).save(buf, "JPEG")
            sink.write({"__key__": f"{i:04d}", "jpg": buf.getvalue(), "cls": i % 4,
                        "txt": f"caption {i}"})  # fmt: skip
    damaged = tmp_path / "s-0002.tar"
    damaged.write_bytes(damaged.read_bytes()[:3000])
    return str(tmp_path / "s-{0000..0003}.tar")


def compare(engine, urls: str, out: Path) -> None:
    ds = fl.read_webdataset(urls, ["__key__", "jpg", "cls", "txt"], on_error="skip")
    local = ds.write(out / "local")
    info = ds.write(out / "engine", engine=engine)
    want, got = fl.open(out / "local").to_arrow(), fl.open(out / "engine").to_arrow()
    assert got.num_rows == want.num_rows and 18 <= want.num_rows < 24
    assert got.sort_by("__key__").equals(want.sort_by("__key__"))
    assert got.schema.field("jpg").type == pa.binary()
    assert info.report["records_skipped"] == local.report["records_skipped"] == 1


@pytest.mark.spark
@pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                    reason="Spark needs a Java runtime")  # fmt: skip
def test_spark_engine_reads_the_same_samples(spark, urls, tmp_path) -> None:
    from feedline.engines.spark.engine import SparkEngine

    compare(SparkEngine(spark), urls, tmp_path)


@pytest.mark.ray
def test_ray_engine_reads_the_same_samples(ray_engine, urls, tmp_path) -> None:
    compare(ray_engine, urls, tmp_path)
