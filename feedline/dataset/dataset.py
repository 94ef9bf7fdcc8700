"""The lazy :class:`Dataset`: an immutable plan with a fluent API and terminal calls.

One class, thin methods: each builds or runs a plan through the module for its role
(:mod:`feedline.dataset.plans` builds plans, :mod:`feedline.dataset.collect` brings rows into
this process, :mod:`feedline.dataset.outputs` writes them out, :mod:`feedline.dataset.fit`
holds the fit pass) and wraps a new plan into a new ``Dataset``. A terminal call resolves its
``engine=`` once and hands the :class:`~feedline.engines.protocol.Engine` down.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.arrow.pandas_metadata import valid_pandas_schema
from feedline.dataset import collect, outputs, plans, table_outputs
from feedline.dataset.display import describe, print_table, to_html
from feedline.dataset.fit import (
    FitCache,
    checked_sample,
    fit_call,
    fit_sample,
    sampled_aggregate,
)
from feedline.dataset.grouped import GroupedDataset
from feedline.engines.batch.fusion import rebatch
from feedline.engines.local.engine import plan_schema
from feedline.engines.protocol import Engine, WriteInfo, get_engine
from feedline.engines.ray.bridge import streaming_split, to_ray
from feedline.engines.spark.bridge import to_spark
from feedline.errors import ConfigurationError
from feedline.io.source import ExecutionReport, Source
from feedline.loader.loader import Loader
from feedline.loader.options import options_signature
from feedline.plan.plan import Limit, Plan, Select, Transform, pushdown
from feedline.plan.relational import RelationalSource, plan_lines
from feedline.preprocess.chain import Chain
from feedline.preprocess.preprocessor import from_state
from feedline.statistics.compute import store_stats
from feedline.store.dataset_files import open_source
from feedline.store.shard_source import BatchStream, ShardSource
from feedline.ui.inert_text import inert

if TYPE_CHECKING:
    import pandas
    import polars
    import pyspark.sql
    import ray.data
    from pyspark.sql import SparkSession
    from rich.console import Console

    from feedline.preprocess.preprocessor import Preprocessor
    from feedline.store.manifest import Manifest

__all__ = ["Dataset"]

T = TypeVar("T")


class Dataset:
    """A lazy, immutable pipeline. Every method returns a new ``Dataset``; nothing runs
    until a terminal call (``iter_batches``, ``to_arrow``, ``take``, ``count``, ``write``).

    Examples
    --------
    >>> import feedline as fl, pyarrow.compute as pc
    >>> ds = fl.range(100).filter(pc.field("id") >= 5).limit(3)
    >>> ds.to_arrow()["id"].to_pylist()
    [5, 6, 7]
    """

    def __init__(self, plan: Plan, _fits: FitCache | None = None) -> None:
        self._plan = plan
        # Fitted preprocessors, shared with every dataset derived from this one (their
        # plans extend this plan, so a preprocessor at the same position saw the same data).
        self._fits = _fits if _fits is not None else FitCache()

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
        # from_state says what is wrong with an entry that holds no state dict
        states = [cast("dict[str, Any]", entry.get("state")) for entry in manifest.preprocessors]
        steps = [from_state(state) for state in states]
        return steps[0] if len(steps) == 1 else Chain(steps)

    def __repr__(self) -> str:
        return describe(self._plan)

    def _repr_html_(self) -> str:
        """The notebook view: plan, schema table, and the row count when metadata knows it."""
        return to_html(self._plan)

    def _derived(self, plan: Plan) -> Dataset:
        """A dataset of ``plan``, which extends this one's: it shares the fitted preprocessors."""
        return Dataset(plan, self._fits)

    # ------------------------------------------------------------------ transformations

    def select(self, columns: str | Sequence[str]) -> Dataset:
        """Keep ``columns`` in the given order (pushed into the reader where possible).

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> fl.from_arrow(pa.table({"a": [1], "b": [2]})).select("b").schema().names
        ['b']
        """
        return self._derived(plans.select(self._plan, columns))

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
        return self._derived(plans.filter_rows(self._plan, predicate))

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
        return self._derived(
            plans.map_batches(
                self._plan,
                fn,
                batch_size=batch_size,
                fn_kwargs=fn_kwargs,
                fn_constructor_kwargs=fn_constructor_kwargs,
                output_schema=output_schema,
                concurrency=concurrency,
                device=device,
                passthrough=passthrough,
            )
        )

    def transform(self, preprocessor: Preprocessor) -> Dataset:
        """Apply a preprocessor; an unfitted one is fitted when the plan first executes."""
        return self._derived(plans.transform(self._plan, preprocessor))

    def limit(self, n: int) -> Dataset:
        """Keep the first ``n`` rows (in stored order when order is preserved)."""
        return self._derived(plans.limit(self._plan, n))

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
            plans.check_sample_n(fraction, n)
            return self.random_shuffle(seed).limit(n)
        return self._derived(plans.sample(self._plan, fraction, seed))

    # ------------------------------------------------------------------ relational

    def sort(
        self,
        by: str | Sequence[str],
        descending: bool | Sequence[bool] = False,
        nulls_last: bool = True,
    ) -> Dataset:
        """Rows ordered by the columns ``by`` (the first decides, later ones break ties).

        ``descending`` is one flag or one per column; nulls go last (``nulls_last=False``:
        first); NaN sorts above every number. Rows equal on every key come in an
        unspecified order. Runs out of core: larger-than-memory inputs spill to disk.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> ds = fl.from_arrow(pa.table({"k": [2, None, 1], "v": ["b", "n", "a"]}))
        >>> ds.sort("k").to_arrow()["v"].to_pylist()
        ['a', 'b', 'n']
        >>> ds.sort(["k"], descending=True, nulls_last=False).to_arrow()["k"].to_pylist()
        [None, 2, 1]
        """
        return Dataset(plans.sort(self._plan, by, descending, nulls_last))

    def groupby(self, keys: str | Sequence[str]) -> GroupedDataset:
        """Group rows by ``keys`` (null is a key of its own); aggregate with ``.agg(...)``.

        ``keys=[]`` aggregates the whole dataset into one row. See
        :meth:`feedline.dataset.grouped.GroupedDataset.agg` for the functions.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> ds = fl.from_arrow(pa.table({"k": ["a", "b", "a"], "x": [1, 2, 3]}))
        >>> out = ds.groupby("k").agg(n=("*", "count"), total=("x", "sum")).sort("k")
        >>> out.to_arrow().to_pydict()
        {'k': ['a', 'b'], 'n': [2, 1], 'total': [4, 2]}
        """
        return GroupedDataset(self, plans.group_keys(keys))

    def join(
        self,
        other: Dataset,
        on: str | Sequence[str],
        how: str = "inner",
        suffix: str = "_right",
    ) -> Dataset:
        """Rows of this dataset matched with rows of ``other`` on equal ``on`` columns.

        ``how``: ``"inner"`` (matching pairs), ``"left"`` (every left row, nulls where
        nothing matches), ``"outer"`` (every row of both), ``"semi"`` (left rows with a
        match, left columns only), ``"anti"`` (left rows without one). The key columns
        appear once (an outer join fills them from either side); right columns whose
        names are taken get ``suffix``. Null keys never match. Row order is unspecified.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> left = fl.from_arrow(pa.table({"id": [1, 2], "x": ["a", "b"]}))
        >>> right = fl.from_arrow(pa.table({"id": [2, 3], "x": ["B", "C"]}))
        >>> left.join(right, on="id").to_arrow().to_pydict()
        {'id': [2], 'x': ['b'], 'x_right': ['B']}
        >>> left.join(right, on="id", how="anti").to_arrow()["id"].to_pylist()
        [1]
        """
        return Dataset(plans.join(self._plan, other, on, how, suffix))

    def union(self, *others: Dataset) -> Dataset:
        """All rows of this dataset and of ``others`` (duplicates kept, order unspecified).

        Every dataset needs the same column names and types (in any order); the result has
        this dataset's column order.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(2).union(fl.range(3)).count()
        5
        """
        return Dataset(plans.union(self._plan, others))

    def unique(self, subset: str | Sequence[str] | None = None) -> Dataset:
        """Distinct rows; with ``subset``, one row per distinct value of those columns
        (which row of each is unspecified). Nulls count as equal to each other.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> ds = fl.from_arrow(pa.table({"a": [1, 1, 2], "b": [0, 0, 5]}))
        >>> ds.unique().count(), ds.unique("a").count()
        (2, 2)
        """
        return Dataset(plans.unique(self._plan, subset))

    def random_shuffle(self, seed: int = 0) -> Dataset:
        """The rows in a random order that depends only on ``seed`` and the rows' content.

        Each row is keyed by a seeded 64-bit hash of its values
        (:mod:`feedline.plan.rowhash`) and the rows are sorted by it, so every engine,
        batching and file layout gives the same order; identical rows are interchangeable.

        Examples
        --------
        >>> import feedline as fl
        >>> a = fl.range(6).random_shuffle(seed=1).to_arrow()["id"].to_pylist()
        >>> sorted(a), a == fl.range(6).random_shuffle(seed=1).to_arrow()["id"].to_pylist()
        ([0, 1, 2, 3, 4, 5], True)
        """
        return Dataset(plans.random_shuffle(self._plan, seed))

    def repartition(self, n: int) -> Dataset:
        """The same rows cut into ``n`` partitions of near-equal size (the local engine
        yields ``n`` batches; Spark and Ray ``n`` partitions/blocks), order unspecified.

        Examples
        --------
        >>> import feedline as fl
        >>> [b.num_rows for b in fl.range(10).repartition(3).iter_batches()]
        [4, 3, 3]
        """
        return Dataset(plans.repartition(self._plan, n))

    def split(
        self,
        fractions: Sequence[float] | int,
        seed: int = 0,
        stratify: str | None = None,
    ) -> list[Dataset]:
        """Disjoint datasets that together hold every row exactly once.

        ``fractions`` (numbers in ``(0, 1]`` summing to 1, or an int ``n`` for ``n`` equal
        parts; anything else is a ``ConfigurationError``) are cut by rank of a seeded
        row-content key (see :meth:`random_shuffle`): of ``n`` rows, piece ``i`` gets the
        ranks ``floor(c_(i-1) * n) <= r < floor(c_i * n)`` with ``c`` the cumulative
        fractions, so sizes are exact and the partition is the same on every engine and file
        layout. ``stratify`` names a column whose every value (null included) is cut
        separately, keeping its proportions in every piece: the pieces' sizes stay exactly
        the unstratified ones, and each stratum gets its share of each piece rounded up or
        down (:mod:`feedline.plan.split_sizes`).

        Examples
        --------
        >>> import feedline as fl
        >>> parts = fl.range(10).split([0.5, 0.3, 0.2], seed=0)
        >>> [p.count() for p in parts]
        [5, 3, 2]
        """
        return [Dataset(plan) for plan in plans.split(self._plan, fractions, seed, stratify)]

    def train_test_split(
        self, test_size: float, seed: int = 0, stratify: str | None = None
    ) -> tuple[Dataset, Dataset]:
        """``(train, test)``: ``split([1 - test_size, test_size], seed, stratify)``.

        Examples
        --------
        >>> import feedline as fl
        >>> train, test = fl.range(100).train_test_split(test_size=0.25, seed=0)
        >>> train.count(), test.count()
        (75, 25)
        """
        train, test = self.split(plans.train_test_fractions(test_size), seed, stratify)
        return train, test

    # ------------------------------------------------------------------ column edits

    def with_columns(
        self, columns: Mapping[str, pc.Expression] | None = None, /, **named: pc.Expression
    ) -> Dataset:
        """Add or replace columns computed by pyarrow expressions (all on the input rows).

        Examples
        --------
        >>> import feedline as fl, pyarrow.compute as pc
        >>> ds = fl.range(3).with_columns(double=pc.field("id") * 2)
        >>> ds.schema().names, ds.to_arrow()["double"].to_pylist()
        (['id', 'double'], [0, 2, 4])
        """
        return self._derived(plans.with_columns(self._plan, columns, named))

    def rename(self, mapping: Mapping[str, str]) -> Dataset:
        """Rename columns (``{"old": "new"}``); the others keep their names and places.

        A new name that another column has (or two columns renamed to one name) raises
        ``SchemaError``: a dataset names each column once.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(1).rename({"id": "row"}).schema().names
        ['row']
        """
        return self._derived(plans.rename(self._plan, mapping))

    def drop(self, columns: str | Sequence[str]) -> Dataset:
        """Remove ``columns``.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> fl.from_arrow(pa.table({"a": [1], "b": [2]})).drop("a").schema().names
        ['b']
        """
        return self._derived(plans.drop(self._plan, columns))

    def cast(self, types: Mapping[str, pa.DataType | str]) -> Dataset:
        """Cast columns to Arrow types (``{"x": pa.float32()}`` or ``{"x": "float32"}``);
        a value the new type cannot hold raises ``DataError`` naming the column and the value:
        an integer out of range, a truncated float or timestamp, and a finite float too large
        for a narrower float type (``1e40`` as ``float32``; infinities and NaN stay as they are).

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(2).cast({"id": "float32"}).schema().field("id").type
        DataType(float)
        """
        return self._derived(plans.cast(self._plan, types))

    # ------------------------------------------------------------------ inspection

    def schema(self) -> pa.Schema:
        """The output schema; user functions run on at most 16 rows only when needed.

        Its ``pandas`` metadata keeps only what is still true of the columns.
        """
        return valid_pandas_schema(plan_schema(self.fitted_plan()))

    def fitted_plan(self, engine: str | Engine | None = None) -> Plan:
        """The plan with its unfitted preprocessors fitted on the data before them: what an
        engine runs.

        Each preprocessor is fitted once (on ``engine``) for a dataset and all datasets
        derived from it; later calls reuse the fitted copies and read nothing. Statistics and
        the engines' bridges (``to_spark``) take the plan to run from here.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> ds = fl.from_arrow(pa.table({"x": [1.0, 3.0]})).transform(fl.StandardScaler("x"))
        >>> ds.plan.ops[0].preprocessor.is_fitted, ds.fitted_plan().ops[0].preprocessor.is_fitted
        (False, True)
        """
        return self._fitted_plan(get_engine(engine))

    def _fitted_plan(self, engine: Engine) -> Plan:
        ops: list[Any] = []
        for position, op in enumerate(self._plan.ops):
            if isinstance(op, Transform) and not getattr(op.preprocessor, "is_fitted", True):
                upstream = Dataset(Plan(self._plan.source, tuple(ops)), self._fits)
                op = self._fits.get(position, op, fit_call(op.preprocessor, upstream, engine))
            ops.append(op)
        source = self._plan.source
        if isinstance(source, RelationalSource):  # fit the inputs' preprocessors too
            source = source.with_inputs(
                [
                    Dataset(plan, self._fits.child(number))._fitted_plan(engine)
                    for number, plan in enumerate(source.inputs)
                ]
            )
        return Plan(source, tuple(ops))

    def explain(self, analyze: bool = False, engine: str | Engine | None = None) -> str:
        """The plan, one operator per line, with what is pushed into the reader (control
        and bidi characters in names shown as escapes).

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
        return "\n".join(inert(line) for line in lines)  # names from data: shown inert

    def analyze(self, engine: str | Engine | None = None) -> ExecutionReport:
        """Run the plan, discard the rows, and return the execution counters."""
        report = ExecutionReport()
        for _ in self._execute(get_engine(engine), preserve_order=False, report=report):
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
            plan = self._plan
            if isinstance(plan.source, RelationalSource):
                # a relational source types itself from its inputs: fit their preprocessors
                engine = get_engine(engine)  # resolved once: aggregate below passes it on
                plan = self._fitted_plan(engine)
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
        *,
        fraction: float | None = None,
        seed: int = 0,
        columns: Sequence[str] | None = None,
    ) -> T | None:
        """Merge ``partial(batch)`` over every batch of the dataset, on ``engine``.

        ``partial`` turns one batch into a partial result and ``merge`` combines two of them;
        engines merge in a fixed order, so the result is the same on every engine.
        ``None`` when the dataset has no batches. Preprocessors fit and ``fl.stats`` compute
        through this call, so they never touch an engine themselves.

        ``fraction`` reads a sample of about that share of the rows, the same for the same
        ``seed`` on every engine: the chosen row groups only, for a Parquet or feedline input
        read through row-wise operators (select, filter, map_batches, transform, sample);
        otherwise ``sample(fraction, seed)`` (see :mod:`feedline.dataset.fit`). Unfitted
        preprocessors in the dataset are fitted first, on all of its data. ``columns``
        selects the columns ``partial`` sees (after the sample).

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> fl.range(10).aggregate(lambda b: b.num_rows, lambda a, b: a + b)
        10
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> shuffled = fl.range(1000).random_shuffle(seed=0)  # ids in no order: well mixed
        >>> _ = shuffled.write(out, rows_per_shard=500, row_group_rows=100)
        >>> fl.open(out).aggregate(len, lambda a, b: a + b, fraction=0.2, columns=["id"])
        200
        """
        if fraction is not None:
            plans.check_fraction(fraction)  # before any preprocessor is fitted
        resolved = get_engine(engine)
        plan = fit_sample(self._fitted_plan(resolved), fraction, seed)
        if columns is not None:
            plan = plan.then(Select(plans.names_of(columns, "aggregate(columns=...)")))
        if fraction is None:
            return resolved.aggregate(plan, partial, merge)
        return sampled_aggregate(resolved, plan, partial, merge)[0]  # checked: see fit.py

    def fit_sample(
        self,
        fraction: float | None,
        seed: int = 0,
        *,
        engine: str | Engine | None = None,
        columns: Sequence[str] | None = None,
    ) -> Dataset:
        """The rows a fit on ``fraction`` reads, as a dataset: what ``aggregate(...,
        fraction=fraction, seed=seed)`` reads, for fits of several passes over one sample
        (a :class:`~feedline.Chain` fits each step on the sample and the steps before it).

        A Parquet or feedline input read through row-wise operators gives a row-group sample
        (only the chosen row groups are read; unfitted preprocessors in this dataset are
        fitted first, on ``engine`` and all of its data); anything else
        ``sample(fraction, seed)``. ``fraction`` ``None`` or ``1``: this dataset. With
        ``columns`` (those the fits read), a row-group sample is checked on them as a fit's
        is, in one pass, and grows to more row groups when they differ too much
        (:func:`feedline.dataset.fit.checked_sample`).

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.range(1000).write(out, rows_per_shard=500, row_group_rows=100)
        >>> sampled = fl.open(out).fit_sample(0.2, seed=0)
        >>> sampled.plan.source.kind, sampled.count()
        ('row-group sample', 200)
        >>> fl.range(10).fit_sample(0.5).plan.ops[-1]
        Sample(fraction=0.5, seed=0)
        """
        sampled = fit_sample(self._plan, fraction, seed)
        if sampled is self._plan:
            return self
        if sampled.source is self._plan.source:  # a row sample appended: derived from this
            return self._derived(sampled)
        resolved = get_engine(engine)
        plan = Plan(sampled.source, self.fitted_plan(resolved).ops)
        return Dataset(checked_sample(resolved, plan, columns or ()))

    # ------------------------------------------------------------------ execution

    def _execute(
        self, engine: Engine, *, preserve_order: bool, report: ExecutionReport | None = None
    ) -> Iterator[pa.RecordBatch]:
        return engine.execute(
            self._fitted_plan(engine), preserve_order=preserve_order, report=report
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
        stream = self._execute(get_engine(engine), preserve_order=preserve_order)
        return rebatch(stream, batch_size) if batch_size else stream

    def to_arrow(
        self, engine: str | Engine | None = None, *, progress: bool | None = None
    ) -> pa.Table:
        """Run the plan and collect the result as a ``pyarrow.Table``.

        Its ``pandas`` schema metadata (from ``fl.from_pandas``) keeps only what is still
        true of the result's columns (:mod:`feedline.arrow.pandas_metadata`). ``progress``: a
        bar of the rows collected (``None``: ``fl.config.progress``).
        """
        resolved = get_engine(engine)
        return collect.collect_table(
            resolved, lambda: self._fitted_plan(resolved), progress=progress
        )

    def to_pandas(
        self, engine: str | Engine | None = None, *, progress: bool | None = None
    ) -> pandas.DataFrame:
        """Run the plan and collect the result as a pandas DataFrame (``progress``: as in
        :meth:`to_arrow`)."""
        return self.to_arrow(engine, progress=progress).to_pandas()

    def take(self, n: int = 20, engine: str | Engine | None = None) -> list[dict[str, Any]]:
        """The first ``n`` rows as a list of dicts (reads only what it needs)."""
        return self.limit(n).to_arrow(engine).to_pylist()

    # ------------------------------------------------------------------ quick looks

    def head(self, n: int = 5, engine: str | Engine | None = None) -> pa.Table:
        """The first ``n`` rows as a ``pyarrow.Table``; only what they need is read and run.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(1_000_000).head(3)["id"].to_pylist()
        [0, 1, 2]
        """
        return self.limit(collect.check_rows(n)).to_arrow(engine)

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
        print_table(self.head(n, engine), None, console)

    def to_polars(self, engine: str | Engine | None = None) -> polars.DataFrame:
        """Run the plan and collect the result as a Polars DataFrame.

        Fixed-shape tensor columns become Polars ``Array`` columns of the same shape.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(3).to_polars()["id"].to_list()
        [0, 1, 2]
        """
        return collect.polars_frame(self.to_arrow(engine))

    def to_numpy(
        self,
        columns: str | Sequence[str] | None = None,
        stack: bool = False,
        *,
        order: Literal["C", "F"] = "C",
        engine: str | Engine | None = None,
        per_file: bool = False,
        rows: int | None = None,
    ) -> dict[str, np.ndarray] | np.ndarray:
        """Run the plan and return its columns as NumPy arrays.

        ``stack=False``: a dict of one array per column (numeric columns 1-D, fixed-shape
        tensors ``(rows, *shape)``, other types object arrays). ``stack=True``: one
        ``(rows, C)`` array of ``columns`` (default: the numeric columns, in order), which
        must be numeric; mixed dtypes are promoted to their ``numpy.result_type`` (``int64``
        with ``float64``: ``float64``). ``order="F"`` makes each column contiguous (one
        copy per column; C order transposes as it copies, which has been measured 5-8x
        slower on some machines). Float nulls become NaN (in a
        float stack, nulls of any column do); nulls in other types raise
        :class:`~feedline.DataError`.

        ``per_file=True`` gives one block per input file: with ``stack=True`` a
        ``(files, rows, C)`` cube of each file's first ``rows`` rows (``rows=None``: all of
        them, the same number in every file), ``cube[f]`` column-major with ``order="F"``;
        with ``stack=False`` a dict of ``(files, rows)`` arrays. Only the row groups (and
        pages) holding those rows are read. It needs a Parquet input read as stored
        (``fl.read_parquet``, ``fl.open``; column selections at most).

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
        plan = self._fitted_plan(resolved)
        return collect.collect_arrays(
            resolved, plan, columns, stack, order=order, per_file=per_file, rows=rows
        )

    # ------------------------------------------------------------------ outputs

    def write(
        self,
        path: str | os.PathLike[str],
        *,
        mode: str = "overwrite",
        engine: str | Engine | None = None,
        rows_per_shard: int | None = None,
        bytes_per_shard: int | str | None = "256MiB",
        row_group_rows: int | None = None,
        compression: str | None = "zstd",
        preserve_order: bool = True,
        storage_options: dict[str, Any] | None = None,
        on_rows: Callable[[int], None] | None = None,
        stats: bool = False,
        progress: bool | None = None,
        resume: bool = False,
    ) -> WriteInfo:
        """Materialize the dataset as a feedline dataset (shards + manifest) at ``path``.

        Each write commits a new version of the dataset at ``path``
        (:func:`feedline.history`). ``mode="overwrite"`` (the default) replaces the data;
        the older versions stay readable (``fl.open(path, version=N)``) until
        :func:`feedline.vacuum` drops them. ``mode="append"`` adds these rows to the
        current version's: the columns and types must be the dataset's (else
        :class:`~feedline.errors.SchemaError` naming them), and the dataset's fitted
        preprocessor state is applied to the new rows, never refit (an unfitted
        preprocessor of this dataset takes it; one fitted to other data is refused).

        Many small inputs become few right-sized shards: a shard closes after
        ``rows_per_shard`` rows or about ``bytes_per_shard`` bytes. The manifest is
        committed last, so an interrupted write never leaves a dataset that opens.
        ``stats=True`` then stores ``fl.stats`` of the committed data in the manifest's
        ``statistics`` (a second, parallel read of the shards on the same engine, and an
        atomic manifest replacement; see :func:`feedline.statistics.compute.store_stats`).
        ``progress`` shows a bar of the rows written (``None``: ``fl.config.progress``, by
        default only on a terminal or in a notebook; see :mod:`feedline.ui.progress`).

        A write on the local engine to local disk journals its shards in its staging folder
        (a plan without ``limit`` or a class ``map_batches``). ``resume=True`` continues such
        a write that a crash (SIGKILL, preemption) interrupted: the verified shards are
        kept and only the read tasks whose rows are not in them run again; the result is
        byte-identical to an uninterrupted write (the manifest but for its times and the
        write's execution report). A changed plan, input, shard options or fitted state
        refuses to resume (:class:`~feedline.errors.ConfigurationError` saying what
        differs); with no interrupted write, the write starts from the beginning. See
        :mod:`feedline.store.write_journal`. On Spark and Ray the read tasks run in units (a
        Spark partition, a Ray task) that record each shard as it completes, and a resume
        continues each unit after its last verified shard (Spark records every write of
        read tasks without ``limit``; Ray writes in units with ``resume=True`` only, the
        first run's included): :mod:`feedline.engines.write_resume`.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> info = fl.range(1000).write(tempfile.mkdtemp() + "/out", rows_per_shard=400)
        >>> info.rows, info.shards
        (1000, 3)
        """
        resolved = get_engine(engine)
        info = outputs.write(
            resolved,
            lambda: self._fitted_plan(resolved),
            path,
            mode=mode,
            keep_states=lambda entries: Dataset(
                outputs.with_states(self._plan, entries, os.fspath(path)), self._fits
            )._fitted_plan(resolved),
            rows_per_shard=rows_per_shard,
            bytes_per_shard=bytes_per_shard,
            row_group_rows=row_group_rows,
            compression=compression,
            preserve_order=preserve_order,
            storage_options=storage_options,
            on_rows=on_rows,
            progress=progress,
            resume=resume,
        )
        if stats:
            written = Dataset.from_source(open_source(path, storage_options=storage_options))
            store_stats(written, engine=resolved)
        return info

    def write_tfrecord(
        self,
        path: str | os.PathLike[str],
        *,
        engine: str | Engine | None = None,
        compression: str | None = None,
        records_per_file: int | None = None,
        bytes_per_file: int | str | None = "256MiB",
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> WriteInfo:
        """Write the rows as TFRecord files of ``tf.train.Example`` records (for tf.data).

        The plan runs on ``engine`` and its batches stream into ``part-00000.tfrecord``,
        ``part-00001.tfrecord`` … in the folder ``path`` (a new file after
        ``records_per_file`` records or about ``bytes_per_file`` bytes), ``compression``
        ``None``, ``"GZIP"`` or ``"ZLIB"``. Integers and booleans become ``int64_list``,
        floats ``float_list`` (float32), binary and strings ``bytes_list``; lists and
        tensors are flattened; a null leaves the feature out of the row's Example. A value an
        Example cannot hold (a uint64 above ``2**63 - 1``, a float64 beyond float32's range)
        raises :class:`~feedline.errors.DataError` naming the column, row and value, unless
        you convert the column yourself first. See :mod:`feedline.io.tfrecord.writer`.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> info = fl.range(10).write_tfrecord(tempfile.mkdtemp(), records_per_file=4)
        >>> info.rows, info.shards
        (10, 3)
        """
        resolved = get_engine(engine)
        return outputs.write_tfrecord(
            resolved,
            lambda: self._fitted_plan(resolved),
            path,
            compression=compression,
            records_per_file=records_per_file,
            bytes_per_file=bytes_per_file,
            overwrite=overwrite,
            storage_options=storage_options,
        )

    def write_delta(
        self,
        path: str | os.PathLike[str],
        *,
        mode: Literal["error", "append", "overwrite"] = "error",
        partition_by: Sequence[str] | None = None,
        engine: str | Engine | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> WriteInfo:
        """Write the rows as a new version of the Delta table at ``path`` (``deltalake``,
        the ``feedline[delta]`` extra).

        The plan runs on ``engine``; its batches stream to the driver, where delta-rs writes
        the Parquet files and commits the version (one writer per call, not a distributed
        write). ``mode``: ``"error"`` (the default: the table must not exist), ``"append"``
        (the table's columns and types, else :class:`~feedline.errors.SchemaError` naming
        them; its partitioning is kept) or ``"overwrite"`` (a new version holding only these
        rows, schema included; older versions stay readable until the table is vacuumed).
        The commit's ``feedline.lineage`` metadata (``DeltaTable.history()``) names the
        source (with the snapshot of a table read in) and the plan. ``info.report``'s
        ``table_version`` is the version committed.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> path = tempfile.mkdtemp() + "/events"
        >>> fl.range(6).write_delta(path).report["table_version"]
        0
        >>> fl.range(2).write_delta(path, mode="append").rows
        2
        >>> fl.read_delta(path).count(), fl.read_delta(path, version=0).count()
        (8, 6)
        """
        resolved = get_engine(engine)
        return table_outputs.write_delta(
            resolved,
            lambda: self._fitted_plan(resolved),
            path,
            mode=mode,
            partition_by=partition_by,
            storage_options=storage_options,
        )

    def write_lance(
        self,
        path: str | os.PathLike[str],
        *,
        mode: Literal["error", "append", "overwrite"] = "error",
        engine: str | Engine | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> WriteInfo:
        """Write the rows as a new version of the Lance dataset at ``path`` (``pylance``,
        the ``feedline[lance]`` extra); ``mode`` and the driver-side write as in
        :meth:`write_delta`. The lineage goes into the transaction's properties
        (``lance.dataset(path).read_transaction(version).transaction_properties``).

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> path = tempfile.mkdtemp() + "/events.lance"
        >>> fl.range(6).write_lance(path).report["table_version"]
        1
        >>> fl.read_lance(path).count()
        6
        """
        resolved = get_engine(engine)
        return table_outputs.write_lance(
            resolved,
            lambda: self._fitted_plan(resolved),
            path,
            mode=mode,
            storage_options=storage_options,
        )

    def to_spark(self, spark: SparkSession | None = None) -> pyspark.sql.DataFrame:
        """This dataset as a lazy Spark DataFrame (see
        :func:`feedline.engines.spark.bridge.to_spark`)."""
        return to_spark(self, spark)

    def to_ray(self, engine: str | Engine | None = None) -> ray.data.Dataset:
        """This dataset as a lazy ``ray.data.Dataset`` (see
        :func:`feedline.engines.ray.bridge.to_ray`)."""
        return to_ray(self.fitted_plan(), engine)

    def streaming_split(
        self, n: int, *, equal: bool = True, engine: str | Engine | None = None
    ) -> list[ray.data.DataIterator]:
        """``n`` disjoint streams of this dataset for ``n`` Ray consumers (Ray Train workers),
        computed on Ray as they are read, nothing written first (see
        :func:`feedline.engines.ray.bridge.streaming_split`)."""
        return streaming_split(self.fitted_plan(), n, equal=equal, engine=engine)

    @options_signature
    def loader(self, *args: Any, **options: Any) -> Loader:
        """A training loader over this dataset: ``Loader(self, *args, **options)``.

        Every option (``batch_size``, ``shuffle``, ``seed``, ...) is a field of
        :class:`~feedline.loader.options.LoaderOptions`, which documents and checks it; this
        signature lists them all, as :class:`~feedline.loader.Loader`'s does.

        Training: ``ds.loader(batch_size=256, seed=0)`` (shuffled, remainder dropped);
        evaluation: ``ds.loader(batch_size=256, shuffle=False)`` (every sample once, a short
        last batch).

        Examples
        --------
        >>> import feedline as fl
        >>> [b["id"].tolist() for b in fl.range(5).loader(batch_size=2, shuffle=False)]
        [[0, 1], [2, 3], [4]]
        """
        return Loader(self, *args, **options)

    def shard_source(self, columns: Sequence[str] | None = None) -> ShardSource | BatchStream:
        """What a loader reads; the loader never sees a Dataset.

        A written dataset or a Parquet folder read as it is (a plan of column selections at
        most) gives its :class:`~feedline.store.shard_source.ShardSource` (files, row groups,
        checksums, schema); any other plan a :class:`~feedline.store.shard_source.BatchStream`
        of its batches (row count known when metadata tells). ``columns`` selects columns
        first. :class:`feedline.loader.Loader` calls this on whatever it is given.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> fl.range(10).limit(4).shard_source().num_rows
        4
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.range(10).write(out)
        >>> type(fl.open(out).shard_source(["id"])).__name__
        'ShardSource'
        """
        if columns is not None:
            return self.select(list(columns)).shard_source()
        schema = self.schema()

        def batches(names: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
            if names is None or list(names) == schema.names:
                return self.iter_batches()
            return self.select(list(names)).iter_batches()

        return outputs.shard_source(self._plan, schema, batches, repr(self).splitlines()[0])


def _num_rows(batch: pa.RecordBatch) -> int:
    """A batch's partial count (for :meth:`Dataset.count`)."""
    return batch.num_rows
