"""Fitting on a sample: bytes read and wall time of ``fit(ds, fraction=f)`` against a full scan.

Usage::

    .venv/bin/python bench/fit_sample.py [--gb 1] [--fraction 0.05] [--engine local]

Generates ``--gb`` GB of uncompressed Parquet once under ``--root`` (16 files, 128k-row row
groups: an int64 id and 7 float64 features), then fits ``StandardScaler`` on the features,
each case in a fresh process:

- ``full``: ``fit(ds)``, every row;
- ``row-sample``: ``fit(ds.sample(f, seed))``: a row-level sample of the plan, which reads
  every row group and drops rows (what ``fit(ds, fraction=f)`` did before it sampled row
  groups);
- ``fraction``: ``fit(ds, fraction=f, seed)``: a row-group sample chosen from the footers,
  reading only those row groups.

Bytes read are the process's ``rchar`` (``/proc/self/io``: bytes through read system calls,
whether from disk or page cache), so they count every file byte the fit touched. One run per
case on a shared machine: compare the cases of one run. Writes ``bench/out/fit_sample.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FILES = 16
ROW_GROUP = 128 * 1024
FEATURES = [f"x{k}" for k in range(7)]
OUT = Path(__file__).parent / "out" / "fit_sample.json"


def make_input(folder: Path, gb: float) -> Path:
    """``gb`` GB of uncompressed Parquet in :data:`FILES` files of 128k-row row groups."""
    rows = max(ROW_GROUP, round(gb * 1e9 / 64 / FILES))
    marker = folder / f".rows-{rows}"
    if marker.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(FILES):
        columns = {"id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64)}
        columns |= {c: rng.standard_normal(rows) for c in FEATURES}
        pq.write_table(
            pa.table(columns),
            folder / f"part-{i:04d}.parquet",
            compression="none",
            row_group_size=ROW_GROUP,
        )
    marker.touch()
    return folder


def _rchar() -> int:
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("rchar"))


def run_case(folder: str, case: str, fraction: float, engine: str) -> dict[str, object]:
    """One fit in this process: wall seconds, bytes read, rows the fit saw."""
    import feedline as fl

    ds = fl.read_parquet(folder)
    scaler = fl.StandardScaler(FEATURES)
    before, start = _rchar(), time.perf_counter()
    if case == "full":
        fitted = scaler.fit(ds, engine=engine)
    elif case == "row-sample":
        fitted = scaler.fit(ds.sample(fraction, 0), engine=engine)
    else:
        fitted = scaler.fit(ds, fraction=fraction, seed=0, engine=engine)
    seconds = time.perf_counter() - start
    read = _rchar() - before
    state = fitted.state["fitted"]
    return {
        "case": case,
        "seconds": round(seconds, 3),
        "bytes_read": read,
        "rows": next(iter(state["count"].values())) if "count" in state else None,
        "mean_x0": state["mean"]["x0"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--engine", default="local")
    parser.add_argument("--root", default="/tmp/feedline-fit-sample")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = Path(args.root) / f"{args.gb:g}gb"
    if args.case:
        print(json.dumps(run_case(str(folder), args.case, args.fraction, args.engine)))
        return
    make_input(folder, args.gb)
    size = sum(p.stat().st_size for p in folder.glob("*.parquet"))
    results = []
    for case in ("full", "row-sample", "fraction"):
        cmd = [
            sys.executable,
            __file__,
            "--gb",
            str(args.gb),
            "--fraction",
            str(args.fraction),
            "--engine",
            args.engine,
            "--root",
            args.root,
            "--case",
            case,
        ]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        result = json.loads(line.strip().splitlines()[-1])
        results.append(result)
        print(
            f"{case:>11}: {result['seconds']:7.2f} s, {result['bytes_read'] / 1e6:9.1f} MB "
            f"read of {size / 1e6:.0f} MB, rows={result['rows']}, "
            f"mean_x0={result['mean_x0']:.5f}"
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "input_bytes": size,
                "fraction": args.fraction,
                "engine": args.engine,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
