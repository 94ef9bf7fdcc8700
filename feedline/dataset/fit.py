"""The fit pass: the rows a fit on a ``fraction`` reads, and the cache of fitted preprocessors.

:meth:`feedline.Dataset.aggregate` with ``fraction=`` (what ``Preprocessor.fit(ds,
fraction=f, seed=s)`` calls) reads :func:`fit_sample` of the dataset's plan, its unfitted
preprocessors fitted first. Appending ``Sample(f, s)`` to the plan would read every row group
and drop rows; when the plan reads Parquet (or a feedline dataset) through row-wise
operators only (select, filter, map_batches, transform, sample), its source is replaced by a
:class:`~feedline.store.sampling.RowGroupSample`, so only the sampled row groups are read (see
:mod:`feedline.store.sampling` for how they are chosen). Anything else (a limit, a relational
operator, a CSV or in-memory input) keeps the row-level sample.

A row-group sample is a cluster sample, so a pass over one is checked
(:func:`sampled_aggregate`): the fit's partials also carry each batch's moments of the
numeric columns it reads, and when the spread between row groups makes the fitted means
uncertain beyond 0.01 standard deviations (:mod:`feedline.statistics.cluster_sample`) the
pass is run again over more row groups (thinned to the same fraction of rows) until it is
not, with a warning that says what was measured and how to keep ``fraction=`` fast.

:class:`FitCache` keeps the preprocessors a plan's ``transform`` steps fitted, so a dataset and
every dataset derived from it fit each one once.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.dataset.plans import sample
from feedline.plan.plan import Filter, MapBatches, Plan, Sample, Select, Transform
from feedline.statistics.cluster_sample import (
    TOLERANCE,
    ClusterSpread,
    batch_moments,
    cluster_spread,
    groups_needed,
    merge_moments,
)
from feedline.store.sampling import RowGroupSample, row_group_sample

if TYPE_CHECKING:
    from feedline.engines.protocol import Engine

__all__ = ["FitCache", "checked_sample", "fit_call", "fit_sample", "sampled_aggregate"]

logger = logging.getLogger(__name__)

#: operators that act row by row, so sampling before them equals sampling after them
_ROW_WISE = (Select, Filter, MapBatches, Transform, Sample)


def fit_sample(plan: Plan, fraction: float | None, seed: int) -> Plan:
    """The plan a fit reads: ``plan``, or a sample of about ``fraction`` of its rows.

    Pass the plan with its preprocessors fitted (on all the data, as when the pipeline
    runs), so the sample changes only what the fit sees. An invalid ``fraction`` raises the
    :class:`~feedline.errors.ConfigurationError` of ``Dataset.sample``.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(1000).write(out, rows_per_shard=500, row_group_rows=100)
    >>> sampled = fit_sample(fl.open(out).plan, 0.2, seed=0)
    >>> sampled.source.kind, fl.Dataset(sampled).count()
    ('row-group sample', 200)
    >>> fit_sample(fl.range(10).plan, 0.5, seed=0).ops[-1]
    Sample(fraction=0.5, seed=0)
    """
    if fraction is None or fraction == 1.0:
        return plan  # a sample of every row
    rowwise = all(isinstance(op, _ROW_WISE) for op in plan.ops)
    source = None
    if rowwise and 0.0 <= fraction < 1.0:  # an invalid fraction: sample() says why
        source = row_group_sample(plan.source, fraction, seed)
    if source is None:
        return sample(plan, fraction, seed)
    return Plan(source, plan.ops)


def sampled_aggregate(
    engine: Engine,
    plan: Plan,
    partial: Callable[[pa.RecordBatch], Any],
    merge: Callable[[Any, Any], Any],
) -> tuple[Any, Plan]:
    """``engine.aggregate(plan, partial, merge)`` and the plan it read, checked when ``plan``
    reads a row-group sample through row-wise operators: the pass also measures the spread
    between the row groups read (per numeric column ``partial`` sees) and, while the sample
    is not representative
    (:attr:`~feedline.statistics.cluster_sample.ClusterSpread.representative`), runs again
    over the row groups :func:`~feedline.statistics.cluster_sample.groups_needed` says (the
    plan returned reads those), with a ``UserWarning`` (also logged by the ``feedline``
    logger). Every engine computes the same moments, so every engine reads the same row
    groups.

    Examples
    --------
    >>> import feedline as fl, tempfile, warnings
    >>> from feedline.engines.protocol import get_engine
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(1000).write(out, rows_per_shard=500, row_group_rows=100)
    >>> plan = fit_sample(fl.open(out).plan, 0.2, seed=0)  # 2 of 10 row groups, ids sorted
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     rows, read = sampled_aggregate(get_engine(), plan, len, lambda a, b: a + b)
    >>> "row groups differ" in str(caught[0].message)  # so it read all 10, thinned to 20%
    True
    >>> len(read.source.read_tasks(None, None))
    10
    """
    source = plan.source
    rowwise = all(isinstance(op, _ROW_WISE) for op in plan.ops)
    if not isinstance(source, RowGroupSample) or not rowwise:
        return engine.aggregate(plan, partial, merge), plan
    total = source.total_groups
    first = _groups(source)
    while True:
        groups = _groups(source)
        if groups >= total:  # every row group, rows thinned: a uniform sample of rows
            return engine.aggregate(plan, partial, merge), plan
        merged = engine.aggregate(plan, _WithMoments(partial), _MergeWithMoments(merge))
        if merged is None:
            return None, plan
        value, moments = merged
        spread = cluster_spread(moments, groups, total)
        if spread is None or spread.representative:
            return value, plan
        needed = groups_needed(spread, total)
        _warn(spread, needed, first, source.fraction, again=groups > first)
        source = source.enlarged(needed)
        plan = Plan(source, plan.ops)


def checked_sample(engine: Engine, sampled: Plan, columns: Sequence[str]) -> Plan:
    """``sampled`` (a plan over a row-group sample, or anything else) reading enough row
    groups for fits of ``columns``: one pass over the sample measures them
    (:func:`sampled_aggregate`), and the plan returned reads the row groups it settled on.
    For fits of several passes over one sample (a :class:`~feedline.Chain`).

    Examples
    --------
    >>> import feedline as fl, numpy as np, tempfile
    >>> from feedline.engines.protocol import get_engine
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> table = pa.table({"x": np.random.default_rng(0).normal(size=1000)})
    >>> _ = fl.from_arrow(table).write(out, rows_per_shard=500, row_group_rows=100)
    >>> sampled = fit_sample(fl.open(out).plan, 0.2, seed=0)
    >>> checked_sample(get_engine(), sampled, ["x"]) is sampled  # well mixed: as it was
    True
    """
    if not columns or not isinstance(sampled.source, RowGroupSample):
        return sampled
    _, read = sampled_aggregate(engine, sampled.then(Select(tuple(columns))), _rows, _add)
    return sampled if read.source is sampled.source else Plan(read.source, sampled.ops)


def _rows(batch: pa.RecordBatch) -> int:
    return batch.num_rows


def _add(a: int, b: int) -> int:
    return a + b


def _groups(source: RowGroupSample) -> int:
    return sum(len(groups) for groups in source.choice.groups.values())


def _warn(spread: ClusterSpread, needed: int, first: int, fraction: float, again: bool) -> None:
    """Warn (once per fit: a second enlargement is only logged) that the sample grows."""
    message = (
        f"fit on a sample (fraction={fraction}): the row groups differ in what is fitted "
        f"({spread.describe()}), so a few of them do not represent the data; reading "
        f"{needed} of {spread.total} row groups instead of {first} (rows thinned to the same "
        f"fraction) to keep the fitted means within {TOLERANCE} std. Fix: to keep "
        "fraction= fast, write the data in shuffled order (ds.random_shuffle(seed).write(...))"
        " or with smaller row groups; or fit on ds.sample(fraction, seed), which reads every "
        "row group."
    )
    logger.warning(message)
    if not again:
        warnings.warn(message, UserWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside feedline (the warning names the user's
    line)."""
    level, frame = 2, sys._getframe(2)
    while frame.f_globals.get("__name__", "").startswith("feedline") and frame.f_back:
        level, frame = level + 1, frame.f_back
    return level


