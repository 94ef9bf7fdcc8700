"""Scale-out figures: driver peak RSS while writing GBs, and 1 vs 2 Spark workers vs native Spark.

Usage::

    .venv/bin/python bench/scale.py [--sizes 0.5,2] [--workers 1,2] [--engines local,spark]

For each input size (GB of uncompressed Parquet, generated once under ``--root``) every case
runs the same job in a fresh process: read Parquet -> filter (keeps ~84%) -> map_batches
(a derived column) -> write. Cases:

- ``local``: feedline's local engine.
- ``spark-<n>w``: feedline's Spark engine on a standalone cluster of ``n`` workers (1 core,
  2 GB each) started on 127.0.0.1 from the pyspark package.
- ``native-<n>w``: the same work as plain Spark on the same cluster: ``spark.read.parquet``
  -> ``filter`` -> ``mapInArrow`` -> ``write.parquet``.

Reported per case: wall seconds, MB/s of input, and the *driver* Python process's peak RSS
(``ru_maxrss``; for Spark the driver JVM is a separate process and is not included). The
goal is a driver peak that is flat in the data size (< 600 MB). One run each; the machine
is shared, so compare ratios within one run. Writes ``bench/out/scale.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FILE_ROWS = 2 << 20  # 2M rows x 32 bytes = 64 MiB per input file
OUT = Path(__file__).parent / "out" / "scale.json"


def make_input(folder: Path, gb: float) -> Path:
    """``gb`` GB of uncompressed Parquet: an int64 id and 6 float32 features."""
    files = max(1, round(gb * 1e9 / (FILE_ROWS * 32)))
    if folder.exists() and len(list(folder.glob("*.parquet"))) == files:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        columns = {"id": np.arange(i * FILE_ROWS, (i + 1) * FILE_ROWS, dtype=np.int64)}
        columns |= {f"x{k}": rng.standard_normal(FILE_ROWS, dtype=np.float32) for k in range(6)}
        pq.write_table(pa.table(columns), folder / f"part-{i:04d}.parquet", compression="none")
    return folder


def derive(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The map_batches step: one derived column (x0 * 2 + x1)."""
    y = batch["x0"].to_numpy() * np.float32(2) + batch["x1"].to_numpy()
    return pa.RecordBatch.from_arrays([*batch.columns, pa.array(y)], [*batch.schema.names, "y"])


# ----------------------------------------------------------------------------- one case


def run_case(case: str, source: str, out: str, master: str | None) -> dict:
    """Runs inside a fresh process; returns wall seconds, rows and this process's peak RSS."""
    import pyarrow.compute as pc

    start = time.perf_counter()
    if case == "local":
        import feedline as fl

        ds = fl.read_parquet(source).filter(pc.field("x0") > -1.0).map_batches(derive)
        rows = ds.write(out, compression=None).rows
    elif case.startswith("spark"):
        import feedline as fl
        from feedline.engines.spark import SparkEngine, spark_session

        spark = spark_session(master or "local[2]")
        start = time.perf_counter()  # the session start is not the job
        ds = fl.read_parquet(source).filter(pc.field("x0") > -1.0).map_batches(derive)
        rows = ds.write(out, engine=SparkEngine(spark), compression=None).rows
    else:
        from pyspark.sql import SparkSession
        from pyspark.sql.types import FloatType, StructField, StructType

        # the hand work plain Spark needs on a cluster: the executors' Python, the bind address
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark = (
            SparkSession.builder.master(master)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.parquet.compression.codec", "uncompressed")
            .getOrCreate()
        )
        start = time.perf_counter()
        frame = spark.read.parquet(source).filter("x0 > -1.0")
        schema = StructType([*frame.schema.fields, StructField("y", FloatType())])

        def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                yield derive(batch)

        frame.mapInArrow(stage, schema).write.mode("overwrite").parquet(out)
        rows = spark.read.parquet(out).count()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    return {"case": case, "seconds": seconds, "rows": rows, "driver_peak_rss_mb": peak}


