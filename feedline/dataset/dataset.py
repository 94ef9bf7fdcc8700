"""The lazy :class:`Dataset`: an immutable plan with a fluent API and terminal calls."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from feedline.arrow.pandas_metadata import valid_pandas_schema
from feedline.dataset.column_methods import RelationalMethods
from feedline.dataset.conveniences import ConvenienceMethods
from feedline.dataset.outputs import OutputMethods
from feedline.engines.base import Engine, get_engine
from feedline.engines.batch.fusion import rebatch
from feedline.engines.local.engine import plan_schema
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport, Source
from feedline.plan.inference import check_model_options
from feedline.plan.plan import Filter, Limit, MapBatches, Plan, Sample, Select, Transform, pushdown
from feedline.plan.relational import RelationalSource, plan_lines
from feedline.preprocess.base import from_state
from feedline.preprocess.chain import Chain
from feedline.ui.display import describe
from feedline.ui.progress import bar as progress_bar

if TYPE_CHECKING:
    import pandas

    from feedline.preprocess.base import Preprocessor
    from feedline.store.manifest import Manifest

__all__ = ["Dataset"]

T = TypeVar("T")


class Dataset(RelationalMethods, ConvenienceMethods, OutputMethods):
    """A lazy, immutable pipeline. Every method returns a new ``Dataset``; nothing runs
    until a terminal call (``iter_batches``, ``to_arrow``, ``take``, ``count``, ``write``).

    Examples
    --------
    >>> import feedline as fl, pyarrow.compute as pc
    >>> ds = fl.range(100).filter(pc.field("id") >= 5).limit(3)
    >>> ds.to_arrow()["id"].to_pylist()
    [5, 6, 7]
    """

    def __init__(self, plan: Plan, _fits: _FitCache | None = None) -> None:
        self._plan = plan
        # Fitted preprocessors, shared with every dataset derived from this one (their
        # plans extend this plan, so a preprocessor at the same position saw the same data).
        self._fits = _fits if _fits is not None else _FitCache()

    @classmethod
    def from_source(cls, source: Source) -> Dataset:
        """A dataset reading ``source``."""
        return cls(Plan(source))

    @property
    def plan(self) -> Plan:
        """The logical plan (read-only)."""
        return self._plan

    @property
    def manifest(self) -> Manifest | None:
        """The manifest when this dataset reads a committed feedline dataset, else ``None``."""
        return getattr(self._plan.source, "manifest", None)

    @property
    def preprocessor(self) -> Preprocessor | None:
        """The fitted preprocessing stored with a written dataset, ready for serving.

        Rebuilt (with :func:`feedline.preprocess.from_state`, which runs no foreign code)
        from the manifest of the committed dataset this one reads: the preprocessor that
        ``ds.transform(p)`` fitted when the write ran, or a :class:`~feedline.Chain` of them
        when the pipeline had several. ``None`` when the dataset was never written (a lazy
        plan: write it, then ``fl.open(path).preprocessor``) or its pipeline had none. Each
        access rebuilds it: keep the result.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa, tempfile
        >>> path = tempfile.mkdtemp() + "/ds"
        >>> ds = fl.from_arrow(pa.table({"x": [1.0, 3.0]})).transform(fl.StandardScaler("x"))
        >>> _ = ds.write(path)
        >>> fl.open(path).preprocessor.transform_record({"x": 3.0})
        {'x': 1.0}
        >>> fl.range(3).preprocessor is None
        True
        """
        manifest = self.manifest
        if manifest is None or not manifest.preprocessors:
            return None

        steps = [from_state(entry.get("state")) for entry in manifest.preprocessors]
        if len(steps) == 1:
            return steps[0]

        return Chain(steps)

    def __repr__(self) -> str:

        return describe(self._plan)

    def _then(self, op: Any) -> Dataset:
        return Dataset(self._plan.then(op), self._fits)

    # ------------------------------------------------------------------ transformations

    def select(self, columns: str | Sequence[str]) -> Dataset:
        """Keep ``columns`` in the given order (pushed into the reader where possible).

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> fl.from_arrow(pa.table({"a": [1], "b": [2]})).select("b").schema().names
        ['b']
        """
        names = (columns,) if isinstance(columns, str) else tuple(columns)
        if not names or not all(isinstance(c, str) for c in names):
            raise ConfigurationError(
                f"select() needs one or more column names, got {columns!r}. Fix: pass a list of "
                "strings."
            )
        return self._then(Select(names))

    def filter(self, predicate: pc.Expression | Callable[[pa.RecordBatch], Any]) -> Dataset:
        """Keep rows where ``predicate`` holds.

        ``predicate`` is a pyarrow expression (``pc.field("x") > 0``; pushed down to the
        Parquet reader, which then skips row groups whose statistics rule it out) or a
        function ``batch -> boolean mask``.

        Examples
        --------
        >>> import feedline as fl, pyarrow.compute as pc
        >>> fl.range(10).filter(pc.field("id") >= 8).count()
        2
        >>> fl.range(10).filter(lambda b: pc.less(b["id"], 3)).count()
        3
        """
        if not isinstance(predicate, pc.Expression) and not callable(predicate):
            raise ConfigurationError(
                "filter() takes a pyarrow expression or a function, got "
                f"{type(predicate).__name__}. Fix: e.g. ds.filter(pc.field('price') > 0)."
            )
        return self._then(Filter(predicate))

    def map_batches(
        self,
        fn: Callable[..., Any],
        *,
        batch_size: int | None = None,
        fn_kwargs: Mapping[str, Any] | None = None,
        fn_constructor_kwargs: Mapping[str, Any] | None = None,
        output_schema: pa.Schema | None = None,
        concurrency: int | None = None,
        device: str | None = None,
        passthrough: Sequence[str] | None = None,
    ) -> Dataset:
        """Apply ``fn`` to batches of at most ``batch_size`` rows.

        ``fn(batch: pa.RecordBatch, **fn_kwargs)`` returns a ``RecordBatch``, ``Table``, a
        dict of column → array (NumPy arrays with more dimensions become fixed-shape tensor
        columns; torch tensors are converted on the CPU) or a pandas/polars DataFrame.
        Batches of a function are formed within each read task (file); pass
        ``output_schema`` to let ``schema()`` answer without running ``fn``.

        ``fn`` may be a class (batch inference, see :mod:`feedline.plan.inference`): it is
        constructed once per worker with ``fn_constructor_kwargs`` (plus ``device=device``
        when ``device`` is given: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``) and
        called per batch. On the local engine it runs in a stage of ``concurrency`` threads
        (default 1) overlapping with the reads, on batches of exactly ``batch_size`` rows;
        on Ray in a pool of ``concurrency`` actors; on Spark once per Python worker.
        ``passthrough`` names input columns (ids, labels) put before ``fn``'s outputs,
        which then must have one row per input row.

        Examples
        --------
        >>> import feedline as fl, pyarrow.compute as pc
        >>> ds = fl.range(4).map_batches(lambda b: {"twice": pc.multiply(b["id"], 2)})
        >>> ds.to_arrow()["twice"].to_pylist()
        [0, 2, 4, 6]
        """

        if not callable(fn):
            raise ConfigurationError(
                f"map_batches() needs a function or class, got {fn!r}. Fix: pass a callable "
                "taking a pa.RecordBatch, or a class whose instances are callable."
            )
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError(
                f"batch_size={batch_size} must be >= 1. Fix: pass a positive int or None."
            )
        if fn_constructor_kwargs and not isinstance(fn, type):
            raise ConfigurationError(
                "fn_constructor_kwargs only applies when fn is a class. Fix: drop it or pass a "
                "class."
            )
        device = check_model_options(fn, device, fn_constructor_kwargs, concurrency)
        if isinstance(passthrough, str):
            passthrough = [passthrough]
        return self._then(
            MapBatches(
                fn,
                batch_size,
                tuple(sorted((fn_kwargs or {}).items())),
                tuple(sorted((fn_constructor_kwargs or {}).items())),
                output_schema,
                concurrency,
                device,
                tuple(passthrough or ()),
            )
        )

    def transform(self, preprocessor: Preprocessor) -> Dataset:
        """Apply a preprocessor; an unfitted one is fitted when the plan first executes."""
        if not hasattr(preprocessor, "transform_batch"):
            raise ConfigurationError(
                f"transform() needs a feedline preprocessor, got {type(preprocessor).__name__}. "
                "Fix: use e.g. fl.StandardScaler(...) or map_batches for plain functions."
            )
        return self._then(Transform(preprocessor))

    def limit(self, n: int) -> Dataset:
        """Keep the first ``n`` rows (in stored order when order is preserved)."""
        if not isinstance(n, int) or n < 0:
            raise ConfigurationError(
                f"limit() needs a non-negative int, got {n!r}. Fix: pass e.g. ds.limit(100)."
            )
        return self._then(Limit(n))

    def sample(
        self, fraction: float | None = None, seed: int = 0, *, n: int | None = None
    ) -> Dataset:
        """Keep each row with probability ``fraction``, or exactly ``n`` rows (all when fewer);
        the same rows for the same ``seed``.

        ``n=`` takes the first ``n`` rows of ``random_shuffle(seed)``: rows keyed by a seeded
        hash of their content, so every engine and file layout picks the same ones.

        Examples
        --------
        >>> import feedline as fl
        >>> 800 < fl.range(10_000).sample(0.1, seed=1).count() < 1200
        True
        >>> fl.range(10_000).sample(n=7, seed=1).count()
        7
        """
        if n is not None:
            if fraction is not None or not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ConfigurationError(
                    f"sample() takes either fraction= or a non-negative int n=, got "
                    f"fraction={fraction!r}, n={n!r}. Fix: pass one, e.g. ds.sample(n=1000)."
                )
            return self.random_shuffle(seed).limit(n)
        if fraction is None or not 0.0 <= fraction <= 1.0:
            raise ConfigurationError(
                f"sample() needs 0 <= fraction <= 1, got {fraction}. Fix: pass e.g. 0.1 for 10%."
            )
        return self._then(Sample(float(fraction), int(seed)))

    # ------------------------------------------------------------------ inspection

    def schema(self) -> pa.Schema:
        """The output schema; user functions run on at most 16 rows only when needed.

        Its ``pandas`` metadata keeps only what is still true of the columns.
        """
        return valid_pandas_schema(plan_schema(self._resolved_plan()))

    def explain(self, analyze: bool = False, engine: str | Engine | None = None) -> str:
        """The plan, one operator per line, with what is pushed into the reader.

        With ``analyze=True`` the plan runs (output discarded) and the counters are shown.
        """

        lines = ["Logical plan:"]
        lines += [f"  {line}" for line in plan_lines(self._plan)]
        pushed = pushdown(self._plan)
        lines.append("Pushed into the reader:")
        lines.append(f"  columns: {list(pushed.columns) if pushed.columns else 'all'}")
        lines.append(f"  predicate: {pushed.predicate if pushed.predicate is not None else 'none'}")
        if analyze:
            report = self.analyze(engine=engine)
            lines.append("Execution:")
            lines += [f"  {k}: {v}" for k, v in report.as_dict().items() if k != "skipped"]
        return "\n".join(lines)

    def analyze(self, engine: str | Engine | None = None) -> ExecutionReport:
        """Run the plan, discard the rows, and return the execution counters."""
        report = ExecutionReport()
        for _ in self._execute(engine, preserve_order=False, report=report):
            pass
        return report

    def count(self, engine: str | Engine | None = None) -> int:
        """The number of rows (from metadata alone when the plan allows it).

        Otherwise each engine counts where the rows are (Spark's executors, Ray's tasks, the
        local engine's threads) and only the counts travel: a relational plan on Spark is not
        fetched to the driver to be counted.

        Examples
        --------
        >>> import feedline as fl
        >>> import pyarrow.compute as pc
        >>> fl.range(10).count(), fl.range(10).filter(pc.field("id") >= 4).count()
        (10, 6)
        """
        if all(isinstance(op, Select | Limit) for op in self._plan.ops):
            # a relational source types itself from its inputs: fit their preprocessors first
            relational = isinstance(self._plan.source, RelationalSource)
            plan = self._resolved_plan(engine) if relational else self._plan
            plan_schema(plan)  # validates selected columns without reading data
            total = plan.known_rows()
            if total is not None:
                return total
        return self.aggregate(_num_rows, operator.add, engine) or 0

    def aggregate(
        self,
        partial: Callable[[pa.RecordBatch], T],
        merge: Callable[[T, T], T],
        engine: str | Engine | None = None,
    ) -> T | None:
        """Merge ``partial(batch)`` over every batch of the dataset, on ``engine``.

        ``partial`` turns one batch into a partial result and ``merge`` combines two of them;
        engines merge in a fixed order, so the result is the same on every engine.
        ``None`` when the dataset has no batches. Preprocessors fit and ``fl.stats`` compute
        through this call, so they never touch an engine themselves.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(10).aggregate(lambda b: b.num_rows, lambda a, b: a + b)
        10
        """
        return get_engine(engine).aggregate(self._resolved_plan(engine), partial, merge)

    # ------------------------------------------------------------------ execution

    def _resolved_plan(self, engine: str | Engine | None = None) -> Plan:
        """The plan with unfitted preprocessors fitted on the data before them.

        Each preprocessor is fitted once for a dataset and all datasets derived from it.
        """
        ops: list[Any] = []
        for position, op in enumerate(self._plan.ops):
            if isinstance(op, Transform) and not getattr(op.preprocessor, "is_fitted", True):
                upstream = Dataset(Plan(self._plan.source, tuple(ops)), self._fits)
                op = self._fits.get(position, op, lambda o=op, u=upstream: _fit(o, u, engine))
            ops.append(op)
        source = self._plan.source
        if isinstance(source, RelationalSource):  # fit the inputs' preprocessors too
            source = source.with_inputs(
                [
                    Dataset(plan, self._fits.child(number))._resolved_plan(engine)
                    for number, plan in enumerate(source.inputs)
                ]
            )
        return Plan(source, tuple(ops))

    def _execute(
        self,
        engine: str | Engine | None,
        *,
        preserve_order: bool,
        report: ExecutionReport | None = None,
    ) -> Iterator[pa.RecordBatch]:
        return get_engine(engine).execute(
            self._resolved_plan(engine), preserve_order=preserve_order, report=report
        )

    def iter_batches(
        self,
        batch_size: int | None = None,
        *,
        preserve_order: bool = True,
        engine: str | Engine | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream the output as record batches of exactly ``batch_size`` rows (last may be
        short), or as produced when ``batch_size`` is ``None``.

        Examples
        --------
        >>> import feedline as fl
        >>> [b.num_rows for b in fl.range(10).iter_batches(4)]
        [4, 4, 2]
        """
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError(
                f"batch_size={batch_size} must be >= 1. Fix: pass a positive int or None."
            )
        stream = self._execute(engine, preserve_order=preserve_order)
        return rebatch(stream, batch_size) if batch_size else stream

    def to_arrow(
        self, engine: str | Engine | None = None, *, progress: bool | None = None
    ) -> pa.Table:
        """Run the plan and collect the result as a ``pyarrow.Table``.

        Its ``pandas`` schema metadata (from ``fl.from_pandas``) keeps only what is still
        true of the result's columns (:mod:`feedline.arrow.pandas_metadata`). ``progress``: a
        bar of the rows collected (``None``: ``fl.config.progress``).
        """
        batches: list[pa.RecordBatch] = []
        with progress_bar("collect rows", progress=progress) as advance:
            for batch in self._execute(engine, preserve_order=True):
                batches.append(batch)
                advance(batch.num_rows)
        table = pa.Table.from_batches(batches) if batches else self.schema().empty_table()
        return table.replace_schema_metadata(valid_pandas_schema(table.schema).metadata)

    def to_pandas(
        self, engine: str | Engine | None = None, *, progress: bool | None = None
    ) -> pandas.DataFrame:
        """Run the plan and collect the result as a pandas DataFrame (``progress``: as in
        :meth:`to_arrow`)."""
        return self.to_arrow(engine, progress=progress).to_pandas()

    def take(self, n: int = 20, engine: str | Engine | None = None) -> list[dict[str, Any]]:
        """The first ``n`` rows as a list of dicts (reads only what it needs)."""
        return self.limit(n).to_arrow(engine).to_pylist()


def _num_rows(batch: pa.RecordBatch) -> int:
    """A batch's partial count (for :meth:`Dataset.count`)."""
    return batch.num_rows


def _fit(op: Transform, upstream: Dataset, engine: str | Engine | None) -> Any:
    """Fit ``op``'s preprocessor on ``upstream`` with the engine that runs the plan."""
    if engine is None:
        return op.preprocessor.fit(upstream)
    return op.preprocessor.fit(upstream, engine=engine)


class _FitCache:
    """Fitted ``Transform`` operators by (position in the plan, operator identity)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._fitted: dict[tuple[int, int], tuple[Transform, Transform]] = {}
        self._children: dict[int, _FitCache] = {}

    def child(self, number: int) -> _FitCache:
        """The cache of a relational operator's input ``number`` (kept with this one)."""
        with self._lock:
            return self._children.setdefault(number, _FitCache())

    def get(self, position: int, op: Transform, fit: Callable[[], Any]) -> Transform:
        key = (position, id(op))
        with self._lock:
            if key not in self._fitted:
                # the original op is kept in the value so its id cannot be reused
                self._fitted[key] = (op, Transform(fit()))
            return self._fitted[key][1]
