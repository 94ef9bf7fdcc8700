"""Writes on the Ray engine: Ray's Parquet writer into a staging folder, manifest last.

The workers write Parquet files with ``Dataset.write_parquet`` into feedline's hidden
staging folder of a locked write (:func:`feedline.io.format.writing`). The driver then
renames them to ``part-NNNNN-<write id>.parquet`` in dataset order (Ray's write-task
index, then the file number inside the task), reads their footers for row and row-group
counts, computes their sha256 checksums, builds the :class:`~feedline.io.format.Manifest` (lineage
``engine="ray"``) and calls :func:`feedline.io.format.commit`, which writes the manifest
last. A write that fails or is interrupted before the commit leaves no new manifest: the
staging folder is removed on failure, and the previous dataset (if any) still opens.

Shard layout:

- ``rows_per_shard``: ``repartition(target_num_rows_per_block=n, strict=True)`` then
  ``max_rows_per_file=n``: every shard but the last holds exactly ``n`` rows, as on the
  local engine.
- otherwise ``bytes_per_shard`` becomes Ray's ``min_bytes_per_file``: blocks are combined
  until their *in-memory* (uncompressed) size reaches it, so shards on disk are usually
  smaller than on the local engine, which measures the compressed file.
- row groups hold ``row_group_rows`` rows, or as many rows as fit ``row_group_bytes`` by
  an estimate of the row size from the schema (variable-width values counted at 64 bytes),
  capped by ``rows_per_shard``.

``on_rows`` (progress) is called once per shard, after Ray has written them all.

Within one write task, Ray's writer (``pyarrow.dataset.write_dataset`` with threads) may
interleave its input blocks, so the row order inside a shard can differ from the local
engine's even with ``preserve_order=True``; the shards follow the dataset's order.
"""

from __future__ import annotations

import posixpath
import re
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.engines.base import WriteInfo, WriteOptions
from feedline.engines.fusion import split_at_limits
from feedline.io import format as fmt
from feedline.io.footer import footer_of
from feedline.io.shards import conform, writable_schema
from feedline.io.source import ExecutionReport
from feedline.io.storage import Location
from feedline.plan import Plan, pushdown

if TYPE_CHECKING:
    from feedline.engines.ray import RayEngine

__all__ = ["estimate_row_bytes", "write_plan"]

_VARIABLE_BYTES = 64
_ARROW_MAX_ROWS_PER_GROUP = 1 << 20
_NAME = re.compile(r"-(\d+)-(\d+)\.parquet$")


def estimate_row_bytes(schema: pa.Schema) -> int:
    """Bytes per row of ``schema`` (fixed-width exactly; variable-width values at 64 bytes).

    Examples
    --------
    >>> estimate_row_bytes(pa.schema({"x": pa.float32(), "s": pa.string()}))
    68
    >>> estimate_row_bytes(pa.schema({"img": pa.fixed_shape_tensor(pa.uint8(), [2, 3])}))
    6
    """
    return max(1, sum(_type_bytes(field.type) for field in schema))


