"""Relational operators on more data than DuckDB's memory limit spill instead of failing."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.engines.local.engine import LocalEngine
from feedline.io.source import ExecutionReport, ReadTask, Source

ROWS = 3_000_000  # 4 float64/int64 columns + a string: about 145 MB of Arrow data
PER_TASK = 250_000
KEYS = 500_000  # each drawn 6 times on average: all but ~0.25% of them appear


class _Generated(Source):
    """Rows generated per read task (never held in memory together)."""

    kind = "generated"

    def __init__(self, rows: int, keys: int) -> None:
        self.rows, self.keys = rows, keys

    def schema(self) -> pa.Schema:
        return pa.schema([("k", pa.int64()), ("x", pa.float64()), ("y", pa.float64()),
                          ("z", pa.float64()), ("s", pa.string())])  # fmt: skip

    def describe(self) -> str:
        return f"generated: {self.rows} rows"

    def read_tasks(self, columns, predicate) -> list[ReadTask]:
        def task(start: int) -> ReadTask:
            def read(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
                rng = np.random.default_rng(start)
                for lo in range(start, min(self.rows, start + PER_TASK), 50_000):
                    n = min(50_000, self.rows - lo)
                    yield pa.record_batch(
                        [pa.array(rng.integers(0, self.keys, n)), pa.array(rng.random(n)),
                         pa.array(rng.random(n)), pa.array(rng.random(n)),
                         pa.array(rng.integers(0, 10**12, n)).cast(pa.string())],
                        schema=self.schema(),
                    )  # fmt: skip

            return ReadTask(f"rows {start}+", read)

        return [task(s) for s in range(0, self.rows, PER_TASK)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> LocalEngine:
    spill = tmp_path_factory.mktemp("spill")
    return LocalEngine(parallelism=2, memory_budget="32MB", relational_memory="32MB",
                       spill_directory=spill)  # fmt: skip


def test_groupby_sort_and_join_beyond_the_memory_limit_spill(engine: LocalEngine) -> None:
    # DuckDB cannot hold the input within 32 MB: finishing means it spilled
    data = fl.Dataset.from_source(_Generated(ROWS, KEYS))
    assert sum(b.nbytes for b in _Generated(PER_TASK, 10).read_tasks(None, None)[0].read(
        ExecutionReport())) * (ROWS // PER_TASK) > 4 * (32 << 20)  # fmt: skip

    groups = data.groupby("k").agg(n=("*", "count"), m=("x", "mean"))
    rows = total = 0
    for batch in groups.iter_batches(engine=engine):
        rows += batch.num_rows
        total += sum(batch["n"].to_pylist())
    assert total == ROWS and 0.99 * KEYS < rows <= KEYS

    previous = None
    count = 0
    for batch in data.sort("s").select(["s"]).iter_batches(engine=engine):
        values = batch["s"].to_pylist()
        assert previous is None or previous <= values[0]
        assert values == sorted(values)
        previous, count = values[-1], count + len(values)
    assert count == ROWS

    right = fl.Dataset.from_source(_Generated(ROWS // 2, KEYS)).unique("k")
    joined = data.join(right, on="k", how="inner", suffix="_r")
    assert joined.count(engine=engine) > ROWS * 0.9
