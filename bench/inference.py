"""Batch inference throughput: feedline's pipelined ``map_batches(Model)`` vs a naive loop.

The job: read a Parquet dataset (16 float32 features, row groups of 8192 rows), preprocess
every read batch (a step of fixed cost), then run a model on batches of 1024 rows (a step
of fixed cost) and collect ``id`` + predictions.

- **naive**: what a notebook does: read everything, preprocess everything, then predict
  batch by batch (one thread, stages one after the other: time ≈ sum of the stages).
- **feedline p=1**: ``read_parquet(...).map_batches(preprocess).map_batches(Model,
  batch_size=1024)`` on the local engine with one read thread: the model stage runs in a
  thread of its own fed by a bounded queue, so it overlaps with reading and preprocessing
  (time ≈ the slowest stage).
- **feedline p=2**: the same with two read threads (preprocessing itself in parallel).

Two cost models (``--cost``):

- ``sleep`` (default): the fixed costs are ``time.sleep`` (the model as an accelerator
  that leaves the CPU free, preprocessing as I/O-bound decoding). Shows the overlap itself.
- ``compute``: real CPU work: NumPy feature expansion as preprocessing and a two-layer MLP
  (16 → 512 → 16, float32 matmuls) as the model. On a 2-core machine both stages compete
  for the same cores, so the gain is bounded by the cores, not by the stages.

Every run's predictions are checked against the naive loop's (same rows, same values).

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/inference.py
    flock /tmp/feedline-bench.lock .venv/bin/python bench/inference.py --cost compute
    .venv/bin/python bench/inference.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import feedline as fl
from feedline.arrow.python_columns import to_arrow_array
from feedline.engines.batch.fusion import as_record_batches

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
FEATURES = 16
ROW_GROUP = 8192
MODEL_BATCH = 1024
#: the compute cost model: MLP width, and rounds of elementwise work in preprocessing
HIDDEN = 512
PRE_ROUNDS = 40


# ----------------------------------------------------------------------------- the two steps


def make_steps(cost: str, pre_ms: float, model_ms: float) -> tuple[Callable, type]:
    """The preprocessing function and the model class for a cost model."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32) / 4
    w2 = rng.normal(size=(HIDDEN, FEATURES)).astype(np.float32) / 16

    def preprocess(batch: pa.RecordBatch) -> dict[str, Any]:
        x = batch["x"].to_numpy_ndarray() if isinstance(batch["x"], pa.Array) else None
        if x is None:
            x = batch["x"].combine_chunks().to_numpy_ndarray()
        if cost == "sleep":
            time.sleep(pre_ms / 1000)
            out = (x - 0.5) * 2.0
        else:
            out = np.tanh(x)
            for _ in range(PRE_ROUNDS):  # a fixed amount of elementwise work per row
                out = np.sin(out * 1.1 + 0.3)
        return {"id": batch["id"], "x": out.astype(np.float32)}

    class Model:
        """Built once per model worker; called per batch of ``MODEL_BATCH`` rows."""

        def __init__(self) -> None:
            self.w1, self.w2 = w1, w2

        def __call__(self, batch: pa.RecordBatch) -> dict[str, Any]:
            x = batch["x"].to_numpy_ndarray()
            if cost == "sleep":
                time.sleep(model_ms / 1000)
                y = x.sum(axis=1)
            else:
                y = (np.maximum(x @ self.w1, 0) @ self.w2).sum(axis=1)
            return {"id": batch["id"], "y": y}

    return preprocess, Model


# ----------------------------------------------------------------------------- the runs


def naive(path: Path, preprocess: Callable, model_cls: type) -> pa.Table:
    """Read all, preprocess all, then predict all (one thread)."""
    table = pq.read_table(path)
    prepared = [preprocess(b) for b in table.to_batches(max_chunksize=ROW_GROUP)]
    prepared_table = pa.Table.from_batches(
        [as_record_batches(p, "preprocess")[0] for p in prepared]
    )
    model = model_cls()
    outputs = [
        as_record_batches(model(b), "model")[0]
        for b in prepared_table.combine_chunks().to_batches(max_chunksize=MODEL_BATCH)
    ]
    return pa.Table.from_batches(outputs)


