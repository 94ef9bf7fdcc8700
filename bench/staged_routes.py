"""Staged epochs at scale: what one node holds to route its share of the rows, by order kind.

    PYTHONPATH=. .venv/bin/python bench/staged_routes.py [--rows 1e6,1e7,1e8,1e9]
        [--nodes 100] [--ranks-per-node 8] [--batch 256] [--before-max 1e7]

Pass 1 of ``cache="staged"`` sends each row of a node's share to every ``(rank, position)``
that reads it this epoch. Two ways to find them, for an exact shuffle of ``N`` rows among
``nodes * ranks_per_node`` ranks (``drop_last=False``: padding repeats included):

- ``plans``: every rank's plan materialized, then scanned for the node's rows (what every
  node did before: N int64 of plans on each node, whatever its share);
- ``inverse``: the lazy permutation (the loader's order over ``LAZY_ROWS`` rows) inverted at
  the node's rows (:func:`feedline.loader.order.stage_routes.lazy_routes`).

For each ``N``: node 0's routes by each way (the same destinations: checked), the peak memory
(tracemalloc) and the time. ``plans`` runs up to ``--before-max`` rows (it needs 8 bytes a row
of the whole dataset, on every node). Both use the same lazy permutation, so they route the
same rows; the loader itself draws the permutation below ``LAZY_ROWS`` rows (2**26), where the
plans' memory is bounded (512 MiB).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import Any

from feedline.loader.order.lazy_permutation import LazyPermutation
from feedline.loader.order.sample_order import split_for_rank
from feedline.loader.order.stage_routes import Routes, lazy_routes, routes


def _measure(route: Callable[[], Routes]) -> tuple[Routes, float, float]:
    tracemalloc.start()
    started = time.perf_counter()
    got = route()
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return got, peak, seconds


def _by_plans(order: LazyPermutation, lo: int, hi: int, kw: dict[str, Any]) -> Routes:
    plans = [split_for_rank(order, rank=r, **kw).indices for r in range(kw["world_size"])]
    return routes(plans, lo, hi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="1e6,1e7,1e8,1e9")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--before-max", type=float, default=1e7)
    args = parser.parse_args()
    world = args.nodes * args.ranks_per_node
    before_max = int(args.before_max)
    print(f"{args.nodes} nodes x {args.ranks_per_node} ranks, batch {args.batch}, node 0's share")
    print("| rows | node 0's rows | destinations | plans: peak MiB, s | inverse: peak MiB, s |")
    print("|---:|---:|---:|---:|---:|")
    for text in args.rows.split(","):
        n = int(float(text))
        order = LazyPermutation(n, seed=0, epoch=1)
        lo, hi = 0, min(n, -(-n // args.nodes))  # node 0's share of the rows
        kw = {"world_size": world, "batch_size": args.batch, "drop_last": False}
        lazy, lazy_mb, lazy_s = _measure(partial(lazy_routes, order, lo, hi, pad_last=True, **kw))
        if n <= before_max:
            full, full_mb, full_s = _measure(partial(_by_plans, order, lo, hi, kw))
            same = all((a == b).all() for a, b in ((full.source, lazy.source),
                                                   (full.rank, lazy.rank),
                                                   (full.position, lazy.position)))  # fmt: skip
            assert same, "the two ways disagree"
            before = f"{full_mb:,.1f}, {full_s:.2f}"
        else:
            before = "—"
        print(f"| {n:,} | {hi - lo:,} | {len(lazy.source):,} | {before} | "
              f"{lazy_mb:,.1f}, {lazy_s:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
