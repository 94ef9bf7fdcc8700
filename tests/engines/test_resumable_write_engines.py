"""Writes that resume (issue 27, item 3) on Spark and on Ray: a write of 240 read tasks, in
8 units (a Spark partition or a Ray task each, on 2 cores), has its driver SIGKILLed once
half of its shards are recorded, then is re-run with ``resume=True``. The shards are
byte-identical to an uninterrupted write's, the manifest too but for its times, write id
and execution report, and only the read tasks after each unit's recorded shards run again
(counted by the map function, which notes each task it runs in a file): about half.

The killed driver is a child process, started in a session of its own so that the kill
takes the JVM / the Ray processes it started with it. On Spark the resume and the
uninterrupted write then run in the test process, on the suite's ``spark`` session (the same
``local[2]`` as the child's), with the map function imported from one module file in both
processes (so the plan is the same plan); on Ray they run in a second child, which starts
Ray itself (``ray.init``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import feedline as fl
from feedline.store.commit import STAGING_PREFIX
from feedline.store.write_journal import UNIT_PREFIX

TASKS, ROWS_PER_TASK, ROWS_PER_SHARD, UNITS = 240, 20, 70, 8
#: each unit of 30 tasks x 20 rows writes 8 shards of 70 rows and one of 40
SHARDS = UNITS * 9

_WRITER = textwrap.dedent(
    """
    import os, sys, time
    import pyarrow as pa, pyarrow.compute as pc

    out, resume = sys.argv[1], sys.argv[4] == "1"
    with open(sys.argv[3] + ".driver", "w") as handle:  # the schema probe runs note() here
        handle.write(str(os.getpid()))
    # read by note() from the environment (set before Ray starts, so that its workers
    # inherit it): not part of what it computes
    os.environ["WRITER_COUNTER"], os.environ["WRITER_DELAY"] = sys.argv[3], sys.argv[5]
    import feedline as fl

    def note(batch: pa.RecordBatch) -> pa.RecordBatch:
        with open(os.environ["WRITER_COUNTER"], "a") as handle:  # one line per read task run
            handle.write(f"{batch['id'][0].as_py() // %(rows)d} {os.getpid()}\\n")
        time.sleep(float(os.environ["WRITER_DELAY"]))
        return batch.append_column("x", pc.multiply(batch["id"], 2.0))

    from feedline.engines.ray.engine import RayEngine

    engine = RayEngine(num_cpus=2)  # ray.init here, in the driver that gets killed
    ds = fl.range(%(tasks)d * %(rows)d, rows_per_task=%(rows)d).map_batches(note)
    options = {"rows_per_shard": %(shard)d, "row_group_rows": 7, "progress": False}
    info = ds.write(out, engine=engine, resume=resume, **options)
    print("COUNTERS", info.report["counters"])
    if len(sys.argv) > 6:  # then an uninterrupted write, on the warm engine, to compare with
        with open(sys.argv[3], "a") as handle:
            handle.write("uninterrupted\\n")
        ds.write(sys.argv[6], engine=engine, resume=sys.argv[7] == "1", **options)
    """
) % {"rows": ROWS_PER_TASK, "tasks": TASKS, "shard": ROWS_PER_SHARD}


def _start(script: Path, out: Path, engine: str, counter: Path, resume: bool, *more: str) -> Any:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, str(script), str(out), engine, str(counter), str(int(resume))]
    return subprocess.Popen(
        [*command, *more], env=env, start_new_session=True, stdout=subprocess.PIPE, text=True
    )


def _run(script: Path, out: Path, engine: str, counter: Path, *more: str) -> str:
    """The write with ``resume=True``; with ``more``, then an uninterrupted one."""
    child = _start(script, out, engine, counter, True, "0", *more)
    try:
        stdout, _ = child.communicate(timeout=240)
    finally:
        _kill(child)
    assert child.returncode == 0, stdout
    return stdout


def _kill(child: Any) -> None:
    """SIGKILL the child's whole session at once: the driver and the JVM or the Ray
    processes it started (Ray's workers have process groups of their own)."""
    session = [child.pid]
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if int(entry.name) != child.pid and os.getsid(int(entry.name)) == child.pid:
                session.append(int(entry.name))
    for pid in session:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    child.wait(timeout=60)


def _kill_after_half(script: Path, out: Path, engine: str, counter: Path, resume: bool) -> None:
    """Start the write and SIGKILL it once half of its shards are recorded."""
    _kill_when_half_recorded(_start(script, out, engine, counter, resume, "0.02"), out)


def _records(out: Path) -> list[dict]:
    """The unit records in the staging folder (each replaced whole as its unit writes)."""
    return [json.loads(p.read_text()) for p in out.glob(f"{STAGING_PREFIX}*/{UNIT_PREFIX}*.json")]


def _kill_when_half_recorded(child: Any, out: Path) -> None:
    """SIGKILL the write ``child`` once half of its shards are recorded by their units."""
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and child.poll() is None:
            if sum(len(r["shards"]) for r in _records(out)) >= SHARDS // 2:
                break
            time.sleep(0.005)
        assert child.poll() is None, "the write finished before it could be killed"
    finally:
        _kill(child)


def _to_redo(out: Path) -> tuple[int, int]:
    """The complete units the interrupted write recorded, and the read tasks a resume runs
    again: every task of a unit without a record, none of a complete unit, and for the
    others the tasks from the one their last recorded shard ended in."""
    records = {r["unit"]: r for r in _records(out)}
    tasks = 0
    for unit in range(UNITS):
        record, end = records.get(unit), (unit + 1) * TASKS // UNITS
        if record is None or not record["shards"]:
            tasks += TASKS // UNITS
        elif not record["complete"]:
            tasks += end - record["positions"][-1][0]
    return sum(r["complete"] for r in records.values()), tasks


def _tasks_run(counter: Path) -> tuple[list[int], list[int]]:
    """The read tasks the workers ran in the first write and in the uninterrupted one (not
    the driver's schema probe on the first rows)."""
    driver = Path(f"{counter}.driver").read_text()
    first, _, then = counter.read_text().partition("uninterrupted\n")
    return tuple(  # type: ignore[return-value]
        [int(task) for task, pid in map(str.split, text.splitlines()) if pid != driver]
        for text in (first, then)
    )


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


def _killed_ray_write_resumes(engine: str, tmp_path: Path, *, journal_first: bool) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _kill_after_half(script, resumed, engine, tmp_path / "killed.count", journal_first)
    assert not (resumed / "_feedline.json").exists()  # killed before its commit
    complete, to_redo = _to_redo(resumed)
    output = _run(
        script, resumed, engine, tmp_path / "resume.count", str(whole), str(int(journal_first))
    )

    redone, uninterrupted = _tasks_run(tmp_path / "resume.count")
    assert sorted(uninterrupted) == list(range(TASKS))
    assert f"'resumed_units_kept': {complete}" in output
    assert f"'resumed_read_tasks_skipped': {TASKS - to_redo}" in output
    _check_resumed(whole, resumed, redone, to_redo)


def _check_resumed(whole: Path, resumed: Path, redone: list[int], to_redo: int) -> None:
    """The resumed dataset is the uninterrupted one, and about half the tasks ran again."""
    assert _shards(resumed) == _shards(whole)
    assert len(_shards(whole)) >= TASKS * ROWS_PER_TASK // ROWS_PER_SHARD
    assert _manifest(resumed) == _manifest(whole)
    assert fl.open(resumed, verify=True).to_arrow().equals(fl.open(whole).to_arrow())
    # each read task after the recorded shards runs once more, and no other: about half
    assert len(redone) == len(set(redone)) == to_redo
    assert 0.3 * TASKS <= len(redone) <= 0.6 * TASKS, len(redone)
    assert not list(resumed.glob(f"{STAGING_PREFIX}*"))


#: the Spark test's plan, imported by the killed child and by the test process alike
_SPARK_PLAN = textwrap.dedent(
    """
    import os, time
    import pyarrow as pa, pyarrow.compute as pc
    import feedline as fl

    COUNTER, DELAY = %(counter)r, 0.02

    def note(batch: pa.RecordBatch) -> pa.RecordBatch:
        with open(COUNTER, "a") as handle:  # one line per read task run
            handle.write(f"{batch['id'][0].as_py() // %(rows)d} {os.getpid()}\\n")
        time.sleep(DELAY)
        return batch.append_column("x", pc.multiply(batch["id"], 2.0))

    def dataset() -> fl.Dataset:
        return fl.range(%(tasks)d * %(rows)d, rows_per_task=%(rows)d).map_batches(note)

    OPTIONS = {"rows_per_shard": %(shard)d, "row_group_rows": 7, "progress": False}
    """
)

_SPARK_CHILD = textwrap.dedent(
    """
    import sys

    sys.path.insert(0, sys.argv[2])
    from pyspark import cloudpickle
    import resumed_spark_plan as plan
    from feedline.engines.spark.engine import SparkEngine, spark_session

    cloudpickle.register_pickle_by_value(plan)
    session = spark_session("local[2]", spark_sql_shuffle_partitions=2)
    session.sparkContext.setLogLevel("FATAL")
    plan.dataset().write(sys.argv[1], engine=SparkEngine(session), **plan.OPTIONS)
    """
)


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs a Java runtime",
)
def test_spark_killed_write_resumes_byte_identical_redoing_about_half(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from pyspark import cloudpickle

    from feedline.engines.spark.engine import SparkEngine

    counter = tmp_path / "tasks.count"
    (tmp_path / "resumed_spark_plan.py").write_text(
        _SPARK_PLAN
        % {"counter": str(counter), "rows": ROWS_PER_TASK, "tasks": TASKS, "shard": ROWS_PER_SHARD}
    )
    (tmp_path / "child.py").write_text(_SPARK_CHILD)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # a plain write: every Spark write of read tasks journals its partitions
    child = subprocess.Popen(
        [sys.executable, str(tmp_path / "child.py"), str(resumed), str(tmp_path)],
        env=env, start_new_session=True,
    )  # fmt: skip
    _kill_when_half_recorded(child, resumed)
    assert not (resumed / "_feedline.json").exists()  # killed before its commit
    complete, to_redo = _to_redo(resumed)

    monkeypatch.syspath_prepend(str(tmp_path))
    plan = importlib.import_module("resumed_spark_plan")
    cloudpickle.register_pickle_by_value(plan)
    try:
        engine = SparkEngine(spark)
        counter.write_text(counter.read_text() + "resumed\n")
        info = plan.dataset().write(resumed, engine=engine, resume=True, **plan.OPTIONS)
        counter.write_text(counter.read_text() + "uninterrupted\n")
        plan.dataset().write(whole, engine=engine, **plan.OPTIONS)
    finally:
        cloudpickle.unregister_pickle_by_value(plan)
        sys.modules.pop("resumed_spark_plan", None)

    lines = counter.read_text().split("resumed\n")[1].split("uninterrupted\n")
    # the read tasks the Spark workers ran (not the driver's schema probe on the first rows)
    redone, uninterrupted = (
        [int(t) for t, pid in map(str.split, text.splitlines()) if int(pid) != os.getpid()]
        for text in lines
    )
    assert sorted(uninterrupted) == list(range(TASKS))
    counters = info.report["counters"]
    assert counters["resumed_units_kept"] == complete
    assert counters["resumed_read_tasks_skipped"] == TASKS - to_redo
    _check_resumed(whole, resumed, redone, to_redo)


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ray_killed_write_resumes_byte_identical_redoing_about_half(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    # on Ray a write journals in units with resume=True (the first run's too)
    _killed_ray_write_resumes("ray", tmp_path, journal_first=True)
