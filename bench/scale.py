"""Scale-out figures: driver peak RSS while writing GBs, and 1 vs 2 workers on Spark and Ray
against the native engine doing the same job.

Usage::

    flock /tmp/feedline-bench.lock .venv/bin/python bench/scale.py \
        [--sizes 0.5,2] [--workers 1,2] [--engines local,spark,ray]

For each input size (GB of uncompressed Parquet, generated once under ``--root``) every case
runs the same job in a fresh process: read Parquet -> filter (keeps ~84%) -> map_batches
(a derived column) -> write. Cases:

- ``local``: feedline's local engine.
- ``spark-<n>w``: feedline's Spark engine on a standalone cluster of ``n`` workers (1 core,
  2 GB each) started on 127.0.0.1 from the pyspark package.
- ``spark-native-<n>w``: the same work as plain Spark on the same cluster:
  ``spark.read.parquet`` -> ``filter`` -> ``mapInArrow`` -> ``write.parquet``.
- ``ray-<n>w``: feedline's Ray engine on a Ray cluster of ``n`` raylets (1 CPU and a 1 GiB
  object store each) started from this interpreter; the driver connects with
  ``RayEngine(address=...)``.
- ``ray-native-<n>w``: the same work as plain Ray Data on the same cluster:
  ``ray.data.read_parquet`` -> ``filter(expr=...)`` -> ``map_batches`` -> ``write_parquet``.

Reported per case: wall seconds (session start / ``ray.init`` excluded), MB/s of input,
the *driver* Python process's peak RSS (``VmHWM`` of the case's process: for Spark the
driver JVM is a separate process and is not included; on Ray the reads, operators, writes
and checksums run in the raylets' worker processes, the driver only plans and collects
shard descriptions), and the peak of the summed RSS of every process the case and its
cluster run (driver, JVMs or raylets, GCS, workers; shared memory such as Ray's object
store is counted once per process that maps it, so this over-counts). The goal is a
driver peak that is flat in the data size (< 600 MB). One run each; the machine is shared,
so compare ratios within one run. Clusters are torn down on success and failure alike.
Writes ``bench/out/scale.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
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
    """The map_batches step: one derived column (x0 * 2 + x1); a RecordBatch or a Table."""
    y = batch["x0"].to_numpy() * np.float32(2) + batch["x1"].to_numpy()
    return batch.append_column("y", pa.array(y))


# ----------------------------------------------------------------------------- one case


def run_case(case: str, source: str, out: str, master: str | None) -> dict:
    """Runs inside a fresh process; returns wall seconds, rows and this process's peak RSS."""
    import pyarrow.compute as pc

    start = time.perf_counter()
    if case == "local":
        import feedline as fl

        ds = fl.read_parquet(source).filter(pc.field("x0") > -1.0).map_batches(derive)
        rows = ds.write(out, compression=None).rows
    elif case.startswith("spark-") and not case.startswith("spark-native"):
        import feedline as fl
        from feedline.engines.spark.engine import SparkEngine, spark_session

        spark = spark_session(master or "local[2]")
        start = time.perf_counter()  # the session start is not the job
        ds = fl.read_parquet(source).filter(pc.field("x0") > -1.0).map_batches(derive)
        rows = ds.write(out, engine=SparkEngine(spark), compression=None).rows
    elif case.startswith("spark-native"):
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
    elif case.startswith("ray-native"):
        import ray

        ray.init(address=master, include_dashboard=False, log_to_driver=False)
        _wait_for_raylets(case)
        ray.data.DataContext.get_current().enable_progress_bars = False
        start = time.perf_counter()  # ray.init is not the job
        data = ray.data.read_parquet(source).filter(expr="x0 > -1.0")
        data.map_batches(derive, batch_format="pyarrow").write_parquet(out, compression="none")
        seconds = time.perf_counter() - start
        rows = sum(pq.read_metadata(p).num_rows for p in Path(out).rglob("*.parquet"))
    elif case.startswith("ray-"):
        import feedline as fl
        from feedline.engines.ray.engine import RayEngine

        engine = RayEngine(address=master)
        engine.ensure_ray()  # connects, probes the nodes (not timed, as a session start)
        _wait_for_raylets(case)
        start = time.perf_counter()
        ds = fl.read_parquet(source).filter(pc.field("x0") > -1.0).map_batches(derive)
        rows = ds.write(out, engine=engine, compression=None).rows
    else:
        raise ValueError(f"unknown case {case!r}")
    if not case.startswith("ray-native"):
        seconds = time.perf_counter() - start
    return {"case": case, "seconds": seconds, "rows": rows, "driver_peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``). Not ``ru_maxrss``: on Linux that keeps the
    parent's RSS at the fork across ``exec``, a floor of the bench's own RSS."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # KiB -> MiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _wait_for_raylets(case: str) -> None:
    """Waits until the cluster of ``case`` (``...-<n>w``) has its ``n`` raylets alive."""
    import ray

    want = int(case.rsplit("-", 1)[1].rstrip("w"))
    deadline = time.monotonic() + 60
    while sum(node["Alive"] for node in ray.nodes()) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{want} raylets did not join: {ray.nodes()}")
        time.sleep(0.2)


# ----------------------------------------------------------------------------- clusters


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def spark_cluster(workers: int, root: Path) -> Iterator[str]:
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
        _stop(processes)


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def raylet(head: str, temp: str, address_file: str) -> None:
    """Runs one raylet (the head when ``head`` is empty) until SIGTERM; writes its GCS address
    to ``address_file``.

    Started without ``ray start``: that writes ``/tmp/ray/ray_current_cluster``, which a
    concurrent ``ray.init()`` elsewhere on the machine would join. Ray binds the machine's
    address even when asked for ``127.0.0.1`` (a loopback-only head is then unreachable),
    so the address written is the one to connect to.
    """
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    params = RayParams(
        num_cpus=1,
        object_store_memory=1 << 30,
        min_worker_port=0,
        max_worker_port=0,
        temp_dir=temp,
        **({"gcs_address": head, "node_manager_port": 0} if head else {}),
        include_dashboard=False,
    )
    if head:
        params.dashboard_agent_listen_port = None
    node = Node(params, head=not head, shutdown_at_exit=True, spawn_reaper=True)
    Path(address_file + ".tmp").write_text(node.gcs_address)
    os.replace(address_file + ".tmp", address_file)

    def stop(*_: object) -> None:
        node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        time.sleep(0.5)


@contextlib.contextmanager
def ray_cluster(raylets: int, root: Path) -> Iterator[str]:
    """A head and ``raylets - 1`` more raylets (1 CPU, 1 GiB object store each); its address."""
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    temp = tempfile.mkdtemp(prefix="flscale", dir="/tmp")  # short: Unix socket paths
    processes: list[subprocess.Popen] = []

    def start(name: str, head: str) -> str:
        address = Path(temp, f"{name}.address")
        command = [sys.executable, __file__, "--raylet", head, temp, str(address)]
        with open(logs / f"{name}.log", "wb") as log:
            processes.append(subprocess.Popen(command, stdout=log, stderr=log))
        deadline = time.monotonic() + 120
        while not address.exists():
            if processes[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"raylet {name} did not start; see {logs / f'{name}.log'}")
            time.sleep(0.2)
        return address.read_text()

    try:
        address = start("head", "")
        for k in range(1, raylets):
            start(f"raylet-{k}", address)
        yield address
    finally:
        _stop(processes[::-1])
        shutil.rmtree(temp, ignore_errors=True)


# ----------------------------------------------------------------------------- measuring


class _PeakRss:
    """The peak summed RSS of this process's descendants, sampled every 0.2 s."""

    def __init__(self) -> None:
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._done.wait(0.2):
            total = 0
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += child.memory_info().rss
            self.peak = max(self.peak, total)


def measure(case: str, source: Path, out: Path, master: str | None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, __file__, "--run", case, str(source), str(out), master or ""]
    with _PeakRss() as everything:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{case} failed:\n{done.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(lines[-1]) | {"all_processes_peak_rss_mb": everything.peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.5,2", help="input sizes in GB, comma separated")
    parser.add_argument("--workers", default="1,2", help="cluster sizes (Spark workers, raylets)")
    parser.add_argument(
        "--engines",
        default="local,spark,ray",
        help="local, spark, ray; spark and ray also run the native engine's job (spark-native, "
        "ray-native) unless only the native one is named",
    )
    parser.add_argument("--root", default="/tmp/feedline-scale")
    parser.add_argument("--run", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--raylet", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        case, source, out, master = args.run
        print(json.dumps(run_case(case, source, out, master or None)))
        return
    if args.raylet:
        raylet(*args.raylet)
        return
    # a plain kill unwinds too, so the clusters' finally blocks stop their processes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(args.root)
    engines = _engines(args.engines)
    results = []
    for gb in (float(s) for s in args.sizes.split(",")):
        source = make_input(root / f"input-{gb:g}gb", gb)
        size = sum(p.stat().st_size for p in source.glob("*.parquet"))
        cases: list[tuple[str, str | None]] = [("local", None)] if "local" in engines else []
        for row in _run_all(cases, source, root, size, gb):
            results.append(row)
        for system, start_cluster in (("spark", spark_cluster), ("ray", ray_cluster)):
            for n in (int(w) for w in args.workers.split(",")):
                wanted = [e for e in (system, f"{system}-native") if e in engines]
                if not wanted:
                    continue
                with start_cluster(n, root / f"{system}-cluster-{n}") as master:
                    cases = [(f"{e}-{n}w", master) for e in wanted]
                    results.extend(_run_all(cases, source, root, size, gb))
    _print(results)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))


def _engines(names: str) -> list[str]:
    """``--engines`` as case prefixes: ``spark`` and ``ray`` bring their native peer along."""
    known = {"local", "spark", "spark-native", "ray", "ray-native", "native"}
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; choose from {sorted(known)}")
    engines = []
    for name in wanted:
        name = "spark-native" if name == "native" else name  # the old spelling
        engines += [name, f"{name}-native"] if name in ("spark", "ray") else [name]
    return list(dict.fromkeys(engines))


def _run_all(cases, source: Path, root: Path, size: int, gb: float) -> list[dict]:
    rows = []
    for name, master in cases:
        result = measure(name, source, root / "out", master)
        result |= {"input_gb": size / 1e9, "mb_per_s": size / 1e6 / result["seconds"]}
        print(json.dumps(result), flush=True)
        rows.append(result)
    return rows


def _print(results: list[dict]) -> None:
    print(
        f"{'case':<18}{'input GB':>9}{'seconds':>9}{'MB/s':>8}{'driver peak RSS MB':>20}"
        f"{'all processes peak RSS MB':>27}"
    )
    for r in results:
        print(
            f"{r['case']:<18}{r['input_gb']:>9.2f}{r['seconds']:>9.1f}{r['mb_per_s']:>8.0f}"
            f"{r['driver_peak_rss_mb']:>20.0f}{r.get('all_processes_peak_rss_mb', math.nan):>27.0f}"
        )
    by = {(r["case"], round(r["input_gb"], 1)): r["seconds"] for r in results}
    for (case, gb), seconds in sorted(by.items()):
        system, _, workers = case.rpartition("-")
        if workers == "2w" and (f"{system}-1w", gb) in by:
            speedup = by[(f"{system}-1w", gb)] / seconds
            print(f"{gb} GB: {system}, 1 -> 2 workers: {speedup:.2f}x")
        native = (f"{system}-native-{workers}", gb)
        if system in ("spark", "ray") and native in by:
            print(f"{gb} GB: {case} time / native time: {seconds / by[native]:.2f}")


if __name__ == "__main__":
    main()
