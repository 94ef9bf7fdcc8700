"""Exact shuffle from a memory-mapped node cache on data 2x the page cache it may use, against
the two-level streaming shuffle, with shuffle quality.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/node_cache_ooc.py --gb 4 --page-cache 2

``bench/node_cache.py`` stands in for a small page cache by evicting the files' pages each
time half the data was read. This bench caps it for real: each reader runs in its own
process inside a memory cgroup (cgroup v1, nested under this process's own; needs root)
whose limit is the reader's memory just before timing (interpreter, imports, the loader's
state) plus ``--page-cache`` GiB. Page-cache pages (read or memory-mapped) are charged to
the cgroup, so the kernel keeps at most that much of the data cached and reclaims the rest
(LRU), as on a machine whose free memory is that size. The streaming loader's own buffers
(``--budget``) count against the same limit: both readers get the same memory.

Data (``bench/node_cache.py``'s ``make_data``): ``--gb`` GiB of rows of ``x`` = float32[1024]
(4 KiB) and ``label`` int64, sorted by label (10 runs: the worst case for a windowed
shuffle), 8 zstd shards; generating it holds about twice the data in memory once. The node
cache file (the same size again) is filled before timing, outside the cgroup.

Readers, each from a cold page cache for ``--seconds`` (batches of 256, numpy, no prefetch):

* ``node``: ``loader(cache="node")``: the exact global permutation, one gather per batch
  from the memory-mapped cache file, with the readahead advice the loader chose
  (``MADV_RANDOM`` when the file is over half the memory the page cache may use);
* ``node-normal``: the same with the kernel's default readahead (``MADV_NORMAL``), which
  the loader used before it chose;
* ``node-random``: the same with ``madvise(MADV_RANDOM)`` set by the bench;
* ``stream``: ``loader(cache="none", memory_budget=--budget)``: the two-level shuffle.

Reported per reader: samples/s, MB/s, passes over the data, and the cgroup's page cache,
anonymous memory, peak usage and how often the limit was hit (``failcnt`` > 0: the cap
was in force); and the shuffle quality of both orders over one epoch
(:func:`feedline.loader.order.sample_order.shuffle_quality`). Results go to
``bench/out/node_cache_ooc.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from node_cache import BATCH, SEED, WIDTH, evict, make_data, mappings, run

OUT = Path(__file__).resolve().parent / "out" / "node_cache_ooc.json"
MEMORY = Path("/sys/fs/cgroup/memory")


@contextlib.contextmanager
def memory_cgroup() -> Iterator[Path]:
    """A fresh cgroup-v1 memory cgroup under this process's own; removed at the end."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = next((ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1] == "memory"), None)
    if own is None or not (MEMORY / "memory.limit_in_bytes").exists():
        raise SystemExit(
            "no cgroup-v1 memory controller at /sys/fs/cgroup/memory: this bench needs one "
            "(and root) to cap the page cache; bench/node_cache.py --conditions half is the "
            "stand-in without it."
        )
    group = MEMORY / own.lstrip("/") / f"feedline-ooc-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        for _ in range(50):  # the reader has exited; its charges move to the parent
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def _stat(group: Path) -> dict[str, int]:
    rows = (line.split() for line in (group / "memory.stat").read_text().splitlines())
    return {key: int(value) for key, value in rows}


