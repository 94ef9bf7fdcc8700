"""How the Ray engine starts Ray and what Ray prints (issue 24, items 11 and 13).

- Another Ray instance on the machine (``ray start --head``) is left alone: ``RayEngine(
  num_cpus=2)`` starts a private local Ray instead of joining it (before: Ray's raw
  ``ValueError: When connecting to an existing cluster, num_cpus and num_gpus must not be
  provided``); ``RAY_ADDRESS`` still names a cluster to join, and ``num_cpus`` is then
  ignored with a warning.
- A small write prints a few lines, not Ray Data's progress reports (188 lines before),
  and no "concurrency is deprecated" warning: feedline uses ``compute=ActorPoolStrategy``.

Each case runs in a fresh interpreter (its own Ray, its own output). The ``ray start``
head gets a private ``RAY_TMPDIR``: its address file is seen only by the script of this
test, never by another Ray user of the machine, and it is stopped in teardown.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import feedline as fl

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = str(Path(fl.__file__).resolve().parents[1])

#: a small write with a model class in an actor pool of one (concurrency=1)
SMALL_WRITE = """
import sys
import pyarrow as pa
import pyarrow.compute as pc
import feedline as fl
from feedline.engines.ray.engine import RayEngine

class Double:
    def __call__(self, batch):
        return {"id": batch["id"], "twice": pc.multiply(batch["id"], 2)}

schema = pa.schema([("id", pa.int64()), ("twice", pa.int64())])
ds = fl.range(1000, rows_per_task=250).map_batches(Double, concurrency=1, output_schema=schema)
info = ds.write(sys.argv[1], engine=RayEngine(num_cpus=2))
print("ROWS", info.rows, flush=True)
"""

#: RayEngine(num_cpus=2) beside a running head, then with RAY_ADDRESS naming that head
BESIDE_A_HEAD = """
import json, os, sys, warnings
import ray
import feedline as fl
from feedline.engines.ray.engine import RayEngine

report = {}
engine = RayEngine(num_cpus=2)
report["count"] = fl.range(10).map_batches(lambda b: b).count(engine=engine)
report["private"] = ray.get_runtime_context().gcs_address
report["private_cpus"] = ray.cluster_resources().get("CPU")
ray.shutdown()
os.environ["RAY_ADDRESS"] = sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    engine = RayEngine(num_cpus=2)
    report["joined_count"] = fl.range(10).map_batches(lambda b: b).count(engine=engine)
report["joined"] = ray.get_runtime_context().gcs_address
report["joined_cpus"] = ray.cluster_resources().get("CPU")
report["warnings"] = [str(w.message) for w in caught if "num_cpus" in str(w.message)]
ray.shutdown()
print("REPORT", json.dumps(report), flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return env | {"PYTHONPATH": ROOT, **extra}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(400)
def test_a_small_write_prints_a_few_lines_and_no_deprecation_warning(tmp_path: Path) -> None:
    script = tmp_path / "write.py"
    script.write_text(SMALL_WRITE)
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=360,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "ROWS 1000" in run.stdout, output[-5000:]
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("ROWS")]
    assert len(lines) <= 3, "\n".join(lines)  # e.g. Ray's note on token authentication
    assert "deprecated" not in output.lower(), output
    assert fl.open(tmp_path / "out").count() == 1000


def test_ray_datas_info_lines_are_hidden_only_while_feedline_runs_and_not_when_verbose(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import ray.data  # noqa: F401 - configures the ray.data logger

    from feedline.engines.ray.logs import _FILTER, quiet_ray

    logger = logging.getLogger("ray.data._internal.execution.streaming_executor")
    handler = logging.getLogger("ray.data").handlers[0]
    seen: list[str] = []

    def emit(message: str, level: int = logging.INFO) -> None:
        record = logger.makeRecord(logger.name, level, __file__, 1, message, (), None)
        if handler.filter(record):
            seen.append(message)

    saved = fl.config.verbosity
    try:
        fl.config.verbosity = None
        with quiet_ray():
            assert _FILTER in handler.filters
            emit("Starting execution of Dataset dataset_1")
            emit("Progress bars disabled. To enable, ...", logging.WARNING)
            emit("a real warning", logging.WARNING)
        emit("after the run")
        fl.config.verbosity = "info"
        with quiet_ray():
            emit("verbose: Ray's own lines")
    finally:
        fl.config.verbosity = saved
    assert seen == ["a real warning", "after the run", "verbose: Ray's own lines"]


@pytest.fixture
def ray_head() -> Iterator[dict[str, Any]]:
    """``ray start --head --block`` (1 CPU) with a private ``RAY_TMPDIR``; stopped after."""
    temp = tempfile.mkdtemp(prefix="flr", dir="/tmp")  # short: Unix socket paths
    env = _env(RAY_TMPDIR=temp)
    port = _free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    ports = [
        f"--{name}={_free_port()}"
        for name in (
            "ray-client-server-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
    ]
    command = [ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
               "--include-dashboard=false", "--disable-usage-stats", *ports]  # fmt: skip
    log = open(Path(temp, "head.log"), "wb")  # noqa: SIM115 - closed in teardown
    head = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
    address_file = Path(temp, "ray", "ray_current_cluster")
    try:
        deadline = time.monotonic() + 120
        while not address_file.exists() and time.monotonic() < deadline:
            assert head.poll() is None, Path(temp, "head.log").read_text()[-3000:]
            time.sleep(0.5)
        assert address_file.exists(), Path(temp, "head.log").read_text()[-3000:]
        yield {"env": env, "address": address_file.read_text().strip()}
    finally:
        # ray start --block stops what it started on SIGTERM, but gracefully (~30 s): give it
        # a moment, then kill its group and every process of this private Ray (their command
        # lines name its temporary folder)
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(3)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(30)
        _kill_processes_naming(temp)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _kill_processes_naming(text: str) -> None:
    """SIGKILL every process whose command line contains ``text``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


@pytest.mark.timeout(500)
def test_another_ray_on_the_machine_is_left_alone(ray_head: dict[str, Any], tmp_path) -> None:
    script = tmp_path / "beside.py"
    script.write_text(BESIDE_A_HEAD)
    run = subprocess.run(
        [sys.executable, str(script), ray_head["address"]],
        env=ray_head["env"],
        capture_output=True,
        text=True,
        timeout=420,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("REPORT ")]
    assert run.returncode == 0 and lines, (run.stdout[-3000:], run.stderr[-5000:])
    report = json.loads(lines[0][len("REPORT ") :])
    # a private local Ray with the 2 CPUs asked for, not the head's 1
    assert report["count"] == 10 and report["private_cpus"] == 2.0
    assert report["private"] != ray_head["address"]
    # RAY_ADDRESS names the cluster to join: joined, num_cpus ignored with a warning
    assert report["joined_count"] == 10 and report["joined"] == ray_head["address"]
    assert report["joined_cpus"] == 1.0
    assert report["warnings"] and "RAY_ADDRESS" in report["warnings"][0]
