"""The Spark engine on a real local SparkSession (``local[2]``), compared with the local engine."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import feedline as fl

pytest.importorskip("pyspark")
PIL = pytest.importorskip("PIL.Image")

# after the skip for a missing pyspark
from feedline.dataset.from_memory import from_spark  # noqa: E402
from feedline.engines.spark.bridge import clear_spark_cache, to_spark  # noqa: E402
from feedline.engines.spark.engine import SparkEngine  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Spark needs a Java runtime",
    ),
]

ROWS_PER_FILE = 40


@pytest.fixture(scope="module")
def engine(spark) -> SparkEngine:
    return SparkEngine(spark)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Two CSV files, two Parquet files (same rows) and an image folder with a corrupt file."""
    root = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    (root / "csv").mkdir()
    (root / "pq").mkdir()
    for i in range(2):
        ids = np.arange(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "price": np.round(rng.normal(10, 5, ROWS_PER_FILE), 3),
                "category": rng.choice(["red", "green", "blue", "grey"], ROWS_PER_FILE),
            }
        )
        pacsv.write_csv(table, root / "csv" / f"part-{i}.csv")
        pq.write_table(table, root / "pq" / f"part-{i}.parquet")
    for label, count in (("cats", 5), ("dogs", 4)):
        (root / "images" / label).mkdir(parents=True)
        for k in range(count):
            pixels = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
            PIL.fromarray(pixels).save(root / "images" / label / f"{label}-{k}.png")
    (root / "images" / "dogs" / "dogs-broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    return root


def add_ratio(batch: pa.RecordBatch) -> dict:
    """A map_batches function (runs on the Spark workers, pickled by value)."""
    price = batch["price"].to_numpy()
    return {
        "id": batch["id"],
        "price": batch["price"],
        "ratio": price / (1.0 + np.abs(price)),
        "category": batch["category"],
    }


def not_grey(batch: pa.RecordBatch):
    return pc.not_equal(batch["category"], "grey")


def fails_on_id_50(batch: pa.RecordBatch):
    if pc.any(pc.equal(batch["id"], 50)).as_py():
        raise ValueError("cannot handle id 50")
    return batch


def tabular(ds: fl.Dataset) -> fl.Dataset:
    return (
        ds.filter(pc.field("price") > 0)
        .filter(not_grey)
        .map_batches(add_ratio, batch_size=7)
        .transform(fl.StandardScaler(["price", "ratio"]))
        .transform(fl.StringIndexer("category"))
    )


def written(ds: fl.Dataset, path: Path, engine) -> tuple[fl.WriteInfo, pa.Table, fl.Dataset]:
    info = ds.write(path, engine=engine)
    opened = fl.open(path)
    return info, opened.to_arrow(), opened


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_tabular_pipeline_same_rows_schema_and_state(engine, inputs, tmp_path, kind):
    read = fl.read_csv if kind == "csv" else fl.read_parquet
    source = read(inputs / ("csv" if kind == "csv" else "pq"))
    _, local, local_ds = written(tabular(source), tmp_path / "local", "local")
    info, spark, spark_ds = written(tabular(source), tmp_path / "spark", engine)

    assert spark.num_rows == local.num_rows > 20
    assert spark.sort_by("id").equals(local.sort_by("id"))
    assert spark_ds.schema() == local_ds.schema()
    assert spark_ds.manifest.preprocessors == local_ds.manifest.preprocessors
    assert spark_ds.manifest.lineage["engine"] == "spark"
    assert info.engine == "spark" and info.report["function_calls"] > 0
    assert fl.verify(tmp_path / "spark").rows == local.num_rows


def test_fitting_on_spark_matches_local(engine, inputs):
    upstream = fl.read_csv(inputs / "csv").filter(not_grey).map_batches(add_ratio)
    for make in (fl.StandardScaler(["price", "ratio"]), fl.StringIndexer("category")):
        on_spark = make.fit(upstream, engine=engine).state
        on_local = make.fit(upstream).state
        assert _close(on_spark, on_local), (on_spark, on_local)


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=1e-12)
    return a == b


