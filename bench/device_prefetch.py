"""Feeding a CUDA GPU: feedline's side-stream device prefetch against the usual ways, one run.

Needs a CUDA device (run it where one is lent; CI has none). Two shapes, each a real feedline
dataset written to ``--work``:

* ``images``: ``--images`` samples of uint8[3,64,64] + an int64 label (case B's shape); the
  step converts to float, normalises and trains a small CNN (forward, backward, SGD).
* ``wide``: ``--rows`` rows of 32 separate float32 columns + an int64 label (a CSV's or a
  pandas frame's shape), loaded with ``stack={"features": [...]}``; the step trains an MLP.

Ways of getting batches onto the GPU, each warmed by one untimed epoch (the loader's cache fill
is not timed), then timed for ``--epochs`` epochs per round, the ways taking turns for
``--rounds`` rounds (the median is reported); the training step is the same in every one:

* ``resident``: the batches already on the GPU (no loading at all): the step's own ceiling;
* ``feedline device=cuda``: ``loader(format="torch", device="cuda", pin_memory=True)``: gathered
  into page-locked memory, copied on a side stream one batch ahead;
* ``feedline device=cuda``: the same without ``pin_memory``: gathered into reused pageable
  buffers, copied from the prefetch thread (a pageable copy returns once the driver has staged it);
* ``feedline + .to(cuda)``: ``loader(format="torch")`` and a blocking ``.to("cuda")`` in the
  loop (what most training scripts do);
* ``feedline pinned + .to(non_blocking)``: pinned batches, the copy issued by the loop;
* ``torch DataLoader w=N``: a hand-written map-style ``Dataset`` over the same arrays in
  memory, ``DataLoader(shuffle=True, pin_memory=True, num_workers=N)``, ``.to(non_blocking)``.

Each way also runs with ``--no-step`` semantics in a ``load only`` row: batches are moved to
the GPU and touched (one reduction), which is the delivery ceiling of that way.

Run::

    python bench/device_prefetch.py --work /tmp/devbench --json $OUT/device_prefetch.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

import feedline as fl

WIDE_COLUMNS = [f"f{i}" for i in range(32)]


def write_images(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(n, 3, 64, 64), dtype=np.uint8)
    table = pa.table(
        {
            "image": pa.FixedShapeTensorArray.from_numpy_ndarray(pixels),
            "label": rng.integers(0, 1000, size=n, dtype=np.int64),
        }
    )
    fl.from_arrow(table).write(path)


def write_wide(path: Path, n: int) -> None:
    rng = np.random.default_rng(1)
    columns = {name: rng.standard_normal(n, dtype=np.float32) for name in WIDE_COLUMNS}
    columns["label"] = rng.integers(0, 10, size=n, dtype=np.int64)
    fl.from_arrow(pa.table(columns)).write(path)


class Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(128, 256, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(256, 1000),
        )  # fmt: skip

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float().div_(255.0).sub_(0.5)
        return self.body(x)


def make_step(shape: str, train: bool) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    if shape == "images":
        model: torch.nn.Module = Cnn().cuda()
        key = "image"
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(), torch.nn.Linear(1024, 10),
        ).cuda()  # fmt: skip
        key = "features"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not train:
            return batch[key].float().sum()
        loss = torch.nn.functional.cross_entropy(model(batch[key]), batch["label"] % 10)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return step


class ArrayDataset(torch.utils.data.Dataset):
    """The hand-written peer: per-sample ``__getitem__`` over arrays in memory."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.n = len(next(iter(arrays.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[i] for k, v in self.arrays.items()}


def arrays_of(ds: fl.Dataset, shape: str) -> dict[str, np.ndarray]:
    table = ds.to_arrow()
    if shape == "images":
        return {
            "image": table.column("image").combine_chunks().to_numpy_ndarray(),
            "label": table.column("label").to_numpy(),
        }
    features = np.stack([table.column(c).to_numpy() for c in WIDE_COLUMNS], axis=1)
    return {"features": features, "label": table.column("label").to_numpy()}


def warm(batches: Callable[[], Iterable[dict[str, Any]]], move: Callable, step: Callable) -> None:
    """One untimed epoch: the loader's cache fill, workers, cuDNN's autotuning."""
    for batch in batches():
        step(move(batch))
    torch.cuda.synchronize()


def timed(batches: Callable[[], Iterable[dict[str, Any]]], move: Callable, step: Callable,
          epochs: int) -> float:  # fmt: skip
    """Samples per second over ``epochs`` epochs."""
    torch.cuda.synchronize()
    samples, start = 0, time.perf_counter()
    for _ in range(epochs):
        for batch in batches():
            out = move(batch)
            step(out)
            samples += len(out["label"])
    torch.cuda.synchronize()
    return samples / (time.perf_counter() - start)


