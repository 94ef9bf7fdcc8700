"""Batch inference on Ray (``ray.init(num_cpus=2)``): an actor pool of ``concurrency``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import UserFunctionError
from feedline.plan.inference import Predictor, TorchPredictor

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")


pytestmark = [
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]


@pytest.fixture(scope="module")
def engine(ray_engine):
    """The Ray engine of tests/engines/conftest.py (this module travels by value)."""
    return ray_engine


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


def test_same_predictions_as_local_one_model_per_actor(engine, tmp_path) -> None:
    ds = (
        fl.range(400, rows_per_task=50)
        .map_batches(features)
        .map_batches(
            CountedTorch,
            batch_size=16,
            concurrency=2,
            device="cpu",
            passthrough=["id"],
            fn_constructor_kwargs={"folder": str(tmp_path / "built")},
        )
    )
    (tmp_path / "built").mkdir()
    local = ds.to_arrow(engine="local")
    for name in os.listdir(tmp_path / "built"):
        os.remove(tmp_path / "built" / name)
    got = ds.to_arrow(engine=engine)
    assert got["id"].to_pylist() == list(range(400))  # preserve_order
    np.testing.assert_allclose(
        got["y"].combine_chunks().to_numpy_ndarray(),
        local["y"].combine_chunks().to_numpy_ndarray(),
        rtol=1e-6,
    )
    built = os.listdir(tmp_path / "built")
    pids = {name.split("-")[1] for name in built}
    assert len(built) == 2 == len(pids)  # concurrency=2: two actors, one model each
    assert str(os.getpid()) not in pids

    info = ds.write(tmp_path / "out", engine=engine)
    back = fl.open(tmp_path / "out").to_arrow().sort_by("id")
    assert info.rows == 400 and back["id"].to_pylist() == list(range(400))
    np.testing.assert_allclose(
        back["y"].combine_chunks().to_numpy_ndarray(),
        local["y"].combine_chunks().to_numpy_ndarray(),
        rtol=1e-6,
    )


class Broken(Predictor):
    def __call__(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        raise ZeroDivisionError("model exploded")


def test_a_failing_model_names_the_class(engine) -> None:
    ds = fl.range(100, rows_per_task=50).map_batches(Broken, batch_size=10, concurrency=1)
    with pytest.raises(UserFunctionError, match=r"class .*Broken given to map_batches raised"):
        ds.to_arrow(engine=engine)


class BadInit:
    def __init__(self) -> None:
        raise OSError("weights.pt not found")

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch


def test_a_failing_constructor_names_the_class(engine) -> None:
    ds = fl.range(100, rows_per_task=50).map_batches(
        BadInit, concurrency=1, output_schema=pa.schema({"id": pa.int64()})
    )
    with pytest.raises(UserFunctionError, match=r"Constructing .*BadInit\(\) raised OSError"):
        ds.to_arrow(engine=engine)


class Called(TorchPredictor):
    """The torch model, leaving one file per construction (``built-<pid>-<uuid>``)."""

    def __init__(self, folder: str, device: str | None = None) -> None:
        Path(folder, f"built-{os.getpid()}-{uuid.uuid4().hex}").touch()
        super().__init__(make_linear, ["a", "b", "c"], "y", device)


def test_one_shard_feeds_every_replica_and_no_model_is_built_on_the_driver(
    engine, tmp_path
) -> None:
    """A one-shard dataset is one read task: it is read in 2 shares, one input per actor of
    ``concurrency=2`` (before: one input, one busy actor, "the operator only received 1
    input"), with the same rows in the same order; the write learns its schema in a Ray
    task, so the model is never built in the driver's process (before: once, for a 16-row
    sample)."""
    fl.range(600, rows_per_task=600).map_batches(features).write(tmp_path / "one")
    assert len(fl.open(tmp_path / "one").manifest.shards) == 1
    built = tmp_path / "built"
    built.mkdir()
    ds = fl.open(tmp_path / "one").map_batches(
        Called,
        batch_size=16,
        concurrency=2,
        device="cpu",
        passthrough=["id"],
        fn_constructor_kwargs={"folder": str(built)},
    )
    rds = ds.to_ray(engine=engine).materialize()
    stats = rds.stats()
    line = next(row for row in stats.splitlines() if "ActorStage" in row and "executed" in row)
    assert int(line.split(":", 1)[1].split("tasks executed")[0].strip()) >= 2, stats
    assert rds.count() == 600

    for name in os.listdir(built):
        os.remove(built / name)
    info = ds.write(tmp_path / "out", engine=engine)
    pids = {name.split("-")[1] for name in os.listdir(built)}
    assert pids and str(os.getpid()) not in pids  # built in Ray's workers only
    back = fl.open(tmp_path / "out").to_arrow().sort_by("id")
    assert info.rows == 600 and back["id"].to_pylist() == list(range(600))
    local = ds.to_arrow(engine="local")
    np.testing.assert_allclose(
        back["y"].combine_chunks().to_numpy_ndarray(),
        local["y"].combine_chunks().to_numpy_ndarray(),
        rtol=1e-6,
    )