def test_image_pipeline_skips_and_counts_the_corrupt_image_on_both(engine, inputs, tmp_path):
    def images() -> fl.Dataset:
        return (
            fl.read_images(inputs / "images")
            .transform(fl.DecodeImages(size=(8, 8), on_error="skip"))
            .transform(fl.StringIndexer("label"))
        )

    local_info, local, local_ds = written(images(), tmp_path / "local", "local")
    spark_info, spark, spark_ds = written(images(), tmp_path / "spark", engine)

    assert spark.num_rows == local.num_rows == 9
    assert spark.sort_by("path").equals(local.sort_by("path"))
    assert spark_ds.schema() == local_ds.schema()
    assert isinstance(spark_ds.schema().field("bytes").type, pa.FixedShapeTensorType)
    for info in (local_info, spark_info):
        assert info.report["records_skipped"] == 1
        assert "dogs-broken.png" in info.report["skipped"][0]["where"]
    assert local_info.report["skipped"] == spark_info.report["skipped"]


def test_user_function_error_names_the_function_and_the_file(engine, inputs):
    ds = fl.read_parquet(inputs / "pq").map_batches(fails_on_id_50)
    with pytest.raises(fl.UserFunctionError) as caught:
        ds.to_arrow(engine=engine)
    message = str(caught.value)
    assert "fails_on_id_50" in message and "cannot handle id 50" in message
    assert "part-1.parquet" in message
    assert "org.apache.spark" not in message and "Py4J" not in message
    assert "raise ValueError" in caught.value.worker_traceback


def test_interrupted_write_leaves_no_manifest(engine, inputs, tmp_path):
    failing = fl.read_parquet(inputs / "pq").map_batches(fails_on_id_50)
    fresh = tmp_path / "fresh"
    with pytest.raises(fl.UserFunctionError):
        failing.write(fresh, engine=engine)
    assert not (fresh / "_feedline.json").exists()
    assert not [p for p in os.listdir(fresh) if p.startswith(".feedline-staging")]

    previous = tmp_path / "previous"
    fl.range(5).write(previous)
    with pytest.raises(fl.UserFunctionError):
        failing.write(previous, engine=engine)
    assert fl.open(previous).to_arrow()["id"].to_pylist() == [0, 1, 2, 3, 4]


def test_from_spark_write_twice_computes_once(spark, tmp_path):
    from pyspark.sql import functions as F

    calls = spark.sparkContext.accumulator(0)

    def double(x):  # a Python UDF counting its calls
        calls.add(1)
        return 2 * x

    df = spark.range(30, numPartitions=3).withColumn("twice", F.udf(double, "long")("id"))
    cache = str(tmp_path / "cache")
    first = from_spark(df, cache_dir=cache).write(tmp_path / "a")
    second = from_spark(df, cache_dir=cache).write(tmp_path / "b", engine=SparkEngine(spark))
    assert calls.value == 30
    assert first.rows == second.rows == 30
    table = fl.open(tmp_path / "b").to_arrow().sort_by("id")
    assert table["twice"].to_pylist() == [2 * i for i in range(30)]

    assert clear_spark_cache(cache) == 1
    from_spark(df, cache_dir=cache).write(tmp_path / "c")
    assert calls.value == 60


def test_lineage_names_the_spark_source_through_a_split(spark, engine, tmp_path):
    """The manifest's lineage names the DataFrame, not the ``split(...)`` over it (issue
    24, item 15), on the local and the Spark engine."""
    df = spark.range(40, numPartitions=2).selectExpr("id", "id % 3 AS k")
    for name, on in (("local", "local"), ("spark", engine)):
        train, _ = from_spark(df, cache_dir=str(tmp_path / "cache")).train_test_split(0.25)
        train.write(tmp_path / name, engine=on)
        lineage = fl.open(tmp_path / name).manifest.lineage
        assert lineage["source"].startswith("spark DataFrame [id, k]"), lineage
        assert lineage["plan"][0].startswith("split(") and "spark DataFrame" in lineage["plan"][1]


SESSION_SCRIPT = """
import sys
import feedline as fl
from feedline.engines.spark.bridge import default_cache_dir
from feedline.engines.spark.engine import spark_session

spark = spark_session("local[1]")
ds = fl.from_spark(spark.range(30).selectExpr("id", "id * 2 AS twice"))
print("ROWS", ds.write(sys.argv[1]).rows, flush=True)
print("CACHE", default_cache_dir(), flush=True)
import os
print("ENTRIES", len(os.listdir(default_cache_dir())), flush=True)
spark.stop()
"""


