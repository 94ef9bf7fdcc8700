"""Exact shuffle from a memory-mapped node cache vs the two-level streaming shuffle, cold reads.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/node_cache.py --gb 2

Data: ``--gb`` GiB of rows of ``x`` = float32[1024] (4 KiB, one page) and ``label`` int64, written
sorted by label (10 classes in 10 runs: the worst case for a windowed shuffle), 8 zstd shards.

Readers, each for ``--seconds`` of batches of 256 (numpy out, no prefetch thread, so the rate
is the data path's):

* ``node``: ``loader(cache="node")``: the exact global permutation gathered from the mapped
  cache file (filled first; its fill time is reported);
* ``stream``: ``loader(cache="none", memory_budget=--budget)``: the two-level shuffle (row
  groups permuted, rows permuted inside pools of as many groups as a third of the budget holds).

Page-cache conditions (this VM cannot cap the page cache without cgroups, so they are made
with ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the files the reader reads, after ``fsync``):

* ``warm``: the files are in the page cache (read once before timing);
* ``cold``: evicted once before timing: every page is read from disk the first time;
* ``half``: evicted before timing and again each time the reader has consumed half the data's
  bytes: a stand-in for a page cache half the size of the data (pessimistic: an LRU cache of
  that size would keep up to half the pages between evictions, this keeps 0 to half).

Shuffle quality of both orders over a whole epoch comes from
:func:`feedline.loader.order.sample_order.shuffle_quality` (``mean_jump``, ``batch_spread``,
``label_diversity`` ~1 ideal; ``label_tv`` ~0 ideal). Results go to
``bench/out/node_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "node_cache.json"
WIDTH = 1024
BATCH = 256
SEED = 7
#: ``--advice``: the readahead the node cache's mapping gets; ``loader`` keeps what the loader
#: chose (``MADV_RANDOM`` when the file is over half the memory its page cache can use)
ADVICE = {"normal": mmap.MADV_NORMAL, "random": mmap.MADV_RANDOM, "loader": None}


def make_data(path: Path, gb: float) -> int:
    import pyarrow as pa

    import feedline as fl

    rows = int(gb * 2**30) // (WIDTH * 4)
    if (path / "_feedline.json").exists():
        return fl.open(path).count()
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((rows, WIDTH), dtype=np.float32)
    table = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(x),
                      "label": np.arange(rows) * 10 // rows})  # fmt: skip
    del x
    fl.from_arrow(table).write(path, rows_per_shard=-(-rows // 8), bytes_per_shard=None,
                               row_group_rows=8192)  # fmt: skip
    return rows


def evict(files: list[Path], maps: list[Any] = ()) -> None:
    """Drop the files' pages from the page cache (written back first, so all can go).

    The kernel keeps pages that a process maps, so ``maps`` (this process's mappings of
    the files) first drop their page-table entries (``MADV_DONTNEED``: the data stays in
    the file; the next access reads it again).
    """
    for memory in maps:
        memory.madvise(mmap.MADV_DONTNEED)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb") as handle:
            while handle.read(64 << 20):
                pass


def mappings(loader: Any) -> list[Any]:
    """The memory maps behind a node-cached loader's arrays (none for a streaming one)."""
    from feedline.loader.data.bulk_arrays import _mapping

    source = loader._prepare().source
    found = [_mapping(a) for a in getattr(source, "storage", {}).values()]
    return list({id(m): m for m in found if m is not None}.values())


def run(loader: Any, files: list[Path], condition: str, data_bytes: int, seconds: float,
        advice: str) -> dict:  # fmt: skip
    maps = mappings(loader)
    for memory in maps:
        if ADVICE[advice] is not None:
            memory.madvise(ADVICE[advice])
    if condition == "warm":
        warm(files)
    else:
        evict(files, maps)
    row_bytes = WIDTH * 4 + 8
    since_evict, rows, start = 0, 0, time.perf_counter()
    first = None
    for batch in loader:
        n = len(batch["label"])
        rows += n
        since_evict += n * row_bytes
        if first is None:
            first = time.perf_counter() - start
        if condition == "half" and since_evict >= data_bytes // 2:
            evict(files, maps)
            since_evict = 0
        if time.perf_counter() - start >= seconds:
            break
    elapsed = time.perf_counter() - start
    return {"samples_per_s": rows / elapsed, "MB_per_s": rows * row_bytes / elapsed / 1e6,
            "rows": rows, "seconds": elapsed, "first_batch_s": first}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="data size in GiB")
    parser.add_argument("--budget", default="512MB", help="the streaming loader's memory_budget")
    parser.add_argument("--seconds", type=float, default=20.0, help="timed per reader and case")
    parser.add_argument("--work", default="/tmp/bench/node_cache")
    parser.add_argument("--conditions", nargs="*", default=["warm", "cold", "half"])
    parser.add_argument("--advice", choices=sorted(ADVICE), default="normal",
                        help="madvise the node cache mapping gets before timing")  # fmt: skip
    args = parser.parse_args()

    import feedline as fl
    from feedline.loader.order.sample_order import global_order, shuffle_quality

    work = Path(args.work)
    data = work / f"data-{args.gb:g}gb"
    started = time.perf_counter()
    rows = make_data(data, args.gb)
    print(f"data: {rows:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
    ds = fl.open(data)
    shards = sorted(data.glob("*.parquet"))
    kw = {"batch_size": BATCH, "seed": SEED, "format": "numpy", "prefetch": 0}
    cache_dir = work / "cache"
    start = time.perf_counter()
    node = ds.loader(cache="node", cache_dir=cache_dir, **kw)
    node_stats = node.stats()
    fill = time.perf_counter() - start
    node_file = Path(node_stats["node_cache_file"])
    stream = ds.loader(cache="none", memory_budget=args.budget, **kw)
    window = stream.stats()["shuffle_window"]
    data_bytes = rows * (WIDTH * 4 + 8)
    results: dict[str, Any] = {"advice": args.advice, "rows": rows, "data_bytes": data_bytes,
                               "window": window, "fill_s": fill,
                               "built": node_stats["node_cache_built"], "runs": {}}  # fmt: skip
    for condition in args.conditions:
        for name, loader, files in (("node", node, [node_file]), ("stream", stream, shards)):
            load = os.getloadavg()[0]
            r = run(loader, files, condition, data_bytes, args.seconds, args.advice)
            r["load_avg_1m"] = load
            results["runs"][f"{name}-{condition}"] = r
            print(f"{name:6s} {condition:4s}: {r['samples_per_s']:>10,.0f} samples/s "
                  f"{r['MB_per_s']:>8,.0f} MB/s (first batch {r['first_batch_s']:.3f} s, load "
                  f"{load:.1f})", flush=True)  # fmt: skip
    labels = np.arange(rows) * 10 // rows
    sizes = node._prepare().sizes
    for name, win in (("exact", None), ("two-level", window)):
        order = global_order(sizes, shuffle=True, seed=SEED, epoch=0, window=win)
        results[f"quality_{name}"] = q = shuffle_quality(order, labels, BATCH)
        print(f"quality {name:9s}: " + ", ".join(f"{k} {v:.3f}" for k, v in q.items()))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    print(
        f"node cache fill {fill:.1f} s ({data_bytes / fill / 1e9:.2f} GB/s, built "
        f"{node_stats['node_cache_built']}); stream window {window} row groups of 8192 rows"
    )


if __name__ == "__main__":
    main()
