"""``Dataset.streaming_split``: equal, disjoint streams for concurrent Ray consumers.

On a local Ray (2 CPUs, one ``ray.init`` for the module): two Ray actors (as two Ray Train
workers would) read one stream each, concurrently, for two epochs; the plan runs on Ray
while they read, and nothing is written to storage.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import feedline as fl

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]


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


def double(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("twice", pc.multiply(batch["id"], 2))


class Trainer:
    """A stand-in for one Ray Train worker: reads its stream, epoch after epoch."""

    def epoch(self, stream: Any) -> list[int]:
        seen = []
        for batch in stream.iter_batches(batch_size=64, batch_format="pyarrow"):
            assert batch["twice"].equals(pc.multiply(batch["id"], 2))
            seen.extend(batch["id"].to_pylist())
        return seen


def test_two_consumers_get_equal_disjoint_covering_streams(engine, tmp_path: Path):
    source = tmp_path / "source"
    source.mkdir()
    for i in range(6):
        ids = np.arange(i * 1000, i * 1000 + 150 + 10 * i, dtype=np.int64)  # 1050 rows, 1044 kept
        pq.write_table(pa.table({"id": ids}), source / f"part-{i}.parquet")
    ds = fl.read_parquet(source).filter(pc.field("id") > 5).map_batches(double)
    expected = sorted(ds.to_arrow()["id"].to_pylist())
    assert len(expected) % 2 == 0  # so equal streams drop nothing
    before = sorted(p.name for p in tmp_path.rglob("*"))

    streams = ds.streaming_split(2, engine=engine)
    trainers = [ray.remote(num_cpus=0)(Trainer).remote() for _ in streams]
    for _ in range(2):  # two epochs, the consumers reading at the same time
        first, second = ray.get([t.epoch.remote(s) for t, s in zip(trainers, streams, strict=True)])
        assert len(first) == len(second) == len(expected) // 2
        assert not set(first) & set(second)
        assert sorted(first + second) == expected
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_streaming_split_arguments_are_checked():
    ds = fl.range(10)
    for n in (0, -1, 1.5, True):
        with pytest.raises(fl.errors.ConfigurationError, match=r"positive int.*Fix:"):
            ds.streaming_split(n)
    with pytest.raises(fl.errors.ConfigurationError, match=r"runs on Ray.*Fix:"):
        ds.streaming_split(2, engine="local")
