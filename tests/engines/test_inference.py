"""Batch inference on the local engine: a model stage of its own, pipelined with the reads."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, UserFunctionError
from feedline.plan.inference import Predictor, TorchPredictor, add_passthrough

torch = pytest.importorskip("torch")

WEIGHTS = np.random.default_rng(0).normal(size=(3, 2))


def features(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """The preprocessing step: three features per id (runs in the read tasks)."""
    ids = batch["id"].to_numpy().astype(np.float64)
    return {"id": batch["id"], "f": np.stack([ids / 100, np.sin(ids), np.cos(ids)], axis=1)}


def expected(ids: np.ndarray) -> np.ndarray:
    f = np.stack([ids / 100, np.sin(ids), np.cos(ids)], axis=1)
    return f @ WEIGHTS


class Linear(Predictor):
    """A NumPy model recording its constructions and the batch sizes it sees."""

    built: ClassVar[list[str]] = []
    sizes: ClassVar[list[int]] = []

    def __init__(self, scale: float = 1.0, device: str | None = None) -> None:
        super().__init__(device)
        self.scale = scale
        type(self).built.append(threading.current_thread().name)

    def __call__(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        type(self).sizes.append(batch.num_rows)
        f = batch["f"].combine_chunks() if isinstance(batch["f"], pa.ChunkedArray) else batch["f"]
        return {"y": self.scale * (f.to_numpy_ndarray() @ WEIGHTS)}


@pytest.fixture(autouse=True)
def _reset() -> None:
    Linear.built = []
    Linear.sizes = []


def test_predictions_in_order_at_exact_batch_size(engine) -> None:
    ds = (
        fl.range(1000, rows_per_task=130)
        .map_batches(features)
        .map_batches(Linear, batch_size=64, concurrency=3, passthrough=["id"])
    )
    table = ds.to_arrow(engine=engine)
    assert table.column_names == ["id", "y"]
    assert table["id"].to_pylist() == list(range(1000))  # preserve_order: input order
    np.testing.assert_allclose(
        table["y"].combine_chunks().to_numpy_ndarray(), expected(np.arange(1000.0))
    )
    # re-cut across read tasks of 130 rows: all 64 but the last
    assert sorted(Linear.sizes) == [1000 % 64] + [64] * (1000 // 64)
    # one model per worker thread of the model stage, each built once
    assert sorted(Linear.built) == [f"feedline-Linear-{i}" for i in range(3)]


class SeededNet:
    """A model seeding torch's global generator in ``__init__``, then drawing its weights
    (a pause between the two, as a real model's layer construction takes time)."""

    built: ClassVar[list[str]] = []

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        time.sleep(0.05)  # other workers' constructors run here when not serialized
        self.net = torch.nn.Linear(3, 2)
        type(self).built.append(threading.current_thread().name)

    def __call__(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        with torch.no_grad():
            digest = float(self.net.weight.double().sum() + self.net.bias.double().sum())
        return {"id": batch["id"], "weights": np.full(batch.num_rows, digest)}


def test_seeded_models_get_the_same_weights_in_every_worker() -> None:
    # the local engine builds one copy per worker thread; constructed concurrently, the
    # copies' torch.manual_seed and weight draws interleaved and the workers disagreed
    expected_digest = SeededNet(0)(pa.record_batch({"id": [0]}))["weights"][0]
    for run in range(2):
        ds = fl.range(400, rows_per_task=25).map_batches(SeededNet, batch_size=25, concurrency=4)
        SeededNet.built = []
        digests = set(ds.to_arrow()["weights"].to_pylist())
        assert digests == {expected_digest}, run
        assert len(SeededNet.built) == 4  # one copy per worker


def test_fewer_batches_than_workers_build_fewer_models(engine) -> None:
    ds = fl.range(100).map_batches(features).map_batches(Linear, batch_size=60, concurrency=4)
    assert ds.count(engine=engine) == 100
    assert sorted(Linear.built) == ["feedline-Linear-0", "feedline-Linear-1"]  # 2 batches


def test_unordered_gives_the_same_rows(engine) -> None:
    ds = fl.range(500, rows_per_task=50).map_batches(features)
    ds = ds.map_batches(Linear, batch_size=32, concurrency=2, passthrough="id")
    table = pa.Table.from_batches(ds.iter_batches(preserve_order=False, engine=engine))
    table = table.sort_by("id")
    assert table["id"].to_pylist() == list(range(500))
    np.testing.assert_allclose(
        table["y"].combine_chunks().to_numpy_ndarray(), expected(np.arange(500.0))
    )
    assert len(Linear.built) == 2


def test_write_and_open(engine, tmp_path: Path) -> None:
    ds = (
        fl.range(300, rows_per_task=70)
        .map_batches(features)
        .map_batches(
            Linear, batch_size=50, fn_constructor_kwargs={"scale": 2.0}, passthrough=["id"]
        )
    )
    info = ds.write(tmp_path / "preds", engine=engine, rows_per_shard=100)
    assert info.rows == 300 and info.shards == 3
    back = fl.open(tmp_path / "preds").to_arrow()
    assert back.equals(ds.to_arrow(engine=engine))
    np.testing.assert_allclose(
        back["y"].combine_chunks().to_numpy_ndarray(), 2 * expected(np.arange(300.0))
    )


def test_limit_before_and_after_the_model(engine) -> None:
    base = fl.range(1000, rows_per_task=100).map_batches(features)
    before = base.limit(150).map_batches(Linear, batch_size=64, passthrough=["id"])
    assert before.to_arrow(engine=engine)["id"].to_pylist() == list(range(150))
    assert sorted(Linear.sizes) == [22, 64, 64]
    after = base.map_batches(Linear, batch_size=64, passthrough=["id"]).limit(10)
    assert after.to_arrow(engine=engine)["id"].to_pylist() == list(range(10))


def test_closing_early_stops_the_model_workers() -> None:
    ds = fl.range(10_000, rows_per_task=100).map_batches(features)
    engine = fl.LocalEngine(parallelism=2, memory_budget=1)  # a few batches in flight
    rows = ds.map_batches(Linear, batch_size=10, concurrency=2).take(3, engine=engine)
    assert len(rows) == 3
    deadline = time.monotonic() + 10
    while any(t.name.startswith("feedline-Linear") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "model stage threads are still running"
        time.sleep(0.01)
    assert len(Linear.sizes) < 100  # stopped long before the 1000 batches


# ----------------------------------------------------------------------------- pipelining


def test_reads_and_preprocessing_overlap_with_the_model() -> None:
    """One read thread: before the model stage existed, preprocessing and the model ran in
    that one thread, one after the other; now they run at the same time."""
    spans: dict[str, list[tuple[float, float]]] = {"pre": [], "model": []}

    def slow_preprocess(batch: pa.RecordBatch) -> pa.RecordBatch:
        start = time.perf_counter()
        time.sleep(0.02)
        spans["pre"].append((start, time.perf_counter()))
        return batch

    class SlowModel:
        def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
            start = time.perf_counter()
            time.sleep(0.02)
            spans["model"].append((start, time.perf_counter()))
            return batch

    ds = fl.range(160, rows_per_task=10).map_batches(slow_preprocess)
    ds = ds.map_batches(SlowModel, batch_size=10)
    assert ds.count(engine=fl.LocalEngine(parallelism=1)) == 160
    overlapping = [
        (p, m) for p in spans["pre"] for m in spans["model"] if p[0] < m[1] and m[0] < p[1]
    ]
    assert len(spans["pre"]) == len(spans["model"]) == 16
    assert len(overlapping) >= 8  # most model calls ran while the next batch was prepared
    model = sorted(spans["model"])  # concurrency=1: one model call at a time
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(model))


def test_the_model_queue_is_bounded() -> None:
    """With a tiny memory budget the reads wait for a slow model instead of running ahead."""
    events: list[str] = []
    lock = threading.Lock()

    def produced(batch: pa.RecordBatch) -> pa.RecordBatch:
        with lock:
            events.append("read")
        return batch

    class Slow:
        def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
            time.sleep(0.005)
            with lock:
                events.append("model")
            return batch

    ds = fl.range(400, rows_per_task=5).map_batches(produced).map_batches(Slow, batch_size=5)
    assert ds.count(engine=fl.LocalEngine(parallelism=2, memory_budget=1)) == 400
    ahead, worst = 0, 0
    for event in events:
        ahead += 1 if event == "read" else -1
        worst = max(worst, ahead)
    assert events.count("model") == 80
    assert worst <= 8  # 80 batches, but only a handful are ever waiting for the model


# ----------------------------------------------------------------------------- outputs


def make_linear() -> torch.nn.Module:
    """Fixed weights from a generator of its own (the global torch RNG is shared by the
    model stage's threads, so seeding it per model would race)."""
    layer = torch.nn.Linear(3, 2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(2, 3, generator=generator))
        layer.bias.copy_(torch.randn(2, generator=generator))
    return layer


def test_torch_outputs_become_arrow_columns(engine) -> None:
    ds = fl.range(50, rows_per_task=20).map_batches(
        lambda b: {"id": b["id"], "a": pc.divide(b["id"], 10.0), "b": b["id"], "c": b["id"]}
    )
    preds = ds.map_batches(
        TorchPredictor,
        fn_constructor_kwargs={"model_factory": make_linear, "input_columns": ["a", "b", "c"]},
        batch_size=16,
        device="cpu",
        passthrough=["id"],
    ).to_arrow(engine=engine)
    assert preds.column_names == ["id", "prediction"]
    assert isinstance(preds.schema.field("prediction").type, pa.FixedShapeTensorType)
    ids = np.arange(50.0)
    x = torch.from_numpy(np.stack([ids / 10, ids, ids], axis=1).astype(np.float32))
    want = make_linear()(x).detach().numpy()
    got = preds["prediction"].combine_chunks().to_numpy_ndarray()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_passthrough_checks_rows_and_names() -> None:
    ins = pa.record_batch({"id": [1, 2]})
    with pytest.raises(UserFunctionError, match="returned 1 rows for a batch of 2"):
        add_passthrough(ins, pa.record_batch({"y": [1]}), ["id"], "M")
    with pytest.raises(UserFunctionError, match=r"\['nope'\] are not in"):
        add_passthrough(ins, pa.record_batch({"y": [1, 2]}), ["nope"], "M")
    with pytest.raises(UserFunctionError, match="also copies"):
        add_passthrough(ins, pa.record_batch({"id": [1, 2]}), ["id"], "M")


# ----------------------------------------------------------------------------- errors


class Broken(Predictor):
    def __call__(self, batch: pa.RecordBatch) -> dict[str, np.ndarray]:
        raise ZeroDivisionError("model exploded")


class BadInit:
    def __init__(self) -> None:
        raise OSError("weights.pt not found")

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch


class NoDevice:
    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch


def test_a_failing_model_names_the_class(engine) -> None:
    ds = fl.range(100).map_batches(Broken, batch_size=10, concurrency=2)
    with pytest.raises(
        UserFunctionError,
        match=r"class .*Broken given to map_batches raised "
        r"ZeroDivisionError: model exploded.*Fix:",
    ):
        ds.to_arrow(engine=engine)
    with pytest.raises(UserFunctionError, match=r"Constructing .*BadInit\(\) raised OSError"):
        fl.range(10).map_batches(BadInit).to_arrow(engine=engine)


def test_device_errors(engine) -> None:
    with pytest.raises(ConfigurationError, match=r"takes no 'device' parameter.*Fix:"):
        fl.range(3).map_batches(NoDevice, device="cpu")
    with pytest.raises(ConfigurationError, match="is not a device name"):
        fl.range(3).map_batches(Linear, device="gpu0")
    with pytest.raises(ConfigurationError, match="only applies when fn is a class"):
        fl.range(3).map_batches(features, device="cpu")
    with pytest.raises(ConfigurationError, match="both as device= and in fn_constructor"):
        fl.range(3).map_batches(Linear, device="cpu", fn_constructor_kwargs={"device": "cpu"})
    with pytest.raises(ConfigurationError, match="concurrency=0"):
        fl.range(3).map_batches(Linear, concurrency=0)
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    ds = fl.range(30).map_batches(features).map_batches(Linear, device="cuda")
    with pytest.raises(ConfigurationError, match=r"device='cuda'.*sees 0 CUDA device.*Fix:"):
        ds.to_arrow(engine=engine)
    assert Linear.built == []
