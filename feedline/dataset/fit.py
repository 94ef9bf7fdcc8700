"""The data a preprocessor fits on when asked for a ``fraction``: a row-group sample if possible.

``fit(ds, fraction=f, seed=s)`` used to append ``Dataset.sample(f, s)`` to the plan, which
reads every row group and drops rows. When ``ds`` reads Parquet (or a feedline dataset)
through row-wise operators only (select, filter, map_batches, transform, sample), the plan's
source is replaced by a :class:`~feedline.io.sampling.RowGroupSample`, so only the sampled
row groups are read (see :mod:`feedline.io.sampling` for how they are chosen). Anything
else (a limit, a relational operator, a CSV or in-memory input) keeps the row-level sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from feedline.io.sampling import row_group_sample
from feedline.plan.plan import Filter, MapBatches, Plan, Sample, Select, Transform

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.engines.base import Engine

__all__ = ["fit_data"]

#: operators that act row by row, so sampling before them equals sampling after them
_ROW_WISE = (Select, Filter, MapBatches, Transform, Sample)


def fit_data(
    ds: Dataset, fraction: float | None, seed: int, engine: str | Engine | None = None
) -> Dataset:
    """The dataset to fit on: ``ds``, or a sample of about ``fraction`` of its rows.

    Unfitted preprocessors already in ``ds`` are fitted first, on all of ``ds``'s data (as
    when the pipeline runs), so the sample changes only what *this* fit sees.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(1000).write(out, rows_per_shard=500, row_group_rows=100)
    >>> sampled = fit_data(fl.open(out), 0.2, seed=0)
    >>> sampled.plan.source.kind, sampled.count()
    ('row-group sample', 200)
    >>> fit_data(fl.range(10), 0.5, seed=0).plan.ops[-1]
    Sample(fraction=0.5, seed=0)
    """
    if fraction is None or fraction == 1.0:
        return ds  # a sample of every row
    rowwise = all(isinstance(op, _ROW_WISE) for op in ds.plan.ops)
    source = None
    if rowwise and 0.0 <= fraction < 1.0:  # an invalid fraction: Dataset.sample says why
        source = row_group_sample(ds.plan.source, fraction, seed)
    if source is None:
        return ds.sample(fraction, seed)
    plan = ds._resolved_plan(engine)  # upstream preprocessors fitted on the whole data
    return type(ds)(Plan(source, plan.ops))
