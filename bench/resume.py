"""A resumed write's time vs a full one (issue 27), on the local, Spark or Ray engine.

Usage::

    PYTHONPATH=. .venv/bin/python bench/resume.py [--engine local|spark|ray] [--tasks 200]
        [--rows-per-task 20000]

A plan of ``--tasks`` read tasks (``fl.range``) with a CPU-bound ``map_batches`` (a few
vectorised passes per row) is written once in full, in a child process (timed); then again
in a child process SIGKILLed (with the JVM or the Ray processes it started) once half of
the shards are in its staging folder, and re-run with ``resume=True`` (timed). Prints, for
both runs, the child's wall time and the write's own time (``WriteInfo.seconds``: without
the interpreter, Spark or Ray start, nor the start of their workers: each child first runs
a small write of the same plan on the same engine), the read tasks the resume skipped, and
writes ``bench/out/resume-<engine>.json``. Asserts that the two datasets' shards are
byte-identical. Spark runs on ``local[2]``, Ray on 2 CPUs (``--cores``); a Ray write
journals in units with ``resume=True`` only, so its full run passes ``resume=True`` too
(with nothing to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_WRITER = """
import json, shutil, sys, tempfile
import numpy as np, pyarrow as pa
import feedline as fl

def work(batch: pa.RecordBatch) -> pa.RecordBatch:
    x = batch["id"].to_numpy().astype(np.float64)
    for _ in range(40):
        x = np.sqrt(x * x + 1.0)
    return batch.append_column("x", pa.array(x))

out, resume, tasks, rows = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
name, cores = sys.argv[5], int(sys.argv[6])
if name == "spark":
    from feedline.engines.spark.engine import SparkEngine, spark_session

    session = spark_session(f"local[{cores}]", spark_sql_shuffle_partitions=cores)
    session.sparkContext.setLogLevel("FATAL")
    engine = SparkEngine(session)
elif name == "ray":
    from feedline.engines.ray.engine import RayEngine

    engine = RayEngine(num_cpus=cores)
else:
    engine = fl.LocalEngine(parallelism=cores)
# a small write first, so that the timed one finds the engine's workers started
warm = tempfile.mkdtemp()
fl.range(tasks * 10, rows_per_task=10).map_batches(work).write(
    warm + "/out", engine=engine, rows_per_shard=15, resume=name == "ray", progress=False
)
shutil.rmtree(warm)
info = fl.range(tasks * rows, rows_per_task=rows).map_batches(work).write(
    out, engine=engine, rows_per_shard=rows * 3 // 2, resume=resume, progress=False
)
print("RESULT " + json.dumps({"write_s": info.seconds, "counters": info.report["counters"]}))
"""


def _kill_session(child: subprocess.Popen) -> None:
    """SIGKILL the child and every process of its session (the JVM, Ray's processes)."""
    session = [child.pid]
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if int(entry.name) != child.pid and os.getsid(int(entry.name)) == child.pid:
                session.append(int(entry.name))
    for pid in session:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    child.wait()


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return wall, json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("local", "spark", "ray"), default="local")
    parser.add_argument("--tasks", type=int, default=200, help="read tasks")
    parser.add_argument("--rows-per-task", type=int, default=20_000, help="rows per task")
    parser.add_argument("--cores", type=int, default=2, help="Spark/Ray/local cores")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="feedline-resume-"))
    script = work / "writer.py"
    script.write_text(_WRITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, str(script)]
    size = [str(args.tasks), str(args.rows_per_task), args.engine, str(args.cores)]
    first = "1" if args.engine == "ray" else "0"
    try:
        full_wall, full = _timed([*command, str(work / "full"), first, *size], env)
        shards = len(list((work / "full").glob("part-*.parquet")))
        # the shards in the staging folder (on Spark and Ray, in one folder per unit)
        pattern = "part-*.parquet" if args.engine == "local" else "*/part-*.parquet"
        half = shards // 2
        out = work / "resumed"
        child = subprocess.Popen(
            [*command, str(out), first, *size], env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        started = time.perf_counter()
        while child.poll() is None:
            if len(list(out.glob(f".feedline-staging-*/{pattern}"))) >= half:
                _kill_session(child)
                break
            time.sleep(0.005)
        child.wait()
        killed_s = time.perf_counter() - started
        resume_wall, resumed = _timed([*command, str(out), "1", *size], env)
        full_files = sorted((work / "full").glob("part-*.parquet"))
        resumed_files = sorted(out.glob("part-*.parquet"))
        same = len(full_files) == len(resumed_files) and all(
            a.read_bytes() == b.read_bytes() for a, b in zip(full_files, resumed_files, strict=True)
        )
        assert same, "the resumed write's shards differ"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "engine": args.engine, "tasks": args.tasks, "rows_per_task": args.rows_per_task,
        "cores": args.cores, "shards": shards,
        "full_wall_s": round(full_wall, 2), "full_write_s": round(full["write_s"], 2),
        "killed_after_s": round(killed_s, 2),
        "resume_wall_s": round(resume_wall, 2), "resume_write_s": round(resumed["write_s"], 2),
        "resume_counters": resumed["counters"],
    }  # fmt: skip
    (Path(__file__).parent / "out").mkdir(exist_ok=True)
    (Path(__file__).parent / "out" / f"resume-{args.engine}.json").write_text(
        json.dumps(result, indent=1)
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