def _type_bytes(kind: pa.DataType) -> int:
    if isinstance(kind, pa.FixedShapeTensorType):
        size = 1
        for dim in kind.shape:
            size *= dim
        return size * _type_bytes(kind.value_type)
    if isinstance(kind, pa.BaseExtensionType):
        return _type_bytes(kind.storage_type)
    if pa.types.is_fixed_size_list(kind):
        return kind.list_size * _type_bytes(kind.value_type)
    if pa.types.is_struct(kind):
        return sum(_type_bytes(kind.field(i).type) for i in range(kind.num_fields))
    try:
        return max(1, kind.bit_width // 8)
    except ValueError:  # strings, binaries, lists: variable width
        return _VARIABLE_BYTES


def _filename_provider() -> Any:
    from ray.data.datasource import FilenameProvider

    class _OrderedNames(FilenameProvider):
        """``<write uuid>-<task index>-<file number>.parquet``: sortable into dataset order."""

        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"{write_uuid}-{task_index:06d}-{{i}}.parquet"

    return _OrderedNames()


def write_plan(
    engine: RayEngine,
    plan: Plan,
    target: Location,
    options: WriteOptions,
    *,
    preserve_order: bool,
    on_rows: Callable[[int], None] | None,
    report: ExecutionReport,
    preprocessors: list[dict[str, Any]] | None,
) -> WriteInfo:
    """Write ``plan`` as a feedline dataset at ``target`` with Ray's Parquet writer."""
    from feedline.engines.local import lineage_of
    from feedline.engines.ray import surface_errors
    from feedline.engines.schema import infer_schema

    start = time.perf_counter()
    schema = writable_schema(infer_schema(plan), "the plan")
    for name in ("rows_per_shard", "row_group_rows"):
        value = getattr(options, name)
        if value is not None and value < 1:
            from feedline.errors import ConfigurationError

            raise ConfigurationError(f"{name}={value} must be >= 1. Fix: pass a positive count.")
    engine.ensure_ray()
    collector, run_id = engine._collector(), uuid.uuid4().hex
    with fmt.writing(target) as write:
        staging = write.staging
        try:
            rds = _dataset(engine, plan, schema, preserve_order, report, collector, run_id)
            if rds is not None:
                rds, kwargs = _layout(rds, options, schema)
                with surface_errors():
                    rds.write_parquet(
                        staging.path,
                        filesystem=staging.arrow_filesystem(),
                        filename_provider=_filename_provider(),
                        schema=schema,
                        **kwargs,
                    )
        finally:
            engine._collect(collector, run_id, report)
        shards = _finalize(staging, write.shard_folder, write.shard_name, on_rows)
        manifest = fmt.Manifest(
            schema=schema,
            shards=shards,
            lineage=lineage_of(plan, engine.name),
            preprocessors=preprocessors or [],
            write={"options": options.writer_kwargs(), "report": report.as_dict()},
        )
        fmt.commit(write, manifest)
    return WriteInfo.from_manifest(
        target.url, manifest, started=start, engine=engine.name, report=report
    )


def _dataset(engine, plan, schema, preserve_order, report, collector, run_id) -> Any:
    """The Ray dataset to write: the plan in Ray, or (after a ``limit`` followed by more
    operators) the driver's stream handed to Ray."""
    pushed = pushdown(plan)
    segments = split_at_limits(pushed.remaining)
    if len(segments) == 1:
        return engine.dataset(
            plan,
            pushed,
            segments[0][0],
            preserve_order=preserve_order,
            collector=collector,
            run_id=run_id,
            conform=schema,
            count_output=True,
        )
    import ray.data

    batches = engine.execute(plan, preserve_order=preserve_order, report=report)
    tables = [pa.Table.from_batches([conform(b, schema)]) for b in batches]
    if not tables:
        return None
    rds = ray.data.from_arrow(tables)
    rds.context.execution_options.preserve_order = True
    return rds


def _layout(rds: Any, options: WriteOptions, schema: pa.Schema) -> tuple[Any, dict[str, Any]]:
    """Repartition ``rds`` and choose ``write_parquet`` arguments for ``options``."""
    per_row = estimate_row_bytes(schema)
    group = options.row_group_rows or max(1, options.row_group_bytes // per_row)
    group = min(group, _ARROW_MAX_ROWS_PER_GROUP)
    kwargs: dict[str, Any] = {
        "compression": options.compression or "none",
        "use_dictionary": fmt.dictionary_columns(schema),
        "write_statistics": True,
        "write_page_checksum": True,  # CRC-32 per page, verified on every read
    }
    if options.rows_per_shard is not None:
        n = options.rows_per_shard
        rds = rds.repartition(target_num_rows_per_block=n, strict=True)
        kwargs["max_rows_per_file"] = n
        group = min(group, n)
    elif options.bytes_per_shard is not None:
        kwargs["min_bytes_per_file"] = options.bytes_per_shard
    kwargs["row_group_size"] = group
    return rds, kwargs


def _finalize(
    staging: Location,
    into: Location,
    shard_name: Callable[[int], str],
    on_rows: Callable[[int], None] | None,
) -> list[fmt.ShardInfo]:
    """Rename Ray's files to ``into/shard_name(n)`` in dataset order; describe each shard."""
    fs = staging.fs
    names = []
    if fs.exists(staging.path):
        for path in fs.ls(staging.path, detail=False):
            name = posixpath.basename(path.rstrip("/"))
            match = _NAME.search(name)
            if match:
                names.append(((int(match.group(1)), int(match.group(2))), name))
    shards = []
    for number, (_, name) in enumerate(sorted(names)):
        part = shard_name(number)
        fs.mv(staging.join(name), into.join(part))
        location = into.child(part)
        footer = footer_of(location)
        rows = footer.metadata.num_rows
        size, checksum = fmt.file_checksum(location)
        shards.append(
            fmt.ShardInfo(part, rows, size, footer.row_groups, checksum, footer.digest, True)
        )
        if on_rows is not None:
            on_rows(rows)
    return shards
