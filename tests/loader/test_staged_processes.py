"""cache="staged" across real processes: simulated nodes sharing an exchange folder, and a
stager SIGKILLed mid-way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.loader.order.stage_routes import node_row_groups

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 2


def _write(path: Path, rows: int) -> Path:
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": (ids * 3).astype(np.float32)})
    fl.from_arrow(table).write(path, rows_per_shard=400, row_group_rows=50)
    return path


def _options(**extra):
    return {"batch_size": 16, "format": "numpy", "seed": 11, "cache": "staged",
            "memory_budget": 12 * 100 * 4} | extra  # fmt: skip


def _worker(path, cache_dir, stage_dir, rank, world, per_node, out) -> None:
    loader = fl.open(path).loader(**_options(
        cache_dir=cache_dir, stage_dir=stage_dir, rank=rank, world_size=world,
        ranks_per_node=per_node,
    ))  # fmt: skip
    epochs = []
    for _ in range(EPOCHS):
        batches = list(loader)
        assert all((b["x"] == b["id"] * 3).all() for b in batches)
        epochs.append([b["id"].tolist() for b in batches])
    assert loader._prepare().source.join(120)
    report = loader.stats()["staged_epochs"]
    Path(out).write_text(json.dumps({"epochs": epochs, "report": report}))


def _killed(path, cache_dir, flag) -> None:
    """Stage epoch 0, and stop for good once the first bucket rows are sent (to be killed)."""
    from feedline.loader.data.staging import exchange

    write = exchange._FileOutbox.write

    def write_then_hang(self, rank, bucket, block):
        write(self, rank, bucket, block)
        self.flush()
        Path(flag).write_text(str(self.marker))
        time.sleep(600)

    exchange._FileOutbox.write = write_then_hang
    next(iter(fl.open(path).loader(**_options(cache_dir=cache_dir, prefetch=0))))


def _start(*args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=env, cwd=ROOT)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("world", "per_node"), [(4, 2)])
def test_simulated_nodes_exchange_through_a_shared_folder(tmp_path, world, per_node):
    """Each node (its own cache folder; ``per_node`` rank processes) reads only its share of
    the row groups; the ranks' batches are exactly cache="memory"'s, disjoint, and cover the
    epoch."""
    rows = 1000
    path = _write(tmp_path / "ds", rows)
    nodes = world // per_node
    procs = [
        _start("worker", path, tmp_path / f"node{r // per_node}", tmp_path / "shared", r, world,
               per_node, tmp_path / f"rank{r}.json")
        for r in range(world)
    ]  # fmt: skip
    try:
        for p in procs:
            assert p.wait(timeout=240) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    ds = fl.open(path)
    for r in range(world):
        memory = ds.loader(batch_size=16, format="numpy", seed=11, cache="memory", rank=r,
                           world_size=world)  # fmt: skip
        for e in range(EPOCHS):
            assert results[r]["epochs"][e] == [b["id"].tolist() for b in memory], (r, e)
    sizes = ds.shard_source().row_group_sizes
    share = [sum(sizes[g] for g in groups) for groups in node_row_groups(sizes, nodes)]
    for e in range(EPOCHS):
        seen = [i for res in results for batch in res["epochs"][e] for i in batch]
        assert len(seen) == len(set(seen)) == rows // (16 * world) * 16 * world
        read = [0] * nodes
        for r, res in enumerate(results):
            report = {x["epoch"]: x for x in res["report"]}[e]
            read[r // per_node] += report["stage_rows_read"]
        assert read == share  # each row read once across the nodes, by the node it is on
        assert max(read) <= 1.2 * rows / nodes


@pytest.mark.timeout(180)
def test_a_stager_killed_mid_way_never_serves_a_partial_epoch(tmp_path):
    """SIGKILL while epoch 0's rows are half sent: its bucket files have no marker, so a new
    loader never reads them; it sends the rows again (replacing them) and its batches are
    cache="memory"'s."""
    path = _write(tmp_path / "ds", 600)
    flag = tmp_path / "flag"
    child = _start("killed", path, tmp_path / "cache", flag)
    try:
        deadline = time.monotonic() + 120
        while not flag.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), "the child never sent a row"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    marker = Path(flag.read_text())
    partial = marker.parent / marker.name.removesuffix(".done")
    assert not marker.exists() and any(partial.iterdir())  # rows sent, never marked complete
    loader = fl.open(path).loader(**_options(cache_dir=tmp_path / "cache"))
    memory = fl.open(path).loader(batch_size=16, format="numpy", seed=11, cache="memory")
    assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in memory]
    assert loader._prepare().source.join(60)
    assert loader.stats()["staged_epochs"][0]["staged_here"] is True
    assert marker.exists()  # sent again, whole


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        a = sys.argv[2:]
        _worker(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), a[6])
    elif sys.argv[1] == "killed":
        _killed(*sys.argv[2:5])
