"""The local engine's write that journals its shards and resumes after a crash.

Used by :meth:`~feedline.engines.local.engine.LocalEngine.write` for a plan whose read tasks
stream in order through one batch pipeline (no ``limit``, no class ``map_batches``) to a
dataset on local disk; the journal and what a resume checks are described in
:mod:`feedline.store.write_journal`. Each read task's batches are followed in the stream by a
marker, so the writer knows which task's output every shard ended in.
"""

from __future__ import annotations

import base64
import logging
import posixpath
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from feedline.engines.batch.fusion import BatchPipeline, InstancePool
from feedline.engines.local.executor import run_tasks
from feedline.engines.write_resume import find_interrupted
from feedline.io.source import ExecutionReport, ReadTask
from feedline.io.storage.paths import Location
from feedline.plan.plan import Operator
from feedline.store.commit import WriteBase, commit, writing
from feedline.store.manifest import Manifest
from feedline.store.shards import ShardWriter
from feedline.store.write_journal import JOURNAL_NAME, Journal, JournalShard

__all__ = ["write_resumable"]

logger = logging.getLogger(__name__)


class _TaskEnd:
    """Marks the end of read task ``index``'s batches in the stream (0 bytes queued)."""

    nbytes = 0

    def __init__(self, index: int) -> None:
        self.index = index


def _schema_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_of(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def write_resumable(
    target: Location,
    tasks: Sequence[ReadTask],
    ops: tuple[Operator, ...],
    *,
    identity: dict[str, Any],
    resume: bool,
    parallelism: int,
    memory_budget: int,
    writer_options: dict[str, Any],
    schema_hint: Callable[[], pa.Schema],
    lineage: dict[str, Any],
    write_info: dict[str, Any],
    on_rows: Callable[[int], None] | None,
    preprocessors: list[dict[str, Any]] | None,
    report: ExecutionReport,
    base: WriteBase | None,
) -> Manifest:
    """Run ``tasks`` through ``ops`` into shards at ``target``, journaling each shard, and
    commit; with ``resume``, continue the interrupted write of the same ``identity``."""
    found = find_interrupted(target, identity) if resume else None
    if resume and found is None:
        logger.info("No interrupted write of this plan at %s: writing from the start", target.url)
    with writing(target, base, found.write_id if found is not None else None) as write:
        staging = write.staging
        journal = Journal.start(identity, write.write_id)
        if found is not None:
            journal.writer = found.writer
            journal.shards = found.verified(staging)
            keep = {e.shard.path for e in journal.shards} | {JOURNAL_NAME}
            for path in staging.fs.ls(staging.path, detail=False):  # partial shards
                if posixpath.basename(path.rstrip("/")) not in keep:
                    staging.fs.rm_file(path)
        kept = list(journal.shards)
        start, skip = (kept[-1].task, kept[-1].rows) if kept else (0, 0)
        if found is not None:
            report.count("resumed_shards_kept", len(kept))
            report.count("resumed_read_tasks_skipped", start)
            logger.info(
                "Resuming write %s at %s: %d verified shard(s) kept, read tasks %d..%d to run",
                write.write_id, target.url, len(kept), start, len(tasks) - 1,
            )  # fmt: skip
        writer = ShardWriter(
            staging,
            on_rows=on_rows,
            write_id=write.write_id,
            first_shard=len(kept),
            **writer_options,
        )
        if kept:
            writer.restore(journal.writer)
        journal.save(staging)
        pipeline = BatchPipeline(ops, report, InstancePool())

        def make_task(index: int) -> Callable[[], Iterator[Any]]:
            task = tasks[index]

            def run() -> Iterator[Any]:
                to_skip = skip if index == start else 0
                for batch in pipeline(task.read(report), task.label, index):
                    if to_skip:  # rows of this task already in a kept shard
                        if batch.num_rows <= to_skip:
                            to_skip -= batch.num_rows
                            continue
                        batch, to_skip = batch.slice(to_skip), 0
                    yield batch
                yield _TaskEnd(index)

            return run

        stream = run_tasks(
            [make_task(i) for i in range(start, len(tasks))],
            parallelism=parallelism,
            memory_budget=memory_budget,
            preserve_order=True,
        )
        try:
            task, task_base, fed, closed, written = start, -skip, 0, 0, 0
            for item in stream:
                if isinstance(item, _TaskEnd):
                    task, task_base = item.index + 1, fed
                    continue
                if not item.num_rows:  # as the engine's stream does
                    continue
                writer.write(item)
                fed += item.num_rows
                report.add(rows_out=item.num_rows, batches_out=1)
                for shard in writer.shards[written:]:  # shards this batch completed
                    closed += shard.rows
                    settings = writer.settings()
                    if writer.schema is not None:
                        settings["schema"] = _schema_text(writer.schema)
                    journal.add(staging, JournalShard(shard, task, closed - task_base), settings)
                written = len(writer.shards)
            shards = [e.shard for e in kept] + writer.close()
        except BaseException:
            writer.abort()
            raise
        if writer.schema is not None:
            schema = writer.schema
        elif "schema" in journal.writer:  # every row was in the kept shards
            schema = _schema_of(journal.writer["schema"])
        else:
            schema = schema_hint()
        manifest = Manifest(
            schema=schema,
            shards=shards,
            lineage=lineage,
            preprocessors=preprocessors or [],
            write=dict(write_info) | {"report": report.as_dict()},
        )
        commit(write, manifest)
    return manifest
