"""MLflow tracking against a real local file store: dataset inputs, artifacts, loader metrics."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.tracking import dataset_digest, local_store, log_dataset

mlflow = pytest.importorskip("mlflow")  # imported once for the module (a few seconds)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh MLflow file store in ``tmp_path``; the process's tracking state is restored."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # restored (unset) afterwards
    uri = local_store(tmp_path / "mlruns")
    mlflow.set_tracking_uri(uri)
    yield tmp_path / "mlruns"
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A feedline dataset with fitted preprocessors (their state is in the manifest)."""
    rng = np.random.default_rng(0)
    table = pa.table({
        "price": rng.normal(50, 10, 500),
        "category": rng.choice(["a", "b", "c"], 500),
        "vec": pa.FixedShapeTensorArray.from_numpy_ndarray(rng.random((500, 2, 2), np.float32)),
    })  # fmt: skip
    ds = fl.from_arrow(table).transform(
        fl.Chain([fl.StandardScaler("price"), fl.StringIndexer("category")])
    )
    ds.write(tmp_path / "train", rows_per_shard=200)
    return tmp_path / "train"


def _files(folder: Path) -> list[Path]:
    return [Path(root, f) for root, _, files in os.walk(folder) for f in files]


def test_local_store_is_a_usable_file_store(store: Path) -> None:
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert (store / "0" / "meta.yaml").exists()  # the default experiment is laid out
    assert mlflow.get_tracking_uri() == store.resolve().as_uri()
    with mlflow.start_run() as run:
        mlflow.log_param("a", 1)
    assert mlflow.MlflowClient().get_run(run.info.run_id).data.params == {"a": "1"}
    assert local_store(store) == store.resolve().as_uri()  # again: the runs are kept
    assert mlflow.MlflowClient().get_run(run.info.run_id).info.status == "FINISHED"


def test_log_dataset_records_digest_source_schema_rows_and_preprocessors(
    store: Path, written: Path
) -> None:
    ds = fl.open(written)
    manifest = ds.manifest
    assert manifest.preprocessors, "the fixture must store fitted preprocessor state"
    with mlflow.start_run() as run:
        log_dataset(ds, name="train")
    got = mlflow.MlflowClient().get_run(run.info.run_id)
    (entry,) = got.inputs.dataset_inputs
    dataset = entry.dataset
    assert dataset.name == "train"
    assert dataset.digest == dataset_digest(manifest) == ds.plan.source.fingerprint()
    assert dataset.source_type == "local"
    assert json.loads(dataset.source) == {"uri": str(written.resolve())}
    profile = json.loads(dataset.profile)
    assert profile["num_rows"] == 500 and profile["num_shards"] == 3
    columns = {c["name"]: c for c in json.loads(dataset.schema)["mlflow_colspec"]}
    assert set(columns) == {"price", "category", "vec"}
    assert columns["price"]["type"] == "double" and columns["vec"]["type"] == "array"
    assert {t.key: t.value for t in entry.tags} == {"mlflow.data.context": "training"}
    source = mlflow.data.get_source(entry)  # MLflow can resolve it back
    assert source.uri == str(written.resolve())

    artifacts = Path(got.info.artifact_uri.removeprefix("file://"))
    stored = json.loads((artifacts / "feedline/train/preprocessors.json").read_text())
    assert stored == {"preprocessors": manifest.preprocessors}
    lineage = json.loads((artifacts / "feedline/train/lineage.json").read_text())
    assert lineage["lineage"] == manifest.lineage and lineage["source"] == str(written.resolve())
    # never the data: no Parquet or shard file anywhere in the store, only small JSON artifacts
    everything = _files(store)
    assert not [p for p in everything if p.suffix == ".parquet" or p.name.startswith("part-")]
    assert sorted(p.name for p in _files(artifacts)) == ["lineage.json", "preprocessors.json"]
    assert sum(p.stat().st_size for p in _files(artifacts)) < 20_000


def test_log_dataset_by_path_to_a_given_run_with_context(store: Path, written: Path) -> None:
    with mlflow.start_run() as run:
        pass  # the run has ended: log to it by id
    log_dataset(str(written), run=run.info.run_id, context="validation")
    (entry,) = mlflow.MlflowClient().get_run(run.info.run_id).inputs.dataset_inputs
    assert entry.dataset.name == "train"  # the folder's name by default
    assert {t.key: t.value for t in entry.tags} == {"mlflow.data.context": "validation"}
    assert entry.dataset.digest == dataset_digest(fl.open(written).manifest)


def test_the_digest_changes_with_the_data(store: Path, tmp_path: Path) -> None:
    a = fl.open(fl.range(10).write(tmp_path / "a").path).manifest
    b = fl.open(fl.range(11).write(tmp_path / "b").path).manifest
    again = fl.open(fl.range(10).write(tmp_path / "c").path).manifest
    assert dataset_digest(a) != dataset_digest(b)
    assert dataset_digest(a) == dataset_digest(again)  # same bytes, same digest


