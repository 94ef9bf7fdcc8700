"""Physical batch operators, fused into one function per read task.

Every engine runs the same fused function: the local engine in its worker threads, Spark
through ``mapInArrow``, Ray through ``map_batches``. So the same plan gives the same rows
everywhere.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.arrow.column_names import check_unique
from feedline.arrow.python_columns import arrays_from_columns
from feedline.engines.batch.column_edits import apply_edit
from feedline.errors import FeedlineError, SchemaError, UserFunctionError
from feedline.io.source import ExecutionReport
from feedline.plan.exact_aggregates import add_partials
from feedline.plan.inference import add_passthrough, check_device
from feedline.plan.plan import (
    Cast,
    Drop,
    ExactPartials,
    Filter,
    Limit,
    MapBatches,
    Operator,
    Rename,
    RowHash,
    Sample,
    Select,
    Transform,
    WithColumns,
    callable_name,
)
from feedline.plan.rowhash import row_hash

__all__ = [
    "BatchPipeline",
    "InstancePool",
    "as_record_batches",
    "rebatch",
    "split_at_limits",
    "split_at_models",
]

#: the fix for a user function returning two columns of one name
_ONCE = "return each column once, under a name of its own (a dict or batch of unique names)."

Stage = Callable[[Iterator[pa.RecordBatch], str, int], Iterator[pa.RecordBatch]]


class InstancePool:
    """Builds callable classes once per worker thread (one model per worker).

    Examples
    --------
    >>> class Twice:
    ...     def __call__(self, x):
    ...         return 2 * x
    >>> pool = InstancePool()
    >>> pool.get(Twice, ()) is pool.get(Twice, ())
    True
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def get(
        self,
        cls: Callable[..., Any],
        kwargs: tuple[tuple[str, Any], ...],
        device: str | None = None,
    ) -> Any:
        """The instance of ``cls`` for this thread, built with ``kwargs`` (and ``device``)."""
        cache = getattr(self._local, "instances", None)
        if cache is None:
            cache = self._local.instances = {}
        key = (cls, hashable(kwargs), device)
        if key not in cache:
            cache[key] = construct(cls, kwargs, device)
        return cache[key]


def hashable(kwargs: tuple[tuple[str, Any], ...]) -> Any:
    """``kwargs`` as a dictionary key: itself when hashable, else its identity (the plan's
    operator keeps the same tuple for its lifetime)."""
    try:
        hash(kwargs)
    except TypeError:
        return ("id", id(kwargs))
    return kwargs


#: held while a class of ``map_batches`` is constructed: one at a time in a process
_CONSTRUCTING = threading.RLock()


def construct(
    cls: Callable[..., Any], kwargs: tuple[tuple[str, Any], ...], device: str | None = None
) -> Any:
    """``cls(**kwargs, device=device)`` (``device`` only when set, checked to exist here).

    Constructions run one at a time in a process (a lock): worker threads each build their
    own copy of a model at the same moment, and an ``__init__`` that seeds a global
    generator (``torch.manual_seed(0)``, ``np.random.seed(0)``) and then draws its weights
    would otherwise interleave its draws with another copy's, giving each worker different
    weights.

    Examples
    --------
    >>> class Seeded:
    ...     def __init__(self, seed):
    ...         np.random.seed(seed)
    ...         self.w = np.random.normal(size=3)
    >>> a, b = construct(Seeded, (("seed", 0),)), construct(Seeded, (("seed", 0),))
    >>> bool((a.w == b.w).all())
    True
    """

    if device is not None:
        check_device(device, f"by {callable_name(cls)} (process {os.getpid()})")
        kwargs = (*kwargs, ("device", device))
    try:
        with _CONSTRUCTING:
            return cls(**dict(kwargs))
    except FeedlineError:
        raise
    except Exception as exc:
        raise UserFunctionError(
            f"Constructing {callable_name(cls)}({_kwargs_text(kwargs)}) raised "
            f"{type(exc).__name__}: {exc}. The original traceback is chained above. "
            "Fix: correct the class's __init__ or its fn_constructor_kwargs."
        ) from exc


