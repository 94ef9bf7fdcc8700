"""The fit pass: the rows a fit on a ``fraction`` reads, and the cache of fitted preprocessors.

:meth:`feedline.Dataset.aggregate` with ``fraction=`` (what ``Preprocessor.fit(ds,
fraction=f, seed=s)`` calls) reads :func:`fit_sample` of the dataset's plan, its unfitted
preprocessors fitted first. Appending ``Sample(f, s)`` to the plan would read every row group
and drop rows; when the plan reads Parquet (or a feedline dataset) through row-wise
operators only (select, filter, map_batches, transform, sample), its source is replaced by a
:class:`~feedline.store.sampling.RowGroupSample`, so only the sampled row groups are read (see
:mod:`feedline.store.sampling` for how they are chosen). Anything else (a limit, a relational
operator, a CSV or in-memory input) keeps the row-level sample.

:class:`FitCache` keeps the preprocessors a plan's ``transform`` steps fitted, so a dataset and
every dataset derived from it fit each one once.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from feedline.dataset.plans import sample
from feedline.plan.plan import Filter, MapBatches, Plan, Sample, Select, Transform
from feedline.store.sampling import row_group_sample

if TYPE_CHECKING:
    from feedline.engines.protocol import Engine

__all__ = ["FitCache", "fit_call", "fit_sample"]

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