def test_log_dataset_refuses_what_it_cannot_log_and_logs_nothing(
    store: Path, written: Path, tmp_path: Path
) -> None:
    with pytest.raises(fl.ConfigurationError, match=r"no active MLflow run.*|none is active"):
        log_dataset(written)
    with mlflow.start_run() as run:
        with pytest.raises(fl.FormatError, match=r"not a written feedline dataset.*Fix:"):
            log_dataset(fl.range(5))  # computed, no manifest
        import pyarrow.parquet as pq

        (tmp_path / "plain").mkdir()
        pq.write_table(pa.table({"x": [1]}), tmp_path / "plain" / "p.parquet")
        with pytest.raises(fl.FormatError, match="Fix:"):
            log_dataset(tmp_path / "plain")  # a Parquet folder without a manifest
        with pytest.raises(fl.ConfigurationError, match="Fix:"):
            log_dataset(42)  # type: ignore[arg-type]
    with pytest.raises(fl.ConfigurationError, match=r"no MLflow run 'nope'.*Fix:"):
        log_dataset(written, run="nope")
    assert not mlflow.MlflowClient().get_run(run.info.run_id).inputs.dataset_inputs


def test_track_logs_one_value_per_epoch_with_step_epoch(store: Path, written: Path) -> None:
    with mlflow.start_run() as run:
        loader = fl.open(written).loader(
            batch_size=50, format="numpy", columns=["price"], track=True
        )
        for epoch in range(3):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        loader.set_epoch(3)
        for i, _ in enumerate(loader):  # an abandoned epoch is not logged
            if i == 2:
                break
    client = mlflow.MlflowClient()
    metrics = loader.metrics()
    assert [m["epoch"] for m in metrics] == [0, 1, 2, 3]
    for key in ("samples_per_s", "data_wait_fraction", "batches", "samples", "seconds"):
        history = client.get_metric_history(run.info.run_id, f"loader/{key}")
        assert sorted(h.step for h in history) == [0, 1, 2], key
        by_step = {h.step: h.value for h in history}
        for m in metrics[:3]:
            assert by_step[m["epoch"]] == pytest.approx(m[key], rel=1e-9), key
    samples = client.get_metric_history(run.info.run_id, "loader/samples")
    assert {h.value for h in samples} == {500 // 50 * 50}
    fractions = client.get_metric_history(run.info.run_id, "loader/data_wait_fraction")
    assert all(0 <= h.value <= 1 for h in fractions)


def test_track_needs_a_run(store: Path, written: Path) -> None:
    with pytest.raises(fl.ConfigurationError, match=r"none is active.*Fix:"):
        fl.open(written).loader(batch_size=10, track=True)
    with pytest.raises(fl.ConfigurationError, match=r"no MLflow run 'missing'.*Fix:"):
        fl.open(written).loader(batch_size=10, track="missing")
    with pytest.raises(fl.ConfigurationError, match=r"track=.*Fix:"):
        fl.open(written).loader(batch_size=10, track=1)  # type: ignore[arg-type]
    assert mlflow.active_run() is None  # no run was started behind the caller's back


def test_track_by_run_id_outside_the_run(store: Path, written: Path) -> None:
    with mlflow.start_run() as run:
        pass
    loader = fl.open(written).loader(batch_size=100, format="numpy", track=run.info.run_id)
    assert len(list(loader)) == 5
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "loader/batches")
    assert [(h.step, h.value) for h in history] == [(0, 5.0)]


def test_log_dataset_on_object_storage(store: Path, s3_bucket) -> None:
    url = f"{s3_bucket.url}/train"
    fl.range(100).write(url, storage_options=s3_bucket.storage_options)
    with mlflow.start_run() as run:
        log_dataset(url, storage_options=s3_bucket.storage_options)
    (entry,) = mlflow.MlflowClient().get_run(run.info.run_id).inputs.dataset_inputs
    assert entry.dataset.source_type == "s3"
    assert json.loads(entry.dataset.source) == {"uri": url}
    assert json.loads(entry.dataset.profile)["num_rows"] == 100
    opened = fl.open(url, storage_options=s3_bucket.storage_options)
    assert entry.dataset.digest == dataset_digest(opened.manifest)
    assert not [p for p in _files(store) if p.suffix == ".parquet"]


def test_without_mlflow_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    with pytest.raises(fl.MissingDependencyError, match=r"feedline\[mlflow\]"):
        fl.range(5).loader(batch_size=5, track=True)
    with pytest.raises(fl.MissingDependencyError, match=r"feedline\[mlflow\]"):
        log_dataset("anything")
