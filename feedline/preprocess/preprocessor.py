"""The preprocessor contract: mergeable partial statistics, pure vectorized transforms, JSON state.

A preprocessor is fitted in three steps that every engine can run:

1. ``partial(batch)`` computes partial statistics of one batch (in parallel, anywhere);
2. ``merge(a, b)`` combines two partials (associative and commutative);
3. ``finish(partial)`` turns the merged partial into fitted parameters (JSON-safe).

``transform_batch`` is then a pure function of a batch and the fitted parameters, and
``transform_record`` applies exactly the same code to one dict record (serving), so there
is no training/serving skew. ``state`` is a JSON-safe dict stored in the dataset manifest;
:func:`from_state` rebuilds the fitted preprocessor from it without running any code
other than feedline's own.
"""

from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from feedline.errors import ConfigurationError, DataError, FeedlineError, FormatError, SchemaError
from feedline.preprocess.state_checks import check_fitted, invalid_state, non_finite
from feedline.ui.progress import bar as progress_bar
from feedline.ui.progress import counting

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.engines.protocol import Engine

__all__ = ["Preprocessor", "from_state", "register"]

_REGISTRY: dict[str, type[Preprocessor]] = {}


def register(cls: type[Preprocessor]) -> type[Preprocessor]:
    """Class decorator: make ``cls`` rebuildable by :func:`from_state` under its class name."""
    _REGISTRY[cls.__name__] = cls
    return cls


def from_state(state: dict[str, Any]) -> Preprocessor:
    """Rebuild a fitted preprocessor from its JSON-safe ``state``.

    The registry maps class names to feedline's own classes; a state never names code
    to import, so loading one from a manifest runs nothing foreign.
    """
    if not isinstance(state, dict) or "type" not in state:
        raise FormatError(
            f"Not a preprocessor state: {str(state)[:200]!r}. Fix: pass the dict from `.state`."
        )
    kind = state["type"]
    if not isinstance(kind, str):
        raise FormatError(
            f"A saved preprocessor state has type={kind!r}, not a class name. Fix: pass the "
            "dict from `.state` unedited (re-fit and save it again)."
        )
    # importing this module ran feedline/preprocess/__init__.py, which registers the built-ins
    if kind not in _REGISTRY:
        raise FormatError(
            f"Unknown preprocessor type {kind!r} in a saved state (known: {sorted(_REGISTRY)}). "
            "Fix: import the module that defines it, or upgrade feedline."
        )
    return _REGISTRY[kind]._from_state(state)


