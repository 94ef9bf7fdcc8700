"""``ds.groupby(keys)``: the grouped view whose ``agg`` builds the aggregate operator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feedline.dataset.plans import aggregate

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
        return type(self._dataset)(aggregate(self._dataset.plan, self.keys, aggs))
