"""What a resume in units keeps and redoes (feedline/engines/write_resume.py), without an
engine: a complete unit whose shards verify is kept, a unit killed in its middle continues
after its last recorded shard (byte-identical shards), a unit with a torn record or none
runs again, and whatever else the interrupted run left is removed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import feedline as fl
from feedline.engines.write_resume import (
    find_interrupted,
    resume_units,
    shards_in_order,
    unit_bounds,
    write_identity,
    write_unit,
)
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import resolve
from feedline.store.commit import STAGING_PREFIX
from feedline.store.write_journal import UNIT_PREFIX, Journal

STAGING = STAGING_PREFIX + "0a1b2c3d4e5f"


TASKS, ROWS, OPTIONS = 40, 10, {"rows_per_shard": 7, "row_group_rows": 3}
SCHEMA = pa.schema({"x": pa.int64()})


def _outputs(first: int, count: int, ran: list[int], stop_after: int | None = None):
    """``(task, its batches)`` for tasks ``first..``: 10 rows each in batches of 4, 4, 2;
    notes each task whose batches are read in ``ran``; raises (a kill) after task
    ``stop_after``."""

    def batches(index: int):
        ran.append(index)
        rows = list(range(index * ROWS, (index + 1) * ROWS))
        for start in (0, 4, 8):
            yield pa.record_batch({"x": rows[start : min(start + 4, ROWS)]})
        if index == stop_after:
            raise KeyboardInterrupt("killed")

    for index in range(first, first + count):
        yield index, batches(index)


def _write_all(staging: Path, bounds: list[int], units: list[int], partial=None) -> dict:
    done, ran = {}, []
    for n in units:
        first, count = bounds[n], bounds[n + 1] - bounds[n]
        done[n] = write_unit(
            resolve(staging), f"unit-{n:06d}-{len(ran):04d}", (n, first, count),
            _outputs(first, count, ran), OPTIONS, SCHEMA, ExecutionReport(),
            (partial or {}).get(n),
        )  # fmt: skip
    return {"done": done, "ran": ran}


def test_a_resume_keeps_complete_units_and_continues_the_others_byte_identical(
    tmp_path: Path,
) -> None:
    bounds = unit_bounds(TASKS, 4)
    whole = _write_all(tmp_path / "whole", bounds, [0, 1, 2, 3])["done"]

    staging = resolve(tmp_path / "resumed")
    Journal.start({"read_tasks": TASKS}, "0a1b2c3d4e5f", bounds).save(staging)
    _write_all(tmp_path / "resumed", bounds, [0])
    with pytest.raises(KeyboardInterrupt):  # unit 1 killed after its task 16
        write_unit(
            staging, "unit-000001-kill", (1, 10, 10), _outputs(10, 10, [], stop_after=16),
            OPTIONS, SCHEMA, ExecutionReport(),
        )  # fmt: skip
    (tmp_path / "resumed" / f"{UNIT_PREFIX}000002.json").write_text('{"format": 1, "un')  # torn
    (tmp_path / "resumed" / "unit-000003-ffff").mkdir()  # a unit the kill interrupted
    (tmp_path / "resumed" / "unit-000003-ffff" / "part-00000.parquet").write_bytes(b"PAR1")

    units = resume_units(staging, Journal.load(staging), unit_bounds(TASKS, 8))
    assert units.bounds == bounds  # the interrupted write's split, not this run's
    assert list(units.kept) == [0] and units.run == [1, 2, 3] and list(units.partial) == [1]
    # unit 1 wrote 70 rows (tasks 10..16): 10 shards of 7; the last ended in task 16
    assert units.partial[1].positions[-1] == (16, 10)
    assert units.tasks_skipped() == 10 + 6
    assert not (tmp_path / "resumed" / "unit-000003-ffff" / "part-00000.parquet").exists()

    again = _write_all(tmp_path / "resumed", bounds, units.run, units.partial)
    assert again["ran"] == list(range(16, TASKS))  # task 16 again: its rows are dropped
    resumed = shards_in_order(units.kept, again["done"])
    expected = shards_in_order({}, whole)
    assert [s.rows for s in resumed] == [s.rows for s in expected]
    assert [(tmp_path / "resumed" / s.path).read_bytes() for s in resumed] == [
        (tmp_path / "whole" / s.path).read_bytes() for s in expected
    ]
    assert [s.checksum for s in resumed] == [s.checksum for s in expected]


def test_a_fresh_write_runs_every_unit(tmp_path: Path) -> None:
    units = resume_units(resolve(tmp_path), None, unit_bounds(3, 8))
    assert units.bounds == [0, 1, 2, 3] and units.run == [0, 1, 2] and not units.kept


def test_an_interrupted_write_of_another_plan_or_engine_is_refused(tmp_path: Path) -> None:
    target = resolve(tmp_path)
    plan = fl.range(100, rows_per_task=10).plan
    spark = write_identity(plan, 10, {"rows_per_shard": 5}, None, None, engine="spark")
    Journal.start(spark, "0a1b2c3d4e5f", unit_bounds(10, 4)).save(target.child(STAGING))
    assert find_interrupted(target, spark).units == [0, 2, 5, 7, 10]
    ray = dict(spark, engine="ray")
    with pytest.raises(ConfigurationError, match=r"the engine .*was \"spark\", now \"ray\""):
        find_interrupted(target, ray)
    other = write_identity(fl.range(200, rows_per_task=10).plan, 20, {}, None, None, "spark")
    with pytest.raises(ConfigurationError, match="the input") as refused:
        find_interrupted(target, other)
    assert "the number of read tasks the input splits into (was 10, now 20)" in str(refused.value)
    assert "Fix:" in str(refused.value)
