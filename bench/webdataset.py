"""WebDataset tar shards → decoded, augmented training batches: feedline vs WebDataset itself.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/webdataset.py [--images 5000]

The data: ``--images`` real-size JPEGs (about 500x400, quality 90, random crops of the real
photos that ship in scikit-learn's and scikit-image's wheels) + an int label, written by
WebDataset's own ``ShardWriter`` into 4 tar shards under ``bench/out/webdataset-<n>/`` (kept
between runs). Both runners read those shards, decode every JPEG, take a
RandomResizedCrop(224) (scale 0.08-1, ratio 3/4-4/3) and a random horizontal flip, and yield
shuffled batches of 256 ``uint8 (3, 224, 224)`` tensors + labels, with 2 workers:

* **webdataset**: ``wds.WebDataset(urls, shardshuffle=True).shuffle(1000).decode("pil")``,
  the augmentation torchvision does on Pillow images (its ``RandomResizedCrop.get_params``,
  crop + bilinear resize, flip, ``PILToTensor``; torchvision itself does not install beside
  torch 2.13 CPU, so it is written out on Pillow with torch's RNG), ``.to_tuple`` and
  ``.batched(256)``, in ``torch.utils.data.DataLoader(num_workers=2, batch_size=None)``.
* **feedline**: ``fl.read_webdataset(urls, fields=["jpg", "cls"]).loader(batch_size=256,
  seed=0, transform=fl.ImageTransform("jpg", size=224, normalize=False), num_workers=2)``
  (thread workers; the first epoch also reads the shards into the loader's cache).

Each runner runs in its own child process, ``--epochs`` epochs, ``--repeat`` times
round-robin (medians reported); reported: wall time to the first batch, samples/s of the first
epoch (including the first batch) and of the later ones.
``webdataset-read`` / ``feedline-read`` time reading alone (one process, no decoding:
``WebDataset(urls)`` iteration vs ``fl.read_webdataset(urls).iter_batches()``). The machine
is shared: run it under the lock, and compare only ratios from one run.
Writes ``bench/out/webdataset.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
BATCH, CROP, SHARDS, SEED = 256, 224, 4, 0


def photos() -> list[Any]:
    """Real photos from installed wheels (scikit-image's if present, scikit-learn's two)."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    arrays = list(load_sample_images().images)
    try:
        import skimage.data as sk

        arrays += [getattr(sk, n)() for n in ("astronaut", "coffee", "chelsea", "rocket")]
    except ImportError:
        print("scikit-image is not installed: scikit-learn's 2 photos only", file=sys.stderr)
    return [Image.fromarray(a).convert("RGB") for a in arrays]


