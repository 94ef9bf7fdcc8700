"""Write, read and CSV-conversion throughput: feedline vs plain pyarrow and pandas, one run.

Usage::

    .venv/bin/python bench/read_write.py [--rows 5000000] [--repeat 3] [--only csv|checks]

Prints a table of MB/s (uncompressed Arrow bytes per second) and rows/s, the ratios
feedline/peer, and writes ``bench/out/read_write.json``. Reads are from the page cache
(every reader reads the same files once before timing).

It also measures what feedline's read-time checks cost, on the same 16-shard dataset in the
same run: page-checksum verification plus the footer checks (on open and on every shard
read) against the same reads with them turned off (patched out in this process only), for
``fl.open().to_arrow()`` and for the loader's read path; and, for comparison, a sha256 of
every shard (the check ``fl.verify`` does, rejected as a default by this measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
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


def best_of(variants: dict[str, Callable[[], object]], repeat: int) -> dict[str, tuple]:
    """Per variant, the best wall time and the best CPU time (all threads of this process)
    of ``repeat`` runs; the variants run interleaved, so a busy machine slows all alike."""
    for fn in variants.values():
        fn()
    walls: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, fn in variants.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            cpus[name].append(time.process_time() - cpu)
            walls[name].append(time.perf_counter() - wall)
    return {name: (min(walls[name]), min(cpus[name])) for name in variants}


@contextlib.contextmanager
def checks_off(pages: bool = True, footers: bool = True) -> Iterator[None]:
    """feedline's read-time integrity checks turned off, to measure what they cost.

    ``pages``: page-checksum verification off in both read paths; ``footers``: footers
    neither checked on open nor on read. Patched in this process for the ``with`` block
    only; there is no user-facing switch.
    """
    import pyarrow.dataset as pads

    import feedline.io.parquet as fpq
    import feedline.store.dataset_files as fmt
    import feedline.store.shard_source as loader_reads

    def unverified_file(*args, **kwargs):
        return pq.ParquetFile(*args, **{**kwargs, "page_checksum_verification": False})

    saved = (fpq._FORMAT, fmt.check_footers, fmt.check_identity, loader_reads.pq)
    if pages:
        fpq._FORMAT = pads.ParquetFileFormat()
        loader_reads.pq = type("pq", (), {"ParquetFile": staticmethod(unverified_file)})
    if footers:
        fmt.check_footers = lambda *args, **kwargs: None
        fmt.check_identity = lambda *args, **kwargs: None
    try:
        yield
    finally:
        fpq._FORMAT, fmt.check_footers, fmt.check_identity, loader_reads.pq = saved


#: the variants of the integrity-check measurement, in table order
CHECKS = {
    "all checks (default)": None,
    "page CRCs off": (True, False),
    "all checks off": (True, True),
}


def measure_checks(table: pa.Table, work: Path, repeat: int, record: Callable) -> dict:
    """Read throughput with feedline's integrity checks on vs off, one dataset, one run.

    Returns the cost of the checks per read path: CPU and wall time with them over without.
    """
    from dataclasses import replace

    from feedline.io.storage.paths import resolve
    from feedline.loader.data.columns import column_specs
    from feedline.loader.data.memory_cache import load_cache
    from feedline.store.shards import file_checksum

    out = work / "checked"
    fl.from_arrow(table).write(
        out, compression="zstd", rows_per_shard=-(-table.num_rows // 16), bytes_per_shard=None
    )
    numeric = [f.name for f in table.schema if f.name != "category"]
    source = fl.open(out).shard_source(numeric)  # what Dataset.loader() reads
    specs = column_specs(source.schema(), numeric)

    def load(variant):  # the loader skips footer checks for a source without manifest entries
        shards = replace(source, shards=()) if variant == (True, True) else source
        return lambda: load_cache(shards, specs)

    paths = {
        "checks: fl.open().to_arrow()": (lambda v: lambda: fl.open(out).to_arrow(), table.nbytes),
        "checks: loader read (numeric columns into the cache)": (
            load,
            table.select(numeric).nbytes,
        ),
        "checks: fl.open() of 16 shards (footers only)": (
            lambda v: lambda: fl.open(out),
            table.nbytes,
        ),
    }
    costs = {}
    for case, (make, nbytes) in paths.items():
        variants = {name: _patched(make(v), v) for name, v in CHECKS.items()}
        timed = best_of(variants, max(repeat, 5))
        for name, (wall, _cpu) in timed.items():
            record(case, name, wall, nbytes / 1e6, table.num_rows)
        (wall_on, cpu_on), (wall_off, cpu_off) = (
            timed["all checks (default)"],
            timed["all checks off"],
        )
        costs[case] = {
            "cpu": cpu_on / cpu_off - 1,
            "wall": wall_on / wall_off - 1,
            "cpu_seconds_on": cpu_on,
            "cpu_seconds_off": cpu_off,
            "cpu_seconds_page_crcs_off": timed["page CRCs off"][1],
        }

    case = "checks: sha256 of every shard (fl.verify's pass)"
    files = [resolve(out).child(s.path) for s in fl.open(out).manifest.shards]
    t = best(lambda: [file_checksum(f) for f in files], repeat)
    record(case, "hashlib.sha256", t, table.nbytes / 1e6, table.num_rows)
    return costs


def _patched(fn: Callable[[], object], variant: tuple[bool, bool] | None):
    if variant is None:
        return fn

    def run() -> object:
        with checks_off(*variant):
            return fn()

    return run


CSV_TOOLS = {
    "feedline read_csv().write()": lambda src, out: fl.read_csv(src).write(out / "csv_fl"),
    "pandas read_csv + to_parquet": lambda src, out: pd.read_csv(src).to_parquet(
        out / "csv_pd.parquet"
    ),
    "pyarrow.csv + write_table": lambda src, out: pq.write_table(
        pacsv.read_csv(src), out / "csv_pa.parquet", compression="zstd"
    ),
}


def csv_conversion(rows: int, repeat: int, work: Path, record: Callable) -> float:
    """CSV -> Parquet with feedline, pandas and pyarrow (each tool's defaults) on one file.

    One warm-up call each, then ``repeat`` rounds running the three in turn (so a busy machine
    slows all alike); the best time of each is recorded. Returns the CSV's size in MB.
    """
    path = work / "data.csv"
    pacsv.write_csv(make_table(rows, seed=1), path)
    size_mb = path.stat().st_size / 1e6
    for convert in CSV_TOOLS.values():
        convert(path, work)
    times: dict[str, list[float]] = {tool: [] for tool in CSV_TOOLS}
    for _ in range(repeat):
        for tool, convert in CSV_TOOLS.items():
            start = time.perf_counter()
            convert(path, work)
            times[tool].append(time.perf_counter() - start)
    for tool, seconds in times.items():
        record("CSV -> Parquet", tool, min(seconds), size_mb, rows)
    return size_mb


def csv_only(rows: int, repeat: int, work: Path) -> None:
    """``--only csv``: the CSV cases alone, with their two ratios."""
    results: list[dict[str, object]] = []

    def record(case: str, tool: str, seconds: float, size_mb: float, n: int) -> None:
        results.append(
            {
                "case": case,
                "tool": tool,
                "seconds": round(seconds, 4),
                "MB/s": round(size_mb / seconds, 1),
                "rows/s": round(n / seconds),
            }
        )

    size_mb = csv_conversion(rows, repeat, work, record)
    shutil.rmtree(work, ignore_errors=True)
    console = Console()
    view = Table(title=f"CSV -> Parquet: {rows:,} rows, {size_mb:.0f} MB")
    for name in ("tool", "seconds", "MB/s", "rows/s"):
        view.add_column(name)
    for row in results:
        view.add_row(
            *(
                f"{row[k]:,}" if isinstance(row[k], int | float) else str(row[k])
                for k in ("tool", "seconds", "MB/s", "rows/s")
            )
        )
    console.print(view)
    speed = {row["tool"]: row["MB/s"] for row in results}
    ours = speed["feedline read_csv().write()"]
    ratios = {
        "csv: feedline / pandas": ours / speed["pandas read_csv + to_parquet"],
        "csv: feedline / pyarrow": ours / speed["pyarrow.csv + write_table"],
    }
    for name, value in ratios.items():
        console.print(f"{name}: {value:.2f}x")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "read_write_csv.json").write_text(
        json.dumps({"results": results, "ratios": ratios}, indent=1)
    )


def checks_ratios(costs: dict, results: list[dict], console: Console) -> dict[str, float]:
    """Print and return the cost figures of :func:`measure_checks`."""
    ratios: dict[str, float] = {}
    footers = costs["checks: fl.open() of 16 shards (footers only)"]
    ratios["checks: footer check per shard on open, CPU ms"] = (
        (footers["cpu_seconds_on"] - footers["cpu_seconds_off"]) / 16 * 1e3
    )
    console.print(
        "checks: footer check per shard on open: "
        f"{ratios['checks: footer check per shard on open, CPU ms']:.3f} ms CPU"
    )
    for case in (
        "checks: fl.open().to_arrow()",
        "checks: loader read (numeric columns into the cache)",
    ):
        cost = costs[case]
        crc = cost["cpu_seconds_on"] / cost["cpu_seconds_page_crcs_off"] - 1
        ratios[f"{case}: cost of the checks, CPU"] = cost["cpu"]
        ratios[f"{case}: cost of the checks, wall"] = cost["wall"]
        ratios[f"{case}: cost of the page CRCs alone, CPU"] = crc
        console.print(
            f"{case}: the checks cost {cost['cpu']:+.1%} CPU time "
            f"(the page CRCs alone {crc:+.1%}), {cost['wall']:+.1%} wall time"
        )
    seconds = {
        r["tool"]: r["seconds"]
        for r in results
        if r["case"].startswith("checks: sha256") or r["case"] == ("checks: fl.open().to_arrow()")
    }
    ratio = seconds["hashlib.sha256"] / seconds["all checks (default)"]
    ratios["checks: sha256 of every shard / fl.open().to_arrow() wall time"] = ratio
    console.print(
        f"checks: a sha256 of every shard takes {ratio:.2f}x the time of fl.open().to_arrow()"
    )
    return ratios


def checks_only(rows: int, repeat: int, work: Path) -> None:
    """``--only checks``: what the integrity checks cost, alone."""
    table = make_table(rows)
    results: list[dict[str, object]] = []

    def record(case: str, tool: str, seconds: float, size_mb: float, n: int) -> None:
        results.append(
            {
                "case": case,
                "tool": tool,
                "seconds": round(seconds, 4),
                "MB/s": round(size_mb / seconds, 1),
                "rows/s": round(n / seconds),
            }
        )

    costs = measure_checks(table, work, repeat, record)
    shutil.rmtree(work, ignore_errors=True)
    console = Console()
    view = Table(
        title=f"integrity checks: {rows:,} rows, {table.nbytes / 1e6:.0f} MB in "
        "memory, 16 zstd shards (best wall time)"
    )
    for name in ("case", "tool", "seconds", "MB/s"):
        view.add_column(name)
    for row in results:
        view.add_row(
            *(
                f"{row[k]:,}" if isinstance(row[k], int | float) else str(row[k])
                for k in ("case", "tool", "seconds", "MB/s")
            )
        )
    console.print(view)
    ratios = checks_ratios(costs, results, console)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "read_write_checks.json").write_text(
        json.dumps({"results": results, "ratios": ratios, "costs": costs}, indent=1)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--csv-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--only",
        choices=["all", "csv", "checks"],
        default="all",
        help="'csv': only the CSV -> Parquet cases (bench/out/read_write_csv.json)"
        "; 'checks': only the integrity checks (bench/out/read_write_checks.json)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="feedline-bench-"))
    if args.only == "csv":
        csv_only(args.csv_rows, args.repeat, work)
        return
    if args.only == "checks":
        checks_only(args.rows, args.repeat, work)
        return
    table = make_table(args.rows)
    mb = table.nbytes / 1e6
    results: list[dict[str, object]] = []

    def record(case: str, tool: str, seconds: float, size_mb: float, rows: int) -> None:
        results.append(
            {
                "case": case,
                "tool": tool,
                "seconds": round(seconds, 4),
                "MB/s": round(size_mb / seconds, 1),
                "rows/s": round(rows / seconds),
            }
        )

    # --- write: same table, zstd, ~same row group size
    fl_out, pa_out = work / "fl", work / "pa.parquet"
    t = best(
        lambda: fl.from_arrow(table).write(fl_out, compression="zstd", bytes_per_shard=None),
        args.repeat,
    )
    record("write parquet (zstd)", "feedline", t, mb, args.rows)
    rg_rows = fl.open(fl_out).manifest.shards[0].row_groups[0]
    t = best(
        lambda: pq.write_table(table, pa_out, compression="zstd", row_group_size=rg_rows),
        args.repeat,
    )
    record("write parquet (zstd)", "pyarrow.parquet.write_table", t, mb, args.rows)

    # --- read: the same file(s), all columns, from the page cache
    shard_files = [str(fl_out / s.path) for s in fl.open(fl_out).manifest.shards]
    t = best(lambda: fl.open(fl_out).to_arrow(), args.repeat)
    record("read to Arrow table", "feedline open().to_arrow()", t, mb, args.rows)
    t = best(lambda: sum(b.num_rows for b in fl.open(fl_out).iter_batches()), args.repeat)
    record("read to Arrow table", "feedline open().iter_batches()", t, mb, args.rows)
    t = best(lambda: pq.read_table(shard_files), args.repeat)
    record("read to Arrow table", "pyarrow.parquet.read_table", t, mb, args.rows)

    # --- what the integrity checks cost (same run, on vs off)
    check_costs = measure_checks(table, work, args.repeat, record)

    # --- CSV conversion
    csv_mb = csv_conversion(args.csv_rows, args.repeat, work, record)

    shutil.rmtree(work, ignore_errors=True)
    console = Console()
    view = Table(
        title=f"read/write: {args.rows:,} rows, {mb:.0f} MB in memory; "
        f"CSV {args.csv_rows:,} rows, {csv_mb:.0f} MB"
    )
    for name in ("case", "tool", "seconds", "MB/s", "rows/s"):
        view.add_column(name)
    for row in results:
        view.add_row(
            *(
                f"{row[k]:,}" if isinstance(row[k], int | float) else str(row[k])
                for k in ("case", "tool", "seconds", "MB/s", "rows/s")
            )
        )
    console.print(view)

    def speed(case: str, tool: str) -> float:
        return next(r["MB/s"] for r in results if r["case"] == case and r["tool"] == tool)

    ratios = {
        "write: feedline / pyarrow": speed("write parquet (zstd)", "feedline")
        / speed("write parquet (zstd)", "pyarrow.parquet.write_table"),
        "read: feedline to_arrow / pyarrow read_table": speed(
            "read to Arrow table", "feedline open().to_arrow()"
        )
        / speed("read to Arrow table", "pyarrow.parquet.read_table"),
        "read: feedline iter_batches / pyarrow read_table": speed(
            "read to Arrow table", "feedline open().iter_batches()"
        )
        / speed("read to Arrow table", "pyarrow.parquet.read_table"),
        "csv: feedline / pandas": speed("CSV -> Parquet", "feedline read_csv().write()")
        / speed("CSV -> Parquet", "pandas read_csv + to_parquet"),
        "csv: feedline / pyarrow": speed("CSV -> Parquet", "feedline read_csv().write()")
        / speed("CSV -> Parquet", "pyarrow.csv + write_table"),
    }
    for name, value in ratios.items():
        console.print(f"{name}: {value:.2f}x")
    ratios |= checks_ratios(check_costs, results, console)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "read_write.json").write_text(
        json.dumps({"results": results, "ratios": ratios}, indent=1)
    )


if __name__ == "__main__":
    main()
