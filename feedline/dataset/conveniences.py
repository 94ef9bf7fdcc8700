"""Quick looks and hand-offs of :class:`feedline.Dataset` (a mixin): ``head``, ``show``,
``to_polars``, ``to_numpy`` and the notebook view.

The work lives elsewhere: rows to NumPy in :mod:`feedline.dataset.to_numpy`, formatting in
:mod:`feedline.ui.display`. These methods only wire a dataset to them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa

from feedline.dataset import to_numpy as st
from feedline.engines.base import get_engine
from feedline.errors import ConfigurationError, MissingDependencyError
from feedline.ui.display import print_table, to_html

if TYPE_CHECKING:
    import polars
    from rich.console import Console

    from feedline.dataset.dataset import Dataset
    from feedline.engines.base import Engine
    from feedline.plan.plan import Plan

__all__ = ["ConvenienceMethods"]


class ConvenienceMethods:
    """Mixed into :class:`feedline.Dataset`; see each method."""

    _plan: Plan

    # provided by Dataset
    def limit(self, n: int) -> Dataset:
        raise NotImplementedError

    def select(self, columns: str | Sequence[str]) -> Dataset:
        raise NotImplementedError

    def schema(self) -> pa.Schema:
        raise NotImplementedError

    def to_arrow(self, engine: str | Engine | None = None) -> pa.Table:
        raise NotImplementedError

    def _execute(
        self, engine: str | Engine | None, *, preserve_order: bool, report: Any = None
    ) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def head(self, n: int = 5, engine: str | Engine | None = None) -> pa.Table:
        """The first ``n`` rows as a ``pyarrow.Table``; only what they need is read and run.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(1_000_000).head(3)["id"].to_pylist()
        [0, 1, 2]
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ConfigurationError(
                f"head() needs a non-negative int, got {n!r}. Fix: pass e.g. ds.head(5)."
            )
        return self.limit(n).to_arrow(engine)

    def show(
        self,
        n: int = 10,
        *,
        engine: str | Engine | None = None,
        console: Console | None = None,
    ) -> None:
        """Print the first ``n`` rows as a table on the console (with ``rich``).

        Each column header gives its name and type; long strings are cut, lists shortened
        and tensors summarized as ``<tensor<dtype, shape>>``. ``console`` is a
        ``rich.console.Console`` (default: a new one on stdout).

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> from rich.console import Console
        >>> console = Console(width=60, color_system=None)
        >>> fl.from_arrow(pa.table({"word": ["hi", "yo"]})).show(1, console=console)
        ┏━━━━━━━━┓
        ┃ word   ┃
        ┃ string ┃
        ┡━━━━━━━━┩
        │ hi     │
        └────────┘
        """
        table = self.head(n, engine)

        print_table(table, None, console)

    def to_polars(self, engine: str | Engine | None = None) -> polars.DataFrame:
        """Run the plan and collect the result as a Polars DataFrame.

        Fixed-shape tensor columns become Polars ``Array`` columns of the same shape.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(3).to_polars()["id"].to_list()
        [0, 1, 2]
        """
        try:
            import polars as pl
        except ImportError as exc:
            raise MissingDependencyError("polars", "polars", "Dataset.to_polars()") from exc
        table = self.to_arrow(engine)
        tensors = [f.name for f in table.schema if isinstance(f.type, pa.FixedShapeTensorType)]
        plain = table.drop_columns(tensors)
        frame = pl.from_arrow(plain) if plain.num_columns else pl.DataFrame()
        if not tensors:
            return frame
        series = [
            pl.Series(name, table.column(name).combine_chunks().to_numpy_ndarray())
            for name in tensors
        ]
        return frame.with_columns(series).select(table.schema.names)

    def to_numpy(
        self,
        columns: str | Sequence[str] | None = None,
        stack: bool = False,
        *,
        order: Literal["C", "F"] = "C",
        engine: str | Engine | None = None,
    ) -> dict[str, np.ndarray] | np.ndarray:
        """Run the plan and return its columns as NumPy arrays.

        ``stack=False``: a dict of one array per column (numeric columns 1-D, fixed-shape
        tensors ``(rows, *shape)``, other types object arrays). ``stack=True``: one
        ``(rows, C)`` array of ``columns`` (default: the numeric columns, in order), which
        must be numeric and of one dtype; ``order="F"`` makes each column contiguous.
        Float nulls become NaN; nulls in other types raise :class:`~feedline.DataError`.

        Every array is allocated once at its final size and filled straight from the Arrow
        buffers (no table concatenation). A Parquet input read as stored (column selections
        at most) is read in parallel, each file into its own slice, with row counts from the
        footers; see :mod:`feedline.dataset.to_numpy`.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> ds = fl.from_arrow(pa.table({"a": [1.0, 2.0], "b": [3.0, 4.0], "s": ["x", "y"]}))
        >>> ds.to_numpy(stack=True)
        array([[1., 3.],
               [2., 4.]])
        >>> ds.to_numpy(["s"])["s"].tolist()
        ['x', 'y']
        """

        resolved = get_engine(engine)
        schema = self.schema()
        names = st.output_columns(schema, columns, stack)
        files = st.stored_files(self._plan, schema, names) if resolved.name == "local" else None
        if files is not None:
            workers = st.parallel_workers(resolved)
            return st.fill_from_parquet(
                files, schema, names, stack=stack, order=order, workers=workers
            )
        st.ArrayFiller(schema, names, 0, stack=stack, order=order)  # checks before running
        ds = self.select(names) if names and names != schema.names else self
        return st.fill_from_batches(
            ds._execute(resolved, preserve_order=True),
            schema,
            names,
            stack=stack,
            order=order,
            rows=ds._plan.known_rows(),
        )

    def _repr_html_(self) -> str:
        """The notebook view: plan, schema table, and the row count when metadata knows it."""

        return to_html(self._plan)
