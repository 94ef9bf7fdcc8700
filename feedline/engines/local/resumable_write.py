"""The local engine's write that journals its shards and resumes after a crash.

Used by :meth:`~feedline.engines.local.engine.LocalEngine.write` for a plan whose read tasks
stream in order through one batch pipeline (no ``limit``, no class ``map_batches``) to a
dataset on local disk; the journal and what a resume checks are described in
:mod:`feedline.store.write_journal`. Each read task's batches are followed in the stream by a
marker, so the writer knows which task's output every shard ended in.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import posixpath
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from feedline.engines.batch.fusion import BatchPipeline, InstancePool
from feedline.engines.local.executor import run_tasks
from feedline.io.source import ExecutionReport, ReadTask
from feedline.io.storage.paths import Location
from feedline.plan.plan import Operator
from feedline.store.commit import STAGING_PREFIX, WriteBase, commit, writing
from feedline.store.manifest import Manifest
from feedline.store.shards import ShardWriter
from feedline.store.write_journal import JOURNAL_NAME, Journal, JournalShard, differences, refuse

__all__ = ["functions_digest", "write_resumable"]

logger = logging.getLogger(__name__)


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


class _TaskEnd:
    """Marks the end of read task ``index``'s batches in the stream (0 bytes queued)."""

    nbytes = 0

    def __init__(self, index: int) -> None:
        self.index = index


def _interrupted(target: Location, identity: dict[str, Any]) -> Journal | None:
    """The journal of an interrupted write of this very plan at ``target`` (the one with the
    most shards), ``None`` when there is none; an interrupted write of another plan or input
    raises, saying what differs."""
    fs = target.fs
    if not fs.isdir(target.path):
        return None
    journals = []
    for path in fs.ls(target.path, detail=False):
        if posixpath.basename(path.rstrip("/")).startswith(STAGING_PREFIX):
            journal = Journal.load(target.child(posixpath.basename(path.rstrip("/"))))
            if journal is not None:
                journals.append(journal)
    same = [j for j in journals if j.identity == identity]
    if same:
        return max(same, key=lambda j: len(j.shards))
    if journals:
        other = max(journals, key=lambda j: len(j.shards))
        raise refuse(target, differences(other.identity, identity))
    return None


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
    found = _interrupted(target, identity) if resume else None
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
