"""What leaves the plan: a feedline dataset, TFRecord files, and what a loader reads.

:meth:`feedline.Dataset.write`, ``write_tfrecord`` and ``shard_source`` run here, given the
engine and the plan (its preprocessors fitted); the ``Dataset`` methods only resolve those.
The hand-offs to other systems live with their engines (:mod:`feedline.engines.spark.bridge`,
:mod:`feedline.engines.ray.bridge`), the training loader in :mod:`feedline.loader`.

Examples
--------
>>> import feedline as fl
>>> source = shard_source(fl.range(10).plan, fl.range(10).schema(), lambda names: iter(()), "r")
>>> type(source).__name__, source.num_rows
('BatchStream', 10)
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from feedline.arrow.sizes import parse_bytes
from feedline.engines.protocol import Engine, WriteInfo, WriteOptions
from feedline.errors import ConfigurationError
from feedline.io.parquet import ParquetSource
from feedline.io.source import ExecutionReport
from feedline.io.storage.paths import resolve
from feedline.io.tfrecord.writer import write_tfrecord as write_records
from feedline.plan.plan import Plan, Select, Transform
from feedline.preprocess.preprocessor import from_state
from feedline.store.commit import note_base
from feedline.store.dataset_files import read_manifest
from feedline.store.shard_source import BatchStream, ShardSource
from feedline.ui.progress import also
from feedline.ui.progress import bar as progress_bar

__all__ = ["preprocessor_states", "shard_source", "with_states", "write", "write_tfrecord"]

WRITE_MODES = ("overwrite", "append")


def preprocessor_states(plan: Plan) -> list[dict[str, Any]]:
    """The fitted preprocessors of ``plan`` as manifest entries (``name``, JSON ``state``).

    Examples
    --------
    >>> import feedline as fl
    >>> scaler = fl.StandardScaler("id").fit(fl.range(3))
    >>> [entry["name"] for entry in preprocessor_states(fl.range(3).transform(scaler).plan)]
    ['StandardScaler']
    """
    return [
        {"name": type(op.preprocessor).__name__, "state": op.preprocessor.state}
        for op in plan.ops
        if isinstance(op, Transform) and hasattr(op.preprocessor, "state")
    ]


def with_states(plan: Plan, entries: list[dict[str, Any]], where: str = "the dataset") -> Plan:
    """``plan`` with each preprocessor that needs fitting given the fitted state of the
    matching manifest entry (``entries``, as :func:`preprocessor_states` wrote them, in
    order): what an append applies, so the appended rows are transformed as the dataset's
    were and nothing is refit. A fitted preprocessor must carry the entry's state, and the
    preprocessors must be the entries' (same count and classes), else
    :class:`ConfigurationError`.

    Examples
    --------
    >>> import feedline as fl
    >>> fitted = fl.StandardScaler("id").fit(fl.range(3))
    >>> entries = preprocessor_states(fl.range(3).transform(fitted).plan)
    >>> plan = with_states(fl.range(5).transform(fl.StandardScaler("id")).plan, entries)
    >>> plan.ops[0].preprocessor.state == fitted.state
    True
    """
    ops: list[Any] = []
    stateful = [op for op in plan.ops if isinstance(op, Transform)]
    names = [type(op.preprocessor).__name__ for op in stateful]
    if names != [str(entry.get("name")) for entry in entries]:
        raise ConfigurationError(
            f"The preprocessors of this append ({names}) are not those of {where} "
            f"({[entry.get('name') for entry in entries]}), so its fitted state cannot be "
            "applied. Fix: append a dataset built with the same transforms, unfitted, or "
            'write with mode="overwrite".'
        )
    states = iter(entries)
    for op in plan.ops:
        if isinstance(op, Transform):
            state = next(states)["state"]
            preprocessor = op.preprocessor
            if not getattr(preprocessor, "is_fitted", True):
                op = dataclasses.replace(op, preprocessor=from_state(state))
            elif getattr(preprocessor, "state", state) != state:
                raise ConfigurationError(
                    f"The {type(preprocessor).__name__} of this append was fitted to other "
                    f"data than {where}'s; an append keeps the dataset's fitted state and "
                    "never refits. Fix: pass the preprocessor unfitted (the dataset's state "
                    'is applied), or write with mode="overwrite" to refit.'
                )
        ops.append(op)
    return Plan(plan.source, tuple(ops))


def write(
    engine: Engine,
    fitted: Callable[[], Plan],
    path: str | os.PathLike[str],
    *,
    mode: str = "overwrite",
    keep_states: Callable[[list[dict[str, Any]]], Plan] | None = None,
    rows_per_shard: int | None = None,
    bytes_per_shard: int | str | None = "256MiB",
    row_group_rows: int | None = None,
    compression: str | None = "zstd",
    preserve_order: bool = True,
    storage_options: dict[str, Any] | None = None,
    on_rows: Callable[[int], None] | None = None,
    progress: bool | None = None,
    resume: bool = False,
) -> WriteInfo:
    """Write the plan ``fitted()`` as a feedline dataset at ``path`` on ``engine``.

    ``fitted`` is called inside the progress bar of the rows written, so the fits it
    triggers follow the same ``progress`` setting; the fitted preprocessors' states go into
    the manifest. The write commits only if no other writer committed at ``path`` since
    this call began (else :class:`~feedline.errors.ConcurrentWriteError`). With
    ``mode="append"`` and a dataset at ``path``, the plan is ``keep_states(entries)`` (the
    dataset's fitted preprocessor states applied: :func:`with_states`; ``fitted()`` when
    not given) and its shards are added to the dataset as a new version. See
    :meth:`feedline.Dataset.write` for the parameters.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.engines.protocol import get_engine
    >>> info = write(get_engine(), lambda: fl.range(10).plan, tempfile.mkdtemp() + "/out")
    >>> info.rows
    10
    """
    options = WriteOptions(
        rows_per_shard=rows_per_shard,
        bytes_per_shard=parse_bytes(bytes_per_shard) if bytes_per_shard else None,
        row_group_rows=row_group_rows,
        compression=compression,
    )
    if mode not in WRITE_MODES:
        raise ConfigurationError(
            f"mode={mode!r} is not a write mode. Fix: pass one of {list(WRITE_MODES)}."
        )
    if resume and engine.name not in ("local", "spark", "ray"):
        raise ConfigurationError(
            f"resume=True is supported on the local, Spark and Ray engines; this write runs "
            f"on {engine.name!r}. Fix: drop resume=True (the write starts over), or write "
            'with engine="local".'
        )
    resuming: dict[str, Any] = {"resume": True} if resume else {}
    target = resolve(path, storage_options)
    # the version this write starts from, noted before any work: a commit by another writer
    # from now on (during the fits, the schema inference, the shards) fails this write
    base = note_base(target)
    existing = read_manifest(target) if mode == "append" and base.token is not None else None
    if existing is not None:
        base = dataclasses.replace(base, append=True)
    with progress_bar(f"write {os.fspath(path)}", progress=progress) as advance:
        if existing is not None and keep_states is not None:
            plan = keep_states(existing.preprocessors)
        else:
            plan = fitted()
        return engine.write(
            plan,
            target,
            options,
            preserve_order=preserve_order,
            on_rows=also(advance, on_rows),
            preprocessors=preprocessor_states(plan),
            base=base,
            **resuming,
        )


def write_tfrecord(
    engine: Engine,
    fitted: Callable[[], Plan],
    path: str | os.PathLike[str],
    *,
    compression: str | None = None,
    records_per_file: int | None = None,
    bytes_per_file: int | str | None = "256MiB",
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> WriteInfo:
    """Stream the rows of the plan ``fitted()`` on ``engine`` into TFRecord files at ``path``.

    See :meth:`feedline.Dataset.write_tfrecord` for the parameters and
    :mod:`feedline.io.tfrecord.writer` for the encoding.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> from feedline.engines.protocol import get_engine
    >>> write_tfrecord(get_engine(), lambda: fl.range(5).plan, tempfile.mkdtemp()).rows
    5
    """
    started = time.perf_counter()
    report = ExecutionReport()
    target = resolve(path, storage_options)
    rows, files, size = write_records(
        engine.execute(fitted(), preserve_order=True, report=report),
        target,
        compression=compression,
        records_per_file=records_per_file,
        bytes_per_file=parse_bytes(bytes_per_file) if bytes_per_file else None,
        overwrite=overwrite,
    )
    seconds = time.perf_counter() - started
    return WriteInfo(target.url, rows, len(files), size, seconds, engine.name, report.as_dict())


def shard_source(
    plan: Plan,
    schema: pa.Schema,
    batches: Callable[[Sequence[str] | None], Iterator[pa.RecordBatch]],
    name: str,
) -> ShardSource | BatchStream:
    """What a loader reads of ``plan`` (whose output schema is ``schema``).

    A written dataset or a Parquet folder read as it is (a plan of column selections at
    most) gives its :class:`~feedline.store.shard_source.ShardSource`; any other plan a
    :class:`~feedline.store.shard_source.BatchStream` of ``batches(columns)`` named ``name``
    (row count known when metadata tells).

    Examples
    --------
    >>> import feedline as fl
    >>> ds = fl.range(10).limit(4)
    >>> shard_source(ds.plan, ds.schema(), lambda names: ds.iter_batches(), "ds").num_rows
    4
    """
    as_stored = all(isinstance(op, Select) for op in plan.ops)
    if isinstance(plan.source, ParquetSource) and as_stored:
        return ShardSource.from_source(plan.source, schema.names)
    return BatchStream(
        schema, plan.known_rows(), batches, name, snapshot=plan.source.table_snapshot()
    )
