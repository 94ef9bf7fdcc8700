"""The Ray engine's write that journals its shards and resumes after a crash
(``ds.write(path, engine="ray", resume=True)``).

The plan's read tasks are split into *units* (:func:`~feedline.engines.write_resume.
unit_bounds`: four per CPU of the cluster, contiguous ranges of tasks) and each unit is one
Ray task: it runs its read tasks in order through the plan's fused operators (the local
engine's :class:`~feedline.engines.batch.fusion.BatchPipeline`, so ``sample`` seeds and
batches are the same) and writes its rows as shards into its own folder of the staging
folder (:func:`~feedline.engines.write_resume.write_unit`), recording each shard as it
completes (:class:`~feedline.store.write_journal.UnitRecord`). The driver renames the
shards in unit order and commits, as :mod:`feedline.engines.ray.write` does.
``rows_per_shard`` and ``bytes_per_shard`` apply within each unit: every shard is exact
except the last one of each unit.

Re-run with ``resume=True`` after a crash of the driver (SIGKILL, preemption), the same plan
keeps the complete units whose shards all verify, continues the others after their last
verified shard (as the local engine does) and runs the units with no shard from their
start; the result is the bytes of an uninterrupted ``resume=True`` write
(:mod:`feedline.engines.write_resume`). A plan with ``limit`` or an actor stage (a class
``map_batches``, a tokenizer) is refused: its rows are not a function of one unit's read
tasks.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.engines.batch.fusion import BatchPipeline, InstancePool, split_at_limits
from feedline.engines.local.engine import lineage_of
from feedline.engines.protocol import WriteOptions
from feedline.engines.ray.errors import surface_errors
from feedline.engines.ray.runtime import ship_user_modules
from feedline.engines.ray.source import RaySource
from feedline.engines.ray.stages import merge_report, split_stages
from feedline.engines.write_resume import (
    find_interrupted,
    resume_units,
    shards_in_order,
    unit_bounds,
    write_identity,
    write_unit,
)
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport, ReadTask
from feedline.io.storage.paths import Location
from feedline.plan.plan import Operator, Plan, pushdown
from feedline.plan.relational import RelationalSource
from feedline.store import dataset_files as fmt
from feedline.store.commit import WriteBase
from feedline.store.write_journal import Journal, UnitRecord

if TYPE_CHECKING:
    from feedline.engines.ray.engine import RayEngine

__all__ = ["UNITS_PER_CPU", "check_units", "write_in_units"]

#: units per CPU of the cluster: a resume redoes at most the units running when it stopped
UNITS_PER_CPU = 4
#: renames running at once on the driver (each one a copy on object stores)
_RENAMES = 16


@dataclass(frozen=True)
class _UnitSpec:
    """What every unit task needs (put in Ray's object store once)."""

    staging: Location
    tasks: tuple[ReadTask, ...]
    ops: tuple[Operator, ...]
    schema: pa.Schema
    writer_kwargs: dict[str, Any]


def _write_unit(
    spec: _UnitSpec, unit: int, first: int, count: int, after: UnitRecord | None
) -> tuple[int, list[Any], Any]:
    """Run read tasks ``first .. first + count - 1`` through the operators into shards of
    ``staging/unit-<n>-<id>/`` (after the kept shards of ``after``), recording them as
    they complete; return ``(unit, shards, counters)`` (in a Ray task)."""
    report = ExecutionReport()
    pipeline = BatchPipeline(spec.ops, report, InstancePool())

    def outputs() -> Iterator[tuple[int, Iterator[pa.RecordBatch]]]:
        for index in range(first, first + count):
            task = spec.tasks[index]
            yield index, pipeline(task.read(report), task.label, index)

    folder = f"unit-{unit:06d}-{uuid.uuid4().hex[:8]}"
    shards = write_unit(
        spec.staging,
        folder,
        (unit, first, count),
        outputs(),
        spec.writer_kwargs,
        spec.schema,
        report,
        after,
    )
    return unit, shards, report.as_dict()


def check_units(plan: Plan, target: Location) -> tuple[Operator, ...]:
    """The operators a unit runs; raises a :class:`~feedline.errors.ConfigurationError` for
    a plan whose rows are not a function of one unit's read tasks (nothing runs here)."""
    why = None
    if isinstance(plan.source, RaySource | RelationalSource):
        why = "its input is a Ray dataset or a join/sort, not read tasks"
    segments = split_at_limits(pushdown(plan).remaining)
    if why is None and (len(segments) != 1 or len(split_stages(segments[0][0])) != 1):
        why = "the plan has a limit() or an actor stage (a class map_batches, a tokenizer)"
    if why is not None:
        raise ConfigurationError(
            f"resume=True cannot write {target.url!r} on Ray in resumable units: {why}. Fix: "
            "drop resume=True (the write starts over)."
        )
    return segments[0][0]


def write_in_units(
    engine: RayEngine,
    plan: Plan,
    schema: pa.Schema,
    target: Location,
    options: WriteOptions,
    *,
    on_rows: Callable[[int], None] | None,
    report: ExecutionReport,
    preprocessors: list[dict[str, Any]] | None,
    base: WriteBase | None,
) -> fmt.Manifest:
    """Write ``plan`` (output ``schema``) at ``target`` in journaled units, continuing the
    interrupted write of the same plan, input and options when there is one."""
    import ray

    ops = check_units(plan, target)
    pushed = pushdown(plan)
    tasks = plan.source.read_tasks(pushed.columns, pushed.predicate)
    kwargs = options.writer_kwargs()
    identity = write_identity(plan, len(tasks), kwargs, preprocessors, base, engine="ray")
    found = find_interrupted(target, identity)
    with fmt.writing(target, base, found.write_id if found is not None else None) as write:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        units = resume_units(write.staging, found, unit_bounds(len(tasks), UNITS_PER_CPU * cpus))
        Journal.start(identity, write.write_id, units.bounds).save(write.staging)
        if found is not None:
            report.count("resumed_units_kept", len(units.kept))
            report.count("resumed_read_tasks_skipped", units.tasks_skipped())
        ship_user_modules(ops)
        spec = ray.put(_UnitSpec(write.staging, tuple(tasks), ops, schema, kwargs))
        run = ray.remote(_write_unit)
        bounds = units.bounds
        refs = [
            run.remote(spec, n, bounds[n], bounds[n + 1] - bounds[n], units.partial.get(n))
            for n in units.run
        ]
        with surface_errors():
            results = ray.get(refs)
        done = {}
        for unit, shards, counters in results:
            done[unit] = shards
            merge_report(report, counters)
        staged = shards_in_order(units.kept, done)
        names = [write.shard_name(n) for n in range(len(staged))]
        moves = [
            (write.staging.join(s.path), write.shard_folder.join(n))
            for s, n in zip(staged, names, strict=True)
        ]
        if moves:
            with ThreadPoolExecutor(min(_RENAMES, len(moves))) as pool:
                list(pool.map(lambda move: write.staging.fs.mv(*move), moves))
        shards = [dataclasses.replace(s, path=n) for s, n in zip(staged, names, strict=True)]
        if on_rows is not None:
            for shard in shards:
                on_rows(shard.rows)
        manifest = fmt.Manifest(
            schema=schema,
            shards=shards,
            lineage=lineage_of(plan, engine.name),
            preprocessors=preprocessors or [],
            write={"options": kwargs, "units": len(bounds) - 1, "report": report.as_dict()},
        )
        fmt.commit(write, manifest)
    return manifest
