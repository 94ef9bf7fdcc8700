"""What the per-stage meters of ``loader.profile()`` cost: samples/s with them on and off.

Three loaders, each run many times, briefly, with the meters on (the default) and off
(``loader._stages.enabled = False``), in this one process:

* ``batch 256``: ``fl.range(N)``, NumPy batches, a loop that does nothing (the fastest path:
  small cached batches handed over in groups; the worst case for meters);
* ``batch 32``: the same with batch 32 (more batches, so more meter calls per sample);
* ``transform``: batch 64 with a trivial per-sample transform in 2 thread workers.

Noise from other processes on a shared machine is larger than the meters' cost, so the runs
come in adjacent pairs (on then off, then off then on: the order alternates, so a drift in
load favours neither) and each pair gives one ratio ``on / off``; the table shows the median
ratio over the pairs and its quartiles (the spread), and the overhead ``1 - median``. Two
ratios: samples per second of wall time (what training sees, and what other processes'
load disturbs most) and samples per CPU second of this process, all its threads (what the
meters add to the work; far less sensitive to the other processes on a shared machine).

Run: ``python bench/profile_overhead.py [--samples N] [--pairs P]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import feedline as fl


def ident(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"id": sample["id"]}


def one_run(make: Callable[[], fl.Loader], on: bool) -> tuple[float, float]:
    """Samples per second of wall time and per CPU second of this process (all its threads)."""
    loader = make()
    loader._stages.enabled = on
    loader._prepare()
    start, cpu, samples = time.perf_counter(), time.process_time(), 0
    for batch in loader:
        samples += len(batch["id"])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    loader.close()
    return samples / seconds, samples / max(cpu, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000, help="samples per epoch")
    parser.add_argument("--pairs", type=int, default=21, help="on/off pairs per case")
    args = parser.parse_args()
    n = args.samples
    cases: dict[str, Callable[[], fl.Loader]] = {
        "fl.range, batch 256": lambda: fl.range(n).loader(batch_size=256, format="numpy", seed=0),
        "fl.range, batch 32": lambda: fl.range(n // 4).loader(
            batch_size=32, format="numpy", seed=0
        ),
        "transform, 2 threads": lambda: fl.range(n // 100).loader(
            batch_size=64, format="numpy", seed=0, transform=ident, num_workers=2
        ),
    }
    print(f"{args.pairs} pairs of runs per case (on/off, order alternating)\n")
    print(
        "| case | clock | on / off, median | quartiles | overhead (1 - median) | off, samples/s |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for name, make in cases.items():
        one_run(make, True)  # warm-up: imports, first allocations
        ratios: dict[int, list[float]] = {0: [], 1: []}
        offs: dict[int, list[float]] = {0: [], 1: []}
        for k in range(args.pairs):
            order = (True, False) if k % 2 == 0 else (False, True)
            rate = {on: one_run(make, on) for on in order}
            for i in (0, 1):
                ratios[i].append(rate[True][i] / rate[False][i])
                offs[i].append(rate[False][i])
        for i, clock in enumerate(("wall", "CPU")):
            q1, median, q3 = statistics.quantiles(ratios[i], n=4)
            print(f"| {name} | {clock} | {median:.3f} | {q1:.3f} - {q3:.3f} | {1 - median:.1%} | "
                  f"{statistics.median(offs[i]):,.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
