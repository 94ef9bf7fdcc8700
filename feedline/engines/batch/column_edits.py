"""Column edits on record batches: ``with_columns``, ``rename``, ``drop`` and ``cast``.

The fused batch stage (:mod:`feedline.engines.batch.fusion`) applies these to every batch on every
engine; :func:`edit_schema` gives the schema they produce without reading data.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from feedline.arrow.casts import overflowed
from feedline.arrow.column_names import check_unique
from feedline.errors import DataError, SchemaError
from feedline.plan.plan import Cast, Drop, Rename, WithColumns

__all__ = ["ColumnEdit", "apply_edit", "edit_schema"]

ColumnEdit = WithColumns | Rename | Drop | Cast


def apply_edit(op: ColumnEdit, batch: pa.RecordBatch, label: str) -> pa.RecordBatch:
    """``batch`` after the column edit ``op`` (``label`` names the rows in errors).

    Examples
    --------
    >>> b = pa.record_batch({"a": [1, 2]})
    >>> apply_edit(WithColumns((("b", pc.field("a") * 10),)), b, "here").to_pydict()
    {'a': [1, 2], 'b': [10, 20]}
    >>> apply_edit(Rename((("a", "x"),)), b, "here").schema.names
    ['x']
    """
    if isinstance(op, WithColumns):
        return _with_columns(batch, op, label)
    _check(batch.schema, _named(op), label, op.describe())
    if isinstance(op, Rename):
        mapping = dict(op.mapping)
        names = [mapping.get(n, n) for n in batch.schema.names]
        check_unique(
            names,
            f"{op.describe()} on rows from {label}",
            "rename to names no other column has (or drop the column in the way first, "
            "e.g. ds.drop('s').rename({'v': 's'})).",
        )
        return batch.rename_columns(names)
    if isinstance(op, Drop):
        return batch.drop_columns(list(op.columns))
    return _cast(batch, op, label)


def edit_schema(op: ColumnEdit, schema: pa.Schema) -> pa.Schema:
    """The schema after ``op`` on rows of ``schema`` (runs the edit on zero rows).

    Examples
    --------
    >>> edit_schema(Cast((("a", pa.float32()),)), pa.schema([("a", pa.int64())])).types
    [DataType(float)]
    """
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    return apply_edit(op, empty, "the dataset's schema").schema


def _named(op: ColumnEdit) -> list[str]:
    if isinstance(op, Rename):
        return [old for old, _ in op.mapping]
    if isinstance(op, Drop):
        return list(op.columns)
    if isinstance(op, Cast):
        return [name for name, _ in op.types]
    return []


def _check(schema: pa.Schema, names: list[str], label: str, what: str) -> None:
    missing = [n for n in names if schema.get_field_index(n) < 0]
    if missing:
        raise SchemaError(
            f"{what}: column(s) {missing} are not in the rows from {label} (columns: "
            f"{schema.names}). Fix: name existing columns (check the spelling and the "
            "operators before it)."
        )


def _with_columns(batch: pa.RecordBatch, op: WithColumns, label: str) -> pa.RecordBatch:
    names = list(batch.schema.names)
    new = dict(op.columns)
    exprs = [new.pop(n) if n in new else pc.field(n) for n in names]
    names += list(new)
    exprs += list(new.values())
    plan = acero.Declaration.from_sequence(
        [
            acero.Declaration("table_source", acero.TableSourceNodeOptions(pa.table(batch))),
            acero.Declaration("project", acero.ProjectNodeOptions(exprs, names)),
        ]
    )
    try:
        table = plan.to_table(use_threads=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError) as exc:
        raise SchemaError(
            f"{op.describe()} cannot run on rows from {label} with columns "
            f"{batch.schema.names}: {exc}. Fix: use existing columns and operations valid for "
            "their types (pyarrow.compute expressions)."
        ) from exc
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def _cast(batch: pa.RecordBatch, op: Cast, label: str) -> pa.RecordBatch:
    """Cast column by column (safe casts), so an error names the column; a value that only
    fits as an infinity (``1e40`` as ``float32``) is refused too, which Arrow allows."""
    types = dict(op.types)
    columns, fields = list(batch.columns), list(batch.schema)
    for index, field in enumerate(batch.schema):
        if field.name not in types:
            continue
        target = types[field.name]
        where = f"{op.describe()}: the column {field.name!r} (rows from {label})"
        try:
            cast = batch.column(index).cast(target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise DataError(
                f"{where} cannot become {target}: {exc}. Fix: cast to a type that holds every "
                "value (e.g. a wider number type), or filter or fix the values first."
            ) from exc
        value = overflowed(batch.column(index), cast)
        if value is not None:
            raise DataError(
                f"{where} holds {value!r}, which {target} cannot hold: it would become an "
                "infinity. Fix: cast to a wider type (e.g. float64), or clip or filter the "
                "values first (ds.filter / pc.clip)."
            )
        columns[index] = cast
        fields[index] = pa.field(field.name, target, field.nullable)
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields, batch.schema.metadata))
