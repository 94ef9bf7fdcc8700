"""Loader workers on a NumPy augmentation, and ``prefetch=0`` against the default, in one run.

Two questions from issue 24 (item 8), measured together:

* **workers**: a loader over decoded ``uint8`` images (``--images`` samples of ``3 x --side x
  --side``) with a per-sample NumPy transform (random crop to ``--crop``, flip, per-channel
  normalize to float32: what a user writes by hand), run with 0 workers, 2 thread workers and
  2 process workers; the same augmentation written per batch (``batched=True``: one call per
  batch, one NumPy call per sample writing straight into the batch's array, no generator per
  sample) with 0 and 2 thread workers; and the same images through ``fl.ImageTransform``
  (random *resized* crop, flip, normalize, vectorized per batch with ``batched=True``) with 0
  and 2 thread workers (``--no-image-transform`` leaves those out: the code before the fix
  has no pixel path);
* **prefetch**: the time-series windows loader (``fl.Windows(96, 8)`` over ``--series`` x
  ``--steps`` x 8 float32, torch batches, a loop that does nothing) with the default
  ``prefetch=2`` and with ``prefetch=0``.

Each configuration runs ``--rounds`` times, the rounds interleaved (round 1 of every
configuration, then round 2, ...) so that load from other processes on a shared machine
spreads over all of them; the table gives the median samples/s (and the min and max) over
the rounds, each round timed from its first batch to its last (the workers' start and the
cache's fill left out), and the median CPU time the loader spent per 1,000 samples (this
process's threads plus the worker processes'): on a machine whose cores other processes
hold, wall-clock rates say little about parallel speed-up, CPU time says what each
configuration costs.

``--join-ab`` measures instead what stacking each chunk straight into the batch's arrays
saves (2 thread workers, per-sample augmentation): the same loader with the chunks joined as
before (stacked per chunk, then concatenated), interleaved with the default, and 0 workers.

Run::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/thread_workers.py
    flock /tmp/feedline-bench.lock .venv/bin/python bench/thread_workers.py --join-ab
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "thread_workers.json"
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


class Augment:
    """Random crop + horizontal flip + per-channel normalize of ``uint8[3, H, W]`` (NumPy)."""

    def __init__(self, crop: int) -> None:
        self.crop = crop
        self.scale = (1 / (255 * STD))[:, None, None]
        self.offset = (-MEAN / STD)[:, None, None]

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = sample["image"]
        _, h, w = image.shape
        top = int(rng.integers(0, h - self.crop + 1))
        left = int(rng.integers(0, w - self.crop + 1))
        out = image[:, top : top + self.crop, left : left + self.crop]
        if rng.random() < 0.5:
            out = out[:, :, ::-1]
        x = np.multiply(out, self.scale, dtype=np.float32)
        x += self.offset
        return {"image": x, "label": sample["label"]}


class AugmentBatch(Augment):
    """:class:`Augment` for a whole batch (``batched=True``): the same crop, flip and
    normalize from per-sample uniform draws (no generator per sample), each crop a view
    written straight into the batch's output, the offset added in one call."""

    def __call__(self, batch: dict[str, Any], rngs: Any) -> dict[str, Any]:  # type: ignore[override]
        images = batch["image"]
        n, c, h, w = images.shape
        u = rngs.uniforms(3)
        top = (u[:, 0] * (h - self.crop + 1)).astype(np.intp).tolist()
        left = (u[:, 1] * (w - self.crop + 1)).astype(np.intp).tolist()
        flip = (u[:, 2] < 0.5).tolist()
        x = np.empty((n, c, self.crop, self.crop), np.float32)
        for i in range(n):
            view = images[i, :, top[i] : top[i] + self.crop, left[i] : left[i] + self.crop]
            np.multiply(view[:, :, ::-1] if flip[i] else view, self.scale, out=x[i])
        x += self.offset
        return {"image": x, "label": batch["label"]}


def image_data(n: int, side: int) -> Any:
    import feedline as fl

    pixels = np.random.default_rng(0).integers(0, 256, (n, 3, side, side), dtype=np.uint8)
    table = pa.table({
        "image": pa.FixedShapeTensorArray.from_numpy_ndarray(pixels),
        "label": np.arange(n, dtype=np.int64) % 10,
    })  # fmt: skip
    return fl.from_arrow(table)


def window_data(series: int, steps: int) -> Any:
    import feedline as fl

    rng = np.random.default_rng(0)
    columns: dict[str, Any] = {
        "series": np.repeat(np.arange(series, dtype=np.int32), steps),
        "t": np.tile(np.arange(steps, dtype=np.int64), series),
    }
    for j in range(8):
        columns[f"f{j}"] = rng.standard_normal(series * steps, dtype=np.float32)
    return fl.from_arrow(pa.table(columns))


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) of this process and of the processes ``pids``."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def timed(loader: Any, batches: int) -> tuple[float, float]:
    """Samples/s of ``batches`` batches after the first (which includes any start-up), and
    CPU milliseconds per 1,000 samples."""
    it = iter(loader)
    next(it)
    pids = loader._workers.pids if loader._workers is not None else []
    start, cpu, samples = time.perf_counter(), cpu_seconds(pids), 0
    for _, batch in zip(range(batches), it, strict=False):
        samples += len(next(iter(batch.values())))
    seconds = time.perf_counter() - start
    used = cpu_seconds(pids) - cpu
    it.close()  # type: ignore[attr-defined]
    return samples / seconds, 1e6 * used / samples


