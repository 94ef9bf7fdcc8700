"""The Ray engine on a real 2-raylet cluster on this machine, one node without feedline.

A driver runs in a subprocess (this session's other Ray tests share one ``ray.init``; the
cluster must not meet them) as a user's script would: it starts a head node (this
interpreter) and a second raylet from a bare virtual environment that sees Ray, numpy and
pyarrow but *not* feedline (a ``.pth`` file adds the project's site-packages without
running its editable-install hook), then connects with ``RayEngine(address=...)`` and
sets no environment by hand. feedline's probe finds the node without feedline and ships
the package with ``runtime_env`` ``py_modules``. The user's functions live in the
script's own module (a copy of ``tests/cluster_pipeline.py``, shared with the Spark
cluster test). A full pipeline (read -> filter -> map_batches -> StandardScaler +
StringIndexer -> Tokenize -> write) must give rows and fitted state byte-equal to the
local engine, with tasks run on both nodes (node ids recorded by the user function). A
user who calls ``ray.init`` first, without shipping feedline, gets a ``ConfigurationError``
naming the fix.

No address file is written (``ray.cluster_utils.Cluster`` and ``ray start --head`` write
``/tmp/ray/ray_current_cluster``, which a concurrent ``ray.init()`` would connect to). The
driver connects to the head's own address: Ray rewrites a ``127.0.0.1`` address to the
machine's address, where a loopback-only head is not reachable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import cluster_pipeline
import pyarrow as pa
import pytest
from cluster_pipeline import make_catalog, make_inputs, tokenizer_json

import feedline as fl

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

#: a raylet joining the head at argv[1] (temp folder argv[2]), until SIGTERM
NODE = """
import signal, sys, time
from ray._private.node import Node
from ray._private.parameter import RayParams

params = RayParams(gcs_address=sys.argv[1], num_cpus=1, object_store_memory=150 << 20,
                   include_log_monitor=False, node_manager_port=0, min_worker_port=0,
                   max_worker_port=0, temp_dir=sys.argv[2])
params.dashboard_agent_listen_port = None
node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
print("NODE", flush=True)

def stop(*_):
    node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.5)
"""

#: the user's script: start the cluster, run the pipeline with the Ray engine, report
DRIVER = """
import json, os, subprocess, sys, tempfile, time
from ray._private.node import Node
from ray._private.parameter import RayParams

inputs, tokenizer, out, bare_python, catalog, relational_out = sys.argv[1:7]
temp = tempfile.mkdtemp(prefix="flray", dir="/tmp")  # short: Unix socket paths
head = Node(RayParams(num_cpus=1, object_store_memory=150 << 20, include_dashboard=False,
                      min_worker_port=0, max_worker_port=0, temp_dir=temp),
            head=True, shutdown_at_exit=True, spawn_reaper=True)
bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no feedline there
node = subprocess.Popen([bare_python, "node.py", head.gcs_address, temp],
                        stdout=subprocess.PIPE, text=True, env=bare)
try:
    assert node.stdout.readline().startswith("NODE")
    import ray
    import userfns
    from feedline.engines.ray.engine import RayEngine

    engine = RayEngine(address=head.gcs_address)
    info = userfns.pipeline(inputs, tokenizer).write(out, engine=engine)
    relational = userfns.relational_pipeline(catalog).write(relational_out, engine=engine)
    report = {
        "rows": info.rows,
        "relational_rows": relational.rows,
        "engine": info.engine,
        "nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]),
        "runtime_env": ray.get_runtime_context().runtime_env,
    }
    # a user who calls ray.init first, without shipping feedline: a clear error
    ray.shutdown()
    ray.init(address=head.gcs_address, log_to_driver=False)
    try:
        userfns.fl.range(10).map_batches(lambda b: b).to_arrow(engine=RayEngine())
        report["user_init_error"] = ""
    except userfns.fl.errors.ConfigurationError as exc:
        report["user_init_error"] = str(exc)
    print("REPORT", json.dumps(report), flush=True)
finally:
    import ray
    ray.shutdown()
    node.terminate()
    node.wait(60)
    head.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    import shutil
    shutil.rmtree(temp, ignore_errors=True)