def pipelined(path: Path, preprocess: Callable, model_cls: type, parallelism: int) -> pa.Table:
    ds = fl.read_parquet(path).map_batches(preprocess)
    ds = ds.map_batches(model_cls, batch_size=MODEL_BATCH, concurrency=1)
    engine = fl.LocalEngine(parallelism=parallelism, memory_budget="256MB")
    return ds.to_arrow(engine=engine)


def stage_times(path: Path, preprocess: Callable, model_cls: type) -> dict[str, float]:
    """Each stage alone, one thread: read, preprocess, predict."""
    start = time.perf_counter()
    table = pq.read_table(path)
    read = time.perf_counter() - start
    batches = table.to_batches(max_chunksize=ROW_GROUP)
    start = time.perf_counter()
    prepared = [preprocess(b) for b in batches]
    pre = time.perf_counter() - start
    x = np.concatenate([p["x"] for p in prepared])
    ids = pa.array(np.arange(len(x)))
    model = model_cls()
    inputs = [
        pa.RecordBatch.from_arrays(
            [ids.slice(i, MODEL_BATCH), to_arrow_array(x[i : i + MODEL_BATCH])],
            ["id", "x"],
        )
        for i in range(0, len(x), MODEL_BATCH)
    ]
    model(inputs[0])  # warm-up (BLAS thread start)
    start = time.perf_counter()
    for b in inputs:
        model(b)
    predict = time.perf_counter() - start
    return {"read": read, "preprocess": pre, "model": predict}


def write_input(rows: int, folder: Path) -> Path:
    rng = np.random.default_rng(1)
    x = rng.random((rows, FEATURES), dtype=np.float32)
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "x": pa.FixedShapeTensorArray.from_numpy_ndarray(x),
        }
    )
    path = folder / "input.parquet"
    pq.write_table(table, path, row_group_size=ROW_GROUP, compression="none")
    return path


def timed(run: Callable[[], pa.Table], repeats: int) -> tuple[float, pa.Table]:
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def same(a: pa.Table, b: pa.Table) -> bool:
    a, b = a.sort_by("id"), b.sort_by("id")
    ya = a["y"].to_numpy()
    yb = b["y"].to_numpy()
    return a["id"].equals(b["id"]) and bool(np.allclose(ya, yb, rtol=1e-5, atol=1e-5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cost", choices=["sleep", "compute"], default="sleep")
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--pre-ms", type=float, default=20.0, help="sleep per read batch")
    parser.add_argument("--model-ms", type=float, default=3.0, help="sleep per model batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="65k rows, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = 65_536, 1
    preprocess, model_cls = make_steps(args.cost, args.pre_ms, args.model_ms)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_input(args.rows, Path(tmp))
        stages = stage_times(path, preprocess, model_cls)
        base_s, base = timed(lambda: naive(path, preprocess, model_cls), args.repeats)
        runs = {"naive loop (read all, preprocess all, predict)": (base_s, True)}
        for p in (1, 2):
            secs, out = timed(lambda p=p: pipelined(path, preprocess, model_cls, p), args.repeats)
            runs[f"feedline pipelined, parallelism={p}, concurrency=1"] = (secs, same(out, base))
    total = sum(stages.values())
    slowest = max(stages.values())
    print(
        f"\nbatch inference, cost={args.cost}: {args.rows:,} rows, read batches of {ROW_GROUP}, "
        f"model batches of {MODEL_BATCH}; median of {args.repeats}; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    print("stages alone (one thread): " + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items()))
    print(f"sum of stages {total:.2f} s, slowest stage {slowest:.2f} s\n")
    print(f"{'run':<55} {'seconds':>8} {'rows/s':>10} {'speed-up':>9} {'same preds':>10}")
    for name, (secs, ok) in runs.items():
        print(
            f"{name:<55} {secs:>8.2f} {args.rows / secs:>10,.0f} {base_s / secs:>8.2f}x "
            f"{'yes' if ok else 'NO':>10}"
        )
    OUT.mkdir(exist_ok=True)
    result = {
        "cost": args.cost,
        "rows": args.rows,
        "pre_ms": args.pre_ms,
        "model_ms": args.model_ms,
        "stages": stages,
        "runs": {k: {"seconds": s, "same_predictions": ok} for k, (s, ok) in runs.items()},
    }
    (OUT / f"inference-{args.cost}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
