"""What every engine's resumable write shares: what the write is, where its interrupted
run is, and what a resume redoes (``ds.write(path, resume=True)``, issue 27).

A write is named by :func:`write_identity`: the plan's and the input's fingerprints, the
code of its functions (:func:`functions_digest`), the number of read tasks of the plan's
deterministic task split, the shard options, the fitted preprocessors, the dataset version
it started from and the mode. No unique-ID column is needed: a read task is its index in
that split. The journal itself (:mod:`feedline.store.write_journal`) lives in the write's
staging folder; :func:`find_interrupted` finds the one of this identity, and refuses one of
another plan or input saying what differs.

The Spark and Ray engines run the read tasks in *units* (:func:`unit_bounds`: contiguous
ranges, a Spark partition or a Ray task each). :func:`write_unit` writes one unit's shards
and records each as it completes, with the position after its last row (read task, rows:
as the local engine's journal), in a
:class:`~feedline.store.write_journal.UnitRecord`. :func:`resume_units` keeps the complete
units whose shards all verify, says where every other unit continues (after its last
verified shard), and removes whatever else the interrupted run left in the staging folder;
:func:`shards_in_order` puts the units' shards back in the order of an uninterrupted write.

Examples
--------
>>> unit_bounds(10, 4)
[0, 2, 5, 7, 10]
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import posixpath
import types
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location
from feedline.plan.plan import Operator, Plan
from feedline.store.commit import STAGING_PREFIX, WriteBase
from feedline.store.manifest import ShardInfo
from feedline.store.shards import ShardWriter, conform
from feedline.store.write_journal import (
    JOURNAL_NAME,
    UNIT_PREFIX,
    Journal,
    UnitRecord,
    differences,
    refuse,
)

__all__ = [
    "VERIFIERS",
    "UnitsToRun",
    "find_interrupted",
    "functions_digest",
    "resume_units",
    "shards_in_order",
    "unit_bounds",
    "write_identity",
    "write_unit",
]


#: units whose shards a resume verifies at once (reading them whole, for their sha256)
VERIFIERS = 8

#: values of a function's globals and closure that go into :func:`functions_digest` by value
_PLAIN = (int, float, str, bytes, bool, type(None))


def _code_parts(code: types.CodeType) -> list[Any]:
    parts: list[Any] = [code.co_code, code.co_names]
    for const in code.co_consts:
        parts.extend(_code_parts(const) if isinstance(const, types.CodeType) else [repr(const)])
    return parts


def _function_parts(fn: Any, depth: int = 0) -> list[Any]:
    """What decides what ``fn`` computes, as far as cheaply known: its code (nested code
    included), and the plain values (numbers, strings) of the globals it names and of its
    closure; a class by its ``__call__``/``__init__``; anything else by its type name."""
    if depth > 2:
        return [getattr(fn, "__qualname__", type(fn).__name__)]
    if isinstance(fn, functools.partial):
        return [*_function_parts(fn.func, depth + 1), repr(fn.args), repr(sorted(fn.keywords))]
    if isinstance(fn, type):
        return [
            fn.__qualname__,
            *[p for name in ("__init__", "__call__") for p in _function_parts(
                getattr(fn, name, None), depth + 1)],
        ]  # fmt: skip
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return [getattr(fn, "__qualname__", type(fn).__name__)]
    parts = _code_parts(code)
    names = getattr(fn, "__globals__", {})
    for name in code.co_names:
        value = names.get(name)
        if isinstance(value, _PLAIN):
            parts.append((name, repr(value)))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        parts.extend(
            [repr(value)] if isinstance(value, _PLAIN) else _function_parts(value, depth + 1)
        )
    return parts


def functions_digest(ops: Sequence[Operator]) -> str:
    """A digest of the user functions of ``ops`` (their code and the plain values they read),
    which a plan's fingerprint (their names) does not cover: a resume refuses a function
    whose code or constants changed.

    Examples
    --------
    >>> from feedline.plan.plan import MapBatches
    >>> a = functions_digest([MapBatches(lambda b: b)])
    >>> a == functions_digest([MapBatches(lambda b: b)]), a == functions_digest([MapBatches(len)])
    (True, False)
    """
    digest = hashlib.sha256()
    for op in ops:
        for value in vars(op).values() if hasattr(op, "__dict__") else ():
            if callable(value):
                digest.update(repr(_function_parts(value)).encode())
    return "sha256:" + digest.hexdigest()


def write_identity(
    plan: Plan,
    read_tasks: int,
    options: dict[str, Any],
    preprocessors: list[dict[str, Any]] | None,
    base: WriteBase | None,
    engine: str | None = None,
) -> dict[str, Any]:
    """What decides a write's bytes, journaled so that a resume of another plan, input,
    options (or, for a write in units, ``engine``) is refused
    (:mod:`feedline.store.write_journal`).

    Examples
    --------
    >>> import feedline as fl
    >>> identity = write_identity(fl.range(10).plan, 1, {}, None, None, engine="ray")
    >>> identity["read_tasks"], identity["mode"], identity["engine"]
    (1, 'overwrite', 'ray')
    """
    fitted = json.dumps(preprocessors or [], sort_keys=True, default=str).encode()
    identity = {
        "plan_fingerprint": plan.fingerprint(),
        "functions": functions_digest(plan.ops),
        "source_fingerprint": plan.source.fingerprint(),
        "read_tasks": read_tasks,
        "options": options,
        "preprocessors": "sha256:" + hashlib.sha256(fitted).hexdigest(),
        "base": None if base is None else base.token,
        "mode": "append" if base is not None and base.append else "overwrite",
    }
    if engine is not None:
        identity["engine"] = engine
    return identity


def _name(path: str) -> str:
    return posixpath.basename(path.rstrip("/"))


def find_interrupted(target: Location, identity: dict[str, Any]) -> Journal | None:
    """The journal of an interrupted write of this very plan at ``target`` (the one that got
    furthest), ``None`` when there is none; an interrupted write of another plan or input
    raises a :class:`~feedline.errors.ConfigurationError` saying what differs."""
    fs = target.fs
    if not fs.isdir(target.path):
        return None
    journals = []
    for path in fs.ls(target.path, detail=False):
        if _name(path).startswith(STAGING_PREFIX):
            staging = target.child(_name(path))
            journal = Journal.load(staging)
            if journal is not None:
                units = sum(1 for p in fs.ls(staging.path, detail=False)
                            if _name(p).startswith(UNIT_PREFIX))  # fmt: skip
                journals.append((len(journal.shards) + units, journal))
    same = [(n, j) for n, j in journals if j.identity == identity]
    if same:
        return max(same, key=lambda item: item[0])[1]
    if journals:
        other = max(journals, key=lambda item: item[0])[1]
        raise refuse(target, differences(other.identity, identity))
    return None


def unit_bounds(tasks: int, units: int) -> list[int]:
    """Split ``tasks`` read tasks into at most ``units`` contiguous units of nearly equal
    size: the first task of each, then ``tasks`` (the Spark engine's partition split)."""
    parts = max(1, min(tasks, units))
    return [tasks * i // parts for i in range(parts + 1)]


@dataclass
class UnitsToRun:
    """What a write in units does: its ``bounds`` (:func:`unit_bounds`), the complete units
    of the interrupted run that are ``kept`` (verified), the units to ``run``, and for those
    of them that had verified shards, where they continue (``partial``: the records cut
    after their last verified shard)."""

    bounds: list[int]
    kept: dict[int, UnitRecord]
    run: list[int]
    partial: dict[int, UnitRecord] = field(default_factory=dict)

    def tasks_skipped(self) -> int:
        """Read tasks that do not run again (the kept units', the partial units' before
        the task their last verified shard ended in)."""
        kept = sum(record.count for record in self.kept.values())
        return kept + sum(r.positions[-1][0] - r.first for r in self.partial.values())


def resume_units(staging: Location, found: Journal | None, bounds: list[int]) -> UnitsToRun:
    """The units left to run in ``staging``: with ``found`` (the interrupted run's journal,
    whose unit split is kept: the shards follow it), a complete unit whose shards all
    verify is kept, a unit with verified shards continues after the last of them, and
    every other file the interrupted run left (the shards after a unit's last verified
    one, the files of units without a record) is removed. Without it, every unit runs."""
    if found is None or not found.units:
        return UnitsToRun(
            bounds, {}, [n for n in range(len(bounds) - 1) if bounds[n + 1] > bounds[n]]
        )
    bounds = found.units
    records = [
        record
        for unit, record in UnitRecord.load_all(staging).items()
        if 0 <= unit < len(bounds) - 1
        and (record.first, record.count) == (bounds[unit], bounds[unit + 1] - bounds[unit])
    ]
    with ThreadPoolExecutor(VERIFIERS) as pool:  # each verification reads its shards whole
        verified = list(pool.map(lambda record: record.verified(staging), records))
    kept = {r.unit: r for r in verified if r.complete}
    partial = {r.unit: r for r in verified if not r.complete and r.shards}
    keep = {JOURNAL_NAME} | {f"{UNIT_PREFIX}{unit:06d}.json" for unit in kept | partial}
    keep |= {s.path for r in (kept | partial).values() for s in r.shards}
    fs = staging.fs
    for path in fs.find(staging.path):  # files only: a folder left empty does no harm
        if _relative(staging, path) not in keep:
            fs.rm_file(path)
    run = [n for n in range(len(bounds) - 1) if bounds[n + 1] > bounds[n] and n not in kept]
    return UnitsToRun(bounds, kept, run, partial)


def _relative(staging: Location, path: str) -> str:
    return path[len(staging.path.rstrip("/")) :].strip("/")


def write_unit(
    staging: Location,
    folder: str,
    unit: tuple[int, int, int],
    outputs: Iterable[tuple[int, Iterable[pa.RecordBatch]]],
    writer_kwargs: dict[str, Any],
    schema: pa.Schema,
    report: ExecutionReport,
    after: UnitRecord | None = None,
) -> list[ShardInfo]:
    """Write one unit's rows (``unit``: its number, first read task and task count) as
    shards into ``staging/folder``, recording its progress after each shard
    (:class:`~feedline.store.write_journal.UnitRecord`) and that it is complete at its
    end; returns every shard of the unit, paths relative to ``staging``.

    ``outputs`` yields ``(task index, its output batches)`` in task order (lazily: a task
    whose batches are not iterated is not read). ``after``: the unit's record cut after its
    last verified shard; those shards are kept, the tasks before the one the last of them
    ended in are skipped, and that task's rows already written are dropped, so the shards
    written from there on are the bytes an uninterrupted run writes.
    """
    number, first, count = unit
    shards = list(after.shards) if after is not None else []
    positions = list(after.positions) if after is not None else []
    start, skip = positions[-1] if positions else (first, 0)
    writer = ShardWriter(
        staging.child(folder), schema=schema, first_shard=len(shards), **writer_kwargs
    )
    if after is not None and after.writer:
        writer.restore(after.writer)
    fed, closed = 0, 0

    def note(shard: ShardInfo, position: tuple[int, int]) -> None:
        shards.append(dataclasses.replace(shard, path=f"{folder}/{shard.path}"))
        positions.append(position)

    def save(complete: bool = False) -> None:
        record = UnitRecord(
            number, first, count, tuple(shards), tuple(positions), writer.settings(), complete
        )
        record.save(staging)

    try:
        for index, batches in outputs:
            if index < start:
                continue  # its rows are all in kept shards: not read
            task_base, to_skip = (-skip, skip) if index == start else (fed, 0)
            for batch in batches:
                if to_skip:  # rows of this task already in a kept shard
                    if batch.num_rows <= to_skip:
                        to_skip -= batch.num_rows
                        continue
                    batch, to_skip = batch.slice(to_skip), 0
                if not batch.num_rows:
                    continue
                if not batch.schema.equals(schema):
                    batch = conform(batch, schema)
                report.add(rows_out=batch.num_rows, batches_out=1)
                before = len(writer.shards)
                writer.write(batch)
                fed += batch.num_rows
                for shard in writer.shards[before:]:  # shards this batch completed
                    closed += shard.rows
                    note(shard, (index, closed - task_base))
                if len(writer.shards) > before:
                    save()
        before = len(writer.shards)
        for shard in writer.close()[before:]:
            note(shard, (first + count, 0))
    except BaseException:
        writer.abort()
        raise
    save(complete=True)
    return shards


def shards_in_order(
    kept: Mapping[int, UnitRecord], done: Mapping[int, Sequence[ShardInfo]]
) -> list[ShardInfo]:
    """The shards of the kept and of the newly ``done`` units (paths relative to the staging
    folder), in unit order, then in each unit's order: an uninterrupted write's order.

    Examples
    --------
    >>> a, b = ShardInfo("a", 1, 1, (1,), ""), ShardInfo("b", 1, 1, (1,), "")
    >>> [s.path for s in shards_in_order({1: UnitRecord(1, 1, 1, (b,))}, {0: [a]})]
    ['a', 'b']
    """
    units = {unit: list(record.shards) for unit, record in kept.items()} | {
        unit: list(shards) for unit, shards in done.items()
    }
    return [shard for unit in sorted(units) for shard in units[unit]]
