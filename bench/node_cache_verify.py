"""The cost of checking a node cache file before serving it: warm loaders with and without.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/node_cache_verify.py \
        --rows 400000 --width 256 --repeats 9

Every node-cache loader checks the file's size before each gather and the CRC-32 of each
block of rows (about 1 MiB) before it first serves a row of it (see
``feedline/loader/data/block_checks.py``). This measures what that costs a *warm* loader:
the node cache file exists (another rank or an earlier run filled it) and its pages are in
the page cache, so the loader's first epoch reads only memory, and all the checksum work
lands in it. The file is filled once; then, ``--repeats`` times and alternating the order,
a fresh loader maps it with the checks on (the default) and with the block CRCs off
(``feedline.loader.data.node_cache.VERIFY = False``; the size check stays), and runs
``--epochs`` epochs of the exact shuffle (batches of ``--batch``, numpy, ``prefetch=0`` so
the rate is the data path's).

Reported per mode (medians over the repeats): samples/s of the first epoch (all the CRCs
are computed in it) and of the later epochs (only the size check is left), by the wall clock
and by this process's CPU time (steadier on a shared machine: it leaves out the time other
processes hold the cores), the first batch's seconds, and the ratios checked / unchecked
(the median of each repeat's pair; goal: under 5% slower).
Results go to ``bench/out/node_cache_verify.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "node_cache_verify.json"


def make_data(path: Path, rows: int, width: int) -> None:
    import pyarrow as pa

    import feedline as fl

    if (path / "_feedline.json").exists():
        return
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, width), dtype=np.float32)
    table = pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(x),
                      "label": rng.integers(0, 10, rows)})  # fmt: skip
    fl.from_arrow(table).write(path, row_group_rows=16_384)


def one_run(data: Path, cache_dir: Path, verify: bool, args: argparse.Namespace) -> dict:
    import feedline as fl
    from feedline.loader.data import node_cache

    node_cache.VERIFY = verify
    loader = fl.open(data).loader(batch_size=args.batch, cache="node", cache_dir=cache_dir,
                                  format="numpy", prefetch=0, seed=1)  # fmt: skip
    opened = time.perf_counter()
    stats = loader.stats()  # maps the file (nothing is checked yet: checks are lazy)
    open_s = time.perf_counter() - opened
    assert stats["node_cache_built"] is False, "the file should exist: a warm loader"
    wall: list[float] = []
    cpu: list[float] = []
    first_batch = None
    rows = 0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        rows = 0
        start, start_cpu = time.perf_counter(), time.process_time()
        for batch in loader:
            if first_batch is None:
                first_batch = time.perf_counter() - start
            rows += len(batch["label"])
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    stats = loader.stats()
    if verify:
        assert stats["node_cache_blocks_verified"] == stats["node_cache_blocks"]
    else:
        assert stats["node_cache_blocks_verified"] == 0
    return {
        "first_epoch_samples_per_s": rows / wall[0],
        "later_samples_per_s": rows / statistics.mean(wall[1:] or [float("nan")]),
        "first_epoch_cpu_samples_per_s": rows / cpu[0],
        "later_cpu_samples_per_s": rows / statistics.mean(cpu[1:] or [float("nan")]),
        "first_batch_s": first_batch, "open_s": open_s, "rows_per_epoch": rows,
        "blocks": stats["node_cache_blocks"],
    }  # fmt: skip


RATES = ("first_epoch_samples_per_s", "later_samples_per_s", "first_epoch_cpu_samples_per_s",
         "later_cpu_samples_per_s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--width", type=int, default=256, help="float32 values per row")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", default="/tmp/bench/node_cache_verify")
    args = parser.parse_args()

    import feedline as fl

    work = Path(args.work)
    data = work / f"data-{args.rows}x{args.width}"
    cache_dir = work / "cache"
    make_data(data, args.rows, args.width)
    filled = fl.open(data).loader(cache="node", cache_dir=cache_dir, format="numpy").stats()
    file = Path(filled["node_cache_file"])
    with open(file, "rb") as f:  # into the page cache: a warm file
        while f.read(64 << 20):
            pass
    print(f"file {file} ({file.stat().st_size / 1e6:,.0f} MB), load {os.getloadavg()[0]:.1f}")
    runs: dict[str, list[dict]] = {"checked": [], "unchecked": []}
    for r in range(args.repeats):
        order = (True, False) if r % 2 == 0 else (False, True)
        for verify in order:
            got = one_run(data, cache_dir, verify, args)
            runs["checked" if verify else "unchecked"].append(got)
            print(f"  {'checked  ' if verify else 'unchecked'} first epoch "
                  f"{got['first_epoch_samples_per_s']:>11,.0f} samples/s "
                  f"(CPU {got['first_epoch_cpu_samples_per_s']:>11,.0f}), later "
                  f"{got['later_samples_per_s']:>11,.0f} "
                  f"(CPU {got['later_cpu_samples_per_s']:>11,.0f}), first batch "
                  f"{got['first_batch_s'] * 1e3:.1f} ms", flush=True)  # fmt: skip
    summary: dict[str, Any] = {"args": vars(args), "file_bytes": file.stat().st_size,
                               "load_avg_1m": os.getloadavg()[0], "runs": runs}  # fmt: skip
    for mode, found in runs.items():
        summary[mode] = {k: statistics.median(r[k] for r in found)
                         for k in (*RATES, "first_batch_s")}  # fmt: skip
    for k in RATES:
        pairs = zip(runs["checked"], runs["unchecked"], strict=True)
        summary[f"ratio_{k}"] = statistics.median(c[k] / u[k] for c, u in pairs)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(summary, indent=2))
    c, u = summary["checked"], summary["unchecked"]
    for k in RATES:
        print(f"median {k}: checked {c[k]:,.0f} vs unchecked {u[k]:,.0f}; ratio (median of "
              f"pairs) {summary['ratio_' + k]:.3f}")  # fmt: skip
    print(f"median first batch: checked {c['first_batch_s'] * 1e3:.1f} ms vs unchecked "
          f"{u['first_batch_s'] * 1e3:.1f} ms; load {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