class Preprocessor(ABC):
    """Base class of feedline preprocessors.

    Parameters
    ----------
    columns:
        The input column name(s).
    output:
        Output column name(s); by default the results replace the input columns.

    Notes
    -----
    Subclasses set ``needs_fit = False`` when they have nothing to learn (hashing,
    tokenizing, decoding), and implement ``partial``/``merge``/``finish`` otherwise.
    """

    #: False for stateless preprocessors (nothing to fit)
    needs_fit: ClassVar[bool] = True

    def __init__(
        self, columns: str | Sequence[str], output: str | Sequence[str] | None = None
    ) -> None:
        self.columns: tuple[str, ...] = (columns,) if isinstance(columns, str) else tuple(columns)
        if not self.columns or not all(isinstance(c, str) for c in self.columns):
            raise ConfigurationError(
                f"{type(self).__name__} needs one or more column names, got {columns!r}. "
                f"Fix: e.g. {type(self).__name__}('price') or {type(self).__name__}(['a', 'b'])."
            )
        if output is None:
            self.output: tuple[str, ...] = self.columns
        else:
            self.output = (output,) if isinstance(output, str) else tuple(output)
        self.fitted: dict[str, Any] | None = None

    # ------------------------------------------------------------------ fitting

    @property
    def is_fitted(self) -> bool:
        """True when ``transform_batch`` can run."""
        return not self.needs_fit or self.fitted is not None

    def partial(self, batch: pa.RecordBatch) -> Any:
        """Partial statistics of one batch (override when ``needs_fit``)."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """Combine two partials (associative, commutative)."""
        raise NotImplementedError

    def finish(self, partial: Any) -> dict[str, Any]:
        """Fitted parameters (JSON-safe) from the merged partial."""
        raise NotImplementedError

    def fit(
        self,
        ds: Dataset,
        *,
        fraction: float | None = None,
        seed: int = 0,
        engine: str | Engine | None = None,
        progress: bool | None = None,
    ) -> Preprocessor:
        """Return a fitted copy, computed on ``ds`` (or a ``fraction`` sample of it).

        Partial statistics are computed per batch in parallel and merged in a fixed order,
        so the same fit runs on any engine and gives the same state.

        With ``fraction``, a Parquet or feedline input read through row-wise operators
        (select, filter, map_batches, transform, sample) is sampled by *row group*: row
        groups are chosen from the footers' row counts by ``seed``, systematically over the
        files and their extent, until they hold ``fraction`` of the rows, and only those are
        read (rows inside are thinned to that target). Every engine reads the same ones, so
        the fitted state is the same. Other inputs (CSV, in-memory, after a ``limit`` or a
        relational operator) are read whole and sampled row by row. A row-group sample is a
        cluster sample: the fit measures the spread between the row groups it read (numeric
        columns), and when they differ so much that the fitted means are uncertain beyond
        0.01 standard deviations it reads more row groups and warns (``UserWarning``;
        :func:`feedline.dataset.fit.sampled_aggregate`). On data sorted or clustered by a
        fitted column, ``ds.sample(fraction, seed)`` (every row group read, rows drawn
        uniformly) or data written in shuffled order keep the fit fast.

        When a second pass is unavoidable: ``ds.transform(p)`` with an unfitted ``p`` fits
        it when the pipeline first runs, which is one pass over the data before ``p``
        (a full pass) and then the transform pass. Avoid it by fitting on a sample first
        (``p = p.fit(ds, fraction=0.05)``: reads ~5% of the row groups) or by passing a
        fitted state (``from_state(saved)``, or ``fl.open(path).preprocessor``); a fitted
        ``p`` inside ``ds.transform`` costs no extra pass.

        ``progress`` shows a bar of the rows fitted on (``None``: ``fl.config.progress``; on
        Spark and Ray the bar cannot count inside the workers).

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> shuffled = fl.range(1000).random_shuffle(seed=0)  # sorted ids: a poor sample
        >>> _ = shuffled.write(out, rows_per_shard=500, row_group_rows=100)
        >>> sc = fl.StandardScaler("id").fit(fl.open(out), fraction=0.2, seed=0)
        >>> sc.fitted["count"]["id"]  # 2 of the 10 row groups
        200
        """
        fitted = copy.copy(self)
        if not self.needs_fit:
            return fitted
        with progress_bar(f"fit {self!r}", progress=progress) as advance:
            merged = ds.aggregate(  # a Dataset pass: the dataset samples, fits what is upstream
                counting(self.partial, advance, engine),
                self.merge,
                engine=engine,
                fraction=fraction,
                seed=seed,
                columns=list(self.fit_columns()),
            )
        if merged is None:
            raise ConfigurationError(
                f"{type(self).__name__}({', '.join(self.columns)}) cannot be fitted: the data "
                "(or the sample) has no rows. Fix: fit on a larger fraction or check the filter."
            )
        fitted.fitted = self.finish(merged)
        return fitted

    def fit_columns(self) -> tuple[str, ...]:
        """The columns ``fit`` reads (default: the input columns)."""
        return self.columns

    def _not_fitted_error(self) -> ConfigurationError:
        """The error for using this unfitted preprocessor: it says where a fitted copy is.

        Neither ``p.fit(ds)`` nor ``ds.transform(p)`` changes ``p`` (one preprocessor may
        serve several pipelines, each fitted on its own data): ``fit`` returns a fitted copy,
        and the copy a pipeline fits when it runs is stored in the manifest of what it writes.

        Examples
        --------
        >>> from feedline.preprocess.scalers import StandardScaler
        >>> "fl.open(path).preprocessor" in str(StandardScaler("x")._not_fitted_error())
        True
        """
        return ConfigurationError(
            f"{self!r} is not fitted: p.fit(ds) returns a fitted copy and ds.transform(p) fits "
            "its own copy when the pipeline runs; neither changes p. Fix: use the fitted copy: "
            "p = p.fit(ds), or after ds.transform(p).write(path), fl.open(path).preprocessor "
            "(the fitted pipeline stored in the manifest)."
        )

    # ------------------------------------------------------------------ applying

    @abstractmethod
    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        """Transform one batch with the fitted parameters."""

    def transform_batch(
        self, batch: pa.RecordBatch, report: Any = None, where: str = "a batch"
    ) -> pa.RecordBatch:
        """Apply the preprocessor to a ``RecordBatch`` (pure and vectorized)."""
        if not self.is_fitted:
            raise self._not_fitted_error()
        missing = [c for c in self.columns if batch.schema.get_field_index(c) < 0]
        if missing:
            raise SchemaError(
                f"{type(self).__name__} needs column(s) {missing}, which are not in {where} "
                f"(columns: {batch.schema.names}). Fix: check the column names."
            )
        return self._transform(batch, report, where)

    def transform_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Apply exactly the batch code path to one record (for serving)."""
        if not isinstance(record, Mapping):
            raise ConfigurationError(
                f"{type(self).__name__}.transform_record takes one record, a dict of column -> "
                f"value; got {type(record).__name__} {str(record)[:80]}. Fix: pass e.g. "
                f"{{{self.columns[0]!r}: value}}; for many rows use transform_batch("
                "pa.RecordBatch.from_pylist(records))."
            )
        try:
            batch = pa.RecordBatch.from_pylist([dict(record)])
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise DataError(
                f"The record {str(record)[:120]} given to {type(self).__name__}.transform_record "
                f"cannot become a row ({type(exc).__name__}: {exc}). Fix: give each column one "
                "plain value (number, string, bool, None, or a list for tensors)."
            ) from exc
        out = self.transform_batch(batch, where="the record")
        rows = out.to_pylist()
        return rows[0] if rows else {}

    # ------------------------------------------------------------------ state

    def params(self) -> dict[str, Any]:
        """Constructor arguments (JSON-safe); override to add your own."""
        return {"columns": list(self.columns), "output": list(self.output)}

    def fitted_spec(self) -> dict[str, str]:
        """What ``fitted`` holds: key → kind of its per-column values (checked by
        :func:`from_state`; kinds in :data:`feedline.preprocess.state_checks.KINDS`)."""
        return {}

    def _check_fitted(self) -> None:
        """Raise :class:`FormatError` naming the field when ``fitted`` does not fit
        :meth:`fitted_spec` (override for fitted parameters that are not per column)."""
        check_fitted(self._state_owner(), self.columns, self.fitted, self.fitted_spec())

    def _state_owner(self) -> str:
        return f"{type(self).__name__}({', '.join(self.columns)})"

    @property
    def state(self) -> dict[str, Any]:
        """JSON-safe description: type, constructor parameters, fitted parameters (a copy)."""
        state = {"type": type(self).__name__, "params": self.params(), "fitted": self.fitted}
        try:
            json.dumps(state, allow_nan=False)  # fail here, not when the manifest is written
        except (TypeError, ValueError) as exc:
            where = non_finite(state) or str(exc)
            raise FormatError(
                f"The state of {self._state_owner()} is not JSON-safe: {where}. Fix: re-fit "
                "it on data with finite values (fitted statistics must be finite)."
            ) from exc
        return copy.deepcopy(state)

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> Preprocessor:
        params = state.get("params")
        if not isinstance(params, dict):
            raise invalid_state(cls.__name__, "params", params, "is not a dict of arguments")
        bad = non_finite(state)
        if bad is not None:
            raise FormatError(
                f"The saved state of {cls.__name__} holds NaN or infinity at {bad}; a fitted "
                "statistic is always finite. Fix: re-fit the preprocessor and save its state "
                "again; do not edit a saved state by hand."
            )
        try:
            obj = cls(**params)
        except FeedlineError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(
                f"Cannot rebuild {cls.__name__} from its saved state: params "
                f"{str(params)[:160]} are not valid arguments ({type(exc).__name__}: {exc}). "
                "Fix: re-fit it and save its state again."
            ) from exc
        obj.fitted = copy.deepcopy(state.get("fitted"))
        obj._check_fitted()
        return obj

    def __repr__(self) -> str:
        status = (
            "fitted"
            if self.fitted is not None
            else ("stateless" if not self.needs_fit else "unfitted")
        )
        return f"{type(self).__name__}({', '.join(self.columns)}; {status})"
