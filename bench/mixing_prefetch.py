"""Mixing overhead by ``prefetch``: where a mix of two sources loses to one dataset.

    PYTHONPATH=. python bench/mixing_prefetch.py [--rows 400000] [--dim 64]

The same data as ``bench/mixing.py`` (one dataset of ``rows`` rows of ``float32[dim]`` + an
``int64`` label; a mix of two sources of ``rows / 2`` rows, weights 0.5 / 0.5,
``stop="all_exhausted"``), memory cache, numpy batches of 256, no training step. For each
``prefetch`` in 0, 1, 2, 4: a fresh loader of each, two warm-up epochs, then three rounds of
three epochs; the best round's samples/s of each and their ratio (mix / one dataset).
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


def _rate(loader: object, first_epoch: int, epochs: int, rows: int) -> float:
    started = time.perf_counter()
    for epoch in range(first_epoch, first_epoch + epochs):
        loader.set_epoch(epoch)  # type: ignore[attr-defined]
        sum(len(b["y"]) for b in loader)  # type: ignore[attr-defined]
    return epochs * rows / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    one_ds = _data(args.rows, args.dim, 0)
    parts = {"a": _data(args.rows // 2, args.dim, 1), "b": _data(args.rows // 2, args.dim, 2)}
    for prefetch in (0, 1, 2, 4):
        kw = {"batch_size": 256, "format": "numpy", "prefetch": prefetch, "cache": "memory"}
        one = one_ds.loader(**kw)
        mixed = fl.mix(parts, weights={"a": 0.5, "b": 0.5}, seed=0, stop="all_exhausted")
        mix = mixed.loader(**kw)
        _rate(one, 0, 2, args.rows), _rate(mix, 0, 2, args.rows)
        ones = [_rate(one, 2 + 3 * i, 3, args.rows) for i in range(3)]
        mixes = [_rate(mix, 2 + 3 * i, 3, args.rows) for i in range(3)]
        best_one, best_mix = max(ones), max(mixes)
        print(f"prefetch={prefetch}: one dataset {best_one / 1e6:5.1f}M  mix "
              f"{best_mix / 1e6:5.1f}M samples/s  mix / one {best_mix / best_one:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
