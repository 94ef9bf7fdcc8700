"""What a resume in units keeps and redoes (feedline/engines/write_resume.py), without an
engine: a unit whose record and shards verify is kept, a unit with a damaged shard, a torn
record or no record runs again, and whatever else the interrupted run left is removed."""

from __future__ import annotations

import dataclasses
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
)
from feedline.errors import ConfigurationError
from feedline.io.storage.paths import resolve
from feedline.store.commit import STAGING_PREFIX
from feedline.store.shards import ShardWriter
from feedline.store.write_journal import UNIT_PREFIX, Journal, UnitRecord

STAGING = STAGING_PREFIX + "0a1b2c3d4e5f"


def _unit(staging: Path, unit: int, first: int, count: int) -> UnitRecord:
    folder = f"unit-{unit:06d}-abcd"
    writer = ShardWriter(resolve(staging / folder), rows_per_shard=5)
    writer.write(pa.record_batch({"x": list(range(first, first + count))}))
    shards = tuple(dataclasses.replace(s, path=f"{folder}/{s.path}") for s in writer.close())
    record = UnitRecord(unit, first, count, shards)
    record.save(resolve(staging))
    return record


def test_verified_units_are_kept_and_the_rest_runs_again(tmp_path: Path) -> None:
    staging = resolve(tmp_path)
    bounds = unit_bounds(40, 4)
    journal = Journal.start({"read_tasks": 40}, "0a1b2c3d4e5f", bounds)
    journal.save(staging)
    records = [_unit(tmp_path, n, bounds[n], bounds[n + 1] - bounds[n]) for n in range(3)]
    damaged = tmp_path / records[1].shards[1].path
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    (tmp_path / f"{UNIT_PREFIX}000002.json").write_text('{"format": 1, "unit": 2, "fir')  # torn
    (tmp_path / "unit-000003-ffff").mkdir()  # a unit the kill interrupted
    (tmp_path / "unit-000003-ffff" / "part-00000.parquet").write_bytes(b"PAR1")

    units = resume_units(staging, Journal.load(staging), unit_bounds(40, 8))
    assert units.bounds == bounds  # the interrupted write's split, not this run's
    assert list(units.kept) == [0] and units.run == [1, 2, 3]
    assert units.tasks_skipped() == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "_resume-unit-000000.json",
        "_resume.json",
        "unit-000000-abcd",
    ]
    done = {3: records[2].shards, 1: records[1].shards}
    order = [s.path for s in shards_in_order(units.kept, done)]
    assert order == [s.path for r in (records[0], records[1], records[2]) for s in r.shards]


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