def reader(
    name: str,
    data: str,
    cache_dir: str,
    group: str,
    page_cache: int,
    budget: str,
    seconds: float,
) -> dict[str, Any]:
    """In the reader process: join ``group``, set its limit, read for ``seconds``."""
    cgroup = Path(group)
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    import feedline as fl

    # the cap is in force while the loader opens (it sizes its mapping's readahead advice by
    # the memory it may use); raised below by the loader's own memory once that is known
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    (cgroup / "memory.limit_in_bytes").write_text(str(usage + page_cache))

    ds = fl.open(data)
    kw = {"batch_size": BATCH, "seed": SEED, "format": "numpy", "prefetch": 0}
    if name.startswith("node"):
        loader = ds.loader(cache="node", cache_dir=cache_dir, **kw)
        stats = loader.stats()
        assert not stats["node_cache_built"], "the node cache must be filled beforehand"
        files = [Path(stats["node_cache_file"])]
    else:
        loader = ds.loader(cache="none", memory_budget=budget, **kw)
        loader.stats()
        files = sorted(Path(data).glob("*.parquet"))
    evict(files, mappings(loader))
    base = int((cgroup / "memory.usage_in_bytes").read_text())
    (cgroup / "memory.limit_in_bytes").write_text(str(base + page_cache))
    rows = ds.count()
    data_bytes = rows * (WIDTH * 4 + 8)
    advice = {"node-random": "random", "node-normal": "normal"}.get(name, "loader")
    result = run(loader, files, "cold", data_bytes, seconds, advice)
    stat = _stat(cgroup)
    return result | {
        "passes": result["rows"] / rows,
        "limit_bytes": base + page_cache,
        "base_bytes": base,
        "page_cache_bytes_end": stat["total_cache"],
        "anon_bytes_end": stat["total_rss"],
        "peak_usage_bytes": int((cgroup / "memory.max_usage_in_bytes").read_text()),
        "limit_hits": int((cgroup / "memory.failcnt").read_text()),
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=4.0, help="data size in GiB")
    parser.add_argument(
        "--page-cache",
        type=float,
        default=None,
        help="page cache the readers may use, GiB (default: half of --gb)",
    )
    parser.add_argument("--budget", default="512MB", help="the streaming loader's memory_budget")
    parser.add_argument("--seconds", type=float, default=60.0, help="timed per reader")

    parser.add_argument("--readers", default="node,node-normal,node-random,stream")
    parser.add_argument("--work", default="/tmp/bench/node_cache_ooc")
    parser.add_argument("--reader", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        name, data, cache_dir, group, page_cache, budget = args.reader
        result = reader(name, data, cache_dir, group, int(page_cache), budget, args.seconds)
        print(json.dumps(result), flush=True)
        return

    import feedline as fl
    from feedline.loader.order.sample_order import global_order, shuffle_quality

    work = Path(args.work)
    data = work / f"data-{args.gb:g}gb"
    started = time.perf_counter()
    rows = make_data(data, args.gb)
    print(f"data: {rows:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
    ds = fl.open(data)
    kw = {"batch_size": BATCH, "seed": SEED, "format": "numpy", "prefetch": 0}
    cache_dir = work / "cache"
    started = time.perf_counter()
    node = ds.loader(cache="node", cache_dir=cache_dir, **kw)
    node.stats()
    print(f"node cache ready in {time.perf_counter() - started:.0f} s", flush=True)
    window = ds.loader(cache="none", memory_budget=args.budget, **kw).stats()["shuffle_window"]
    data_bytes = rows * (WIDTH * 4 + 8)
    page_cache = int((args.page_cache if args.page_cache is not None else args.gb / 2) * 2**30)
    results: dict[str, Any] = {
        "rows": rows,
        "data_bytes": data_bytes,
        "window": window,
        "page_cache_bytes": page_cache,
        "runs": {},
    }
    for name in args.readers.split(","):
        with memory_cgroup() as group:
            command = [
                sys.executable,
                __file__,
                "--seconds",
                str(args.seconds),
                "--reader",
                name,
                str(data),
                str(cache_dir),
                str(group),
                str(page_cache),
                args.budget,
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise SystemExit(f"reader {name} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
        r = results["runs"][name] = json.loads(lines[-1])
        print(
            f"{name:11s}: {r['samples_per_s']:>10,.0f} samples/s {r['MB_per_s']:>7,.0f} MB/s "
            f"{r['passes']:.2f} passes; page cache at end {r['page_cache_bytes_end'] / 2**30:.2f}"
            f" GiB of {data_bytes / 2**30:.2f} GiB data, limit hit {r['limit_hits']}x "
            f"(load {r['load_avg_1m']:.1f})",
            flush=True,
        )
    labels = np.arange(rows) * 10 // rows
    sizes = node._prepare().sizes
    for name, win in (("exact", None), ("two-level", window)):
        order = global_order(sizes, shuffle=True, seed=SEED, epoch=0, window=win)
        results[f"quality_{name}"] = q = shuffle_quality(order, labels, BATCH)
        print(f"quality {name:9s}: " + ", ".join(f"{k} {v:.3f}" for k, v in q.items()))
    runs = results["runs"]
    for name in ("node", "node-random"):
        if name in runs and "stream" in runs:
            ratio = runs[name]["samples_per_s"] / runs["stream"]["samples_per_s"]
            print(f"exact shuffle ({name}) / two-level streaming shuffle: {ratio:.2f}x")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
