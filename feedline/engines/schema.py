"""The output schema of a plan, learnt from metadata or from a small sample.

Engines call :func:`infer_schema` to type their outputs (Spark's ``mapInArrow`` schema, the
writers' manifest schema for empty results) without importing :mod:`feedline.dataset.dataset`.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from feedline.engines.batch.column_edits import edit_schema
from feedline.engines.batch.fusion import BatchPipeline
from feedline.errors import ConfigurationError
from feedline.io.source import check_columns
from feedline.plan.exact_aggregates import partial_column
from feedline.plan.plan import (
    Cast,
    Drop,
    ExactPartials,
    Filter,
    Limit,
    MapBatches,
    Plan,
    Rename,
    RowHash,
    Select,
    Transform,
    WithColumns,
)
from feedline.plan.relational import RelationalSource

__all__ = ["SCHEMA_SAMPLE_ROWS", "Sampler", "infer_schema"]

#: runs a plan and returns its first batch (``None`` when it yields no rows)
Sampler = Callable[[Plan], "pa.RecordBatch | None"]

#: rows of the first input batch used to learn the output schema of user functions
SCHEMA_SAMPLE_ROWS = 16


def infer_schema(plan: Plan, sample: Sampler) -> pa.Schema:
    """The plan's output schema.

    Derived from metadata while the operators allow it; a user function without an
    ``output_schema`` is run on the first ``SCHEMA_SAMPLE_ROWS`` rows of the first
    non-empty input batch (on an empty batch when the input is empty). A later
    ``map_batches`` with an ``output_schema`` decides the schema from there on, so the
    functions before it are not run at all.

    ``sample`` runs a plan for its first rows (an engine's job: the local engine's
    :meth:`~feedline.engines.local.engine.LocalEngine.first_rows`), so this module needs no
    engine of its own.
    """
    typed = [
        i
        for i, op in enumerate(plan.ops)
        if isinstance(op, MapBatches) and op.output_schema is not None
    ]
    schema = plan.source.schema()
    skip_to = -1
    for position, op in enumerate(plan.ops):
        if position < skip_to:
            continue
        if isinstance(op, Select):
            check_columns(schema, op.columns, "the dataset")
            schema = pa.schema([schema.field(c) for c in op.columns])
        elif isinstance(op, MapBatches) and op.output_schema is not None:
            schema = op.output_schema
        elif isinstance(op, WithColumns | Rename | Drop | Cast):
            schema = edit_schema(op, schema)
        elif isinstance(op, RowHash):
            schema = schema.append(pa.field(op.column, pa.int64(), nullable=False))
        elif isinstance(op, ExactPartials):
            for column, _ in op.columns:
                schema = schema.append(pa.field(partial_column(column), pa.binary()))
        elif isinstance(op, MapBatches | Transform) or (
            isinstance(op, Filter) and not op.is_expression
        ):
            if isinstance(op, Filter):
                continue
            later = [i for i in typed if i > position]
            if later:
                skip_to = later[-1]
                continue
            return _schema_by_sampling(plan, position, schema, sample)
    return schema


def _schema_by_sampling(
    plan: Plan, position: int, schema: pa.Schema, sample_rows: Sampler
) -> pa.Schema:

    head = _on_samples(Plan(plan.source, tuple(plan.ops[:position])))
    sample = sample_rows(head.then(Limit(SCHEMA_SAMPLE_ROWS)))
    if sample is None:
        sample = schema.empty_table().to_batches() or [
            pa.RecordBatch.from_pylist([], schema=schema)
        ]
        sample = sample[0]
    rest = [op for op in plan.ops[position:] if not isinstance(op, Limit)]
    out = next(iter(BatchPipeline(rest)([sample], "the schema sample")), None)
    if out is None:
        raise ConfigurationError(
            "Cannot infer the output schema: the user function returned no rows for the "
            "sample. Fix: pass output_schema= to map_batches."
        )
    return out.schema


def _on_samples(plan: Plan) -> Plan:
    """``plan`` with every relational operator in it (sort, join, groupby...) run over the
    first ``SCHEMA_SAMPLE_ROWS`` rows of each of its inputs: rows of the same schema, without
    running the operator on all the data just to learn a user function's output types."""

    source = plan.source
    if not isinstance(source, RelationalSource):
        return plan
    inputs = [_on_samples(child).then(Limit(SCHEMA_SAMPLE_ROWS)) for child in source.inputs]
    return Plan(source.with_inputs(inputs), plan.ops)
