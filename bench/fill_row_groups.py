"""Cache fill time against the number of row groups in a shard (loader footer checks).

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/fill_row_groups.py \
        [--rows 1000000] [--groups 100,1000,4000] [--work /tmp/bench/fill-groups]

Writes one shard of ``--rows`` rows (``x`` float32 and ``label`` int64, random) per row-group
count, uncompressed (``x`` is copied from its pages, ``label`` is dictionary-encoded and read
through pyarrow) and zstd (both read through pyarrow), then times ``load_cache`` of the
whole shard (median of 3, page cache warm) and counts the footers parsed during the fill.
The fill checks every file's footer against the manifest; it used to parse the footer on
every row group, so the fill grew with the square of the row groups. Figures go to stdout.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--groups", default="100,1000,4000")
    parser.add_argument("--work", default="/tmp/bench/fill-groups")
    args = parser.parse_args()

    import numpy as np
    import pyarrow as pa

    import feedline as fl
    import feedline.store.footers as footer_module
    from feedline.loader.data.columns import column_specs
    from feedline.loader.data.memory_cache import load_cache
    from feedline.store.shard_source import open_shard_source

    parsed = [0]
    real_digest = footer_module.footer_digest

    def counting(block: bytes) -> str:  # every parsed footer is hashed once
        parsed[0] += 1
        return real_digest(block)

    footer_module.footer_digest = counting
    rng = np.random.default_rng(0)
    table = pa.table({"x": rng.standard_normal(args.rows).astype(np.float32),
                      "label": rng.integers(0, 10, args.rows)})  # fmt: skip
    print("| row groups | compression | fill s (median of 3) | footers parsed per fill |")
    print("|---|---|---|---|")
    for groups in (int(g) for g in args.groups.split(",")):
        for compression in (None, "zstd"):
            out = Path(args.work) / f"{args.rows}-{groups}-{compression or 'none'}"
            if not (out / "_feedline.json").exists():
                fl.from_arrow(table).write(out, rows_per_shard=args.rows, bytes_per_shard=None,
                                           row_group_rows=-(-args.rows // groups),
                                           compression=compression)  # fmt: skip
            source = open_shard_source(out)
            specs = column_specs(source.schema())
            load_cache(source, specs)  # the page cache warm
            times = []
            for _ in range(3):
                parsed[0] = 0
                start = time.perf_counter()
                cache = load_cache(source, specs)
                getattr(cache, "wait", lambda: None)()  # (a background fill: to its end)
                times.append(time.perf_counter() - start)
            print(f"| {len(source.row_group_sizes)} | {compression or 'none'} | "
                  f"{statistics.median(times):.3f} | {parsed[0]} |")  # fmt: skip


if __name__ == "__main__":
    main()
