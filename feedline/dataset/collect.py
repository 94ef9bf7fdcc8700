"""A dataset's rows brought into this process: an Arrow table, a Polars frame, NumPy arrays.

What :meth:`feedline.Dataset.to_arrow`, ``to_polars`` and ``to_numpy`` run, given the engine
and the plan (its preprocessors fitted); the ``Dataset`` methods only resolve those. Filling
NumPy arrays lives in :mod:`feedline.dataset.to_numpy`, printing tables in
:mod:`feedline.dataset.display`.

Examples
--------
>>> import feedline as fl
>>> from feedline.engines.protocol import get_engine
>>> plan = fl.range(3).plan
>>> collect_table(get_engine("local"), lambda: plan)["id"].to_pylist()
[0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import pyarrow as pa

from feedline.arrow.pandas_metadata import valid_pandas_schema
from feedline.dataset import to_numpy as st
from feedline.engines.local.engine import plan_schema
from feedline.errors import ConfigurationError, MissingDependencyError
from feedline.plan.plan import Plan, Select
from feedline.ui.progress import bar as progress_bar

if TYPE_CHECKING:
    import polars

    from feedline.engines.protocol import Engine

__all__ = ["check_rows", "collect_arrays", "collect_table", "polars_frame"]


def check_rows(n: int) -> int:
    """``n`` when it is a non-negative int (the rows of ``head(n)``), else ``ConfigurationError``.

    Examples
    --------
    >>> check_rows(5)
    5
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ConfigurationError(
            f"head() needs a non-negative int, got {n!r}. Fix: pass e.g. ds.head(5)."
        )
    return n


def collect_table(
    engine: Engine, fitted: Callable[[], Plan], *, progress: bool | None = None
) -> pa.Table:
    """Run the plan ``fitted()`` on ``engine`` and collect its rows, in order, as a table.

    ``fitted`` is called inside the progress bar (a bar of the rows collected), so the fits
    it triggers follow the same ``progress`` setting. The ``pandas`` schema metadata keeps
    only what is still true of the result's columns (:mod:`feedline.arrow.pandas_metadata`).

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.engines.protocol import get_engine
    >>> collect_table(get_engine(), lambda: fl.range(0).plan).num_rows
    0
    """
    batches: list[pa.RecordBatch] = []
    with progress_bar("collect rows", progress=progress) as advance:
        plan = fitted()
        for batch in engine.execute(plan, preserve_order=True):
            batches.append(batch)
            advance(batch.num_rows)
    if batches:
        table = pa.Table.from_batches(batches)
    else:
        table = valid_pandas_schema(plan_schema(plan)).empty_table()
    return table.replace_schema_metadata(valid_pandas_schema(table.schema).metadata)


def polars_frame(table: pa.Table) -> polars.DataFrame:
    """``table`` as a Polars DataFrame; fixed-shape tensor columns become ``Array`` columns.

    Examples
    --------
    >>> polars_frame(pa.table({"a": [1, 2]}))["a"].to_list()
    [1, 2]
    """
    try:
        import polars as pl
    except ImportError as exc:
        raise MissingDependencyError("polars", "polars", "Dataset.to_polars()") from exc
    tensors = [f.name for f in table.schema if isinstance(f.type, pa.FixedShapeTensorType)]
    plain = table.drop_columns(tensors)
    frame = cast("polars.DataFrame", pl.from_arrow(plain)) if plain.num_columns else pl.DataFrame()
    if not tensors:
        return frame
    series = [
        pl.Series(name, table.column(name).combine_chunks().to_numpy_ndarray()) for name in tensors
    ]
    return frame.with_columns(series).select(table.schema.names)


def collect_arrays(
    engine: Engine,
    plan: Plan,
    columns: str | Sequence[str] | None = None,
    stack: bool = False,
    *,
    order: Literal["C", "F"] = "C",
    per_file: bool = False,
    rows: int | None = None,
) -> dict[str, np.ndarray] | np.ndarray:
    """The rows of ``plan`` (its preprocessors fitted) as NumPy arrays, run on ``engine``.

    A Parquet input read as stored on the local engine is read in parallel, each file into
    its own slice; anything else streams its batches into the same preallocated arrays
    (see :mod:`feedline.dataset.to_numpy` and :meth:`feedline.Dataset.to_numpy`).
    ``per_file=True``: one block of the first ``rows`` rows per file (:func:`fill_cube`;
    Parquet read as stored only, on any engine: the files are read here).

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.engines.protocol import get_engine
    >>> collect_arrays(get_engine(), fl.range(3).plan, stack=True).ravel().tolist()
    [0, 1, 2]
    """
    schema = valid_pandas_schema(plan_schema(plan))
    names = st.output_columns(schema, columns, stack)
    if per_file:
        inputs, check = st.per_file_inputs(plan, schema, names)
        workers = st.parallel_workers(engine)
        return st.fill_cube(
            inputs, schema, names, rows=rows, stack=stack, order=order, workers=workers, check=check
        )
    if rows is not None:
        raise ConfigurationError(
            f"to_numpy(rows={rows!r}) takes rows per file, with per_file=True. Fix: pass "
            "per_file=True, or ds.limit(n).to_numpy(...) for the first n rows of the dataset."
        )
    files = st.stored_files(plan, schema, names) if engine.name == "local" else None
    if files is not None:
        workers = st.parallel_workers(engine)
        return st.fill_from_parquet(files, schema, names, stack=stack, order=order, workers=workers)
    st.ArrayFiller(schema, names, 0, stack=stack, order=order)  # checks before running
    if names and names != schema.names:
        plan = plan.then(Select(tuple(names)))
    return st.fill_from_batches(
        engine.execute(plan, preserve_order=True),
        schema,
        names,
        stack=stack,
        order=order,
        rows=plan.known_rows(),
    )
