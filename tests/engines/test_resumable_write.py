"""Writes that resume (issue 27, item 3) on the local engine: a write of 150 read tasks is
SIGKILLed after about half its shards, then re-run with ``resume=True``. The shards are
byte-identical to an uninterrupted write's, the manifest too but for its times, write id
and execution report, and only about half the read tasks run again (counted by the map
function, which notes each task it runs in a file)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.store.commit import STAGING_PREFIX

TASKS, ROWS_PER_TASK, ROWS_PER_SHARD = 150, 20, 30  # 100 shards, boundaries inside tasks

_WRITER = textwrap.dedent(
    """
    import os, sys, time
    import pyarrow as pa, pyarrow.compute as pc
    import feedline as fl

    out, resume = sys.argv[1], sys.argv[3] == "1"
    # read by note() from the environment: they are not part of what it computes (a plain
    # global a function reads is, for a resume: it would refuse a changed one)
    os.environ["WRITER_COUNTER"], os.environ["WRITER_DELAY"] = sys.argv[2], sys.argv[4]
    scale = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    tasks = int(sys.argv[6]) if len(sys.argv) > 6 else %(tasks)d

    def note(batch: pa.RecordBatch) -> pa.RecordBatch:
        with open(os.environ["WRITER_COUNTER"], "a") as handle:  # one line per read task run
            handle.write(f"{batch['id'][0].as_py() // %(rows)d}\\n")
        time.sleep(float(os.environ["WRITER_DELAY"]))
        return batch.append_column("x", pc.multiply(batch["id"], scale))

    info = fl.range(tasks * %(rows)d, rows_per_task=%(rows)d).map_batches(note).write(
        out, rows_per_shard=%(shard)d, row_group_rows=7, resume=resume, progress=False
    )
    print(info.report["counters"])
    """
) % {"rows": ROWS_PER_TASK, "tasks": TASKS, "shard": ROWS_PER_SHARD}


def _run(script: Path, out: Path, counter: Path, *args: str, resume: bool = False) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run(
        [sys.executable, str(script), str(out), str(counter), "1" if resume else "0", *args],
        check=True, env=env, timeout=300,
    )  # fmt: skip


def _tasks_run(counter: Path) -> list[int]:
    return [int(line) for line in counter.read_text().split()]


def _shards(out: Path) -> list[bytes]:
    names = sorted(p.name for p in out.glob("part-*.parquet"))
    return [(out / n).read_bytes() for n in names]


def _manifest(out: Path) -> dict:
    """The manifest without what differs between two runs by design: times, write id (in
    the shard names) and the execution report."""
    text = (out / "_feedline.json").read_text()
    write_id = json.loads(text)["write"]["id"]
    doc = json.loads(text.replace(write_id, "WRITEID"))
    doc.pop("created", None)
    doc["lineage"].pop("created", None)
    doc["version"].pop("time", None)
    doc["write"].pop("report", None)
    return doc


def _kill_after(script: Path, out: Path, counter: Path, shards: int) -> None:
    """Start the write and SIGKILL it once its staging folder holds ``shards`` shards."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, str(script), str(out), str(counter), "0", "0.02"], env=env
    )
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and child.poll() is None:
            if len(list(out.glob(f"{STAGING_PREFIX}*/part-*.parquet"))) >= shards:
                break
            time.sleep(0.005)
        assert child.poll() is None, "the write finished before it could be killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)


