"""List columns as tensors (issue 16.1): a ``list<uint8>`` image Parquet folder through the loader
vs the same images as feedline's fixed-size binary tensor column, one run.

Usage::

    .venv/bin/python bench/list_tensors.py [--rows 100000] [--dir /tmp/feedline-list-bench]

Writes ``--rows`` random 3x64x64 ``uint8`` images (plus an int64 label) with pyarrow as
``list<uint8>`` (what Spark's ``ArrayType`` and pyarrow write: 20 files, 1000-row row
groups), converts them with ``fl.ListToTensor`` + ``ds.write`` into a feedline dataset
(fixed-size binary), then for each of the two and each cache mode times a loader
(``batch_size=256``, shuffled, ``format="torch"``): the first batch (from creating the loader,
so it includes filling the cache) and samples/s over one epoch (first batch included and
after it). Files are read from the page cache (each folder is read once before timing).
Prints a table and writes ``bench/out/list_tensors.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import feedline as fl

SHAPE = (3, 64, 64)
FILES = 20
ROW_GROUP = 1000
BATCH = 256


def write_lists(folder: Path, rows: int, seed: int = 0) -> None:
    """``rows`` random images as ``list<uint8>``, ``FILES`` files, pyarrow's defaults."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    width = int(np.prod(SHAPE))
    per_file = -(-rows // FILES)
    for f, start in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - start)
        flat = rng.integers(0, 256, n * width, dtype=np.uint8)
        offsets = pa.array(np.arange(0, n * width + 1, width, dtype=np.int32))
        images = pa.ListArray.from_arrays(offsets, pa.array(flat))
        table = pa.table({"image": images, "label": np.arange(start, start + n)})
        pq.write_table(table, folder / f"part-{f:05d}.parquet", row_group_size=ROW_GROUP)


def warm(folder: Path) -> None:
    for path in sorted(folder.rglob("*.parquet")):
        path.read_bytes()


def time_loader(ds: fl.Dataset, cache: str, **kw: object) -> dict[str, float]:
    start = time.perf_counter()
    loader = ds.loader(batch_size=BATCH, seed=0, cache=cache, format="torch", **kw)
    first = None
    samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
            after = time.perf_counter()
        samples += len(batch["label"])
    total = time.perf_counter() - start
    rest = time.perf_counter() - after
    return {
        "first_batch_s": round(first or 0.0, 3),
        "samples_per_s": round(samples / total, 1),
        "samples_per_s_after_first": round((samples - BATCH) / max(rest, 1e-9), 1),
        "samples": samples,
        "mode": loader.stats().get("cache", cache),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dir", default="/tmp/feedline-list-bench")
    parser.add_argument("--keep", action="store_true", help="keep the files afterwards")
    args = parser.parse_args()
    import torch  # noqa: F401 - imported before timing: the first loader would pay for it

    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    lists, tensors = root / "lists", root / "tensors"
    t0 = time.perf_counter()
    write_lists(lists, args.rows)
    t1 = time.perf_counter()
    fl.read_parquet(lists).transform(fl.ListToTensor("image", shape=SHAPE)).write(tensors)
    t2 = time.perf_counter()
    results: dict[str, object] = {
        "rows": args.rows, "shape": list(SHAPE), "write_lists_s": round(t1 - t0, 2),
        "convert_to_feedline_s": round(t2 - t1, 2),
        "bytes_lists": sum(p.stat().st_size for p in lists.rglob("*.parquet")),
        "bytes_tensors": sum(p.stat().st_size for p in tensors.rglob("*.parquet")),
    }  # fmt: skip
    for name, ds, kw in (
        ("list<uint8> Parquet", fl.read_parquet(lists), {"shapes": {"image": SHAPE}}),
        ("feedline fixed-size binary", fl.open(tensors), {}),
    ):
        for cache in ("auto", "none"):
            warm(lists if "list" in name else tensors)
            results[f"{name} / cache={cache}"] = time_loader(ds, cache, **kw)
    for key, value in results.items():
        print(f"{key:42s} {value}")
    out = Path(__file__).parent / "out" / "list_tensors.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