"""


def bare_venv(folder: Path) -> str:
    """A virtual environment that imports Ray, numpy and pyarrow, but not feedline."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = subprocess.run(
        [str(python), "-c", "import ray, pyarrow\nimport feedline"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=folder,
    )
    assert "No module named 'feedline'" in check.stderr, check.stderr[-2000:]
    return str(python)


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory) -> dict[str, Any]:
    """The user's script run once on the 2-raylet cluster: both pipelines written on Ray.
    ``{"report", "inputs", "catalog", "root"}``."""
    tmp_path = tmp_path_factory.mktemp("raycluster")
    tokenizer = tokenizer_json()
    inputs = make_inputs(tmp_path / "inputs")
    catalog = make_catalog(tmp_path / "catalog")
    script = tmp_path / "script"
    script.mkdir()
    markers = tmp_path / "markers"
    markers.mkdir()
    user_module = Path(cluster_pipeline.__file__).read_text()
    (script / "userfns.py").write_text(user_module + f"\nMARKERS = {str(markers)!r}\n")
    (script / "node.py").write_text(NODE)
    (script / "driver.py").write_text(DRIVER)
    python = bare_venv(tmp_path / "bare")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(Path(fl.__file__).resolve().parents[1])  # the feedline under test
    arguments = [str(inputs), tokenizer, str(tmp_path / "ray"), python, str(catalog)]
    run = subprocess.run(
        [sys.executable, "driver.py", *arguments, str(tmp_path / "ray-relational")],
        cwd=script,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("REPORT ")]
    assert run.returncode == 0 and lines, (run.stdout[-3000:], run.stderr[-5000:])
    report = json.loads(lines[0][len("REPORT ") :])
    return {"report": report, "inputs": inputs, "catalog": catalog, "root": tmp_path}


def test_full_pipeline_on_two_raylets_is_byte_equal_to_local(cluster_run, tmp_path):
    report, inputs = cluster_run["report"], cluster_run["inputs"]
    markers = cluster_run["root"] / "markers"
    ray_path = cluster_run["root"] / "ray"
    tokenizer = tokenizer_json()

    # feedline shipped itself to the node that lacks it
    assert report["engine"] == "ray" and len(report["nodes"]) == 2
    assert any(m.startswith("gcs://") for m in report["runtime_env"]["py_modules"])
    error = report["user_init_error"]  # Ray started by the user: feedline cannot ship itself
    assert "1 Ray node(s)" in error and "no feedline" in error, error
    assert "Fix:" in error and "runtime_env={'py_modules': [feedline]}" in error, error

    pipeline = cluster_pipeline.pipeline(inputs, tokenizer)
    local_info = pipeline.write(tmp_path / "local", engine="local")
    ray_ds, local_ds = fl.open(ray_path), fl.open(tmp_path / "local")
    ray_rows, local_rows = ray_ds.to_arrow(), local_ds.to_arrow()
    assert report["rows"] == local_info.rows == local_rows.num_rows > 1000
    assert ray_ds.schema() == local_ds.schema()
    for name in local_rows.column_names:  # the same rows in the same order, byte for byte
        a, b = ray_rows[name].combine_chunks(), local_rows[name].combine_chunks()
        assert a.equals(b), name
        if pa.types.is_floating(a.type):
            assert a.to_numpy().tobytes() == b.to_numpy().tobytes(), name
    state = json.dumps(ray_ds.manifest.preprocessors, sort_keys=True)
    assert state == json.dumps(local_ds.manifest.preprocessors, sort_keys=True)
    assert fl.verify(ray_path).rows == report["rows"]

    # the user function ran in Ray tasks on both nodes (its markers name the node)
    nodes = {marker.name.rsplit("-", 1)[0] for marker in markers.iterdir()}
    assert set(report["nodes"]) <= nodes, (nodes, report)


def test_relational_pipeline_on_two_raylets_gives_the_local_rows_bit_for_bit(cluster_run, tmp_path):
    """groupby -> float mean/sum/std -> join back -> train_test_split (issue 24, item 14):
    the aggregates are exact on every engine, so the split (which hashes them) keeps the
    local engine's rows; before, Ray's own Mean/Sum/Std summed in their own order."""
    info = cluster_pipeline.relational_pipeline(cluster_run["catalog"]).write(tmp_path / "local")
    ray_rows = fl.open(cluster_run["root"] / "ray-relational").to_arrow().sort_by("id")
    local_rows = fl.open(tmp_path / "local").to_arrow().sort_by("id")
    assert cluster_run["report"]["relational_rows"] == info.rows == 25_600
    assert ray_rows.schema == local_rows.schema
    for name in local_rows.column_names:  # the same rows, byte for byte
        a, b = ray_rows[name].combine_chunks(), local_rows[name].combine_chunks()
        assert a.equals(b), name
        if pa.types.is_floating(a.type):
            assert a.to_numpy().tobytes() == b.to_numpy().tobytes(), name
