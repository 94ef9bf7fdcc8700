"""Writing a plan to a feedline dataset with Spark; the driver commits the manifest last.

Two writers, both into the staging folder of a locked write (:func:`feedline.store.dataset_files.
writing`), both followed by the same driver-side commit (shards renamed
``part-NNNNN-<write id>.parquet`` in partition order, :data:`MOVERS` at once, then
:func:`feedline.store.dataset_files.commit` with lineage ``engine="spark"``). A failed or
interrupted job commits nothing: the previous dataset at the target, if any, still opens,
and the staging folder is removed.

``"feedline"`` (default)
    The fused stage ends in :class:`feedline.store.dataset_files.ShardWriter`: each Spark task
    writes its own shards (folder ``task-<partition>-<attempt>-<id>``) and returns their
    ``{rows, bytes, row_groups, sha256}``. Same file format as the local engine, any
    schema (tensor columns included), checksums computed while writing, no second read.
    Only the shards reported by successful attempts are committed; files left by failed
    or speculative attempts are deleted with the staging folder.
``"spark"``
    Spark's own ``DataFrameWriter.parquet`` (Hadoop commit protocol): ``rows_per_shard`` →
    ``maxRecordsPerFile``, ``row_group_bytes`` → ``parquet.block.size`` (no row-count row
    groups, no ``bytes_per_shard``). Spark tasks then read every footer and compute the
    sha256 checksums in a second, distributed pass (the driver collects only them). Spark
    stores arrays, unsigned and large types differently from Arrow, so only flat schemas
    of booleans, signed integers, floats, strings, binary, dates and decimals are accepted
    (fields become nullable).
"""

from __future__ import annotations

import dataclasses
import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.engines.batch.fusion import split_at_limits
from feedline.engines.local.engine import lineage_of
from feedline.engines.protocol import WriteOptions
from feedline.engines.spark.plan import (
    Units,
    build_job,
    partition_bounds,
    quiet_pandas_warning,
    spark_errors,
)
from feedline.engines.spark.worker import WriteSpec
from feedline.engines.write_resume import (
    find_interrupted,
    resume_units,
    shards_in_order,
    write_identity,
)
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport, ReadTask
from feedline.io.storage.paths import Location
from feedline.plan.plan import Plan, pushdown
from feedline.store import dataset_files as fmt
from feedline.store.commit import WriteBase
from feedline.store.footers import footer_of
from feedline.store.shards import writable_schema
from feedline.store.write_journal import Journal

if TYPE_CHECKING:
    from feedline.engines.spark.engine import SparkEngine

__all__ = ["journaled_tasks", "write_with_feedline", "write_with_spark"]

#: shard renames run at once by the driver
MOVERS = 16

_SPARK_TYPES = (
    pa.bool_(),
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.binary(),
    pa.date32(),
)