@pytest.mark.timeout(600)
def test_killed_write_resumes_byte_identical_redoing_about_half(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _run(script, whole, tmp_path / "whole.count", "0")
    assert sorted(_tasks_run(tmp_path / "whole.count")) == list(range(TASKS))

    total_shards = TASKS * ROWS_PER_TASK // ROWS_PER_SHARD
    _kill_after(script, resumed, tmp_path / "killed.count", total_shards // 2)
    assert not (resumed / "_feedline.json").exists()  # killed before its commit
    _run(script, resumed, tmp_path / "resume.count", "0", resume=True)

    assert _shards(resumed) == _shards(whole)
    assert len(_shards(whole)) == total_shards
    assert _manifest(resumed) == _manifest(whole)
    assert fl.open(resumed, verify=True).to_arrow().equals(fl.open(whole).to_arrow())
    redone = _tasks_run(tmp_path / "resume.count")
    # the tasks from the one the last verified shard ended in to the end, each once:
    # about half of them
    assert sorted(redone) == list(range(min(redone), TASKS))
    assert 0.3 * TASKS <= len(redone) <= 0.6 * TASKS, len(redone)
    assert not list(resumed.glob(f"{STAGING_PREFIX}*"))


def test_resume_refuses_another_plan_saying_what_differs(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    out = tmp_path / "out"
    _kill_after(script, out, tmp_path / "killed.count", 10)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    other = subprocess.run(  # the map function's result changed: scale 3 instead of 2
        [sys.executable, str(script), str(out), str(tmp_path / "c"), "1", "0", "3.0"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert other.returncode != 0
    assert "Cannot resume the interrupted write" in other.stderr
    assert "the plan" in other.stderr and "Fix:" in other.stderr
    assert list(out.glob(f"{STAGING_PREFIX}*/part-*.parquet"))  # the interrupted write kept


def test_resume_refuses_another_input_then_a_fresh_write_replaces_it(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    out = tmp_path / "out"
    _kill_after(script, out, tmp_path / "killed.count", 10)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    more = subprocess.run(  # the input grew: 160 read tasks instead of 150
        [sys.executable, str(script), str(out), str(tmp_path / "c"), "1", "0", "2.0", "160"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert more.returncode != 0
    assert "the number of read tasks the input splits into (was 150, now 160)" in more.stderr
    _run(script, out, tmp_path / "fresh.count", "0", "2.0", "160")  # no resume: starts over
    assert fl.open(out, verify=True).count() == 160 * ROWS_PER_TASK
    assert not list(out.glob(f"{STAGING_PREFIX}*"))


def test_resume_refused_where_no_journal_is_kept(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="limit"):
        fl.range(100).limit(5).write(tmp_path / "out", resume=True)


def test_resume_refused_on_spark_and_ray_where_no_journal_is_kept(tmp_path: Path) -> None:
    """Refused before Spark or Ray starts (the resumes themselves:
    tests/engines/test_resumable_write_engines.py)."""
    pytest.importorskip("pyspark")
    pytest.importorskip("ray")
    from feedline.engines.ray.engine import RayEngine
    from feedline.engines.spark.engine import SparkEngine

    with pytest.raises(ConfigurationError, match="writer='spark'"):
        fl.range(10).write(tmp_path / "out", resume=True, engine=SparkEngine(writer="spark"))

    class Model:
        def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
            return batch

    ray_engine = RayEngine(num_cpus=1)
    with pytest.raises(ConfigurationError, match="actor stage"):
        fl.range(10).map_batches(Model).write(tmp_path / "out", resume=True, engine=ray_engine)
    with pytest.raises(ConfigurationError, match=r"limit\(\)"):
        fl.range(10).limit(3).write(tmp_path / "out", resume=True, engine=ray_engine)


def test_resume_without_interrupted_write_writes_from_the_start(tmp_path: Path) -> None:
    out = tmp_path / "out"
    info = fl.range(50, rows_per_task=10).write(out, rows_per_shard=20, resume=True)
    assert info.rows == 50 and fl.open(out).count() == 50
    assert "resumed_shards_kept" not in info.report["counters"]
    assert re.fullmatch(r"[0-9a-f]{12}", fl.open(out).manifest.write["id"])


def test_a_damaged_shard_and_a_torn_journal_line_are_redone(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _run(script, whole, tmp_path / "whole.count", "0")
    _kill_after(script, resumed, tmp_path / "killed.count", 30)
    (staging,) = resumed.glob(f"{STAGING_PREFIX}*")
    journal = staging / "_resume.json"
    with open(journal, "a") as handle:
        handle.write('{"shard": {"path": "part-0')  # a line torn by the crash
    damaged = sorted(staging.glob("part-*.parquet"))[10]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    _run(script, resumed, tmp_path / "resume.count", "0", resume=True)
    assert _shards(resumed) == _shards(whole)
    assert _manifest(resumed) == _manifest(whole)
    redone = _tasks_run(tmp_path / "resume.count")
    # shard 10 (rows 300..329) starts in task 15: the resume redoes it, and all after it
    assert min(redone) <= 300 // ROWS_PER_TASK and max(redone) == TASKS - 1