class _WithMoments:
    """``partial(batch)`` and the batch's moments (a list, one entry per batch)."""

    def __init__(self, partial: Callable[[pa.RecordBatch], Any]) -> None:
        self.partial = partial

    def __call__(self, batch: pa.RecordBatch) -> tuple[Any, list[Any]]:
        return self.partial(batch), [batch_moments(batch)]


class _MergeWithMoments:
    """``merge`` of the partials; the moments' lists joined (neighbours pooled when long)."""

    def __init__(self, merge: Callable[[Any, Any], Any]) -> None:
        self.merge = merge

    def __call__(self, a: tuple[Any, list[Any]], b: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
        return self.merge(a[0], b[0]), merge_moments(a[1] + b[1])


def fit_call(preprocessor: Any, upstream: Any, engine: Engine) -> Callable[[], Any]:
    """The call that fits ``preprocessor`` on the dataset ``upstream`` with ``engine``.

    ``preprocessor.fit(upstream, engine=engine)``; a duck-typed preprocessor whose ``fit``
    takes no ``engine`` gets ``fit(upstream)`` (it runs its passes itself).

    Examples
    --------
    >>> import feedline as fl
    >>> from feedline.engines.protocol import get_engine
    >>> fit_call(fl.StandardScaler("id"), fl.range(3), get_engine())().fitted["mean"]
    {'id': 1.0}
    """
    fit = preprocessor.fit
    try:
        parameters = inspect.signature(fit).parameters.values()
    except (TypeError, ValueError):  # no signature to read: assume the full protocol
        return partial(fit, upstream, engine=engine)
    if any(p.name == "engine" or p.kind is p.VAR_KEYWORD for p in parameters):
        return partial(fit, upstream, engine=engine)
    return partial(fit, upstream)


class FitCache:
    """Fitted ``Transform`` operators by (position in the plan, operator identity).

    Shared by a dataset and every dataset derived from it (their plans extend its plan, so
    a preprocessor at the same position saw the same data).

    Examples
    --------
    >>> import feedline as fl
    >>> cache, op = FitCache(), Transform(fl.StandardScaler("x"))
    >>> first = cache.get(0, op, lambda: "fitted")
    >>> first.preprocessor, cache.get(0, op, lambda: "again") is first
    ('fitted', True)
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._fitted: dict[tuple[int, int], tuple[Transform, Transform]] = {}
        self._children: dict[int, FitCache] = {}

    def child(self, number: int) -> FitCache:
        """The cache of a relational operator's input ``number`` (kept with this one)."""
        with self._lock:
            return self._children.setdefault(number, FitCache())

    def get(self, position: int, op: Transform, fit: Callable[[], Any]) -> Transform:
        """The fitted operator for ``op`` at ``position``, calling ``fit`` the first time."""
        key = (position, id(op))
        with self._lock:
            if key not in self._fitted:
                # the original op is kept in the value so its id cannot be reused
                self._fitted[key] = (op, Transform(fit()))
            return self._fitted[key][1]
