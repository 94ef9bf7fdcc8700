"""Relational operators and ``to_numpy(stack=True)``: feedline (local engine) side by side
with Polars, DuckDB and pandas, in one run.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/ops.py [--rows 10000000]
        [--repeat 2] [--only ops|numpy|spark|ray] [--files 100] [--cols 1000]
        [--engine-rows 2000000]

* ``ops``: groupby-agg (sum, mean, count over 1 000 000 keys), sort (by a float column,
  all columns carried) and an inner join with a 1 000 000-row dimension table, on
  ``--rows`` rows held in memory by each library (an Arrow table for feedline and DuckDB, a
  Polars frame, a pandas frame), each result collected in memory (Arrow table / frame).
  feedline delegates these to its embedded engine (DuckDB; a join of two in-memory tables
  to Arrow's hash join, Acero); the goal is within 1.2x of the best peer.
  When this feedline has no relational operators yet, its rows say ``n/a``.
* ``spark`` / ``ray``: the same three operations on ``--engine-rows`` rows read from Parquet
  (8 files of facts, 1 of dimensions, in ``/tmp/feedline-bench-ops``), the result collected
  on the driver as one Arrow table: feedline's ``SparkEngine`` vs plain Spark DataFrame code
  (``groupBy().agg``, ``orderBy``, ``join``, ``toArrow()``) on the same ``local[2]``
  session, and feedline's ``RayEngine`` vs plain Ray Data code (``groupby().aggregate``,
  ``sort``, ``join``, ``to_arrow_refs``) on the same local ``ray.init(num_cpus=2)``, each
  with its defaults. Goal: feedline >= 0.9x the native engine (ratio = native / feedline).
* ``numpy``: the "speed cubing" read: ``--files`` Parquet files of 1000 rows x ``--cols``
  float64 columns (written by pandas, snappy, cached in ``/tmp/feedline-bench-cubes``)
  read into one ``(rows, cols)`` array: ``fl.read_parquet(folder).to_numpy(stack=True)``
  vs ``pd.concat([pd.read_parquet(f) for f in files]).to_numpy()`` and
  ``pl.read_parquet(files).to_numpy()``. All read from the page cache (a warm-up pass
  first); every result is checked equal to pandas'.

Each figure is the best of ``--repeat`` timed calls. Prints a table with ratios
(peer time / feedline time: above 1 means feedline is faster), the ``uptime`` load averages
before and after (this machine is shared: other work runs at the same time), and writes
``bench/out/ops.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
from rich.console import Console
from rich.table import Table

import feedline as fl

CUBES = Path("/tmp/feedline-bench-cubes")
ENGINE_DATA = Path("/tmp/feedline-bench-ops")
OUT = Path(__file__).parent / "out" / "ops.json"


def load() -> str:
    """The machine's load averages (1, 5, 15 minutes)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        result = None
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def make_tables(rows: int, keys: int, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """A fact table (k int64 in [0, keys), v float64, w int64) and a dimension table."""
    rng = np.random.default_rng(seed)
    facts = pa.table(
        {
            "k": rng.integers(0, keys, rows),
            "v": rng.standard_normal(rows),
            "w": rng.integers(0, 1000, rows),
        }
    )
    dims = pa.table({"k": np.arange(keys, dtype=np.int64), "d": rng.standard_normal(keys)})
    return facts, dims


def has_relational() -> bool:
    return all(hasattr(fl.Dataset, name) for name in ("sort", "groupby", "join"))


def op_runners(facts: pa.Table, dims: pa.Table) -> dict[str, dict[str, Callable[[], Any]]]:
    """For each operation, a runner per library returning the collected result."""
    pdf, pdims = facts.to_pandas(), dims.to_pandas()
    plf, pldims = pl.from_arrow(facts), pl.from_arrow(dims)
    con = duckdb.connect()
    con.register("facts", facts)
    con.register("dims", dims)
    fdf, fdims = fl.from_arrow(facts), fl.from_arrow(dims)
    runners: dict[str, dict[str, Callable[[], Any]]] = {
        "groupby-agg": {
            "polars": lambda: plf.group_by("k").agg(
                pl.col("v").sum().alias("s"), pl.col("v").mean().alias("m"), pl.len().alias("n")
            ),
            "duckdb": lambda: con.sql(
                "SELECT k, sum(v) AS s, avg(v) AS m, count(*) AS n FROM facts GROUP BY k"
            ).to_arrow_table(),
            "pandas": lambda: pdf.groupby("k", sort=False).agg(
                s=("v", "sum"), m=("v", "mean"), n=("v", "size")
            ),
        },
        "sort": {
            "polars": lambda: plf.sort("v"),
            "duckdb": lambda: con.sql("SELECT * FROM facts ORDER BY v").to_arrow_table(),
            "pandas": lambda: pdf.sort_values("v"),
        },
        "join": {
            "polars": lambda: plf.join(pldims, on="k", how="inner"),
            "duckdb": lambda: con.sql("SELECT * FROM facts JOIN dims USING (k)").to_arrow_table(),
            "pandas": lambda: pdf.merge(pdims, on="k", how="inner"),
        },
    }
    if has_relational():
        runners["groupby-agg"]["feedline"] = lambda: (
            fdf.groupby("k").agg(s=("v", "sum"), m=("v", "mean"), n=("*", "count")).to_arrow()
        )
        runners["sort"]["feedline"] = lambda: fdf.sort("v").to_arrow()
        runners["join"]["feedline"] = lambda: fdf.join(fdims, on="k", how="inner").to_arrow()
    return runners


def rows_of(result: Any) -> int:
    return result.num_rows if isinstance(result, pa.Table) else len(result)


def interleaved(runners: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, int]]:
    """Each runner's best wall time of ``repeat`` calls and its result's row count; the
    runners take turns (round-robin) so that load swings on this shared machine hit them
    alike."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    counts: dict[str, int] = {}
    for _ in range(repeat):
        for name, fn in runners.items():
            start = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - start)
            counts[name] = rows_of(result)
            del result
    return {name: (min(times[name]), counts[name]) for name in runners}


def checked(op: str, measured: dict[str, tuple[float, int]]) -> int:
    """The row count every library returned (exits when they differ)."""
    counts = {name: rows for name, (_, rows) in measured.items()}
    if len(set(counts.values())) > 1:
        raise SystemExit(f"{op}: the libraries returned different row counts {counts}")
    return next(iter(counts.values()))


def bench_ops(rows: int, repeat: int) -> list[dict[str, Any]]:
    facts, dims = make_tables(rows, keys=1_000_000)
    results = []
    for op, runners in op_runners(facts, dims).items():
        row: dict[str, Any] = {"case": f"{op} ({rows:,} rows)"}
        names = [n for n in ("feedline", "polars", "duckdb", "pandas") if n in runners]
        measured = interleaved({n: runners[n] for n in names}, repeat)
        for name in ("feedline", "polars", "duckdb", "pandas"):
            row[name] = measured[name][0] if name in measured else None
        row["rows_out"] = checked(op, measured)
        results.append(row)
    return results


def write_engine_data(rows: int) -> tuple[Path, Path]:
    """``rows`` facts as 8 Parquet files and the dimension table as one (cached)."""
    folder = ENGINE_DATA / str(rows)
    facts_dir, dims_dir = folder / "facts", folder / "dims"
    if not (folder / "_done").exists():
        import pyarrow.parquet as pq

        facts, dims = make_tables(rows, keys=min(1_000_000, rows // 10))
        facts_dir.mkdir(parents=True, exist_ok=True)
        dims_dir.mkdir(parents=True, exist_ok=True)
        step = -(-rows // 8)
        for part, start in enumerate(range(0, rows, step)):
            pq.write_table(facts.slice(start, step), facts_dir / f"part-{part}.parquet")
        pq.write_table(dims, dims_dir / "part-0.parquet")
        (folder / "_done").write_text("ok")
    return facts_dir, dims_dir


def spark_runners(facts_dir: Path, dims_dir: Path) -> dict[str, dict[str, Callable[[], Any]]]:
    """feedline's SparkEngine and plain Spark DataFrame code on one local[2] session."""
    from pyspark.sql import functions as F

    from feedline.engines.spark.engine import spark_session

    # 3 GB of driver heap (local mode: the executor too) for both; Spark's default 1 GB
    # runs out collecting 2M joined rows into feedline's per-partition stream
    spark = spark_session("local[2]", **{"spark.driver.memory": "3g"})
    engine = fl.SparkEngine(spark)
    facts, dims = spark.read.parquet(str(facts_dir)), spark.read.parquet(str(dims_dir))
    fdf, fdims = fl.read_parquet(facts_dir), fl.read_parquet(dims_dir)
    # warm-up (JVM, Python workers): not timed
    fl.range(1000).sort("id").to_arrow(engine=engine)
    spark.range(1000).orderBy("id").toArrow()
    return {
        "groupby-agg": {
            "feedline": lambda: (
                fdf.groupby("k")
                .agg(s=("v", "sum"), m=("v", "mean"), n=("*", "count"))
                .to_arrow(engine=engine)
            ),
            "native": lambda: (
                facts.groupBy("k")
                .agg(F.sum("v").alias("s"), F.avg("v").alias("m"), F.count(F.lit(1)).alias("n"))
                .toArrow()
            ),
        },
        "sort": {
            "feedline": lambda: fdf.sort("v").to_arrow(engine=engine),
            "native": lambda: facts.orderBy(F.col("v").asc_nulls_last()).toArrow(),
        },
        "join": {
            "feedline": lambda: fdf.join(fdims, on="k").to_arrow(engine=engine),
            "native": lambda: facts.join(dims, on="k", how="inner").toArrow(),
        },
    }