def write_with_feedline(
    engine: SparkEngine,
    plan: Plan,
    target: Location,
    options: WriteOptions,
    *,
    preserve_order: bool,
    report: ExecutionReport,
    preprocessors: list[dict[str, Any]],
    base: WriteBase | None = None,
    source_plan: Plan | None = None,
    resume: bool = False,
) -> fmt.Manifest:
    """Executors write feedline shards; the driver renames them (local disk) and commits.

    On object stores the executors write each shard under its final name straight into
    the dataset folder (:func:`~feedline.store.shards.task_first_shard`): the commit copies
    nothing. A write with ``resume=True`` there journals its units in the staging folder
    instead (a resumable write pays one copy per shard at the commit).

    ``source_plan``: the plan as the user built it (``plan`` may have its relational source
    computed as a DataFrame already), for the manifest's lineage. A plan of read tasks
    without ``limit`` is written in units (one per partition) that journal their shards
    (:mod:`feedline.engines.write_resume`); ``resume`` continues its interrupted write."""
    tasks = journaled_tasks(plan)
    if not resume and not target.is_local:
        # on an object store a journaled write stages its shards and copies them at the
        # commit; without resume=True the tasks write final names instead (no copy)
        tasks = None
    if resume and tasks is None:
        raise ConfigurationError(
            f"resume=True cannot resume the write to {target.url!r} on Spark: only a plan "
            "that reads feedline read tasks (not a Spark DataFrame, a join or a sort) and "
            "has no limit() keeps the journal a resume needs. Fix: drop resume=True (the "
            "write starts over)."
        )
    identity: dict[str, Any] = {}
    found = None
    if tasks is not None:
        kwargs = options.writer_kwargs()
        identity = write_identity(plan, len(tasks), kwargs, preprocessors, base, engine="spark")
        found = find_interrupted(target, identity) if resume else None
    with fmt.writing(target, base, found.write_id if found is not None else None) as write:
        staging = write.staging
        units = None
        if tasks is not None:
            bounds = partition_bounds(engine.spark, len(tasks), engine.partitions)
            units = resume_units(staging, found, bounds)
            Journal.start(identity, write.write_id, units.bounds).save(staging)
            if found is not None:
                report.count("resumed_units_kept", len(units.kept))
                report.count("resumed_read_tasks_skipped", units.tasks_skipped())
        job = build_job(
            engine.spark,
            plan,
            mode="write",
            preserve_order=preserve_order,
            partitions=engine.partitions,
            write=WriteSpec(
                staging,
                options.writer_kwargs(),
                units=units is not None,
                resume=units.partial if units is not None else {},
                into=None if units is not None or target.is_local else write.shard_folder,
                write_id=write.write_id,
            ),
            units=None if units is None else Units(tasks or [], units.bounds, units.run),
        )
        writable_schema(job.schema, "the plan")  # refuse what Parquet cannot store, before any task
        if units is None or units.run:
            rows = job.collect(report).to_pylist()
        else:  # every unit was kept
            job.finish(report)
            rows = []
        rows.sort(key=lambda r: (r["part"], r["seq"]))
        done: dict[int, list[fmt.ShardInfo]] = {}
        for row in rows:
            done.setdefault(row["part"], []).append(
                fmt.ShardInfo(
                    row["path"],
                    row["rows"],
                    row["bytes"],
                    tuple(row["row_groups"]),
                    row["checksum"],
                    footer=row["footer"],
                    page_checksums=True,
                )
            )
        if units is None and not target.is_local:
            # written under their final names by the tasks: nothing to copy
            shards = [s for part in sorted(done) for s in done[part]]
        else:  # staged: renamed into the folder in dataset order
            staged = shards_in_order(units.kept if units is not None else {}, done)
            names = [write.shard_name(index) for index in range(len(staged))]
            folder = write.shard_folder
            pairs = zip(staged, names, strict=True)
            _move_all(staging.fs, [(staging.join(s.path), folder.join(n)) for s, n in pairs])
            shards = [dataclasses.replace(s, path=n) for s, n in zip(staged, names, strict=True)]
        manifest = _manifest(
            engine, source_plan or plan, job.schema, shards, options, report, preprocessors
        )
        fmt.commit(write, manifest)
    return manifest


