"""What the per-stage meters of ``loader.profile()`` cost: samples/s with them on and off.

Three loaders, each run with the meters on (the default) and off
(``loader._stages.enabled = False``), rounds interleaved (on, off, on, off...) so that load
from other processes spreads over both; the figure is the median samples/s over the rounds
and the overhead ``1 - on / off``:

* ``small``: ``fl.range(N)``, batch 256, NumPy batches, a loop that does nothing (the
  fastest path: small cached batches handed over in groups; the worst case for meters);
* ``batch 32``: the same with batch 32 (more batches, so more meter calls per sample);
* ``transform``: batch 64 with a trivial per-sample transform in 2 thread workers.

Run: ``python bench/profile_overhead.py [--samples N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import feedline as fl


def ident(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"id": sample["id"]}


def one_round(make: Any, on: bool) -> float:
    loader = make()
    loader._stages.enabled = on
    loader._prepare()
    start, samples = time.perf_counter(), 0
    for batch in loader:
        samples += len(batch["id"])
    seconds = time.perf_counter() - start
    loader.close()
    return samples / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2_000_000, help="samples per epoch")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per configuration")
    args = parser.parse_args()
    n = args.samples
    cases = {
        "small, batch 256": lambda: fl.range(n).loader(batch_size=256, format="numpy", seed=0),
        "small, batch 32": lambda: fl.range(n // 4).loader(batch_size=32, format="numpy", seed=0),
        "transform, 2 threads": lambda: fl.range(n // 100).loader(
            batch_size=64, format="numpy", seed=0, transform=ident, num_workers=2
        ),
    }
    print(f"{'case':24} {'on samples/s':>14} {'off samples/s':>14} {'overhead':>9}")
    for name, make in cases.items():
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for on in (True, False):
                rates[on].append(one_round(make, on))
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"{name:24} {on:14,.0f} {off:14,.0f} {1 - on / off:9.1%}")


if __name__ == "__main__":
    main()