def configs(args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    from thread_workers import Augment as Importable  # the workers unpickle it by this name
    from thread_workers import AugmentBatch

    import feedline as fl

    images = image_data(args.images, args.side)
    augment = Importable(args.crop)
    common = {"batch_size": args.batch, "seed": 0, "format": "torch"}

    def aug(**kw: Any) -> Callable[[], Any]:
        return lambda: images.loader(**common, transform=augment, **kw)

    out = {
        "numpy augment, 0 workers": aug(),
        "numpy augment, 2 thread workers": aug(num_workers=2, worker_type="thread"),
        "numpy augment, 2 process workers": aug(num_workers=2, worker_type="process"),
        "numpy augment, 0 workers, prefetch=0": aug(prefetch=0),
    }
    batched = AugmentBatch(args.crop)
    for n in (0, 2):
        out[f"numpy augment batched, {n} thread workers"] = lambda n=n: images.loader(
            **common, transform=batched, batched=True, num_workers=n
        )
    if args.image_transform:
        tensor = fl.ImageTransform("image", size=args.crop)
        for n in (0, 2):
            label = f"ImageTransform batched, {n} thread workers"
            out[label] = (lambda n=n: images.loader(**common, transform=tensor, batched=True,
                                                      num_workers=n))  # fmt: skip
    ds = window_data(args.series, args.steps)
    windows = fl.Windows(96, 8, by="series", order_by="t")
    for prefetch in (2, 0):
        label = f"windows 96->8, prefetch={prefetch}"
        out[label] = (lambda p=prefetch: ds.loader(batch_size=256, seed=0, windows=windows,
                                                   prefetch=p))  # fmt: skip
    return out


def join_ab(args: argparse.Namespace) -> None:
    """2 thread workers with the chunks stacked into the batch (now) or concatenated (before),
    and 0 workers: median CPU ms per 1,000 samples over interleaved rounds."""
    import feedline.loader.nodes.map as map_node

    sys.path.insert(0, str(HERE))
    from thread_workers import Augment as Importable

    images = image_data(args.images, args.side)
    augment = Importable(args.crop)
    common = {"batch_size": args.batch, "seed": 0, "format": "torch", "transform": augment}
    threads, inline = images.loader(**common, num_workers=2), images.loader(**common)
    filled = map_node._filled
    runs = {"stacked into the batch": (threads, filled),
            "concatenated (before)": (threads, lambda parts: None),
            "0 workers": (inline, filled)}  # fmt: skip
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    batches = min(args.batches, args.images // args.batch - 2)
    for r in range(args.rounds):
        for name, (loader, join) in runs.items():
            map_node._filled = join  # type: ignore[assignment]
            loader.set_epoch(r)
            cpu[name].append(timed(loader, batches)[1])
    map_node._filled = filled
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, {args.rounds} rounds")
    for name, got in cpu.items():
        print(f"| 2 thread workers, {name} | {statistics.median(got):,.1f} CPU ms / 1k samples |"
              if name != "0 workers" else
              f"| 0 workers | {statistics.median(got):,.1f} CPU ms / 1k samples |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--side", type=int, default=160)
    parser.add_argument("--crop", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40, help="timed batches per round")
    parser.add_argument("--window-batches", type=int, default=1500)
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-image-transform", dest="image_transform", action="store_false")
    parser.add_argument("--only", default="", help="run the configurations containing this")
    parser.add_argument("--join-ab", action="store_true", help="stacked vs concatenated join")
    args = parser.parse_args()
    if args.join_ab:
        join_ab(args)
        return
    sys.path.insert(0, str(HERE))
    # the worker processes import the transform's module (bench/thread_workers.py)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    made = {k: v for k, v in configs(args).items() if args.only in k}
    loaders = {name: make() for name, make in made.items()}
    for loader in loaders.values():  # caches filled, workers started: not timed
        timed(loader, 1)
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    cpu: dict[str, list[float]] = {name: [] for name in loaders}
    for r in range(args.rounds):
        for name, loader in loaders.items():
            n = args.window_batches if name.startswith("windows") else args.batches
            rate, ms = timed(loader, n)
            rates[name].append(rate)
            cpu[name].append(ms)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for loader in loaders.values():
        loader.close()
    load = os.getloadavg()[0]
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, load average {load:.2f}, "
          f"{args.rounds} rounds (median [min-max] samples/s)\n")  # fmt: skip
    print("| configuration | samples/s (median) | min - max | CPU ms / 1k samples (median) |")
    print("|---|---:|---:|---:|")
    for name, got in rates.items():
        print(f"| {name} | {statistics.median(got):,.0f} | {min(got):,.0f} - {max(got):,.0f} "
              f"| {statistics.median(cpu[name]):,.1f} |")  # fmt: skip
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"args": vars(args), "rates": rates, "cpu_ms": cpu}, indent=1))


if __name__ == "__main__":
    main()