def ray_runners(facts_dir: Path, dims_dir: Path) -> dict[str, dict[str, Callable[[], Any]]]:
    """feedline's RayEngine and plain Ray Data code on one local ray.init(num_cpus=2)."""
    import ray
    from ray.data.aggregate import Count, Mean, Sum

    engine = fl.RayEngine(num_cpus=2)
    engine.ensure_ray()
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    fdf, fdims = fl.read_parquet(facts_dir), fl.read_parquet(dims_dir)

    def collect(rds: Any) -> pa.Table:
        return pa.concat_tables(ray.get(rds.to_arrow_refs()))

    def facts() -> Any:
        return ray.data.read_parquet(str(facts_dir))

    # warm-up (worker processes, imports): not timed
    fl.range(1000).sort("id").to_arrow(engine=engine)
    collect(ray.data.range(1000).sort("id"))

    return {
        "groupby-agg": {
            "feedline": lambda: (
                fdf.groupby("k")
                .agg(s=("v", "sum"), m=("v", "mean"), n=("*", "count"))
                .to_arrow(engine=engine)
            ),
            "native": lambda: collect(
                facts()
                .groupby("k")
                .aggregate(
                    Sum("v", alias_name="s"), Mean("v", alias_name="m"), Count(alias_name="n")
                )
            ),
        },
        "sort": {
            "feedline": lambda: fdf.sort("v").to_arrow(engine=engine),
            "native": lambda: collect(facts().sort("v")),
        },
        "join": {
            "feedline": lambda: fdf.join(fdims, on="k").to_arrow(engine=engine),
            "native": lambda: collect(
                facts().join(
                    ray.data.read_parquet(str(dims_dir)),
                    join_type="inner",
                    on=("k",),
                    num_partitions=2,
                )
            ),
        },
    }


