"""Writes on the Ray engine: feedline shards written in Ray tasks, manifest last.

Each Ray write task runs :class:`feedline.store.dataset_files.ShardWriter` (the local
engine's writer: same file format, tensor columns included) through a ``ray.data``
``Datasink`` (:class:`ShardSink`), into its own folder ``task-<index>-<id>`` of the staging
folder of a locked write (:func:`feedline.store.dataset_files.writing`). The task computes
every shard's sha256 checksum and footer digest while it writes and returns only
descriptions ``{path, rows, bytes, row_groups, checksum, footer}``; the driver never reads a
shard's bytes. It renames the shards to ``part-NNNNN-<write id>.parquet`` in dataset order
(Ray's write-task index, then the shard number inside the task), in parallel, builds the
:class:`~feedline.store.dataset_files.Manifest` (lineage ``engine="ray"``) and calls
:func:`feedline.store.dataset_files.commit`, which writes the manifest last. A write that
fails or is interrupted before the commit leaves no new manifest: the staging folder is
removed on failure (with the files of failed task attempts), and the previous dataset still
opens.

Shard layout:

- ``rows_per_shard``: ``repartition(target_num_rows_per_block=n, strict=True)``, then each
  task's writer cuts shards of exactly ``n`` rows: every shard but the last holds ``n``
  rows, as on the local engine.
- otherwise ``bytes_per_shard`` becomes the sink's ``min_bytes_per_write``: Ray bundles
  blocks until their *in-memory* (uncompressed) size reaches it, and each write task
  writes its bundle as one shard (cut only past twice ``bytes_per_shard`` on disk), so
  shards on disk are usually smaller than on the local engine, which measures the file.
- row groups as on the local engine (``row_group_rows``, else ``row_group_bytes``).

``on_rows`` (progress) is called once per shard, after Ray has written them all. Rows keep
the order of the blocks a task receives.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.engines.batch.fusion import split_at_limits
from feedline.engines.local.engine import lineage_of, plan_schema
from feedline.engines.protocol import WriteInfo, WriteOptions
from feedline.engines.ray.errors import surface_errors
from feedline.engines.ray.runtime import ship_user_modules
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import Location
from feedline.plan.plan import MapBatches, Plan, pushdown
from feedline.store import dataset_files as fmt
from feedline.store.commit import PendingWrite, WriteBase
from feedline.store.shards import conform, task_first_shard, writable_schema

if TYPE_CHECKING:
    from feedline.engines.ray.engine import RayEngine

__all__ = ["ShardSink", "output_schema", "write_plan"]

#: renames running at once on the driver (each one a copy on object stores)
_RENAMES = 16


def _sink_base() -> type:
    from ray.data import Datasink

    return Datasink


class ShardSink:
    """A ``ray.data`` ``Datasink`` whose write tasks run
    :class:`~feedline.store.dataset_files.ShardWriter`.

    Each task writes into ``staging/task-<index>-<id>/`` and returns the descriptions of its
    shards (checksums and footer digests computed while writing); :attr:`results` holds them
    on the driver once ``write_datasink`` returns, sorted into dataset order.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> sink = ShardSink.create(resolve(tempfile.mkdtemp()), pa.schema({"x": pa.int64()}),
    ...                         WriteOptions(rows_per_shard=2))  # doctest: +SKIP
    >>> ray.data.range(3).write_datasink(sink)  # doctest: +SKIP
    >>> [(r["rows"], r["row_groups"]) for r in sink.results]  # doctest: +SKIP
    [(2, [2]), (1, [1])]
    """

    def __init__(
        self,
        staging: Location,
        schema: pa.Schema,
        options: WriteOptions,
        into: Location | None = None,
        write_id: str = "",
    ) -> None:
        self.staging = staging
        #: where the tasks write their shards under their final names instead of ``staging``
        #: (object stores, where renaming them at the commit would copy every byte)
        self.into = into
        self.write_id = write_id
        self.schema = schema
        self.writer_kwargs = options.writer_kwargs()
        self.min_bytes = None if options.rows_per_shard else options.bytes_per_shard
        if self.min_bytes:  # one shard per task's bundle; a second one only when far over
            self.writer_kwargs["bytes_per_shard"] = 2 * self.min_bytes
            self.writer_kwargs["row_group_bytes"] = min(options.row_group_bytes, self.min_bytes)
        self.results: list[dict[str, Any]] = []

    @classmethod
    def create(
        cls,
        staging: Location,
        schema: pa.Schema,
        options: WriteOptions,
        into: Location | None = None,
        write_id: str = "",
    ) -> Any:
        """A sink that is a real ``ray.data.Datasink`` (Ray is imported only here)."""
        kind = type("FeedlineShardSink", (cls, _sink_base()), {})
        return kind(staging, schema, options, into, write_id)

    @property
    def min_bytes_per_write(self) -> int | None:
        return self.min_bytes

    def get_name(self) -> str:
        return "FeedlineShards"

    def write(self, blocks: Iterable[Any], ctx: Any) -> list[dict[str, Any]]:
        """Write one task's blocks as shards; return their descriptions (runs in the task)."""
        from ray.data.block import BlockAccessor

        if self.into is not None:  # final names, straight into the dataset folder
            name = ""
            writer = fmt.ShardWriter(
                self.into, schema=self.schema, write_id=self.write_id,
                first_shard=task_first_shard(ctx.task_idx), **self.writer_kwargs,
            )  # fmt: skip
        else:
            name = f"task-{ctx.task_idx:06d}-{uuid.uuid4().hex[:8]}"
            writer = fmt.ShardWriter(
                self.staging.child(name), schema=self.schema, **self.writer_kwargs
            )
        try:
            for block in blocks:
                for batch in BlockAccessor.for_block(block).to_arrow().to_batches():
                    writer.write(batch)
            shards = writer.close()
        except BaseException:
            writer.abort()
            raise
        return [
            {
                "task": ctx.task_idx,
                "seq": seq,
                "path": f"{name}/{shard.path}" if name else shard.path,
                "final": not name,
                "rows": shard.rows,
                "bytes": shard.bytes,
                "row_groups": list(shard.row_groups),
                "checksum": shard.checksum,
                "footer": shard.footer,
            }
            for seq, shard in enumerate(shards)
        ]

    def on_write_complete(self, write_result: Any) -> None:
        """Keep the tasks' shard descriptions (runs on the driver), in dataset order."""
        found = [row for rows in write_result.write_returns for row in rows or ()]
        self.results = sorted(found, key=lambda row: (row["task"], row["seq"]))


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
    base: WriteBase | None = None,
) -> WriteInfo:
    """Write ``plan`` as a feedline dataset at ``target``: shards written in Ray tasks."""

    start = time.perf_counter()
    for name in ("rows_per_shard", "row_group_rows"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise ConfigurationError(f"{name}={value} must be >= 1. Fix: pass a positive count.")
    engine.ensure_ray()
    schema = writable_schema(output_schema(plan), "the plan")
    collector, run_id = engine._collector(), uuid.uuid4().hex
    with fmt.writing(target, base) as write:
        into = None if target.is_local else write.shard_folder
        sink = ShardSink.create(write.staging, schema, options, into, write.write_id)
        try:
            rds = _dataset(engine, plan, schema, preserve_order, report, collector, run_id)
            if rds is not None:
                if options.rows_per_shard is not None:
                    rds = rds.repartition(
                        target_num_rows_per_block=options.rows_per_shard, strict=True
                    )
                with surface_errors():
                    rds.write_datasink(sink)
        finally:
            engine._collect(collector, run_id, report)
        shards = _finalize(write, sink.results, on_rows)
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


def output_schema(plan: Plan) -> pa.Schema:
    """The schema the shards get, learnt before the write starts.

    Where it must run a model class (a ``map_batches`` with a class and no
    ``output_schema=``) on a sample, that runs in a Ray task, not on the driver: the model
    is built where the actors run (their packages, their memory, their GPU), once more than
    the actors. ``output_schema=`` on the ``map_batches`` skips it. Other plans learn it on
    the driver (:func:`~feedline.engines.local.engine.plan_schema`).
    """
    if not any(isinstance(op, MapBatches) and op.is_class and op.output_schema is None
               for op in plan.ops):  # fmt: skip
        return plan_schema(plan)
    import ray

    ship_user_modules(plan.ops)
    gpu = any(
        isinstance(op, MapBatches) and op.is_class and (op.device or "").startswith("cuda")
        for op in plan.ops
    )
    gpus = 1 if gpu and ray.cluster_resources().get("GPU", 0) >= 1 else 0
    task = ray.remote(max_retries=0, num_gpus=gpus)(plan_schema)
    with surface_errors():
        return ray.get(task.remote(plan))


def _dataset(
    engine: RayEngine,
    plan: Plan,
    schema: pa.Schema,
    preserve_order: bool,
    report: ExecutionReport,
    collector: Any,
    run_id: str,
) -> Any:
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


def _finalize(
    write: PendingWrite,
    results: list[dict[str, Any]],
    on_rows: Callable[[int], None] | None,
) -> list[fmt.ShardInfo]:
    """Rename the tasks' staged shards to ``write.shard_name(n)`` in dataset order (in
    parallel; shards the tasks wrote under their final names, on object stores, stay where
    they are: no copy) and describe them from what the tasks returned: no shard byte is read
    here."""
    staging, into = write.staging, write.shard_folder
    names = [
        row["path"] if row.get("final") else write.shard_name(number)
        for number, row in enumerate(results)
    ]
    moves = [(r, n) for r, n in zip(results, names, strict=True) if not r.get("final")]

    def rename(pair: tuple[dict[str, Any], str]) -> None:
        staging.fs.mv(staging.join(pair[0]["path"]), into.join(pair[1]))

    if moves:
        with ThreadPoolExecutor(min(_RENAMES, len(moves))) as pool:
            list(pool.map(rename, moves))
    shards = []
    for row, name in zip(results, names, strict=True):
        shards.append(
            fmt.ShardInfo(
                name,
                row["rows"],
                row["bytes"],
                tuple(row["row_groups"]),
                row["checksum"],
                row["footer"],
                True,
            )
        )
        if on_rows is not None:
            on_rows(row["rows"])
    return shards
