"""Batch inference on Spark (``local[2]``): the model is built once per Python worker."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, UserFunctionError
from feedline.plan.inference import Predictor, TorchPredictor

pytest.importorskip("pyspark")
torch = pytest.importorskip("torch")

from feedline.engines.spark.engine import SparkEngine  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.skipif(
        shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
        reason="Spark needs a Java runtime",
    ),
]


def make_linear() -> torch.nn.Module:
    """Fixed weights from a generator of its own (the global torch RNG is shared by the
    model stage's threads, so seeding it per model would race)."""
    layer = torch.nn.Linear(3, 2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(2, 3, generator=generator))
        layer.bias.copy_(torch.randn(2, generator=generator))
    return layer


def features(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    ids = batch["id"].to_numpy().astype(np.float64)
    return {"id": batch["id"], "a": ids / 100, "b": np.sin(ids), "c": np.cos(ids)}


class CountedTorch(TorchPredictor):
    """The torch model, leaving one file per construction: ``built-<pid>-<uuid>``."""

    def __init__(self, folder: str, device: str | None = None) -> None:
        Path(folder, f"built-{os.getpid()}-{uuid.uuid4().hex}").touch()
        super().__init__(make_linear, ["a", "b", "c"], "y", device)


def predictions(ds: fl.Dataset, folder: Path) -> fl.Dataset:
    return ds.map_batches(features).map_batches(
        CountedTorch,
        batch_size=16,
        concurrency=2,
        device="cpu",
        passthrough=["id"],
        fn_constructor_kwargs={"folder": str(folder)},
    )


def worker_pids(folder: Path) -> list[str]:
    driver = str(os.getpid())
    pids = [name.split("-")[1] for name in os.listdir(folder)]
    return [pid for pid in pids if pid != driver]


def test_same_predictions_as_local_model_built_once_per_worker(spark, tmp_path) -> None:
    (tmp_path / "built").mkdir()
    ds = predictions(fl.range(400, rows_per_task=50), tmp_path / "built")
    local = ds.to_arrow(engine="local")
    engine = SparkEngine(spark, partitions=8)
    got = ds.to_arrow(engine=engine).sort_by("id")
    assert got["id"].to_pylist() == list(range(400))
    np.testing.assert_allclose(
        got["y"].combine_chunks().to_numpy_ndarray(),
        local["y"].combine_chunks().to_numpy_ndarray(),
        rtol=1e-6,
    )
    info = ds.write(tmp_path / "out", engine=engine)  # a second job, same workers
    assert info.rows == 400
    back = fl.open(tmp_path / "out").to_arrow().sort_by("id")
    np.testing.assert_allclose(
        back["y"].combine_chunks().to_numpy_ndarray(),
        local["y"].combine_chunks().to_numpy_ndarray(),
        rtol=1e-6,
    )
    pids = worker_pids(tmp_path / "built")
    assert pids  # the model ran in the Python workers
    assert len(pids) == len(set(pids))  # 16 tasks, 2 jobs: no worker built it twice


class Broken(Predictor):
    def __call__(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        raise ZeroDivisionError("model exploded")


def test_a_failing_model_names_the_class(spark) -> None:
    ds = fl.range(100, rows_per_task=50).map_batches(
        Broken, batch_size=10, output_schema=pa.schema({"y": pa.float64()})
    )
    with pytest.raises(UserFunctionError, match=r"class .*Broken given to map_batches raised"):
        ds.to_arrow(engine=SparkEngine(spark))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here")
def test_cuda_on_a_cpu_worker_is_a_clear_error(spark, tmp_path) -> None:
    ds = fl.range(20).map_batches(
        CountedTorch,
        device="cuda",
        fn_constructor_kwargs={"folder": str(tmp_path)},
        output_schema=pa.schema({"y": pa.float32()}),  # so the driver does not build it
    )
    with pytest.raises(ConfigurationError, match=r"device='cuda'.*CUDA device.*Fix:"):
        ds.to_arrow(engine=SparkEngine(spark))
    assert os.listdir(tmp_path) == []
