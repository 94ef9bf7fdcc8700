"""Order memory per rank: one rank's first batches of an exact shuffle over N rows.

Usage::

    .venv/bin/python bench/order_memory.py [--rows 1000000000] [--world 800] [--batch 256]
        [--batches 1000] [--modes drawn,lazy]

Each mode runs in a fresh process and reports its peak RSS (``VmHWM``) above the RSS after
imports, and the seconds taken:

- ``drawn``: today's order below ``LAZY_ROWS``: ``epoch_permutation(N)`` (N int64) then
  ``split_for_rank``: every rank holds the whole order while it splits it.
- ``lazy``: ``global_order`` over ``LAZY_ROWS`` rows: a
  :class:`~feedline.loader.order.lazy_permutation.LazyPermutation` evaluated at the rank's
  positions (``split_for_rank``: the rank's whole share), and at its first ``--batches``
  batches alone (``LazyPermutation.take``);
- ``lazy-elastic``: after every rank yielded ``--batches`` batches, the plan of a rank of a
  world 200 ranks smaller (elastic resume: the seen positions removed as runs);
- ``drawn-stream`` / ``lazy-stream-batches`` (not in the default modes): the two-level
  shuffle's order (row groups of 8192 rows, pools of 16) drawn whole, or evaluated lazily
  for the rank's first ``--batches`` batches, pool by pool.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
from pathlib import Path

def hwm():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmHWM", "VmRSS")):
            yield line.split()[0], int(line.split()[1]) * 1024

import numpy as np
from feedline.loader.order.lazy_permutation import LazyPermutation
from feedline.loader.order.sample_order import (
    _positions, epoch_permutation, global_order, split_for_rank,
)
mode, n, world, batch, batches = sys.argv[1], *map(int, sys.argv[2:6])
base = dict(hwm())["VmRSS:"]
start = time.perf_counter()
rank = world - 1
if mode == "drawn":
    order = epoch_permutation(n, 0, 0)
    plan = split_for_rank(order, rank=rank, world_size=world, batch_size=batch, drop_last=True)
    first = plan.indices[: batches * batch].copy()
elif mode == "lazy-share":
    order = global_order([n], shuffle=True, seed=0, epoch=0, window=None)
    plan = split_for_rank(order, rank=rank, world_size=world, batch_size=batch, drop_last=True)
    first = plan.indices[: batches * batch].copy()
elif mode == "lazy-elastic":  # resumed on world - 200 ranks after `batches` batches each
    from feedline.loader.order.resume import epoch_plan
    from feedline.loader.order.state import Segment
    order = global_order([n], shuffle=True, seed=0, epoch=0, window=None)
    segment = Segment(world, batch, True, (batches * batch,) * world)
    plan = epoch_plan(order, [segment], rank=0, world_size=world - 200, batch_size=batch,
                      drop_last=True)
    first = plan.indices[: batches * batch].copy()
elif mode == "lazy-stream-batches":  # two-level: row groups of 8192 rows, pools of 16
    from feedline.loader.order.sample_order import lazy_block_shuffle_order
    batches = min(batches, n // (world * batch))
    order = lazy_block_shuffle_order([8192] * (n // 8192), 0, 0, 16)
    first = order.take(_positions(rank, batches * batch, world, batch))
elif mode == "drawn-stream":
    from feedline.loader.order.sample_order import block_shuffle_order
    order = block_shuffle_order([8192] * (n // 8192), 0, 0, 16)
    plan = split_for_rank(order, rank=rank, world_size=world, batch_size=batch, drop_last=True)
    first = plan.indices[: batches * batch].copy()
else:
    batches = min(batches, n // (world * batch))  # drop_last=True: the epoch's batches
    first = LazyPermutation(n, 0, 0).take(_positions(rank, batches * batch, world, batch))
seconds = time.perf_counter() - start
print(json.dumps({"mode": mode, "peak_mb": (dict(hwm())["VmHWM:"] - base) / 2**20,
                  "seconds": seconds, "samples": int(first.size)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10**9)
    parser.add_argument("--world", type=int, default=800)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--modes", default="drawn,lazy-share,lazy-batches,lazy-elastic")
    args = parser.parse_args()
    root = str(Path(__file__).resolve().parent.parent)
    for mode in args.modes.split(","):
        argv = [str(v) for v in (args.rows, args.world, args.batch, args.batches)]
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, mode, *argv],
            capture_output=True,
            text=True,
            cwd=root,
            env={"PYTHONPATH": root},
            check=False,
        )
        if done.returncode:
            print(json.dumps({"mode": mode, "error": done.stderr.strip().splitlines()[-1:]}))
            continue
        out = json.loads(done.stdout)
        out["wall_s"] = time.perf_counter() - started
        print(json.dumps(out))


if __name__ == "__main__":
    main()