def write_with_spark(
    engine: SparkEngine,
    plan: Plan,
    target: Location,
    options: WriteOptions,
    *,
    preserve_order: bool,
    report: ExecutionReport,
    preprocessors: list[dict[str, Any]],
    base: WriteBase | None = None,
    source_plan: Plan | None = None,
) -> fmt.Manifest:
    """Spark's Parquet writer writes the shards; the driver reads footers and commits."""
    job = build_job(engine.spark, plan, preserve_order=preserve_order, partitions=engine.partitions)
    unsupported = [f"{f.name}: {f.type}" for f in job.schema if f.type not in _SPARK_TYPES]
    if unsupported:
        raise ConfigurationError(
            f"writer='spark' cannot store the column(s) {unsupported} exactly (Spark's Parquet "
            "writer turns tensors, lists, unsigned and large types into other types). Fix: use "
            "SparkEngine(writer='feedline') (the default), which writes any schema."
        )
    with fmt.writing(target, base) as write:
        staging = write.staging
        out = staging.child("spark")
        writer = job.frame.write.option("compression", options.compression or "none")
        writer = writer.option("parquet.block.size", str(options.row_group_bytes))
        writer = writer.option("parquet.page.write-checksum.enabled", "true")  # CRC per page
        if options.rows_per_shard:
            writer = writer.option("maxRecordsPerFile", str(options.rows_per_shard))
        try:
            with spark_errors(), quiet_pandas_warning():
                writer.parquet(out.path if out.is_local else out.url)
        finally:
            job.finish(report)
        names = sorted(
            posixpath.basename(p)
            for p in out.fs.ls(out.path, detail=False)
            if posixpath.basename(p).startswith("part-") and p.endswith(".parquet")
        )
        described = _describe_all(engine.spark, [out.child(n) for n in names])
        shards = []
        moves = []
        for index, (name, (size, checksum, groups, footer)) in enumerate(
            zip(names, described, strict=True)
        ):
            final = write.shard_name(index)
            moves.append((out.join(name), write.shard_folder.join(final)))
            shards.append(fmt.ShardInfo(final, sum(groups), size, groups, checksum, footer, True))
        _move_all(staging.fs, moves)
        schema = job.schema
        if shards:
            first = write.shard_folder.child(shards[0].path)
            footer = fmt.read_footer(first).schema.to_arrow_schema()
            schema = footer.remove_metadata()
        manifest = _manifest(
            engine, source_plan or plan, schema, shards, options, report, preprocessors
        )
        fmt.commit(write, manifest)
    return manifest


def journaled_tasks(plan: Plan) -> list[ReadTask] | None:
    """The read tasks of a plan written in units that journal their shards (one per Spark
    partition), ``None`` for a plan that is not (a Spark DataFrame source, a ``limit``)."""
    if getattr(plan.source, "native_frame", lambda: None)() is not None:
        return None
    pushed = pushdown(plan)
    if len(split_at_limits(pushed.remaining)) != 1:
        return None
    return plan.source.read_tasks(pushed.columns, pushed.predicate)


def _move_all(fs: Any, moves: list[tuple[str, str]]) -> None:
    """Rename the shards to their final names, :data:`MOVERS` at once (on object stores each
    rename is a copy of the whole shard; locally it is cheap either way)."""
    if not moves:
        return
    with ThreadPoolExecutor(min(MOVERS, len(moves))) as pool:
        list(pool.map(lambda move: fs.mv(*move), moves))


def _describe_all(spark: Any, files: list[Location]) -> list[tuple[int, str, tuple[int, ...], str]]:
    """Size, sha256, row-group sizes and footer digest of every file, computed by Spark tasks."""
    if not files:
        return []
    context = spark.sparkContext
    rdd = context.parallelize(files, min(len(files), 4 * context.defaultParallelism))
    with spark_errors():
        return rdd.map(_describe).collect()


def _describe(loc: Location) -> tuple[int, str, tuple[int, ...], str]:
    size, checksum = fmt.file_checksum(loc)
    footer = footer_of(loc)
    return size, checksum, footer.row_groups, footer.digest


def _manifest(
    engine: SparkEngine,
    plan: Plan,
    schema: pa.Schema,
    shards: list[fmt.ShardInfo],
    options: WriteOptions,
    report: ExecutionReport,
    preprocessors: list[dict[str, Any]],
) -> fmt.Manifest:

    return fmt.Manifest(
        schema=schema,
        shards=shards,
        lineage=lineage_of(plan, engine.name),
        preprocessors=preprocessors,
        write={
            "options": options.writer_kwargs(),
            "engine": {"name": engine.name, "writer": engine.writer, "master": engine.spark_master},
            "report": report.as_dict(),
        },
    )
