"""Why a split window gather needs large groups, and that it stays off under a CPU-bound loop.

Two measurements behind :mod:`feedline.loader.nodes.gather_threads` (case W's data: 2,000
series x 5,000 steps x 8 float32, windows of 96 -> 8, batch 256, torch batches):

* **groups**: the default loader (prefetch thread) with the split forced to 1 or 2 threads and
  the group of batches gathered together set to about 1, 4, 8 or 16 MiB; the loop has run a
  torch op first, as a training loop has. Each configuration runs in its own process.
* **cpu-bound**: a loop that runs a 768 x 512 matmul a batch on every CPU, with the automatic
  split, the split forced off and forced on: the automatic count must not split there.

Run::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/window_groups.py --work /tmp/bench/w
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BATCH, BATCHES, REPEATS = 256, 3000, 3


def child(work: Path, mode: str, group_mib: int, threads: str) -> dict[str, object]:
    """One configuration, in this process: samples/s of ``REPEATS`` loaders (or steps/s)."""
    import torch
    from loader import w_check, w_make_data, w_spec  # bench/loader.py: case W's data

    import feedline as fl
    import feedline.loader.nodes.gather_threads as gt
    import feedline.loader.pipeline as pipeline

    spec = w_spec("W", work)
    w_make_data(spec)
    pipeline.SPLIT_GROUP_BYTES = group_mib << 20
    looks: list[int] = []
    if threads == "auto":
        auto = gt.auto_threads

        def counted(idle: float | None, helpers: float = 0.0) -> int:
            looks.append(auto(idle, helpers))
            return looks[-1]

        gt.auto_threads = counted
    else:
        gt.auto_threads, gt.CHECK_S = (lambda *_: int(threads)), 0.0
    x = torch.randn(4_000_000)
    for _ in range(50):  # the loop's thread has run a parallel torch op
        x.sum()
    weights = torch.randn(W_INPUT, 512)
    windows = fl.Windows(96, 8, by="series", order_by="t", features=[f"f{j}" for j in range(8)])
    rates = []
    for seed in range(REPEATS):
        loader = fl.open(spec["dir"]).loader(windows=windows, batch_size=BATCH, seed=seed,
                                             format="torch", prefetch=2)  # fmt: skip
        batches = iter(loader)
        next(batches)
        start, count = time.perf_counter(), 0
        for _, batch in zip(range(BATCHES // (5 if mode == "cpu-bound" else 1)), batches,
                            strict=False):  # fmt: skip
            if mode == "cpu-bound":
                (batch["inputs"].reshape(BATCH, -1) @ weights).relu().sum()
                count += 1
            else:
                count += w_check(batch)
        rates.append(count / (time.perf_counter() - start))
        loader.close()
    return {"rates": sorted(rates), "looks": len(looks), "splits": sum(n > 1 for n in looks)}


W_INPUT = 96 * 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench/w"))
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, group, threads = args.child
        print(json.dumps(child(args.work, mode, int(group), threads)))
        return
    runs = [("groups", g, t) for g in (1, 4, 8, 16) for t in ("1", "2")]
    runs += [("cpu-bound", 8, t) for t in ("auto", "1", "2")]
    print("| measurement | group MiB | threads | median (range) | split chosen at |")
    print("|---|---|---|---|---|")
    for mode, group, threads in runs:
        done = subprocess.run(
            [sys.executable, __file__, "--work", str(args.work), "--child", mode, str(group),
             threads], capture_output=True, text=True, check=True,
        )  # fmt: skip
        got = json.loads(done.stdout.strip().splitlines()[-1])
        rates = got["rates"]
        unit = "steps/s" if mode == "cpu-bound" else "samples/s"
        looks = f"{got['splits']} of {got['looks']} looks" if threads == "auto" else ""
        print(f"| {mode} | {group} | {threads} | {rates[len(rates) // 2]:,.0f} {unit} "
              f"({rates[0]:,.0f}-{rates[-1]:,.0f}) | {looks} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