@pytest.mark.timeout(300)
def test_from_spark_cache_is_removed_when_the_session_ends(tmp_path):
    """The default cache is a folder of the process, removed at exit (before: a shared
    ``/tmp/feedline-spark-cache`` that outlived every session)."""
    import subprocess
    import sys

    script = tmp_path / "session.py"
    script.write_text(SESSION_SCRIPT)
    root = str(Path(fl.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root)
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    found = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert run.returncode == 0 and found.get("ROWS") == "30", run.stderr[-3000:]
    assert found["ENTRIES"] == "1"  # the materialized DataFrame was there while it ran
    cache = Path(found["CACHE"])
    assert cache.name.startswith("feedline-spark-cache-") and not cache.exists()
    assert fl.open(tmp_path / "out").count() == 30  # the written copy stays


def test_dataframe_bridges_and_limits(spark, engine):
    df = spark.range(20, numPartitions=4).selectExpr("id", "id % 3 AS k")
    native = from_spark(df, cache=False).filter(pc.field("k") == 1)
    expected = [i for i in range(20) if i % 3 == 1]
    assert sorted(native.to_arrow(engine=engine)["id"].to_pylist()) == expected
    assert sorted(native.to_arrow()["id"].to_pylist()) == expected

    tensors = fl.range(6, rows_per_task=2).map_batches(
        lambda b: {"id": b["id"], "t": np.ones((b.num_rows, 2, 2), np.float32)}
    )
    out = to_spark(tensors, spark)
    assert out.schema.simpleString() == "struct<id:bigint,t:array<float>>"
    assert out.count() == 6 and out.first()["t"] == [1.0] * 4
    assert to_spark(from_spark(df), spark) is df

    limited = (
        fl.range(100, rows_per_task=10)
        .limit(25)
        .map_batches(lambda b: {"x": pc.multiply(b["id"], 2)})
    )
    assert limited.to_arrow(engine=engine).equals(limited.to_arrow())
    sampled = fl.range(1000, rows_per_task=100).sample(0.3, seed=1)  # seeded per read task
    assert sampled.to_arrow(engine=engine).equals(sampled.to_arrow())


class Counted:
    """A callable class: Spark builds it once per Python worker, not once per task."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        Path(folder, f"built-{os.getpid()}-{id(self)}").touch()

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        Path(self.folder, f"call-{os.getpid()}-{batch['id'][0].as_py()}").touch()
        return batch


def test_callable_class_is_built_once_per_python_worker(spark, tmp_path):
    ds = fl.range(80, rows_per_task=10).map_batches(
        Counted, fn_constructor_kwargs={"folder": str(tmp_path)}
    )
    assert ds.count(engine=SparkEngine(spark, partitions=8)) == 80
    names = os.listdir(tmp_path)
    driver = f"-{os.getpid()}-"
    built = [n for n in names if n.startswith("built-") and driver not in n]
    calls = [n for n in names if n.startswith("call-") and driver not in n]
    assert len(calls) == 8  # 8 read tasks, one Spark partition each
    pids = [n.split("-")[1] for n in built]
    assert len(set(pids)) == len(pids) < len(calls)  # once per Python worker process


def test_in_memory_table_travels_once_per_partition(spark, monkeypatch):
    from feedline.engines.spark import plan as spark_plan
    from feedline.io.memory import ArrowSource

    monkeypatch.setattr(spark_plan, "BROADCAST_BYTES", 0)  # as for a table too big to broadcast
    table = pa.table({"id": np.arange(1000), "x": np.arange(1000) * 0.5})
    source = fl.Dataset.from_source(ArrowSource(table, rows_per_task=100))
    ds = source.filter(pc.field("id") > 321).map_batches(
        lambda b: {"id": b["id"], "y": pc.multiply(b["x"], 2)}
    )
    assert ds.to_arrow(engine=SparkEngine(spark, partitions=3)).equals(ds.to_arrow())
    pieces = [spark_plan.dumps_tasks(table.slice(i, 100)) for i in (0, 500)]
    assert all(len(p) < 4_000 for p in pieces)


def test_spark_parquet_writer(spark, inputs, tmp_path):
    ds = fl.read_parquet(inputs / "pq").filter(not_grey).map_batches(add_ratio)
    info = ds.write(tmp_path / "out", engine=SparkEngine(spark, writer="spark"), rows_per_shard=15)
    table = fl.open(tmp_path / "out").to_arrow()
    assert table.sort_by("id").equals(ds.to_arrow().sort_by("id"))
    assert all(s.rows <= 15 for s in fl.open(tmp_path / "out").manifest.shards)
    assert info.rows == table.num_rows and fl.verify(tmp_path / "out").rows == table.num_rows
    with pytest.raises(fl.ConfigurationError, match="writer='feedline'"):
        fl.read_images(inputs / "images").transform(fl.DecodeImages(size=4, on_error="skip")).write(
            tmp_path / "img", engine=SparkEngine(spark, writer="spark")
        )


def train_one_epoch(path: str, out: str) -> int:
    """Run by TorchDistributor in each of 2 processes: DDP over gloo, 1 epoch."""
    import torch
    import torch.distributed as dist

    import feedline as fl

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = fl.open(path).loader(batch_size=8, rank=rank, world_size=world, seed=5)
        seen = []
        for batch in loader:
            x = batch["id"].float().reshape(-1, 1)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), 2 * x).backward()
            optimizer.step()
            seen += batch["id"].tolist()
        with open(os.path.join(out, f"rank-{rank}.json"), "w") as handle:
            json.dump(seen, handle)
        del model, optimizer  # the reducer holds the group: release it while both ranks are up
        dist.barrier()
        return len(seen)
    finally:
        dist.destroy_process_group()


def test_torch_distributor_trains_on_disjoint_equal_shards(spark, tmp_path):
    pytest.importorskip("torch")
    from pyspark.ml.torch.distributor import TorchDistributor

    fl.range(64).write(tmp_path / "ds", engine=SparkEngine(spark))
    out = tmp_path / "seen"
    out.mkdir()
    distributor = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False)
    assert distributor.run(train_one_epoch, str(tmp_path / "ds"), str(out)) == 32
    shards = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == 32
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(64))


def test_spark_session_helper_sets_local_defaults(spark):
    assert os.environ.get("SPARK_LOCAL_IP")  # 127.0.0.1 unless the caller chose one
    assert os.environ.get("PYSPARK_PYTHON")
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.ui.enabled") == "false"


def test_spark_writer_manifest_schema_agrees_with_its_shards(spark, tmp_path):
    """timestamp[s] (Parquet stores ms), date64 and a pandas frame whose string column became
    integer codes: the manifest records the written types with true pandas metadata, every
    shard is the same once stored, and every reader gets the data back."""
    import datetime as dt

    import pandas as pd

    from feedline.arrow.parquet_types import same_stored_schema

    seconds = [dt.datetime(2024, 1, 1, 10, 0, s) for s in range(12)]
    frame = pd.DataFrame({"id": range(12), "cat": ["a", "b", "c"] * 4})
    data = (
        fl.from_pandas(frame)
        .transform(fl.StringIndexer("cat"))
        .map_batches(
            lambda b: b.append_column(
                "t", pa.array(seconds, pa.timestamp("s")).take(b["id"])
            ).append_column(
                "d", pc.cast(pc.cast(b["id"], pa.int32()), pa.date32()).cast(pa.date64())
            )
        )
    )
    out = tmp_path / "ds"
    data.write(out, engine=SparkEngine(spark), rows_per_shard=5)
    ds = fl.open(out)
    schema = ds.manifest.schema
    assert schema.field("t").type == pa.timestamp("s") and schema.field("d").type == pa.date64()
    for shard in ds.manifest.shards:
        assert same_stored_schema(pq.read_schema(out / shard.path), schema)
    back = ds.to_arrow().sort_by("id")
    assert back["t"].to_pylist() == seconds
    assert back["cat"].to_pylist() == data.to_arrow()["cat"].to_pylist()
    for got in (ds.to_pandas(), pd.read_parquet(out)):
        assert str(got["cat"].dtype) == "int64"
        assert sorted(got["id"]) == list(range(12))


def test_spark_write_to_s3_copies_no_shard_at_the_commit(engine, s3_proxy):
    """On an object store the executors write each shard under its final name: the commit
    is a manifest write, with no server-side copy (before: every shard renamed, i.e. copied)."""
    bucket, proxy = s3_proxy
    url = f"{bucket.url}/spark"
    options = bucket.storage_options
    fl.range(40).write(url, engine=engine, rows_per_shard=10, storage_options=options)
    assert proxy.copies == []
    ds = fl.open(url, storage_options=bucket.storage_options)
    assert sorted(ds.to_arrow()["id"].to_pylist()) == list(range(40))
    names = {p.rsplit("/", 1)[-1] for p in bucket.fs().ls(url, detail=False)}
    assert names == {"_feedline.json", "_versions", *(s.path for s in ds.manifest.shards)}
