"""What the Ray engine's driver holds: shard descriptions and O(log n) partials, not data.

On a local Ray (2 CPUs, one ``ray.init`` for the module): a write reads no byte of its
shards on the driver (checksums and footer digests come from the write tasks), and a fit
merges the read tasks' partials in Ray tasks, in the fixed tree the local engine uses, so
the fitted state is bit-identical.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.engines.batch.partials import fold

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

TASKS = 40


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """A RayEngine on a local Ray with 2 CPUs (shut down at the end unless already running)."""
    from feedline.engines.ray.engine import RayEngine

    already = ray.is_initialized()
    engine = RayEngine(num_cpus=2) if not already else RayEngine()
    engine.ensure_ray()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield engine
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    if not already:
        ray.shutdown()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """40 Parquet files (40 read tasks) of values over many magnitudes, so the order of
    floating-point merges shows in the last bits."""
    folder = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(3)
    for i in range(TASKS):
        n = 50 + 7 * i
        scale = 10.0 ** rng.integers(-3, 7)
        table = pa.table(
            {
                "id": np.arange(i * 1000, i * 1000 + n, dtype=np.int64),
                "x": rng.normal(scale, scale / 3, n),
                "word": rng.choice(["a", "b", "c", "d"], n),
            }
        )
        pq.write_table(table, folder / f"part-{i:03d}.parquet")
    return folder


def test_write_reads_no_shard_byte_on_the_driver(engine, inputs, tmp_path, monkeypatch):
    from fsspec.implementations.local import LocalFileSystem

    out = tmp_path / "out"
    opened: list[str] = []
    real_open = LocalFileSystem._open

    def watched(self, path, mode="rb", *args, **kwargs):
        if "r" in mode and str(path).startswith(str(out)) and str(path).endswith(".parquet"):
            opened.append(str(path))
        return real_open(self, path, mode, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "_open", watched)  # the driver process only
    info = fl.read_parquet(inputs).write(out, engine=engine, rows_per_shard=1000)
    monkeypatch.undo()

    assert opened == []  # no footer, no checksum read here: the tasks sent them
    manifest = fl.open(out).manifest
    assert info.shards == len(manifest.shards) > 3
    assert all(s.checksum.startswith("sha256:") and s.footer for s in manifest.shards)
    assert [s.rows for s in manifest.shards][:-1] == [1000] * (info.shards - 1)
    assert fl.verify(out).rows == info.rows  # the checksums the tasks computed are right
    assert fl.open(out).to_arrow().equals(fl.read_parquet(inputs).to_arrow())


def moments(batch: pa.RecordBatch) -> np.ndarray:
    x = batch["x"].to_numpy()
    return np.array([x.size, x.sum(), np.square(x).sum()])


def recording_merge(folder: str):
    """``a + b``, noting in ``folder`` the process that merged."""

    def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with open(os.path.join(folder, str(os.getpid())), "a") as handle:
            handle.write("m\n")
        return a + b

    return merge


def test_fit_merges_partials_in_ray_tasks_bit_identical_to_local(engine, inputs, tmp_path):
    ds = fl.read_parquet(inputs)
    scaler = fl.StandardScaler("x")
    on_ray, local = scaler.fit(ds, engine=engine), scaler.fit(ds)
    assert json.dumps(on_ray.state) == json.dumps(local.state)
    # the data tells merge orders apart: folding the tasks left to right gives other bits
    tasks = [scaler.partial(pq.read_table(p).combine_chunks().to_batches()[0])
             for p in sorted(inputs.iterdir())]  # fmt: skip
    assert json.dumps(scaler.finish(fold(tasks, scaler.merge))) != json.dumps(local.fitted)

    # the merges ran in Ray tasks; the driver merged only the chunks' few tree blocks
    markers = tmp_path / "markers"
    markers.mkdir()
    total = ds.aggregate(moments, recording_merge(str(markers)), engine=engine)
    assert total[0] == sum(pq.read_metadata(p).num_rows for p in inputs.iterdir())
    counts = {int(f.name): len(f.read_text().split()) for f in markers.iterdir()}
    on_driver = counts.pop(os.getpid(), 0)
    assert sum(counts.values()) + on_driver == TASKS - 1  # one merge per tree node
    assert on_driver <= 4 < sum(counts.values()), (on_driver, counts)


def test_a_read_task_split_over_two_chunks_is_still_merged_once():
    from feedline.engines.ray.merge import _Assembler, merge_chunk

    def rows(*pairs):
        return pa.table({"task": [p[0] for p in pairs],
                         "partial": [pickle.dumps(p[1]) for p in pairs]})  # fmt: skip

    def add(a, b):
        return a + b

    whole = _Assembler(add)
    for chunk in ([rows((0, 1), (1, 2))], [rows((2, 4)), rows((3, 8))]):
        whole.add(merge_chunk(add, *chunk))
    assert whole.result() == 15
    straddled = _Assembler(add)  # task 1's rows were cut into two blocks, in two chunks
    for chunk in ([rows((0, 1), (1, 2))], [rows((1, 32), (2, 4))], [rows((3, 8))]):
        straddled.add(merge_chunk(add, *chunk))
    assert straddled.result() == 47


def test_a_user_module_the_workers_cannot_import_travels_by_value(engine, tmp_path, monkeypatch):
    folder = tmp_path / "late"
    folder.mkdir()
    (folder / "fl_late_module.py").write_text(
        "import pyarrow.compute as pc\n\n\n"
        "def plus_one(batch):\n"
        "    return batch.set_column(0, 'id', pc.add(batch['id'], 1))\n"
    )
    monkeypatch.syspath_prepend(str(folder))  # on the driver only, after Ray started
    import fl_late_module

    ds = fl.range(5).map_batches(fl_late_module.plus_one)
    assert ds.to_arrow(engine=engine)["id"].to_pylist() == [1, 2, 3, 4, 5]
    assert ray.cloudpickle.cloudpickle._is_registered_pickle_by_value(fl_late_module)
    ray.cloudpickle.unregister_pickle_by_value(fl_late_module)
    sys.modules.pop("fl_late_module")