def run_shape(shape: str, ds: fl.Dataset, args: argparse.Namespace) -> list[dict[str, Any]]:
    options: dict[str, Any] = {"batch_size": args.batch_size, "shuffle": True, "seed": 0}
    if shape == "wide":
        options["stack"] = {"features": WIDE_COLUMNS}
    arrays = arrays_of(ds, shape)
    keep = lambda b: b  # noqa: E731 - already where it must be
    to_sync = lambda b: {k: v.to("cuda") for k, v in b.items()}  # noqa: E731
    to_async = lambda b: {k: v.to("cuda", non_blocking=True) for k, v in b.items()}  # noqa: E731
    rows = []
    for train in (True, False):
        step = make_step(shape, train)
        resident_loader = ds.loader(format="torch", **options)
        resident = [to_sync(b) for b in resident_loader]
        on_gpu = _loader(ds, options, device="cuda", pin_memory=True)
        pinned = _loader(ds, options, pin_memory=True)
        ways: list[tuple[str, Callable, Callable]] = [
            ("resident on the GPU (ceiling)", lambda resident=resident: resident, keep),
            ("feedline device=cuda, pinned", on_gpu, keep),
            ("feedline device=cuda", _loader(ds, options, device="cuda"), keep),
            ("feedline + blocking .to(cuda)", _loader(ds, options), to_sync),
            ("feedline pinned + .to(non_blocking)", pinned, to_async),
        ]
        for workers in args.torch_workers:
            dl = torch.utils.data.DataLoader(
                ArrayDataset(arrays), batch_size=args.batch_size, shuffle=True, drop_last=True,
                num_workers=workers, pin_memory=True, persistent_workers=workers > 0,
            )  # fmt: skip
            ways.append((f"torch DataLoader w={workers}, pinned", lambda dl=dl: dl, to_async))
        for _, batches, move in ways:
            warm(batches, move, step)
        rates: dict[str, list[float]] = {name: [] for name, _, _ in ways}
        for _ in range(args.rounds):  # the ways take turns: drifts hit them alike
            for name, batches, move in ways:
                rates[name].append(timed(batches, move, step, args.epochs))
        for name, values in rates.items():
            rows.append({"shape": shape, "step": "train" if train else "load only", "way": name,
                         "samples_per_s": float(np.median(values)), "rounds": values})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        del resident, ways
        torch.cuda.empty_cache()
    return rows


def _loader(ds: fl.Dataset, options: dict[str, Any], **more: Any) -> Callable[[], Any]:
    loader = ds.loader(format="torch", **options, **more)
    epoch = iter(range(1_000_000))

    def batches() -> Any:
        loader.set_epoch(next(epoch))
        return loader

    return batches


def copy_bandwidth(mb: int = 3) -> dict[str, float]:
    """Host-to-device GB/s of one ``mb`` MB batch, pageable vs pinned (median of 50)."""
    out = {}
    for pinned in (False, True):
        host = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=pinned)
        device = torch.empty_like(host, device="cuda")
        times = []
        for _ in range(50):
            torch.cuda.synchronize()
            start = time.perf_counter()
            device.copy_(host, non_blocking=pinned)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out["pinned" if pinned else "pageable"] = (mb << 20) / float(np.median(times)) / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/devbench"))
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1, help="epochs per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported")
    parser.add_argument("--torch-workers", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--shapes", nargs="+", default=["images", "wide"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("device_prefetch.py needs a CUDA device")
    torch.backends.cudnn.benchmark = True
    info = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "h2d_GBps": copy_bandwidth(),
    }  # fmt: skip
    print(json.dumps(info), flush=True)
    rows = []
    for shape in args.shapes:
        path = args.work / shape
        if not (path / "_manifest.json").exists() and not path.exists():
            start = time.perf_counter()
            (write_images if shape == "images" else write_wide)(
                path, args.images if shape == "images" else args.rows
            )
            print(f"wrote {shape} in {time.perf_counter() - start:.1f} s", flush=True)
        rows.extend(run_shape(shape, fl.open(path), args))
    for shape in args.shapes:
        for step in ("train", "load only"):
            sel = [r for r in rows if r["shape"] == shape and r["step"] == step]
            ceiling = sel[0]["samples_per_s"]
            print(f"\n{shape}, {step}")
            for r in sel:
                share = r["samples_per_s"] / ceiling
                print(f"  {r['way']:<40} {r['samples_per_s']:>14,.0f} samples/s  {share:6.1%}")
    if args.json:
        args.json.write_text(json.dumps({"info": info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