def bench_engine(kind: str, rows: int, repeat: int) -> list[dict[str, Any]]:
    """feedline on Spark or Ray vs the same engine's own API doing the same job."""
    facts_dir, dims_dir = write_engine_data(rows)
    make = spark_runners if kind == "spark" else ray_runners
    label = "Spark local[2]" if kind == "spark" else "Ray, 2 CPUs"
    results = []
    for op, runners in make(facts_dir, dims_dir).items():
        measured = interleaved(runners, repeat)
        results.append(
            {
                "case": f"{op} ({rows:,} rows, {label})",
                "engine": kind,
                "feedline": measured["feedline"][0],
                "native": measured["native"][0],
                "rows_out": checked(op, measured),
            }
        )
    return results


def make_cubes(files: int, cols: int) -> list[Path]:
    """``files`` Parquet files of 1000 x ``cols`` float64 written by pandas (cached)."""
    folder = CUBES / f"{files}x1000x{cols}"
    paths = [folder / f"part-{i:03d}.parquet" for i in range(files)]
    if not (folder / "_done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        names = [f"c{j}" for j in range(cols)]
        for path in paths:
            pd.DataFrame(rng.random((1000, cols)), columns=names).to_parquet(path)
        (folder / "_done").write_text("ok")
    return paths


def bench_numpy(files: int, cols: int, repeat: int) -> list[dict[str, Any]]:
    paths = make_cubes(files, cols)
    folder = paths[0].parent
    runners = {
        "feedline": lambda: fl.read_parquet(folder).to_numpy(stack=True),
        "feedline (order=F)": lambda: fl.read_parquet(folder).to_numpy(stack=True, order="F"),
        "pandas": lambda: pd.concat([pd.read_parquet(p) for p in paths]).to_numpy(),
        "polars": lambda: pl.read_parquet(paths).to_numpy(),
    }
    for path in paths:  # into the page cache
        path.read_bytes()
    reference = runners["pandas"]()
    row: dict[str, Any] = {"case": f"to_numpy: {files} files x 1000 x {cols} float64"}
    for name, fn in runners.items():
        seconds, result = best(fn, repeat)
        if not np.array_equal(result, reference):
            raise SystemExit(f"{name} read different values than pandas")
        row[name] = seconds
        del result
    return [row]


def report(rows: list[dict[str, Any]], before: str, after: str) -> None:
    console = Console(width=150)
    names = ["feedline", "polars", "duckdb", "pandas"]
    table = Table(title="bench/ops.py (seconds, best of runs; ratio = peer / feedline)")
    for column in ["case", *names, "best peer / feedline", "pandas / feedline"]:
        table.add_column(column, justify="left" if column == "case" else "right")
    for row in rows:
        if "engine" in row:
            continue
        peers = [row.get(n) for n in names[1:] if row.get(n) is not None]
        if "polars" in row and "duckdb" not in row:  # the to_numpy row
            peers = [row[n] for n in ("pandas", "polars")]
        ours = row.get("feedline")
        cells = [row["case"], *(f"{row[n]:.3f}" if row.get(n) else "n/a" for n in names)]
        cells.append(f"{min(peers) / ours:.2f}x" if ours else "n/a")
        cells.append(f"{row['pandas'] / ours:.2f}x" if ours else "n/a")
        table.add_row(*cells)
        if "feedline (order=F)" in row:
            f_order = row["feedline (order=F)"]
            table.add_row(
                "  same, order='F'", f"{f_order:.3f}", "", "", "",
                f"{min(peers) / f_order:.2f}x", f"{row['pandas'] / f_order:.2f}x",
            )  # fmt: skip
    if table.rows:
        console.print(table)
    engines = Table(title="feedline on an engine vs the engine's own API (seconds, best of runs)")
    for column in ("case", "feedline", "native", "native / feedline (goal >= 0.9)"):
        engines.add_column(column, justify="left" if column == "case" else "right")
    for row in rows:
        if "engine" in row:
            engines.add_row(
                row["case"], f"{row['feedline']:.3f}", f"{row['native']:.3f}",
                f"{row['native'] / row['feedline']:.2f}x",
            )  # fmt: skip
    if engines.rows:
        console.print(engines)
    console.print(
        f"load averages (1/5/15 min): before {before}, after {after}; the machine is "
        f"shared with other work, {os.cpu_count()} CPUs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--engine-rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--cols", type=int, default=1000)
    parser.add_argument("--only", choices=["ops", "numpy", "spark", "ray"])
    args = parser.parse_args()
    before = load()
    rows: list[dict[str, Any]] = []
    if args.only in (None, "ops"):
        rows += bench_ops(args.rows, args.repeat)
    if args.only in (None, "numpy"):
        rows += bench_numpy(args.files, args.cols, args.repeat)
    for kind in ("spark", "ray"):
        if args.only in (None, kind):
            rows += bench_engine(kind, args.engine_rows, args.repeat)
    after = load()
    report(rows, before, after)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {"args": vars(args), "load_before": before, "load_after": after, "rows": rows},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
