"""The local streaming engine: order, backpressure, early stop, fusion, errors, configuration."""

from __future__ import annotations

import random
import threading
import time
import traceback

import pyarrow as pa
import pytest

import feedline as fl
from feedline.arrow.sizes import parse_bytes


def jitter(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Sleep 0-5 ms so that tasks finish in a scrambled order."""
    time.sleep(random.random() * 0.005)
    return batch


def collect_ids(batches) -> list[int]:
    return [i for batch in batches for i in batch["id"].to_pylist()]


# --------------------------------------------------------------------------- order


def test_preserve_order_over_many_files(parquet_folder):
    folder = parquet_folder(n_files=30, rows=40, row_group_size=10)
    engine = fl.LocalEngine(parallelism=8)
    ds = fl.read_parquet(folder).map_batches(jitter, batch_size=7)
    ordered = collect_ids(ds.iter_batches(preserve_order=True, engine=engine))
    assert ordered == list(range(1_200))
    unordered = collect_ids(ds.iter_batches(preserve_order=False, engine=engine))
    assert sorted(unordered) == list(range(1_200))
    assert len(unordered) == 1_200


def test_preserve_order_over_many_tasks_with_reversed_delays():
    # early tasks are the slowest: an engine that yields in completion order would reverse them
    def slow_start(batch):
        time.sleep(0.002 * max(0, 20 - batch["id"][0].as_py() // 50))
        return batch

    engine = fl.LocalEngine(parallelism=6)
    ds = fl.range(1_000, rows_per_task=50).map_batches(slow_start, batch_size=25)
    assert collect_ids(ds.iter_batches(preserve_order=True, engine=engine)) == list(range(1_000))
    assert ds.to_arrow(engine=engine)["id"].to_pylist() == list(range(1_000))
    unordered = collect_ids(ds.iter_batches(preserve_order=False, engine=engine))
    assert sorted(unordered) == list(range(1_000))


def test_preserve_order_write_keeps_input_order(tmp_path):
    engine = fl.LocalEngine(parallelism=4)
    ds = fl.range(2_000, rows_per_task=100).map_batches(jitter, batch_size=33)
    ds.write(tmp_path / "out", engine=engine, rows_per_shard=300)
    assert fl.open(tmp_path / "out").to_arrow()["id"].to_pylist() == list(range(2_000))


# --------------------------------------------------------------------------- streaming


def test_backpressure_bounds_work_ahead_of_the_consumer():
    calls = []

    def produce(batch):
        calls.append(batch.num_rows)
        return batch

    engine = fl.LocalEngine(parallelism=1, memory_budget=1)  # room for a single queued batch
    ds = fl.range(1_000_000, rows_per_task=1_000_000).map_batches(produce, batch_size=1_000)
    stream = ds.iter_batches(engine=engine)
    first = next(stream)
    time.sleep(0.3)  # give an unbounded producer plenty of time to run ahead
    assert first.num_rows == 1_000
    assert len(calls) <= 4, f"{len(calls)} batches produced while the consumer held one"
    stream.close()


def test_closing_the_stream_stops_the_workers():
    calls = []

    def slow(batch):
        time.sleep(0.01)
        calls.append(1)
        return batch

    engine = fl.LocalEngine(parallelism=4)
    ds = fl.range(100_000, rows_per_task=1_000).map_batches(slow, batch_size=100)
    threads_before = threading.active_count()
    stream = ds.iter_batches(engine=engine)
    for _ in range(3):
        next(stream)
    stream.close()
    produced = len(calls)
    time.sleep(0.2)
    assert len(calls) == produced  # nothing runs after close
    assert produced < 100
    assert threading.active_count() <= threads_before


def test_worker_error_reaches_the_consumer_with_its_traceback():
    def fails_late(batch):
        if batch["id"][0].as_py() >= 5_000:
            raise KeyError("late failure")
        return batch

    engine = fl.LocalEngine(parallelism=3)
    ds = fl.range(10_000, rows_per_task=1_000).map_batches(fails_late, batch_size=500)
    with pytest.raises(fl.UserFunctionError, match=r"range\[5000:6000\]") as info:
        ds.to_arrow(engine=engine)
    assert isinstance(info.value.__cause__, KeyError)
    names = [frame.name for frame in traceback.extract_tb(info.value.__cause__.__traceback__)]
    assert names[-1] == "fails_late"


def test_consecutive_batch_operators_are_fused_in_one_worker():
    def stamp(batch):
        tid = threading.get_ident()
        return batch.append_column("tid", pa.array([tid] * batch.num_rows, pa.int64()))

    def check(batch):
        tids = set(batch["tid"].to_pylist())
        assert tids == {threading.get_ident()}, "the second operator ran in another thread"
        return batch.append_column("ok", pa.array([True] * batch.num_rows))

    engine = fl.LocalEngine(parallelism=4)
    ds = fl.range(5_000, rows_per_task=500).map_batches(stamp, batch_size=50).map_batches(check)
    table = ds.to_arrow(engine=engine)
    assert table.num_rows == 5_000
    assert all(table["ok"].to_pylist())
    assert threading.get_ident() not in set(table["tid"].to_pylist())


def test_parallel_workers_overlap():
    def sleepy(batch):
        time.sleep(0.05)
        return batch

    engine = fl.LocalEngine(parallelism=8)
    ds = fl.range(16, rows_per_task=1).map_batches(sleepy)
    start = time.perf_counter()
    assert ds.count(engine=engine) == 16
    elapsed = time.perf_counter() - start
    assert elapsed < 16 * 0.05 * 0.6  # serial would take 0.8 s


# --------------------------------------------------------------------------- configuration


def test_parse_bytes():
    assert parse_bytes(1024) == 1024
    assert parse_bytes("256MB") == 256 * 10**6
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes(" 1.5 kb ") == 1_500
    for bad in ("lots", "12 parsecs", "0MB", 0, -5):
        with pytest.raises(fl.ConfigurationError, match="Fix:"):
            parse_bytes(bad)


def test_engine_options_are_validated():
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.LocalEngine(parallelism=0)
    engine = fl.LocalEngine(parallelism=3, memory_budget="1MB")
    assert (engine.parallelism, engine.memory_budget) == (3, 10**6)
    assert fl.LocalEngine().parallelism >= 2


def test_get_engine_registry():
    assert fl.get_engine().name == "local"
    engine = fl.LocalEngine(parallelism=2)
    assert fl.get_engine(engine) is engine
    with pytest.raises(fl.ConfigurationError, match="Unknown engine 'nope'"):
        fl.get_engine("nope")
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.get_engine(engine, {"parallelism": 3})


def test_engine_by_name_in_terminal_calls():
    assert fl.range(10).count(engine="local") == 10
    assert fl.range(10).to_arrow(engine="local").num_rows == 10
    with pytest.raises(fl.ConfigurationError):
        fl.range(10).to_arrow(engine="nope")
