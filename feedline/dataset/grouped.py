"""``ds.groupby(keys)``: the grouped view whose ``agg`` builds the aggregate operator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feedline.errors import ConfigurationError
from feedline.plan.relational import AGG_FUNCTIONS

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset

__all__ = ["GroupedDataset"]


class GroupedDataset:
    """A dataset grouped by key columns, waiting for :meth:`agg`."""

    def __init__(self, dataset: Dataset, keys: tuple[str, ...]) -> None:
        self._dataset = dataset
        self.keys = keys

    def __repr__(self) -> str:
        return f"GroupedDataset(keys={list(self.keys)}, {self._dataset!r})"

    def agg(self, **aggs: tuple[str, str]) -> Dataset:
        """One row per group: the key columns, then one column per ``out=(column, fn)``.

        ``fn`` is one of ``count`` (``("*", "count")`` counts rows), ``sum``, ``mean``,
        ``min``, ``max``, ``std`` (sample, ddof=1), ``n_unique``, ``first``, ``list``;
        their null handling and result types are in :mod:`feedline.plan.relational_schema`.
        Row order is unspecified (sort after it for one).

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> ds = fl.from_arrow(pa.table({"k": [1, 1, 2], "x": [1.0, 3.0, None]}))
        >>> out = ds.groupby("k").agg(mean=("x", "mean"), n=("x", "count")).sort("k")
        >>> out.to_arrow().to_pydict()
        {'k': [1, 2], 'mean': [2.0, None], 'n': [2, 0]}
        """
        specs = []
        for out, spec in aggs.items():
            ok = isinstance(spec, tuple) and len(spec) == 2 and spec[1] in AGG_FUNCTIONS
            if not ok or not isinstance(spec[0], str) or (spec[0] == "*" and spec[1] != "count"):
                raise ConfigurationError(
                    f"agg(): {out}={spec!r} must be (column, fn) with fn in "
                    f"{list(AGG_FUNCTIONS)} (column '*' only with 'count'). "
                    "Fix: e.g. agg(total=('price', 'sum'), rows=('*', 'count'))."
                )
            specs.append((out, None if spec[0] == "*" else spec[0], spec[1]))
        if not specs:
            raise ConfigurationError(
                "agg() needs at least one aggregate. Fix: e.g. agg(rows=('*', 'count'))."
            )
        return self._dataset._relational("aggregate", {"keys": self.keys, "aggs": tuple(specs)})