# ----------------------------------------------------------------------------- a cluster


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def cluster(workers: int, root: Path) -> Iterator[str]:
    """A standalone master and ``workers`` workers (1 core, 2 GB each) on 127.0.0.1."""
    from pyspark.find_spark_home import _find_spark_home

    home = _find_spark_home()
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    port, ui = _free_port(), _free_port()
    launcher = os.path.join(home, "bin", "spark-class")
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    processes = []

    def start(name: str, *args: str) -> None:
        with open(logs / f"{name}.log", "wb") as out:
            processes.append(subprocess.Popen([launcher, *args], env=env, stdout=out, stderr=out))

    try:
        master = "org.apache.spark.deploy.master.Master"
        start("master", master, *f"--host 127.0.0.1 --port {port} --webui-port {ui}".split())
        for k in range(workers):
            start(
                f"worker-{k}",
                "org.apache.spark.deploy.worker.Worker",
                *f"--host 127.0.0.1 --cores 1 --memory 2g --webui-port {_free_port()}".split(),
                "--work-dir",
                str(root / f"work-{k}"),
                f"spark://127.0.0.1:{port}",
            )
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    alive = [w for w in json.loads(r.read())["workers"] if w["state"] == "ALIVE"]
                if len(alive) == workers:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not start; see {logs}")
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def measure(case: str, source: Path, out: Path, master: str | None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, __file__, "--run", case, str(source), str(out), master or ""]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{case} failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.5,2", help="input sizes in GB, comma separated")
    parser.add_argument("--workers", default="1,2", help="Spark cluster sizes to run")
    parser.add_argument("--engines", default="local,spark,native")
    parser.add_argument("--root", default="/tmp/feedline-scale")
    parser.add_argument("--run", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        case, source, out, master = args.run
        print(json.dumps(run_case(case, source, out, master or None)))
        return
    root = Path(args.root)
    engines = args.engines.split(",")
    results = []
    for gb in (float(s) for s in args.sizes.split(",")):
        source = make_input(root / f"input-{gb:g}gb", gb)
        size = sum(p.stat().st_size for p in source.glob("*.parquet"))
        cases: list[tuple[str, str | None]] = [("local", None)] if "local" in engines else []
        for row in _run_all(cases, source, root, size, gb):
            results.append(row)
        for n in (int(w) for w in args.workers.split(",")):
            wanted = [(f"{e}-{n}w", e) for e in ("spark", "native") if e in engines]
            if not wanted:
                continue
            with cluster(n, root / f"cluster-{n}") as master:
                cases = [(name, master) for name, _ in wanted]
                results.extend(_run_all(cases, source, root, size, gb))
    _print(results)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))


def _run_all(cases, source: Path, root: Path, size: int, gb: float) -> list[dict]:
    rows = []
    for name, master in cases:
        result = measure(name, source, root / "out", master)
        result |= {"input_gb": size / 1e9, "mb_per_s": size / 1e6 / result["seconds"]}
        print(json.dumps(result), flush=True)
        rows.append(result)
    return rows


def _print(results: list[dict]) -> None:
    print(f"{'case':<12}{'input GB':>9}{'seconds':>9}{'MB/s':>8}{'driver peak RSS MB':>20}")
    for r in results:
        print(
            f"{r['case']:<12}{r['input_gb']:>9.2f}{r['seconds']:>9.1f}{r['mb_per_s']:>8.0f}"
            f"{r['driver_peak_rss_mb']:>20.0f}"
        )
    by = {(r["case"], round(r["input_gb"], 1)): r["seconds"] for r in results}
    for (case, gb), seconds in sorted(by.items()):
        if case.startswith("spark-2w") and ("spark-1w", gb) in by:
            speedup = by[("spark-1w", gb)] / seconds
            print(f"{gb} GB: feedline on Spark, 1 -> 2 workers: {speedup:.2f}x")
        if case.startswith("spark") and (case.replace("spark", "native"), gb) in by:
            native = by[(case.replace("spark", "native"), gb)]
            print(f"{gb} GB: {case} time / native time: {seconds / native:.2f}")


if __name__ == "__main__":
    main()
