"""A resumed write's time vs a full one (issue 27), one run.

Usage::

    PYTHONPATH=. .venv/bin/python bench/resume.py [--tasks 200] [--rows-per-task 20000]

A plan of ``--tasks`` read tasks (``fl.range``) with a CPU-bound ``map_batches`` (a few
vectorised passes per row) is written once in full, in a child process (timed); then again
in a child process SIGKILLed once its staging folder holds half of the shards, and re-run
with ``resume=True`` (timed). Prints both times, the read tasks the resume skipped, and
writes ``bench/out/resume.json``. Asserts that the two datasets' shards are byte-identical.
"""

from __future__ import annotations

import argparse
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
import sys
import numpy as np, pyarrow as pa
import feedline as fl

def work(batch: pa.RecordBatch) -> pa.RecordBatch:
    x = batch["id"].to_numpy().astype(np.float64)
    for _ in range(40):
        x = np.sqrt(x * x + 1.0)
    return batch.append_column("x", pa.array(x))

out, resume, tasks, rows = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
info = fl.range(tasks * rows, rows_per_task=rows).map_batches(work).write(
    out, rows_per_shard=rows * 3 // 2, resume=resume, progress=False
)
print(info.report["counters"])
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="read tasks")
    parser.add_argument("--rows-per-task", type=int, default=20_000, help="rows per task")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="feedline-resume-"))
    script = work / "writer.py"
    script.write_text(_WRITER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, str(script)]
    size = [str(args.tasks), str(args.rows_per_task)]
    try:
        start = time.perf_counter()
        subprocess.run([*command, str(work / "full"), "0", *size], check=True, env=env)
        full_s = time.perf_counter() - start
        shards = len(list((work / "full").glob("part-*.parquet")))
        out = work / "resumed"
        child = subprocess.Popen([*command, str(out), "0", *size], env=env)
        started = time.perf_counter()
        while child.poll() is None:
            if len(list(out.glob(".feedline-staging-*/part-*.parquet"))) >= shards // 2:
                child.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
        child.wait()
        killed_s = time.perf_counter() - started
        start = time.perf_counter()
        done = subprocess.run(
            [*command, str(out), "1", *size], check=True, env=env, capture_output=True, text=True
        )
        resume_s = time.perf_counter() - start
        same = all(
            a.read_bytes() == b.read_bytes()
            for a, b in zip(
                sorted((work / "full").glob("part-*.parquet")),
                sorted(out.glob("part-*.parquet")),
                strict=True,
            )
        )
        assert same, "the resumed write's shards differ"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "tasks": args.tasks, "rows_per_task": args.rows_per_task, "shards": shards,
        "full_s": full_s, "killed_after_s": killed_s, "resume_s": resume_s,
        "resume_counters": done.stdout.strip(),
    }  # fmt: skip
    (Path(__file__).parent / "out").mkdir(exist_ok=True)
    (Path(__file__).parent / "out" / "resume.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
