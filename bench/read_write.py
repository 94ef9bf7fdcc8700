"""Write, read and CSV-conversion throughput: feedline vs plain pyarrow and pandas, one run.

Usage::

    .venv/bin/python bench/read_write.py [--rows 5000000] [--repeat 3]

Prints a table of MB/s (uncompressed Arrow bytes per second) and rows/s, the ratios
feedline/peer, and writes ``bench/out/read_write.json``. Reads are from the page cache
(every reader reads the same files once before timing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

import feedline as fl


def make_table(rows: int, seed: int = 0) -> pa.Table:
    """A training-like table: 8 float32 features, an int64 label, a short string."""
    rng = np.random.default_rng(seed)
    columns = {f"f{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(8)}
    columns["label"] = rng.integers(0, 1000, rows)
    colours = np.array(["red", "green", "blue", "black"])
    columns["category"] = pa.array(colours[rng.integers(0, 4, rows)])
    return pa.table(columns)


def best(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``repeat`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--csv-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="feedline-bench-"))
    table = make_table(args.rows)
    mb = table.nbytes / 1e6
    results: list[dict[str, object]] = []

    def record(case: str, tool: str, seconds: float, size_mb: float, rows: int) -> None:
        results.append({"case": case, "tool": tool, "seconds": round(seconds, 4),
                        "MB/s": round(size_mb / seconds, 1), "rows/s": round(rows / seconds)})

    # --- write: same table, zstd, ~same row group size
    fl_out, pa_out = work / "fl", work / "pa.parquet"
    t = best(lambda: fl.from_arrow(table).write(fl_out, compression="zstd",
                                                bytes_per_shard=None), args.repeat)
    record("write parquet (zstd)", "feedline", t, mb, args.rows)
    rg_rows = fl.open(fl_out).manifest.shards[0].row_groups[0]
    t = best(lambda: pq.write_table(table, pa_out, compression="zstd", row_group_size=rg_rows),
             args.repeat)
    record("write parquet (zstd)", "pyarrow.parquet.write_table", t, mb, args.rows)

    # --- read: the same file(s), all columns, from the page cache
    shard_files = [str(fl_out / s.path) for s in fl.open(fl_out).manifest.shards]
    t = best(lambda: fl.open(fl_out).to_arrow(), args.repeat)
    record("read to Arrow table", "feedline open().to_arrow()", t, mb, args.rows)
    t = best(lambda: sum(b.num_rows for b in fl.open(fl_out).iter_batches()), args.repeat)
    record("read to Arrow table", "feedline open().iter_batches()", t, mb, args.rows)
    t = best(lambda: pq.read_table(shard_files), args.repeat)
    record("read to Arrow table", "pyarrow.parquet.read_table", t, mb, args.rows)

    # --- CSV conversion
    csv_table = make_table(args.csv_rows, seed=1)
    csv_path = work / "data.csv"
    pacsv.write_csv(csv_table, csv_path)
    csv_mb = csv_path.stat().st_size / 1e6
    t = best(lambda: fl.read_csv(csv_path).write(work / "csv_fl"), args.repeat)
    record("CSV -> Parquet", "feedline read_csv().write()", t, csv_mb, args.csv_rows)
    t = best(lambda: pd.read_csv(csv_path).to_parquet(work / "csv_pd.parquet"), args.repeat)
    record("CSV -> Parquet", "pandas read_csv + to_parquet", t, csv_mb, args.csv_rows)
    t = best(lambda: pq.write_table(pacsv.read_csv(csv_path), work / "csv_pa.parquet",
                                    compression="zstd"), args.repeat)
    record("CSV -> Parquet", "pyarrow.csv + write_table", t, csv_mb, args.csv_rows)

    shutil.rmtree(work, ignore_errors=True)
    console = Console()
    view = Table(title=f"read/write: {args.rows:,} rows, {mb:.0f} MB in memory; "
                       f"CSV {args.csv_rows:,} rows, {csv_mb:.0f} MB")
    for name in ("case", "tool", "seconds", "MB/s", "rows/s"):
        view.add_column(name)
    for row in results:
        view.add_row(*(f"{row[k]:,}" if isinstance(row[k], int | float) else str(row[k])
                       for k in ("case", "tool", "seconds", "MB/s", "rows/s")))
    console.print(view)

    def speed(case: str, tool: str) -> float:
        return next(r["MB/s"] for r in results if r["case"] == case and r["tool"] == tool)

    ratios = {
        "write: feedline / pyarrow": speed("write parquet (zstd)", "feedline")
        / speed("write parquet (zstd)", "pyarrow.parquet.write_table"),
        "read: feedline to_arrow / pyarrow read_table": speed(
            "read to Arrow table", "feedline open().to_arrow()")
        / speed("read to Arrow table", "pyarrow.parquet.read_table"),
        "read: feedline iter_batches / pyarrow read_table": speed(
            "read to Arrow table", "feedline open().iter_batches()")
        / speed("read to Arrow table", "pyarrow.parquet.read_table"),
        "csv: feedline / pandas": speed("CSV -> Parquet", "feedline read_csv().write()")
        / speed("CSV -> Parquet", "pandas read_csv + to_parquet"),
        "csv: feedline / pyarrow": speed("CSV -> Parquet", "feedline read_csv().write()")
        / speed("CSV -> Parquet", "pyarrow.csv + write_table"),
    }
    for name, value in ratios.items():
        console.print(f"{name}: {value:.2f}x")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "read_write.json").write_text(json.dumps({"results": results, "ratios": ratios},
                                                    indent=1))


if __name__ == "__main__":
    main()