def make_shards(n: int) -> str:
    """Write the shards once; returns their brace pattern."""
    import numpy as np
    import webdataset as wds
    from PIL import Image

    folder = OUT / f"webdataset-{n}"
    pattern = str(folder / f"train-{{0000..{SHARDS - 1:04d}}}.tar")
    if (folder / "done").exists():
        return pattern
    folder.mkdir(parents=True, exist_ok=True)
    pictures, rng = photos(), np.random.default_rng(SEED)
    per_shard = -(-n // SHARDS)
    with wds.ShardWriter(str(folder / "train-%04d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            im = pictures[i % len(pictures)]
            W, H = im.size
            area, aspect = rng.uniform(0.3, 1.0) * W * H, rng.uniform(1.0, 1.5)
            w, h = min(W, int((area * aspect) ** 0.5)), min(H, int((area / aspect) ** 0.5))
            left, top = int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1))
            size = (int(rng.integers(460, 541)), int(rng.integers(360, 441)))
            pic = im.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
            buf = io.BytesIO()
            pic.save(buf, "JPEG", quality=90)
            sink.write({"__key__": f"{i:07d}", "jpg": buf.getvalue(), "cls": i % len(pictures)})
    (folder / "done").write_text("ok")
    return pattern


# ----------------------------------------------------------------------------- runners


def torchvision_like(sample: tuple[Any, int]) -> tuple[Any, int]:
    """RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, as torchvision on Pillow."""
    import numpy as np
    import torch
    from PIL import Image

    img, label = sample
    width, height = img.size
    top, left, h, w = crop_params(width, height)
    img = img.resize((CROP, CROP), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if torch.rand(1) < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), label


def crop_params(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``, scale (0.08, 1), ratio (3/4, 4/3)."""
    import torch

    area = height * width
    log_ratio = torch.log(torch.tensor((3 / 4, 4 / 3)))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0).item()
        aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,)).item())
            j = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return i, j, h, w
    side = min(width, height)
    return (height - side) // 2, (width - side) // 2, side, side


def stack(batch: tuple[list[Any], list[int]]) -> dict[str, Any]:
    import torch

    images, labels = batch
    return {"image": torch.stack(images), "label": torch.tensor(labels)}


def run_webdataset(pattern: str, epochs: int) -> list[tuple[float, int]]:
    import torch
    import webdataset as wds

    torch.manual_seed(SEED)
    pipeline = (
        wds.WebDataset(pattern, shardshuffle=True, seed=SEED)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map(torchvision_like)
        .batched(BATCH, collation_fn=lambda rows: stack(tuple(zip(*rows, strict=True))))
    )
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=2)
    return timed(lambda epoch: iter(loader), epochs)


def run_feedline(pattern: str, epochs: int) -> list[tuple[float, int]]:
    import feedline as fl

    ds = fl.read_webdataset(pattern, fields=["jpg", "cls"])
    transform = fl.ImageTransform("jpg", size=CROP, normalize=False)
    loader = ds.loader(batch_size=BATCH, seed=SEED, columns=["jpg", "cls"], transform=transform,
                       num_workers=2, drop_last=False)  # fmt: skip

    def epoch_iter(epoch: int) -> Any:
        loader.set_epoch(epoch)
        return iter(loader)

    with loader:
        return timed(epoch_iter, epochs)


def timed(make_iter: Any, epochs: int) -> list[tuple[float, int]]:
    """Per epoch: (seconds, samples), the first one also timed to its first batch."""
    results: list[tuple[float, int]] = []
    for epoch in range(epochs):
        start, samples = time.perf_counter(), 0
        for batch in make_iter(epoch):
            image = batch["jpg"] if "jpg" in batch else batch["image"]
            assert tuple(image.shape[1:]) == (3, CROP, CROP) and str(image.dtype) == "torch.uint8"
            if not samples:
                print(json.dumps({"first_batch_s": time.perf_counter() - start}), flush=True)
            samples += image.shape[0]
        results.append((time.perf_counter() - start, samples))
    return results


def run_webdataset_read(pattern: str, epochs: int) -> list[tuple[float, int]]:
    """Reading only, one process: the samples' raw bytes, no decoding."""
    import webdataset as wds

    def once(epoch: int) -> tuple[float, int]:
        start, n = time.perf_counter(), 0
        for sample in wds.WebDataset(pattern, shardshuffle=False):
            n += len(sample["jpg"]) > 0
        return time.perf_counter() - start, n

    return [once(e) for e in range(epochs)]


def run_feedline_read(pattern: str, epochs: int) -> list[tuple[float, int]]:
    """Reading only, local engine: Arrow batches of the raw bytes, no decoding."""
    import feedline as fl

    def once(epoch: int) -> tuple[float, int]:
        start, n = time.perf_counter(), 0
        for batch in fl.read_webdataset(pattern, fields=["jpg", "cls"]).iter_batches():
            n += batch.num_rows
        return time.perf_counter() - start, n

    return [once(e) for e in range(epochs)]


RUNNERS = {"webdataset": run_webdataset, "feedline": run_feedline,
           "webdataset-read": run_webdataset_read, "feedline-read": run_feedline_read}  # fmt: skip


def child(name: str, pattern: str, epochs: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", name, "--pattern", pattern, "--epochs",
           str(epochs)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        return {"error": done.stderr[-2000:]}
    out: dict[str, Any] = {}
    for line in lines:
        out.update(line)
    return out


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over runs of: time to first batch, epoch-1 rate, rate of the later epochs."""
    import statistics

    def rate(epochs: list[list[float]]) -> float:
        seconds = sum(t for t, _ in epochs)
        return sum(n for _, n in epochs) / seconds if seconds else float("nan")

    firsts = [r["first_batch_s"] for r in results if "first_batch_s" in r]
    return {
        "first_batch_s": statistics.median(firsts) if firsts else None,
        "epoch1_samples_per_s": statistics.median(rate(r["epochs"][:1]) for r in results),
        "later_samples_per_s": statistics.median(rate(r["epochs"][1:]) for r in results),
        "samples_per_epoch": results[0]["epochs"][0][1],
        "runs": len(results),
    }


def main() -> None:
    # this file is named like the package it measures: keep its folder off the import path
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="round-robin runs (median)")
    parser.add_argument("--worker", choices=sorted(RUNNERS))
    parser.add_argument("--pattern")
    args = parser.parse_args()
    if args.worker:
        epochs = RUNNERS[args.worker](args.pattern, args.epochs)
        print(json.dumps({"epochs": epochs}), flush=True)
        return
    pattern = make_shards(args.images)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNNERS}
    for _ in range(args.repeat):  # round-robin: a busy spell slows every runner alike
        for name in RUNNERS:
            runs[name].append(child(name, pattern, args.epochs))
    rows = {}
    for name, results in runs.items():
        failed = [r["error"] for r in results if "error" in r]
        if failed:
            print(f"{name}: FAILED\n{failed[0]}")
            continue
        rows[name] = summary(results)
        row = rows[name]
        first = f"first batch {row['first_batch_s']:.2f} s, " if row["first_batch_s"] else ""
        print(f"{name:>15}: {first}epoch 1 {row['epoch1_samples_per_s']:,.0f} samples/s, later "
              f"epochs {row['later_samples_per_s']:,.0f} samples/s "
              f"({row['samples_per_epoch']} samples/epoch, median of {args.repeat})")  # fmt: skip
    for a, b in (("feedline", "webdataset"), ("feedline-read", "webdataset-read")):
        if a in rows and b in rows:
            for key in ("epoch1_samples_per_s", "later_samples_per_s"):
                print(f"{a} / {b}, {key}: {rows[a][key] / rows[b][key]:.2f}x")
    OUT.mkdir(exist_ok=True)
    (OUT / "webdataset.json").write_text(json.dumps({"images": args.images, "results": rows},
                                                    indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
