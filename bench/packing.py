"""Packing vs a plain padded loader, one run side by side: tokens/s and padding fraction.

    PYTHONPATH=. python bench/packing.py [--docs 20000] [--seq-len 2048]

Documents of lognormal lengths (median ~300 tokens) as list<int32>; the padded loader pads
every document to seq_len (ragged="pad_or_truncate"); the packed loaders pack them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

import feedline as fl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.7, 1.0, args.docs).astype(int), 1, 4 * args.seq_len)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(rng.integers(1, 50000, int(offsets[-1]), dtype=np.int32))
    ds = fl.from_arrow(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, values)}))
    real = int(lengths.sum())
    print(f"{args.docs} documents, {real} tokens, seq_len {args.seq_len}")
    padded = ds.loader(batch_size=8, seed=0, format="numpy", shapes={"input_ids": (args.seq_len,)},
                       ragged="pad_or_truncate")  # fmt: skip
    list(padded)  # load the cache
    t = time.perf_counter()
    rows = sum(len(b["input_ids"]) for b in padded)
    s = time.perf_counter() - t
    kept = int(np.minimum(lengths, args.seq_len).sum())
    print(f"padded loader: {kept / s:,.0f} real tokens/s, padding fraction "
          f"{1 - kept / (rows * args.seq_len):.3f} (truncates {real - kept} tokens)")  # fmt: skip
    for algorithm in ("greedy", "first_fit", "best_fit"):
        pack = fl.Packing(seq_len=args.seq_len, algorithm=algorithm, buffer_size=1024)
        loader = ds.loader(batch_size=8, seed=0, format="numpy", pack=pack)
        list(loader)  # load the cache (epoch 0)
        t = time.perf_counter()
        n = sum(1 for _ in loader)
        s = time.perf_counter() - t
        m = loader.metrics()[-1]
        print(
            f"packed {algorithm:9s}: {m['tokens'] / s:,.0f} tokens/s, padding fraction "
            f"{m['padding_fraction']:.3f}, {n} batches, {m['documents_split']} split"
        )


if __name__ == "__main__":
    main()
