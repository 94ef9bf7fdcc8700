"""Which columns of a dataset are indexed labels (``StringIndexer`` output), for :func:`stats`.

An indexed column holds integer codes ``0 .. len(labels) - 1``: statistics count its
values as categories (a mean of label ids means nothing) and show each id with its label.
The indexers are found in the dataset's plan (``ds.transform(StringIndexer(...))``, also
inside a :class:`~feedline.preprocess.chain.Chain`) and in the preprocessors recorded in
an opened dataset's manifest (applied before it was written).

Examples
--------
>>> import feedline as fl, pyarrow as pa
>>> ds = fl.from_arrow(pa.table({"c": ["b", "a", "b"]})).transform(fl.StringIndexer("c"))
>>> indexed_outputs(ds), indexed_labels(ds)
(['c'], {'c': ['b', 'a']})
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from feedline.preprocess.chain import Chain
from feedline.preprocess.encoders import StringIndexer

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.engines.protocol import Engine

__all__ = ["indexed_labels", "indexed_outputs"]


def _indexers(step: Any) -> Iterator[Any]:

    if isinstance(step, Chain):
        for inner in step.steps:
            yield from _indexers(inner)
    elif isinstance(step, StringIndexer):
        yield step


def _steps(ds: Dataset, ops: Any) -> Iterator[Any]:
    """The manifest's recorded preprocessors (applied first), then the plan's."""
    if ds.manifest is not None and ds.manifest.preprocessors:
        yield from _indexers(ds.preprocessor)
    for op in ops:
        yield from _indexers(getattr(op, "preprocessor", None))


def indexed_outputs(ds: Dataset) -> list[str]:
    """The columns ``StringIndexer`` steps write (fitted or not), in order; runs nothing."""
    names: dict[str, None] = {}
    for indexer in _steps(ds, ds.plan.ops):
        names.update(dict.fromkeys(indexer.output))
    return list(names)


def indexed_labels(ds: Dataset, engine: str | Engine | None = None) -> dict[str, list[str]]:
    """Each indexed column's labels (label ``i`` has id ``i``); fits unfitted indexers (once
    per dataset: fits are cached, so after :func:`stats` ran this reads no data)."""
    out: dict[str, list[str]] = {}
    for indexer in _steps(ds, ds.fitted_plan(engine).ops):
        if indexer.is_fitted:
            for column, name in zip(indexer.columns, indexer.output, strict=True):
                out[name] = indexer.labels(column)
    return out
