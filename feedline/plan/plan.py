"""The logical plan: an immutable chain of operators over one source.

A :class:`Plan` says *what* to compute; the engines in :mod:`feedline.engines` decide *how*.
Nothing here reads data or calls user functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard, Union

import pyarrow as pa
import pyarrow.compute as pc

from feedline.io.source import Source, fingerprint_of

__all__ = [
    "Cast",
    "Drop",
    "ExactPartials",
    "Filter",
    "Limit",
    "MapBatches",
    "Operator",
    "Plan",
    "Rename",
    "RowHash",
    "Sample",
    "Select",
    "Transform",
    "WithColumns",
    "callable_name",
    "only_selects",
    "pushdown",
]


@dataclass(frozen=True)
class Select:
    """Keep ``columns``, in that order."""

    columns: tuple[str, ...]

    def describe(self) -> str:
        return f"Select({', '.join(self.columns)})"


@dataclass(frozen=True)
class Filter:
    """Keep rows where ``predicate`` holds: a pyarrow expression or ``fn(batch) -> mask``."""

    predicate: pc.Expression | Callable[[pa.RecordBatch], Any]

    @property
    def is_expression(self) -> bool:
        return isinstance(self.predicate, pc.Expression)

    def describe(self) -> str:
        what = str(self.predicate) if self.is_expression else callable_name(self.predicate)
        return f"Filter({what})"


@dataclass(frozen=True)
class MapBatches:
    """Apply ``fn`` to batches of at most ``batch_size`` rows.

    ``fn`` may be a function or a class; a class is constructed once per worker (with
    ``fn_constructor_kwargs``, plus ``device=device`` when ``device`` is set) and its
    instances are called per batch (batch inference, see :mod:`feedline.plan.inference`).
    ``passthrough`` names input columns copied next to ``fn``'s outputs.
    """

    fn: Callable[..., Any]
    batch_size: int | None = None
    fn_kwargs: tuple[tuple[str, Any], ...] = ()
    fn_constructor_kwargs: tuple[tuple[str, Any], ...] = ()
    output_schema: pa.Schema | None = None
    concurrency: int | None = None
    device: str | None = None
    passthrough: tuple[str, ...] = ()

    @property
    def is_class(self) -> bool:
        return isinstance(self.fn, type)

    def describe(self) -> str:
        size = f", batch_size={self.batch_size}" if self.batch_size else ""
        device = f", device={self.device}" if self.device else ""
        keep = f", passthrough={list(self.passthrough)}" if self.passthrough else ""
        return f"MapBatches({callable_name(self.fn)}{size}{device}{keep})"


@dataclass(frozen=True)
class Transform:
    """Apply a fitted preprocessor (``transform_batch``) to every batch."""

    preprocessor: Any

    def describe(self) -> str:
        return f"Transform({self.preprocessor!r})"


@dataclass(frozen=True)
class Limit:
    """Keep the first ``n`` rows."""

    n: int

    def describe(self) -> str:
        return f"Limit({self.n})"


@dataclass(frozen=True)
class Sample:
    """Keep each row independently with probability ``fraction`` (deterministic for ``seed``)."""

    fraction: float
    seed: int

    def describe(self) -> str:
        return f"Sample(fraction={self.fraction}, seed={self.seed})"


@dataclass(frozen=True)
class WithColumns:
    """Add or replace columns computed by pyarrow expressions, all on the incoming batch.

    A name already present is replaced in place; new names are appended in the given order.
    """

    columns: tuple[tuple[str, pc.Expression], ...]

    def describe(self) -> str:
        return f"WithColumns({', '.join(f'{n}={e}' for n, e in self.columns)})"


@dataclass(frozen=True)
class Rename:
    """Rename columns (``old -> new`` pairs); the others keep their names and places."""

    mapping: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        return f"Rename({', '.join(f'{a}->{b}' for a, b in self.mapping)})"


@dataclass(frozen=True)
class Drop:
    """Remove ``columns``."""

    columns: tuple[str, ...]

    def describe(self) -> str:
        return f"Drop({', '.join(self.columns)})"


@dataclass(frozen=True)
class Cast:
    """Cast columns to Arrow types (``name -> type`` pairs); safe casts only."""

    types: tuple[tuple[str, pa.DataType], ...]

    def describe(self) -> str:
        return f"Cast({', '.join(f'{n}:{t}' for n, t in self.types)})"


@dataclass(frozen=True)
class RowHash:
    """Append the seeded row-content key of :mod:`feedline.plan.rowhash` (int64).

    Engines add it to the inputs of ``random_shuffle`` and ``split`` (never users).
    """

    seed: int
    column: str

    def describe(self) -> str:
        return f"RowHash(seed={self.seed})"


@dataclass(frozen=True)
class ExactPartials:
    """Append the exact partial sums of each group of ``keys`` per ``(column, with
    squares)`` (binary columns, :mod:`feedline.plan.exact_aggregates`).

    Engines add it to the input of a ``groupby().agg`` with a float ``sum`` or a
    ``mean``/``std`` (never users), so those aggregates give the same bits everywhere.
    """

    keys: tuple[str, ...]
    columns: tuple[tuple[str, bool], ...]

    def describe(self) -> str:
        return f"ExactPartials({', '.join(c for c, _ in self.columns)})"


Operator = Union[  # noqa: UP007
    Select, Filter, MapBatches, Transform, Limit, Sample, WithColumns, Rename, Drop, Cast, RowHash,
    ExactPartials,
]  # fmt: skip


def only_selects(ops: Sequence[Operator]) -> TypeGuard[Sequence[Select]]:
    """True when every operator of ``ops`` is a column selection (or there are none)."""
    return all(isinstance(op, Select) for op in ops)


@dataclass(frozen=True)
class Plan:
    """A source followed by operators, applied in order."""

    source: Source
    ops: tuple[Operator, ...] = field(default_factory=tuple)

    def then(self, op: Operator) -> Plan:
        """A new plan with ``op`` appended."""
        return replace(self, ops=(*self.ops, op))

    def describe(self) -> list[str]:
        """One line per operator, source first."""
        return [f"Read({self.source.describe()})", *(op.describe() for op in self.ops)]

    def fingerprint(self) -> str:
        """Identifies the input and the chain of operators (for caching and lineage)."""
        return fingerprint_of(self.source.fingerprint(), *self.describe())

    def known_rows(self) -> int | None:
        """The row count when metadata gives it without running anything, else ``None``.

        Examples
        --------
        >>> from feedline.io.memory import RangeSource
        >>> Plan(RangeSource(10)).then(Limit(4)).known_rows()
        4
        >>> Plan(RangeSource(10)).then(Filter(pc.field("id") > 3)).known_rows() is None
        True
        """
        if not all(isinstance(op, Select | Limit) for op in self.ops):
            return None
        rows = self.source.count_rows()
        for op in self.ops:
            if rows is not None and isinstance(op, Limit):
                rows = min(rows, op.n)
        return rows

    @property
    def has_user_functions(self) -> bool:
        return any(
            isinstance(op, MapBatches | Transform)
            or (isinstance(op, Filter) and not op.is_expression)
            for op in self.ops
        )


@dataclass(frozen=True)
class Pushdown:
    """What the source can do itself, and the operators left for the engine."""

    columns: tuple[str, ...] | None
    predicate: pc.Expression | None
    remaining: tuple[Operator, ...]


def pushdown(plan: Plan) -> Pushdown:
    """Move leading ``Select`` and expression ``Filter`` operators into the source read.

    A filter is pushed only when every column it reads is still present at that point, so
    ``select(["a"]).filter(pc.field("b") > 0)`` is left to fail with a clear message.

    Examples
    --------
    >>> from feedline.io.memory import RangeSource
    >>> p = Plan(RangeSource(10)).then(Filter(pc.field("id") > 3)).then(Limit(2))
    >>> pushed = pushdown(p)
    >>> str(pushed.predicate), len(pushed.remaining)
    ('(id > 3)', 1)
    """
    columns: tuple[str, ...] | None = None
    predicate: pc.Expression | None = None
    ops = list(plan.ops)
    while ops:
        op = ops[0]
        if isinstance(op, Select):
            if columns is not None:
                missing = [c for c in op.columns if c not in columns]
                if missing:
                    break
            columns = op.columns
        elif isinstance(op, Filter) and op.is_expression:
            available = columns if columns is not None else tuple(plan.source.schema().names)
            if not _references_only(op.predicate, available, plan.source.schema()):
                break
            predicate = op.predicate if predicate is None else (predicate & op.predicate)
        else:
            break
        ops.pop(0)
    return Pushdown(columns, predicate, tuple(ops))


def _references_only(expr: pc.Expression, columns: Sequence[str], schema: pa.Schema) -> bool:
    """True when ``expr`` can be evaluated on ``schema`` restricted to ``columns``."""
    fields = [schema.field(c) for c in columns if schema.get_field_index(c) >= 0]
    empty = pa.Table.from_batches([], schema=pa.schema(fields))
    try:
        empty.filter(expr)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError):
        return False
    return True


def callable_name(fn: Any) -> str:
    """A readable name for a function, class, method or callable object."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module not in ("__main__", "builtins") else name
