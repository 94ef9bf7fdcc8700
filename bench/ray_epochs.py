"""Per-epoch reshuffling for 2 data-parallel consumers: Ray's streams vs write once + loader.

The job (issue 24, item 10): ``E`` epochs over ``--rows`` rows (an ``id`` and 16 float32
features read from Parquet), each epoch in a new seeded order, dealt to 2 consumers that
read concurrently (2 threads here, as 2 Ray Train workers would).

- **ray streams**: ``ds.random_shuffle(seed=epoch).streaming_split(2, engine=ray)`` built
  again every epoch: the plan runs on Ray each epoch (read, row keys, Ray's distributed
  sort), and Ray deals the blocks to the 2 streams.
- **write + loader**: ``ds.write(path)`` once (timed apart), then per epoch a
  ``Loader(path, shuffle=True, seed=0, rank=r, world_size=2)`` per consumer with
  ``set_epoch(epoch)``: the exact global shuffle of each epoch is an index permutation over
  the written shards, read from the OS page cache.

Both paths check that every epoch delivers each id once across the 2 consumers (the
streams drop nothing here: the row count divides by 2).

Usage::

    .venv/bin/python bench/ray_epochs.py                 # 400k rows, 3 epochs
    .venv/bin/python bench/ray_epochs.py --rows 100000 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import feedline as fl

FEATURES = 16
FILES = 8
BATCH = 1024


def make_inputs(folder: Path, rows: int) -> Path:
    """``FILES`` Parquet files: ``id`` and ``FEATURES`` float32 columns."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for number, ids in enumerate(np.array_split(np.arange(rows, dtype=np.int64), FILES)):
        columns: dict[str, Any] = {"id": ids}
        for k in range(FEATURES):
            columns[f"f{k}"] = rng.standard_normal(len(ids), dtype=np.float32)
        pq.write_table(pa.table(columns), folder / f"part-{number}.parquet")
    return folder


def consume(streams: list[Callable[[], Iterable[Any]]], ids_of: Callable[[Any], Any]) -> list[int]:
    """Read every stream to its end in its own thread; all the ids they delivered."""
    found: list[list[int]] = [[] for _ in streams]
    errors: list[BaseException] = []

    def run(number: int) -> None:
        try:
            for batch in streams[number]():
                found[number].extend(np.asarray(ids_of(batch)).tolist())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(streams))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [i for part in found for i in part]


def ray_streams(source: Path, rows: int, epochs: int) -> list[float]:
    from feedline.engines.ray.engine import RayEngine

    engine = RayEngine(num_cpus=os.cpu_count())
    ds = fl.read_parquet(source)
    seconds = []
    for epoch in range(epochs):
        start = time.perf_counter()
        a, b = ds.random_shuffle(seed=epoch).streaming_split(2, engine=engine)
        streams = [
            lambda it=it: it.iter_batches(batch_size=BATCH, batch_format="pyarrow") for it in (a, b)
        ]
        ids = consume(streams, lambda batch: batch["id"])
        seconds.append(time.perf_counter() - start)
        assert len(ids) == rows and len(set(ids)) == rows, (len(ids), len(set(ids)))
    return seconds


def write_and_load(source: Path, target: Path, rows: int, epochs: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    fl.read_parquet(source).write(target)
    written = time.perf_counter() - start
    loaders = [
        fl.Loader(
            str(target),
            batch_size=BATCH,
            shuffle=True,
            seed=0,
            rank=r,
            world_size=2,
            drop_last=False,
            format="numpy",
        )
        for r in range(2)
    ]
    seconds = []
    for epoch in range(epochs):
        start = time.perf_counter()
        for loader in loaders:
            loader.set_epoch(epoch)
        ids = consume([lambda ld=ld: iter(ld) for ld in loaders], lambda batch: batch["id"])
        seconds.append(time.perf_counter() - start)
        assert len(ids) == rows and len(set(ids)) == rows, (len(ids), len(set(ids)))
    return written, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ray-epochs-") as folder:
        root = Path(folder)
        source = make_inputs(root / "inputs", args.rows)
        written, loaded = write_and_load(source, root / "written", args.rows, args.epochs)
        streamed = [] if args.skip_ray else ray_streams(source, args.rows, args.epochs)
    result = {
        "rows": args.rows,
        "epochs": args.epochs,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "write_once_s": round(written, 2),
        "loader_epoch_s": [round(s, 3) for s in loaded],
        "loader_epoch_median_s": round(statistics.median(loaded), 3),
        "ray_streams_epoch_s": [round(s, 2) for s in streamed],
        "ray_streams_epoch_median_s": round(statistics.median(streamed), 2) if streamed else None,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
