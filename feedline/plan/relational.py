"""Relational operators as plan sources: a sort, join, groupby... is a new plan's source.

A plan stays "one source and a linear chain of batch operators". A relational operator is
a pipeline breaker, so it wraps its input plan(s) in a :class:`RelationalSource`; each
engine executes such a source with its own native engine (the local engine with an
embedded query engine, Spark with DataFrame operations, Ray with Ray Data), then runs the
plan's remaining operators on the result as usual.

Examples
--------
>>> from feedline.io.memory import RangeSource
>>> from feedline.plan.plan import Plan
>>> schema_of = lambda plan: plan.source.schema()  # how an input plan's schema is learnt
>>> source = RelationalSource(
...     Relational("sort", (("by", ("id",)),)), (Plan(RangeSource(3)),), schema_of
... )
>>> source.schema().names
['id']
>>> source.describe()
"sort(by=('id',))"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError
from feedline.io.source import ReadTask, Source, fingerprint_of
from feedline.plan.exact_aggregates import exact_columns
from feedline.plan.plan import ExactPartials, Plan, RowHash
from feedline.plan.relational_schema import output_schema
from feedline.plan.rowhash import ROW_HASH_COLUMN

__all__ = [
    "AGG_FUNCTIONS",
    "JOIN_HOWS",
    "OPERATORS",
    "Relational",
    "RelationalSource",
    "plan_lines",
    "split_bounds",
]

#: aggregate functions of ``groupby(...).agg`` (semantics in :mod:`feedline.plan.relational_schema`)
AGG_FUNCTIONS = ("count", "sum", "mean", "min", "max", "std", "n_unique", "first", "list")
#: join types of ``join(how=...)``
JOIN_HOWS = ("inner", "left", "outer", "semi", "anti")
#: every relational operator
OPERATORS = (
    "sort", "aggregate", "join", "union", "unique", "random_shuffle", "repartition", "split",
)  # fmt: skip


@dataclass(frozen=True)
class Relational:
    """A relational operator: its name and its parameters (hashable ``(name, value)`` pairs).

    Examples
    --------
    >>> r = Relational("random_shuffle", (("seed", 3),))
    >>> r.param("seed"), r.param("missing", 0), r.describe()
    (3, 0, 'random_shuffle(seed=3)')
    """

    op: str
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str, default: Any = None) -> Any:
        """The parameter ``name``, or ``default`` when it is not set."""
        for key, value in self.params:
            if key == name:
                return value
        return default

    def describe(self) -> str:
        return f"{self.op}({', '.join(f'{k}={v!r}' for k, v in self.params)})"


class RelationalSource(Source):
    """The rows of a relational operator over input plans (``inputs[0]``: the dataset the
    method was called on; a join's right side or a union's other datasets follow).

    Engines recognise it with ``isinstance(plan.source, RelationalSource)`` and execute it
    natively: :meth:`engine_inputs` are the plans to run as inputs (with the row-hash key
    column added in the batch stage where the operator needs one) and :meth:`schema` is the
    schema to cast the result to. :meth:`read_tasks` refuses, so no engine runs it by
    accident as a plain source.
    """

    kind = "relational"

    def __init__(
        self,
        relational: Relational,
        inputs: Sequence[Plan],
        schema_of: Callable[[Plan], pa.Schema],
    ) -> None:
        if relational.op not in OPERATORS:
            raise ConfigurationError(
                f"Unknown relational operator {relational.op!r}. Fix: use one of {OPERATORS}."
            )
        self.relational = relational
        self.inputs = tuple(inputs)
        #: the schema of an input plan (injected: learning one may run a sample of it)
        self.schema_of = schema_of
        self._schema: pa.Schema | None = None
        self._input_schemas: list[pa.Schema] | None = None

    def schema(self) -> pa.Schema:
        if self._schema is None:
            self._schema = output_schema(self.relational, self.input_schemas())
        return self._schema

    def input_schemas(self) -> list[pa.Schema]:
        """The schemas of the input plans (learnt once)."""
        if self._input_schemas is None:
            self._input_schemas = [self.schema_of(plan) for plan in self.inputs]
        return self._input_schemas

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        raise ConfigurationError(
            f"{self.describe()} is a relational operator; it has no read tasks of its own. "
            "Fix: execute it with an engine (local, spark, ray) that runs relational operators "
            "(it dispatches on feedline.plan.relational.RelationalSource)."
        )

    def describe(self) -> str:
        return self.relational.describe()

    def fingerprint(self) -> str:
        return fingerprint_of(self.describe(), *(plan.fingerprint() for plan in self.inputs))

    def count_rows(self) -> int | None:
        if self.relational.op in ("sort", "random_shuffle", "repartition", "union"):
            counts = [plan.known_rows() for plan in self.inputs]
            return None if None in counts else sum(c for c in counts if c is not None)
        return None

    def with_inputs(self, inputs: Sequence[Plan]) -> RelationalSource:
        """The same operator over other input plans (e.g. with fitted preprocessors)."""
        return RelationalSource(self.relational, inputs, self.schema_of)

    def engine_inputs(self) -> tuple[Plan, ...]:
        """The input plans an engine runs: ``random_shuffle`` and ``split`` get the row key
        column ``ROW_HASH_COLUMN`` (int64) appended by the batch stage, so every engine
        computes it with the same code (:mod:`feedline.plan.rowhash`); an ``aggregate``
        with exact aggregates (a float ``sum``, a ``mean``, a ``std``) gets their partials
        (:mod:`feedline.plan.exact_aggregates`), for the same reason."""
        if self.relational.op in ("random_shuffle", "split"):
            seed = int(self.relational.param("seed", 0))
            return tuple(plan.then(RowHash(seed, ROW_HASH_COLUMN)) for plan in self.inputs)
        if self.relational.op == "aggregate":
            columns = self.exact_columns()
            if columns:
                keys = tuple(self.relational.param("keys"))
                return (self.inputs[0].then(ExactPartials(keys, columns)),)
        return self.inputs

    def exact_columns(self) -> tuple[tuple[str, bool], ...]:
        """``(column, with squares)`` of an aggregate's exact aggregates (none for other
        operators), see :func:`feedline.plan.exact_aggregates.exact_columns`."""
        if self.relational.op != "aggregate":
            return ()
        return exact_columns(self.relational.param("aggs"), self.input_schemas()[0])


def split_bounds(fractions: Sequence[float]) -> list[tuple[float, float]]:
    """The ``[lo, hi)`` rank bounds of each piece of ``split``, as fractions of a stratum.

    Row ``r`` (0-based rank by row key within its stratum of ``n`` rows) belongs to piece
    ``i`` when ``floor(lo_i * n) <= r < floor(hi_i * n)`` (IEEE double products, the same
    on every engine); the last ``hi`` is exactly 1.0, so the pieces cover every row.

    Examples
    --------
    >>> split_bounds([0.8, 0.2])
    [(0.0, 0.8), (0.8, 1.0)]
    """
    total = float(sum(fractions))
    ends = [value / total for value in accumulate(float(f) for f in fractions)]
    ends[-1] = 1.0
    return list(zip([0.0, *ends[:-1]], ends, strict=True))


def plan_lines(plan: Plan, indent: int = 0) -> list[str]:
    """``plan`` as lines for ``explain()``: the source, then each operator one step further
    in; a relational source lists its input plans below it, each marked ``input i:``.

    Examples
    --------
    >>> from feedline.io.memory import RangeSource
    >>> from feedline.plan.plan import Limit
    >>> p = Plan(RangeSource(3))
    >>> s = RelationalSource(
    ...     Relational("union"), (p, p.then(Limit(2))), lambda p: p.source.schema()
    ... )
    >>> print("\\n".join(plan_lines(Plan(s).then(Limit(1)))))
    union()
      input 0: Read(range: 3 rows)
      input 1: Read(range: 3 rows)
                 Limit(2)
      Limit(1)
    """
    pad = "  " * indent
    source = plan.source
    if isinstance(source, RelationalSource):
        lines = [pad + source.describe()]
        for number, child in enumerate(source.inputs):
            marker = f"input {number}: "
            nested = plan_lines(child, 0)
            lines.append(f"{pad}  {marker}{nested[0]}")
            lines += [f"{pad}  {' ' * len(marker)}{line}" for line in nested[1:]]
    else:
        lines = [f"{pad}Read({source.describe()})"]
    lines += [f"{pad}{'  ' * (i + 1)}{op.describe()}" for i, op in enumerate(plan.ops)]
    return lines
