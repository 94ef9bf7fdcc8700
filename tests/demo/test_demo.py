"""``feedline demo`` end to end at the small size: metrics beat baselines, skips reported,
predictions written, MLflow runs recorded, charts drawn."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from rich.console import Console

import feedline as fl
from feedline.cli.main import main
from feedline.demo import run_demo
from feedline.demo.catalog import is_heldout, key_of, retrieval
from feedline.demo.pipelines import write_catalog
from feedline.demo.synthetic import make_catalog

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("demo")
    buffer = io.StringIO()
    summary = run_demo(out, size="small", console=Console(file=buffer, width=140))
    return summary, buffer.getvalue()


def test_losses_fall_and_metrics_beat_the_baselines(demo) -> None:
    summary, _ = demo
    catalog, diamonds = summary.results["catalog"], summary.results["diamonds"]
    for result in (catalog, diamonds):
        assert len(result.epochs) == 4
        assert result.epochs[-1].loss < 0.8 * result.epochs[0].loss
        assert all(e.samples_per_s > 0 and 0 <= e.data_wait <= 1 for e in result.epochs)
    assert 0.01 < catalog.baseline < 0.06  # chance among 50 candidates (with look-alikes)
    assert catalog.epochs[-1].metric >= 5 * catalog.baseline
    assert catalog.epochs[-1].extra["zero_shot_acc"] > 0.2  # 8 balanced classes: ~0.125
    assert diamonds.epochs[-1].metric >= 0.8  # R²; predicting the training mean gives 0
    assert diamonds.epochs[-1].extra["rmse"] < 0.5 * diamonds.epochs[-1].extra["baseline_rmse"]


def test_corrupt_images_skipped_and_reported_with_paths(demo) -> None:
    summary, printed = demo
    catalog = summary.results["catalog"]
    raw = summary.out / "raw" / "catalog"
    corrupt = {str((raw / p).resolve()) for p in _corrupt_files(raw)}
    assert len(corrupt) == 15  # 1% of 1,500
    assert {s["where"] for s in catalog.skipped} == corrupt
    assert all(s["reason"] for s in catalog.skipped)
    assert catalog.train_rows + catalog.heldout_rows + len(corrupt) == 1500
    flat = printed.replace("\n", "")
    assert "skipped 15 record(s)" in printed
    for path in sorted(corrupt)[:3]:
        assert path in flat
    stored = fl.open(summary.out / "datasets" / "catalog-train").manifest
    assert stored.rows == catalog.train_rows
    assert summary.results["diamonds"].skipped == []


def _corrupt_files(raw: Path) -> list[str]:
    from PIL import Image

    bad = []
    for path in sorted((raw / "images").iterdir()):
        try:
            with Image.open(path) as image:
                image.load()
        except Exception:  # noqa: BLE001 - any Pillow failure means corrupt
            bad.append(f"images/{path.name}")
    return bad


def test_the_split_is_deterministic_and_disjoint(demo) -> None:
    summary, _ = demo
    train = fl.open(summary.out / "datasets" / "diamonds-train").to_arrow()["id"]
    held = fl.open(summary.out / "datasets" / "diamonds-heldout").to_arrow()["id"]
    assert not set(train.to_pylist()) & set(held.to_pylist())
    assert all(is_heldout(pa.record_batch({"id": held.combine_chunks()})).to_pylist())
    assert not any(is_heldout(pa.record_batch({"id": train.combine_chunks()})).to_pylist())


def test_predictions_written_one_row_per_heldout_sample(demo) -> None:
    summary, _ = demo
    for name in ("catalog", "diamonds"):
        result = summary.results[name]
        held = fl.open(summary.out / "datasets" / f"{name}-heldout").to_arrow()
        predicted = fl.open(result.predictions, verify=True).to_arrow()
        assert predicted.num_rows == result.prediction_rows == held.num_rows
        assert sorted(predicted["id"].to_pylist()) == sorted(held["id"].to_pylist())
    catalog = _sorted(Path(summary.results["catalog"].predictions))
    img = catalog["image_emb"].combine_chunks().to_numpy_ndarray()
    txt = catalog["text_emb"].combine_chunks().to_numpy_ndarray()
    assert img.shape == txt.shape == (catalog.num_rows, 64)
    np.testing.assert_allclose(np.linalg.norm(img, axis=1), 1.0, rtol=1e-4)
    keys = [key_of(d) for d in catalog["description"].to_pylist()]
    recall, _ = retrieval(img, txt, keys, 50)
    assert recall == pytest.approx(summary.results["catalog"].prediction_metric)
    # the same model: batch inference agrees with the evaluation inside the training loop
    assert recall == pytest.approx(summary.results["catalog"].epochs[-1].metric, abs=0.02)
    diamonds = summary.results["diamonds"]
    assert diamonds.prediction_metric == pytest.approx(diamonds.epochs[-1].metric, abs=1e-3)


def test_mlflow_runs_datasets_and_metrics(demo) -> None:
    mlflow = pytest.importorskip("mlflow")
    summary, printed = demo
    assert summary.mlflow_uri and summary.mlflow_uri.startswith("file://")
    assert "mlflow ui --backend-store-uri" in printed.replace("\n", "")
    client = mlflow.MlflowClient(tracking_uri=summary.mlflow_uri)
    experiment = client.get_experiment_by_name("feedline-demo")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"catalog-clip", "diamonds-regressor"}
    for name, run in runs.items():
        inputs = {d.dataset.name for d in run.inputs.dataset_inputs}
        prefix = name.split("-")[0]
        assert inputs == {f"{prefix}-train", f"{prefix}-heldout"}
        losses = client.get_metric_history(run.info.run_id, "loss")
        assert [m.step for m in sorted(losses, key=lambda m: m.step)] == [0, 1, 2, 3]
        loader_metrics = client.get_metric_history(run.info.run_id, "loader/samples_per_s")
        assert len(loader_metrics) == 4
    assert runs["diamonds-regressor"].data.metrics["predictions_r2"] >= 0.8


def test_loader_charts_are_pngs(demo) -> None:
    summary, printed = demo
    for result in summary.results.values():
        assert result.chart is not None
        assert Path(result.chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert result.chart in printed.replace("\n", "")


def test_summary_table_printed(demo) -> None:
    _, printed = demo
    assert "feedline demo: summary" in printed
    assert "held-out metric" in printed and "trivial baseline" in printed


def test_bad_options_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        run_demo(tmp_path, size="huge")
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        run_demo(tmp_path, engine="dask")
    with pytest.raises(fl.ConfigurationError, match="at least 1 epoch"):
        run_demo(tmp_path, epochs=0)
    assert main(["demo", "--out", str(tmp_path / "o"), "--rows", "100"]) == 2
    assert "200 products" in capsys.readouterr().err
    assert not (tmp_path / "o" / "datasets").exists()
    with pytest.raises(SystemExit):
        main(["demo", "--engine", "dask"])


@pytest.fixture(scope="module")
def engines_cleanup():
    """Stop the Spark session / Ray this module started (other modules start their own)."""
    import ray
    from pyspark.sql import SparkSession

    spark_before, ray_before = SparkSession.getActiveSession(), ray.is_initialized()
    yield
    session = SparkSession.getActiveSession()
    if session is not None and spark_before is None:
        session.stop()
    if ray.is_initialized() and not ray_before:
        ray.shutdown()


def _sorted(path: Path) -> pa.Table:
    table = fl.open(path).to_arrow()
    return table.take(pc.sort_indices(table["id"]))


@pytest.mark.spark
@pytest.mark.ray
@pytest.mark.parametrize("engine", ["spark", "ray"])
def test_preprocessing_same_rows_on_spark_and_ray(engine, engines_cleanup, tmp_path) -> None:
    """``feedline demo --engine spark|ray``: the catalog pipeline (callable filters,
    map_batches, a chain fitted on the engine, image reads, skipped corrupt images) writes
    the same rows and reports the same skips as on the local engine."""
    catalog = make_catalog(300, seed=5, path=tmp_path / "raw")
    console = Console(file=io.StringIO())
    local = write_catalog(catalog, tmp_path / "local", "local", console)
    other = write_catalog(catalog, tmp_path / engine, engine, console)
    assert len(local[3]) == len(catalog.corrupt) == 3
    assert {s["where"] for s in other[3]} == {s["where"] for s in local[3]}
    for split in ("train", "heldout"):
        a, b = _sorted(local[0][split]), _sorted(other[0][split])
        assert a.schema.names == b.schema.names and a.num_rows == b.num_rows > 0
        for name in a.schema.names:
            x, y = a[name].combine_chunks(), b[name].combine_chunks()
            if isinstance(x.type, pa.FixedShapeTensorType):
                np.testing.assert_array_equal(x.to_numpy_ndarray(), y.to_numpy_ndarray())
            elif pa.types.is_floating(x.type):
                np.testing.assert_allclose(x.to_numpy(), y.to_numpy(), rtol=1e-9)
            else:
                assert x.equals(y), name
