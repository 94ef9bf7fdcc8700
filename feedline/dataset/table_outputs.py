"""Rows out to lakehouse tables: :meth:`feedline.Dataset.write_delta` and ``write_lance``.

The plan runs on the engine given (local, Spark or Ray) and its batches stream back to the
driver, where the table library (``deltalake``, ``pylance``) writes the files and commits a
new version; the write's lineage (:func:`~feedline.engines.local.engine.lineage_of`: the
source, with the snapshot of a table read in, and the plan) goes into the commit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from feedline.engines.local.engine import lineage_of, plan_schema
from feedline.engines.protocol import Engine, WriteInfo
from feedline.io.lakehouse.delta_writer import TableWrite, write_delta_table
from feedline.io.lakehouse.lance_writer import write_lance_dataset
from feedline.io.source import ExecutionReport
from feedline.plan.plan import Plan

__all__ = ["write_delta", "write_lance"]


def write_delta(
    engine: Engine,
    fitted: Callable[[], Plan],
    path: str | os.PathLike[str],
    *,
    mode: str = "error",
    partition_by: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> WriteInfo:
    """Run the plan ``fitted()`` on ``engine`` and write its rows as a new version of the
    Delta table at ``path`` (see :meth:`feedline.Dataset.write_delta`).

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.engines.protocol import get_engine
    >>> write_delta(get_engine(), lambda: fl.range(5).plan, tempfile.mkdtemp() + "/t").rows
    5
    """

    def write(batches: Iterator[pa.RecordBatch], schema: pa.Schema, lineage: dict) -> TableWrite:
        return write_delta_table(
            batches,
            schema,
            path,
            mode=mode,
            partition_by=partition_by,
            storage_options=storage_options,
            lineage=lineage,
        )

    return _run(engine, fitted, path, write)


def write_lance(
    engine: Engine,
    fitted: Callable[[], Plan],
    path: str | os.PathLike[str],
    *,
    mode: str = "error",
    storage_options: dict[str, Any] | None = None,
) -> WriteInfo:
    """Run the plan ``fitted()`` on ``engine`` and write its rows as a new version of the
    Lance dataset at ``path`` (see :meth:`feedline.Dataset.write_lance`).

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.engines.protocol import get_engine
    >>> write_lance(get_engine(), lambda: fl.range(5).plan, tempfile.mkdtemp() + "/t").rows
    5
    """

    def write(batches: Iterator[pa.RecordBatch], schema: pa.Schema, lineage: dict) -> TableWrite:
        return write_lance_dataset(
            batches, schema, path, mode=mode, storage_options=storage_options, lineage=lineage
        )

    return _run(engine, fitted, path, write)


def _run(
    engine: Engine,
    fitted: Callable[[], Plan],
    path: str | os.PathLike[str],
    write: Callable[[Iterator[pa.RecordBatch], pa.Schema, dict], TableWrite],
) -> WriteInfo:
    """Hand the plan's batches, in its output schema, to ``write``: the plan runs as the
    table library reads the stream (after its checks of the table)."""
    started = time.perf_counter()
    report = ExecutionReport()
    plan = fitted()
    batches = _lazy(lambda: engine.execute(plan, preserve_order=True, report=report))
    done = write(batches, plan_schema(plan), lineage_of(plan, engine.name))
    seconds = time.perf_counter() - started
    return WriteInfo(
        os.fspath(path),
        done.rows,
        done.files,
        done.bytes,
        seconds,
        engine.name,
        {**report.as_dict(), "table_version": done.version},
    )


def _lazy(start: Callable[[], Iterator[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    """The batches of ``start()``, which is called only when the first one is asked for."""
    yield from start()
