"""Mixing overhead: a mix of sources vs one dataset's loader, samples/s, one run.

    PYTHONPATH=. python bench/mixing.py [--rows 400000] [--dim 64] [--batch-size 256]
        [--epochs 3] [--rounds 7] [--weights 0.5,0.5]

The one-dataset loader reads ``rows`` rows (a ``float32`` vector of ``dim`` and an ``int64``
label); the mix reads sources with the same columns, by default two of ``rows / 2`` rows
with weights 0.5 / 0.5 (``--weights 0.5,0.3,0.2``: three, each with its weight's share of the
rows), and ``stop="all_exhausted"`` (as many samples per epoch). Both cached in memory,
numpy batches, ``prefetch=2``; an epoch to load the caches, then ``--rounds`` rounds, each
loader in turn: one untimed epoch, then ``--epochs`` timed epochs in a row (samples/s from the
caller's side, no training step). Reported: the best rounds and the median of the paired
rounds' ratios (robust to a change of load on a shared machine).

The untimed epoch matters: both loaders work ahead in background threads (the next epoch's
order; the mix's next chunks of draws), and a loader's work ahead at the end of its round
would otherwise run on the clock of the other loader's round. After it, each timed round is
the loaders' steady state: the work ahead for an epoch is done during the epoch before it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import feedline as fl


def _data(rows: int, dim: int, seed: int) -> fl.Dataset:
    rng = np.random.default_rng(seed)
    return fl.from_numpy({"x": rng.standard_normal((rows, dim), dtype=np.float32),
                          "y": rng.integers(0, 10, rows)})  # fmt: skip


def _epoch(loader: object) -> tuple[float, int]:
    t = time.perf_counter()
    samples = sum(len(b["y"]) for b in loader)  # type: ignore[attr-defined]
    return samples / (time.perf_counter() - t), samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each loader")
    parser.add_argument("--weights", default="0.5,0.5",
                        help="a weight per source, which gets its share of --rows")  # fmt: skip
    args = parser.parse_args()
    one = _data(args.rows, args.dim, 0)
    weights = [float(w) for w in args.weights.split(",")]
    sizes = [int(args.rows * w / sum(weights)) for w in weights]
    sizes[0] += args.rows - sum(sizes)
    sources = {f"s{k}": _data(n, args.dim, k + 1) for k, n in enumerate(sizes)}
    single = one.loader(batch_size=args.batch_size, seed=0, format="numpy", prefetch=2)
    mix = fl.mix(sources, dict(zip(sources, weights, strict=True)), seed=0, stop="all_exhausted")
    mixed = mix.loader(args.batch_size, format="numpy", prefetch=2)
    for loader in (single, mixed):  # the caches load
        _epoch(loader)
    r1: list[float] = []
    r2: list[float] = []
    n1 = n2 = 0
    for _ in range(args.rounds):  # alternating, so a change of load hits both alike
        for loader, rates in ((single, r1), (mixed, r2)):
            _epoch(loader)  # untimed: absorbs the other loader's work ahead
            started, samples = time.perf_counter(), 0
            for _ in range(args.epochs):
                samples += _epoch(loader)[1]
            rates.append(samples / (time.perf_counter() - started))
            n1, n2 = (samples // args.epochs, n2) if loader is single else (
                n1, samples // args.epochs)  # fmt: skip
    ratio = float(np.median([m / s for s, m in zip(r1, r2, strict=True)]))
    print(f"{args.rows} rows x (float32[{args.dim}] + int64), batch {args.batch_size}")
    print(
        f"one dataset : best {max(r1):>12,.0f}  median {np.median(r1):>12,.0f} samples/s "
        f"({n1} samples/epoch)"
    )
    print(
        f"mix of {len(sizes):<5}: best {max(r2):>12,.0f}  median {np.median(r2):>12,.0f} samples/s "
        f"({n2} samples/epoch)"
    )
    print(
        f"overhead    : {100 * (1 - max(r2) / max(r1)):.1f}% (best rounds), "
        f"{100 * (1 - ratio):.1f}% (median of the {args.rounds} paired rounds) of the "
        "one-dataset loader's samples/s"
    )


if __name__ == "__main__":
    main()
