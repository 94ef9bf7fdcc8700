"""The Ray engine against the local engine, on a real local Ray (``ray.init(num_cpus=2)``).

One Ray runtime is started for the whole module (about 5 s) and shut down at its end.
Functions and classes defined here are shipped to the Ray workers by value (the workers
cannot import this test module).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.engines.protocol import get_engine
from feedline.errors import UserFunctionError

ray = pytest.importorskip("ray")
PIL = pytest.importorskip("PIL.Image")

pytestmark = [
    pytest.mark.ray,
    # Ray deep-copies its DataContext per dataset, touching its own deprecated fields
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]

from feedline.dataset.from_memory import from_ray  # noqa: E402
from feedline.engines.ray.stages import needs_actor  # noqa: E402
from feedline.plan.plan import Transform  # noqa: E402


@pytest.fixture(scope="module")
def engine(ray_engine):
    """The Ray engine of tests/engines/conftest.py (this module travels by value)."""
    return ray_engine


# ---------------------------------------------------------------------------- inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """CSV and Parquet tables keyed by ``image_id`` and a folder of images (one corrupt)."""
    root = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    n = 24
    ids = np.arange(n)
    weight = np.round(rng.uniform(0.5, 5.0, n), 3)
    breeds = [["tabby", "siamese", "lab", "pug"][i % 4] for i in ids]
    (root / "csv").mkdir()
    for part, rows in enumerate((ids[:14], ids[14:])):
        lines = ["image_id,weight,breed"]
        lines += [f"{i},{weight[i]},{breeds[i]}" for i in rows]
        (root / "csv" / f"meta-{part}.csv").write_text("\n".join(lines) + "\n")
    (root / "pq").mkdir()
    for part, rows in enumerate((ids[:8], ids[8:16], ids[16:])):
        table = pa.table(
            {
                "image_id": pa.array(rows, pa.int64()),
                "weight": weight[rows],
                "breed": [breeds[i] for i in rows],
            }
        )
        pq.write_table(table, root / "pq" / f"meta-{part}.parquet")
    for label in ("cats", "dogs"):
        (root / "images" / label).mkdir(parents=True)
    for i in ids:
        label = "cats" if i % 2 == 0 else "dogs"
        pixels = rng.integers(0, 256, (10 + i % 3, 12, 3), dtype=np.uint8)
        PIL.fromarray(pixels).save(root / "images" / label / f"{i:03d}.png")
    (root / "images" / "dogs" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    return root


class AttachMeta:
    """A "model": loads the metadata tables once (per actor) and joins them to each batch."""

    def __init__(self, csv_dir: str, parquet_dir: str, marker_dir: str | None = None):
        if marker_dir is not None:  # one file per construction
            Path(marker_dir, uuid.uuid4().hex).write_text(str(os.getpid()))
        weights = fl.read_csv(csv_dir).to_arrow()
        breeds = fl.read_parquet(parquet_dir).to_arrow()
        self.weight = dict(
            zip(weights["image_id"].to_pylist(), weights["weight"].to_pylist(), strict=True)
        )
        self.breed = dict(
            zip(breeds["image_id"].to_pylist(), breeds["breed"].to_pylist(), strict=True)
        )

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        stems = [Path(p).stem for p in batch["path"].to_pylist()]
        ids = [int(s) if s.isdigit() else -1 for s in stems]
        return (
            batch.append_column("image_id", pa.array(ids, pa.int64()))
            .append_column("weight", pa.array([self.weight.get(i, 9.9) for i in ids]))
            .append_column("breed", pa.array([self.breed.get(i, "mutt") for i in ids]))
        )


def heavier_than_one(batch: pa.RecordBatch) -> pa.Array:
    return pc.greater(batch["weight"], 1.0)


def image_pipeline(inputs: Path, marker_dir: str | None = None) -> fl.Dataset:
    return (
        fl.read_images(inputs / "images")
        .map_batches(
            AttachMeta,
            batch_size=5,
            concurrency=1,
            fn_constructor_kwargs={
                "csv_dir": str(inputs / "csv"),
                "parquet_dir": str(inputs / "pq"),
                "marker_dir": marker_dir,
            },
        )
        .filter(heavier_than_one)
        .filter(pc.field("breed") != "pug")
    )


def preprocessing() -> fl.Chain:
    return fl.Chain(
        [
            fl.DecodeImages("bytes", size=(8, 8), on_error="skip"),
            fl.StandardScaler("weight"),
            fl.StringIndexer(["label", "breed"]),
        ]
    )


def add_ratio(batch: pa.RecordBatch) -> dict:
    ratio = pc.divide(batch["weight"], pc.add(batch["image_id"], 1))
    return {
        "image_id": batch["image_id"],
        "weight": batch["weight"],
        "ratio": ratio,
        "breed": batch["breed"],
    }


def sorted_table(path: Path, key: str) -> pa.Table:
    table = fl.open(path).to_arrow()
    return table.sort_by(key)


# ---------------------------------------------------------------------------- same results


def test_registry_resolves_ray(engine):
    assert type(get_engine("ray")).__name__ == "RayEngine"


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_tabular_pipeline_same_rows_schema_and_fit(engine, inputs, tmp_path, kind):
    read = fl.read_csv if kind == "csv" else fl.read_parquet
    base = (
        read(inputs / ("csv" if kind == "csv" else "pq"))
        .filter(pc.field("image_id") >= 2)
        .filter(heavier_than_one)
        .map_batches(add_ratio, batch_size=3)
    )
    tokenizers = pytest.importorskip("tokenizers")
    Tokenizer, models, pre_tokenizers = (
        tokenizers.Tokenizer,
        tokenizers.models,
        tokenizers.pre_tokenizers,
    )

    vocab = {"[PAD]": 0, "[UNK]": 1, "tabby": 2, "siamese": 3, "lab": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    steps = [
        fl.Tokenize("breed", str(tmp_path / "tokenizer.json"), max_length=3, output="tokens"),
        fl.StandardScaler(["weight", "ratio"]),
        fl.StringIndexer("breed"),
    ]
    # the tokenizer is heavy per-worker state: the chain runs in a Ray actor pool
    assert needs_actor(Transform(fl.Chain(steps)))
    fitted_ray = fl.Chain(steps).fit(base, engine=engine)
    fitted_local = fl.Chain(steps).fit(base, engine="local")
    ray_state, local_state = fitted_ray.state, fitted_local.state
    assert json.dumps(ray_state, sort_keys=True) == json.dumps(local_state, sort_keys=True)

    info_ray = base.transform(fitted_ray).write(tmp_path / "ray", engine=engine)
    info_local = base.transform(fitted_local).write(tmp_path / "local")
    assert info_ray.engine == "ray" and info_ray.rows == info_local.rows > 0
    a, b = sorted_table(tmp_path / "ray", "image_id"), sorted_table(tmp_path / "local", "image_id")
    assert a.equals(b)
    assert a.schema.field("tokens").type == pa.fixed_shape_tensor(pa.int32(), [3])
    ray_manifest = fl.open(tmp_path / "ray").manifest
    local_manifest = fl.open(tmp_path / "local").manifest
    assert ray_manifest.schema.equals(local_manifest.schema)
    assert ray_manifest.lineage["engine"] == "ray"
    assert ray_manifest.preprocessors == local_manifest.preprocessors
    for counter in ("files_read", "rows_read", "rows_out", "function_calls"):
        assert info_ray.report[counter] == info_local.report[counter], counter
    fl.verify(tmp_path / "ray")


def test_image_pipeline_with_actor_class_and_skipped_image(engine, inputs, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    upstream = image_pipeline(inputs, str(markers))
    chain_ray = preprocessing().fit(upstream, engine=engine)
    chain_local = preprocessing().fit(image_pipeline(inputs), engine="local")
    assert chain_ray.state == chain_local.state
    for marker in markers.iterdir():
        marker.unlink()

    info_ray = upstream.transform(chain_ray).write(tmp_path / "ray", engine=engine)
    # the class ran in an actor pool of one actor: constructed once there for the write,
    # and once in a Ray task where the output schema is learned from 16 rows (never on the
    # driver: issue 24, item 12)
    pids = [int(marker.read_text()) for marker in markers.iterdir()]
    assert len(pids) == 2 and os.getpid() not in pids
    info_local = image_pipeline(inputs).transform(chain_local).write(tmp_path / "local")

    a, b = sorted_table(tmp_path / "ray", "path"), sorted_table(tmp_path / "local", "path")
    assert a.num_rows == b.num_rows > 0
    assert a.equals(b)
    assert a.schema.field("bytes").type == pa.fixed_shape_tensor(pa.uint8(), [8, 8, 3])
    assert not any(p.endswith("broken.png") for p in a["path"].to_pylist())
    ray_manifest = fl.open(tmp_path / "ray").manifest
    local_manifest = fl.open(tmp_path / "local").manifest
    assert ray_manifest.schema.equals(local_manifest.schema)
    assert ray_manifest.preprocessors == local_manifest.preprocessors
    # the corrupt image is skipped and counted the same way on both engines
    for info in (info_ray, info_local):
        assert info.report["records_skipped"] == 1
        assert info.report["skipped"][0]["where"].endswith("broken.png")
    assert info_ray.report["skipped"] == info_local.report["skipped"]
    assert ray_manifest.write["report"]["records_skipped"] == 1


def test_execute_keeps_order_limits_and_the_global_context(engine, inputs):
    before = ray.data.DataContext.get_current().execution_options.preserve_order
    ds = fl.read_csv(inputs / "csv").map_batches(add_ratio, batch_size=4)
    assert ds.to_arrow(engine=engine).equals(ds.to_arrow())  # same order, not only rows
    limited = ds.limit(17).map_batches(add_ratio, batch_size=5).limit(9)
    assert limited.to_arrow(engine=engine).equals(limited.to_arrow())
    assert ray.data.DataContext.get_current().execution_options.preserve_order == before
    report = ds.analyze(engine=engine)
    assert report.rows_read == 24 and report.files_read == 2 and report.rows_out == 24


def test_rows_per_shard_gives_the_local_shard_layout(engine, inputs, tmp_path):
    ds = fl.read_parquet(inputs / "pq")
    ds.write(tmp_path / "ray", engine=engine, rows_per_shard=10, row_group_rows=4)
    ds.write(tmp_path / "local", rows_per_shard=10, row_group_rows=4)
    ray_shards = fl.open(tmp_path / "ray").manifest.shards
    local_shards = fl.open(tmp_path / "local").manifest.shards
    assert [s.rows for s in ray_shards] == [s.rows for s in local_shards] == [10, 10, 4]
    assert [s.row_groups for s in ray_shards] == [s.row_groups for s in local_shards]
    ray_id = fl.open(tmp_path / "ray").manifest.write["id"]
    assert [s.path for s in ray_shards] == [f"part-{i:05d}-{ray_id}.parquet" for i in range(3)]
    assert fl.open(tmp_path / "ray").to_arrow().equals(fl.open(tmp_path / "local").to_arrow())


# ---------------------------------------------------------------------------- bad input


def fails_on_late_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    if pc.max(batch["image_id"]).as_py() >= 20:
        raise ValueError("weights above 20 are not supported")
    return batch


def test_user_function_error_names_function_and_file(engine, inputs):
    ds = fl.read_csv(inputs / "csv").map_batches(fails_on_late_rows)
    with pytest.raises(UserFunctionError) as caught:
        ds.to_arrow(engine=engine)
    message = str(caught.value)
    assert "fails_on_late_rows" in message and "meta-1.csv" in message
    assert "ValueError: weights above 20" in message
    assert "RayTaskError" not in message and "Failed to apply UDF" not in message
    assert type(caught.value) is UserFunctionError  # not Ray's RayTaskError(...) dual class
    assert "fails_on_late_rows" in str(caught.value.__cause__)  # the worker's traceback


class Exploding:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if any(path.endswith("dogs/023.png") for path in batch["path"].to_pylist()):
            raise RuntimeError("model crashed")
        return batch


def test_failed_or_interrupted_write_leaves_no_manifest(engine, inputs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    fl.range(5).write(out)  # the previous dataset
    with pytest.raises(UserFunctionError, match=r"Exploding.*images"):
        fl.read_images(inputs / "images").map_batches(Exploding, concurrency=1).write(
            out, engine=engine
        )
    assert fl.open(out).to_arrow()["id"].to_pylist() == [0, 1, 2, 3, 4]
    old_shards = [s.path for s in fl.open(out).manifest.shards]
    # the manifest, its version history and the old shards: nothing of the failed write
    assert sorted(p.name for p in out.iterdir()) == ["_feedline.json", "_versions", *old_shards]

    from feedline.store import dataset_files as fmt

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the driver dies after Ray wrote, before the commit

    monkeypatch.setattr(fmt, "commit", crash)
    with pytest.raises(KeyboardInterrupt):
        fl.read_parquet(inputs / "pq").write(out, engine=engine)
    monkeypatch.undo()
    assert fl.open(out).to_arrow()["id"].to_pylist() == [0, 1, 2, 3, 4]
    fresh = tmp_path / "fresh"
    with pytest.raises(UserFunctionError):
        fl.read_csv(inputs / "csv").map_batches(fails_on_late_rows).write(fresh, engine=engine)
    assert not (fresh / "_feedline.json").exists()


# ---------------------------------------------------------------------------- bridges


def with_tensor(batch: dict) -> dict:
    batch["vec"] = np.stack([batch["id"], batch["id"] * 2], axis=1).astype(np.float32)
    return batch


def test_from_ray_and_to_ray_round_trip(engine, tmp_path):
    rds = ray.data.range(40, override_num_blocks=4).map_batches(with_tensor)
    ds = (
        from_ray(rds)
        .filter(pc.field("id") >= 14)
        .map_batches(
            lambda b: b.append_column("half", pc.divide(pc.cast(b["id"], pa.float64()), 2))
        )
    )
    assert ds.schema().field("vec").type == pa.fixed_shape_tensor(pa.float32(), [2])
    ds.write(tmp_path / "ray", engine=engine)
    ds.write(tmp_path / "local")
    a, b = sorted_table(tmp_path / "ray", "id"), sorted_table(tmp_path / "local", "id")
    assert a.equals(b) and a.num_rows == 26
    assert a["vec"].combine_chunks().to_numpy_ndarray()[1].tolist() == [15.0, 30.0]

    back = fl.open(tmp_path / "ray").to_ray()
    assert isinstance(back, ray.data.Dataset)
    rows = pa.concat_tables(back.iter_batches(batch_format="pyarrow", batch_size=None))
    assert rows.sort_by("id").select(["id", "half"]).equals(a.select(["id", "half"]))
    lazy = fl.range(10).filter(pc.field("id") >= 7).to_ray()
    assert sorted(r["id"] for r in lazy.take_all()) == [7, 8, 9]


# ---------------------------------------------------------------------------- training


def train_loop(config: dict) -> None:
    """Ray Train worker: read this rank's shard of a feedline dataset and train 1 epoch."""
    import ray.train
    import torch

    import feedline as fl

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    loader = fl.open(config["path"]).loader(
        batch_size=8, shuffle=True, seed=3, rank=rank, world_size=world, format="torch"
    )
    loader.set_epoch(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for batch in loader:
        x = batch["x"].float().unsqueeze(1)
        loss = torch.nn.functional.mse_loss(model(x), 2 * x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += batch["id"].tolist()
    Path(config["out"], f"rank-{rank}.json").write_text(json.dumps(seen))
    ray.train.report({"rows": len(seen)})


def test_ray_train_workers_read_disjoint_equal_shards(engine, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    data = fl.range(96).map_batches(
        lambda b: b.append_column("x", pc.divide(pc.cast(b["id"], pa.float64()), 96))
    )
    data.write(tmp_path / "ds", engine=engine, rows_per_shard=40)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"path": str(tmp_path / "ds"), "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="feedline"),
    )
    result = trainer.fit()
    assert result.error is None
    seen = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == 48
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(96))


def test_ray_writer_manifest_schema_agrees_with_its_shards(engine, tmp_path):
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
    data.write(out, engine=engine, rows_per_shard=5)
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


def test_ray_write_to_s3_copies_no_shard_at_the_commit(engine, s3_proxy):
    """On an object store the write tasks write each shard under its final name: the commit
    is a manifest write, with no server-side copy (before: every shard renamed, i.e. copied)."""
    bucket, proxy = s3_proxy
    url = f"{bucket.url}/ray"
    options = bucket.storage_options
    fl.range(40).write(url, engine=engine, rows_per_shard=10, storage_options=options)
    assert proxy.copies == []
    ds = fl.open(url, storage_options=bucket.storage_options)
    assert ds.to_arrow()["id"].to_pylist() == list(range(40))
    names = {p.rsplit("/", 1)[-1] for p in bucket.fs().ls(url, detail=False)}
    assert names == {"_feedline.json", "_versions", *(s.path for s in ds.manifest.shards)}