def _kwargs_text(kwargs: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs)


def rebatch(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Re-cut a stream of batches into batches of exactly ``size`` rows (the last may be short).

    Examples
    --------
    >>> b = pa.record_batch({"x": list(range(5))})
    >>> [x.num_rows for x in rebatch([b, b], 4)]
    [4, 4, 2]
    """
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = min(size - count, batch.num_rows)
            pending.append(batch.slice(0, take))
            count += take
            batch = batch.slice(take)
            if count == size:
                yield _concat(pending)
                pending, count = [], 0
    if count:
        yield _concat(pending)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def as_record_batches(result: Any, where: str) -> list[pa.RecordBatch]:
    """Turn what a user function returned into record batches.

    Accepts a ``RecordBatch``, a ``Table``, a dict of column → array (NumPy arrays with
    more than one dimension become ``arrow.fixed_shape_tensor`` columns), or a pandas
    DataFrame.
    """
    if isinstance(result, pa.RecordBatch):
        return [result]
    if isinstance(result, pa.Table):
        return result.combine_chunks().to_batches() or [
            pa.RecordBatch.from_pylist([], schema=result.schema)
        ]
    if isinstance(result, dict):
        return [_batch_from_dict(result, where)]
    if type(result).__name__ == "DataFrame" and hasattr(result, "to_arrow"):
        return as_record_batches(result.to_arrow(), where)  # polars
    if type(result).__name__ == "DataFrame":
        return [pa.RecordBatch.from_pandas(result, preserve_index=False)]
    raise UserFunctionError(
        f"{where} returned {type(result).__name__}; expected a pyarrow RecordBatch or Table, a "
        "dict of column -> array, or a pandas/polars DataFrame. Fix: return one of those."
    )


def _batch_from_dict(result: dict[Any, Any], where: str) -> pa.RecordBatch:
    """A batch from a dict of columns; ``UserFunctionError`` naming the column at fault."""

    def bad_column(name: Any, exc: Exception) -> UserFunctionError:
        return UserFunctionError(
            f"{where} returned a column {name!r} that Arrow cannot hold "
            f"({type(exc).__name__}: {exc}). Fix: return one value per row, all of one "
            "type (a 1-D list or NumPy array; an n-d NumPy array for tensors)."
        )

    def uneven(lengths: dict[Any, int]) -> UserFunctionError:
        return UserFunctionError(
            f"{where} returned columns of different lengths {lengths}; every column of a batch "
            "needs the same number of rows. Fix: return equal-length columns (one value per "
            "row), e.g. pad the short ones or wrap per-row lists in one list column."
        )

    arrays = arrays_from_columns(result, bad_column=bad_column, uneven=uneven)
    try:
        return pa.RecordBatch.from_pydict(arrays)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise UserFunctionError(
            f"{where} returned a dict that cannot become a batch ({type(exc).__name__}: "
            f"{exc}). Fix: use str column names and equal-length 1-D columns."
        ) from exc


def _mask_from(result: Any, rows: int, where: str) -> pa.Array:
    if isinstance(result, pa.ChunkedArray):
        result = result.combine_chunks()
    if not isinstance(result, pa.Array):
        values = np.asarray(result)
        if values.ndim != 1:
            raise UserFunctionError(
                f"{where} returned an array of shape {values.shape}; a filter function must "
                f"return a 1-D mask with one boolean per row ({rows}). Fix: reduce it to one "
                "value per row, e.g. mask.all(axis=1) or mask[:, 0]."
            )
        try:
            result = pa.array(values)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise UserFunctionError(
                f"{where} returned a mask Arrow cannot read ({type(exc).__name__}: {exc}). "
                "Fix: return a boolean NumPy array or pyarrow array, one value per row."
            ) from exc
    if not pa.types.is_boolean(result.type) or len(result) != rows:
        raise UserFunctionError(
            f"{where} returned {len(result)} values of type {result.type}; a filter function "
            f"must return one boolean per row ({rows}). Fix: return e.g. pc.greater(batch['x'], 0)."
        )
    return result


class BatchPipeline:
    """A chain of operators fused into one streaming function.

    Call it with the batches of one read task, the task's label (a file path, used in error
    messages) and the task's index (seeds ``Sample`` deterministically per task).
    """

    def __init__(
        self,
        ops: Sequence[Operator],
        report: ExecutionReport | None = None,
        instances: InstancePool | None = None,
    ) -> None:
        if any(isinstance(op, Limit) for op in ops):
            raise ValueError("Limit must be split off with split_at_limits() first")
        self.ops = tuple(ops)
        self.report = report or ExecutionReport()
        self.instances = instances or InstancePool()

    def __call__(
        self, batches: Iterable[pa.RecordBatch], label: str, task_index: int = 0
    ) -> Iterator[pa.RecordBatch]:
        stream: Iterator[pa.RecordBatch] = iter(batches)
        for position, op in enumerate(self.ops):
            stream = self._stage(op, stream, label, task_index, position)
        return stream

    def _stage(
        self,
        op: Operator,
        stream: Iterator[pa.RecordBatch],
        label: str,
        task_index: int,
        position: int,
    ) -> Iterator[pa.RecordBatch]:
        if isinstance(op, Select):
            return (_select(b, op.columns, label) for b in stream)
        if isinstance(op, Filter):
            return self._filter(op, stream, label)
        if isinstance(op, MapBatches):
            return self._map(op, stream, label)
        if isinstance(op, Transform):
            return self._transform(op, stream, label)
        if isinstance(op, Sample):
            return _sample(op, stream, task_index, position)
        if isinstance(op, WithColumns | Rename | Drop | Cast):
            return (apply_edit(op, b, label) for b in stream)
        if isinstance(op, RowHash):
            return (b.append_column(op.column, row_hash(b, op.seed)) for b in stream)
        if isinstance(op, ExactPartials):
            return (add_partials(b, op.keys, op.columns) for b in stream)
        raise TypeError(f"unknown operator {op!r}")

    def _filter(
        self, op: Filter, stream: Iterable[pa.RecordBatch], label: str
    ) -> Iterator[pa.RecordBatch]:
        for batch in stream:
            if op.is_expression:
                try:
                    yield batch.filter(op.predicate)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                    raise SchemaError(
                        f"The filter {op.predicate} cannot run on rows from {label} with columns "
                        f"{batch.schema.names}: {exc}. Fix: filter on existing columns."
                    ) from exc
                continue
            where = f"The filter function {callable_name(op.predicate)}"
            try:
                result = op.predicate(batch)
            except FeedlineError:
                raise
            except Exception as exc:
                raise _user_error(where, exc, label) from exc
            self.report.add(function_calls=1)
            yield batch.filter(_mask_from(result, batch.num_rows, where))

    def _map(
        self, op: MapBatches, stream: Iterable[pa.RecordBatch], label: str
    ) -> Iterator[pa.RecordBatch]:
        if op.batch_size:
            stream = rebatch(stream, op.batch_size)
        if op.is_class:
            fn = self.instances.get(op.fn, op.fn_constructor_kwargs, op.device)
        else:
            fn = op.fn
        kwargs = dict(op.fn_kwargs)
        kind = "class" if op.is_class else "function"
        where = f"The {kind} {callable_name(op.fn)} given to map_batches"
        for batch in stream:
            if batch.num_rows == 0:
                continue
            try:
                result = fn(batch, **kwargs)
            except FeedlineError:
                raise
            except Exception as exc:
                raise _user_error(where, exc, label) from exc
            self.report.add(function_calls=1)
            outputs = as_record_batches(result, where)
            if op.passthrough:
                outputs = [add_passthrough(batch, _concat(outputs), op.passthrough, where)]
            for output in outputs:
                check_unique(output.schema.names, f"{where} (on rows from {label})", _ONCE)
            yield from outputs

    def _transform(
        self, op: Transform, stream: Iterable[pa.RecordBatch], label: str
    ) -> Iterator[pa.RecordBatch]:
        for batch in stream:
            try:
                result = op.preprocessor.transform_batch(batch, report=self.report, where=label)
            except FeedlineError:
                raise
            except Exception as exc:
                raise _user_error(f"The preprocessor {op.preprocessor!r}", exc, label) from exc
            check_unique(
                result.schema.names,
                f"The preprocessor {op.preprocessor!r} (on rows from {label})",
                "give its outputs names no other column has (output=...).",
            )
            yield result


def _user_error(where: str, exc: BaseException, label: str) -> UserFunctionError:
    return UserFunctionError(
        f"{where} raised {type(exc).__name__}: {exc} — on a batch read from {label}. "
        "The original traceback is chained above. Fix: correct the function, or filter out "
        "the rows it cannot handle."
    )


def _select(batch: pa.RecordBatch, columns: tuple[str, ...], label: str) -> pa.RecordBatch:
    missing = [c for c in columns if batch.schema.get_field_index(c) < 0]
    if missing:
        raise SchemaError(
            f"select(): column(s) {missing} are not in the rows from {label} "
            f"(columns: {batch.schema.names}). Fix: select existing columns."
        )
    return batch.select(list(columns))


def _sample(
    op: Sample, stream: Iterable[pa.RecordBatch], task_index: int, position: int
) -> Iterator[pa.RecordBatch]:
    rng = np.random.default_rng([op.seed, task_index, position])
    for batch in stream:
        keep = rng.random(batch.num_rows) < op.fraction
        yield batch.filter(pa.array(keep))


def split_at_models(ops: Sequence[Operator]) -> list[tuple[Operator, ...]]:
    """Cut operators before each ``map_batches`` with a class (a model stage).

    The first group holds the operators before the first model (possibly none); every
    later group starts with a model and holds the operators up to the next one.

    Examples
    --------
    >>> class Model:
    ...     def __call__(self, batch):
    ...         return batch
    >>> [len(g) for g in split_at_models([Select(("a",)), MapBatches(Model), Select(("a",))])]
    [1, 2]
    """
    groups: list[list[Operator]] = [[]]
    for op in ops:
        if isinstance(op, MapBatches) and op.is_class:
            groups.append([op])
        else:
            groups[-1].append(op)
    return [tuple(group) for group in groups]


def split_at_limits(ops: Sequence[Operator]) -> list[tuple[tuple[Operator, ...], int | None]]:
    """Split operators into segments, each followed by an optional row limit.

    The first segment runs in parallel per read task; later segments run on the merged
    stream (after a global limit).

    Examples
    --------
    >>> split_at_limits([Select(("a",)), Limit(5), Select(("a",))])
    [((Select(columns=('a',)),), 5), ((Select(columns=('a',)),), None)]
    """
    segments: list[tuple[tuple[Operator, ...], int | None]] = []
    current: list[Operator] = []
    for op in ops:
        if isinstance(op, Limit):
            segments.append((tuple(current), op.n))
            current = []
        else:
            current.append(op)
    segments.append((tuple(current), None))
    return segments


def apply_limit(batches: Iterable[pa.RecordBatch], n: int) -> Iterator[pa.RecordBatch]:
    """The first ``n`` rows of a stream."""
    left = n
    if left <= 0:
        return
    for batch in batches:
        if batch.num_rows >= left:
            yield batch.slice(0, left)
            return
        left -= batch.num_rows
        yield batch
