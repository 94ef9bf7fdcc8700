"""The plans :class:`feedline.Dataset`'s fluent methods build: arguments checked, plan in, plan out.

Each function takes the dataset's :class:`~feedline.plan.plan.Plan` (and the other
datasets' plans) and returns a new plan; the ``Dataset`` wraps it. Row operators (``select``,
``filter``, ``map_batches``, ``transform``, ``limit``, ``sample``) and column edits
(``with_columns``, ``rename``, ``drop``, ``cast``) append an operator, run in the fused batch
stage. Relational operators (``sort``, ``aggregate``, ``join``, ``union``, ``unique``,
``random_shuffle``, ``repartition``, ``split``) become the source of a new plan
(:mod:`feedline.plan.relational`). Arguments are checked at once; column names too, when
that needs no user function to run (:func:`checked`).

Examples
--------
>>> import feedline as fl
>>> plan = sort(select(fl.range(3).plan, ["id"]), "id", descending=True)
>>> plan.source.describe()
"sort(by=('id',), descending=(True,), nulls_last=True)"
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.arrow.column_names import check_unique
from feedline.engines.local.engine import plan_schema
from feedline.errors import ConfigurationError
from feedline.plan.inference import check_model_options
from feedline.plan.plan import (
    Cast,
    Drop,
    Filter,
    Limit,
    MapBatches,
    Plan,
    Rename,
    Sample,
    Select,
    Transform,
    WithColumns,
)
from feedline.plan.relational import AGG_FUNCTIONS, JOIN_HOWS, Relational, RelationalSource

__all__ = [
    "aggregate",
    "cast",
    "check_fraction",
    "check_sample_n",
    "checked",
    "drop",
    "filter_rows",
    "group_keys",
    "join",
    "limit",
    "map_batches",
    "names_of",
    "plan_of",
    "random_shuffle",
    "relational",
    "rename",
    "repartition",
    "sample",
    "select",
    "sort",
    "split",
    "split_fractions",
    "train_test_fractions",
    "transform",
    "union",
    "unique",
    "with_columns",
]


# ---------------------------------------------------------------------- row operators


def select(plan: Plan, columns: str | Sequence[str]) -> Plan:
    """``plan`` keeping ``columns`` in the given order.

    Examples
    --------
    >>> import feedline as fl
    >>> select(fl.range(1).plan, "id").ops
    (Select(columns=('id',)),)
    """
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    if not names or not all(isinstance(c, str) for c in names):
        raise ConfigurationError(
            f"select() needs one or more column names, got {columns!r}. Fix: pass a list of "
            "strings."
        )
    check_unique(names, f"select({list(names)})", "name each column once.")
    return plan.then(Select(names))


def filter_rows(plan: Plan, predicate: pc.Expression | Callable[[pa.RecordBatch], Any]) -> Plan:
    """``plan`` keeping the rows where ``predicate`` (an expression or a function) holds.

    Examples
    --------
    >>> import feedline as fl, pyarrow.compute as pc
    >>> filter_rows(fl.range(3).plan, pc.field("id") > 0).ops[0].is_expression
    True
    """
    if not isinstance(predicate, pc.Expression) and not callable(predicate):
        raise ConfigurationError(
            "filter() takes a pyarrow expression or a function, got "
            f"{type(predicate).__name__}. Fix: e.g. ds.filter(pc.field('price') > 0)."
        )
    return plan.then(Filter(predicate))


def map_batches(
    plan: Plan,
    fn: Callable[..., Any],
    *,
    batch_size: int | None = None,
    fn_kwargs: Mapping[str, Any] | None = None,
    fn_constructor_kwargs: Mapping[str, Any] | None = None,
    output_schema: pa.Schema | None = None,
    concurrency: int | None = None,
    device: str | None = None,
    passthrough: Sequence[str] | None = None,
) -> Plan:
    """``plan`` followed by ``fn`` on its batches (see :meth:`feedline.Dataset.map_batches`).

    Examples
    --------
    >>> import feedline as fl
    >>> map_batches(fl.range(3).plan, lambda b: b, batch_size=2).ops[0].batch_size
    2
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
            "fn_constructor_kwargs only applies when fn is a class. Fix: drop it or pass a class."
        )
    device = check_model_options(fn, device, fn_constructor_kwargs, concurrency)
    if isinstance(passthrough, str):
        passthrough = [passthrough]
    if output_schema is not None:
        check_unique(
            output_schema.names, "map_batches(output_schema=...)", "name each column once."
        )
    check_unique(passthrough or (), "map_batches(passthrough=...)", "name each column once.")
    return plan.then(
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


def transform(plan: Plan, preprocessor: Any) -> Plan:
    """``plan`` followed by ``preprocessor`` (fitted or not; anything with ``transform_batch``).

    Examples
    --------
    >>> import feedline as fl
    >>> transform(fl.range(3).plan, fl.StandardScaler("id")).ops[0].describe()
    'Transform(StandardScaler(id; unfitted))'
    """
    if not hasattr(preprocessor, "transform_batch"):
        kind = type(preprocessor).__name__
        if kind.endswith("Tokenizer") or hasattr(preprocessor, "encode"):
            # fl.ClipTokenizer, tokenizers.Tokenizer, a transformers tokenizer...
            raise ConfigurationError(
                f"transform() needs a feedline preprocessor, got the tokenizer {kind}: a "
                "tokenizer does not say which column to read or what to write. Fix: wrap it "
                f"in fl.Tokenize, e.g. ds.transform(fl.Tokenize('text', tokenizer=<the {kind}>"
                ", max_length=77)), which writes the ids and mask columns (see the text "
                "how-to)."
            )
        raise ConfigurationError(
            f"transform() needs a feedline preprocessor, got {kind}. "
            "Fix: use e.g. fl.StandardScaler(...) or map_batches for plain functions."
        )
    return plan.then(Transform(preprocessor))


def limit(plan: Plan, n: int) -> Plan:
    """``plan`` keeping its first ``n`` rows.

    Examples
    --------
    >>> import feedline as fl
    >>> limit(fl.range(10).plan, 3).known_rows()
    3
    """
    if not isinstance(n, int) or n < 0:
        raise ConfigurationError(
            f"limit() needs a non-negative int, got {n!r}. Fix: pass e.g. ds.limit(100)."
        )
    return plan.then(Limit(n))


def check_fraction(fraction: float | None) -> float:
    """``fraction`` as a float when ``0 <= fraction <= 1``, else ``ConfigurationError``.

    Examples
    --------
    >>> check_fraction(0.25)
    0.25
    >>> check_fraction(2)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: sample() needs 0 <= fraction <= 1, got 2. Fix: ...
    """
    if fraction is None or not 0.0 <= fraction <= 1.0:
        raise ConfigurationError(
            f"sample() needs 0 <= fraction <= 1, got {fraction}. Fix: pass e.g. 0.1 for 10%."
        )
    return float(fraction)


def sample(plan: Plan, fraction: float | None, seed: int = 0) -> Plan:
    """``plan`` keeping each row with probability ``fraction`` (the same rows for ``seed``).

    Examples
    --------
    >>> import feedline as fl
    >>> sample(fl.range(10).plan, 0.5, seed=0).ops
    (Sample(fraction=0.5, seed=0),)
    """
    return plan.then(Sample(check_fraction(fraction), int(seed)))


def check_sample_n(fraction: float | None, n: Any) -> None:
    """Raise unless ``n`` is a non-negative int given without ``fraction`` (``sample(n=)``)."""
    if fraction is not None or not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ConfigurationError(
            f"sample() takes either fraction= or a non-negative int n=, got "
            f"fraction={fraction!r}, n={n!r}. Fix: pass one, e.g. ds.sample(n=1000)."
        )


# ---------------------------------------------------------------------- relational


def relational(op: str, params: Mapping[str, Any], inputs: Sequence[Plan]) -> Plan:
    """A checked plan whose source is the relational operator ``op`` over ``inputs``."""
    source = RelationalSource(Relational(op, tuple(params.items())), inputs, plan_schema)
    return checked(Plan(source))


def sort(
    plan: Plan,
    by: str | Sequence[str],
    descending: bool | Sequence[bool] = False,
    nulls_last: bool = True,
) -> Plan:
    """``plan``'s rows ordered by ``by`` (see :meth:`feedline.Dataset.sort`).

    Examples
    --------
    >>> import feedline as fl
    >>> sort(fl.range(3).plan, ["id"], [True]).source.describe()
    "sort(by=('id',), descending=(True,), nulls_last=True)"
    """
    keys = names_of(by, "sort(by=...)")
    flags = (descending,) * len(keys) if isinstance(descending, bool) else tuple(descending)
    if len(flags) != len(keys) or not all(isinstance(f, bool) for f in flags):
        raise ConfigurationError(
            f"sort(): descending={descending!r} must be one bool or one per column of "
            f"{list(keys)}. Fix: e.g. descending=[True, False]."
        )
    params = {"by": keys, "descending": flags, "nulls_last": bool(nulls_last)}
    return relational("sort", params, [plan])


def group_keys(keys: str | Sequence[str]) -> tuple[str, ...]:
    """The key columns of ``groupby(keys)`` (``[]``: one group of every row).

    Examples
    --------
    >>> group_keys("k"), group_keys([])
    (('k',), ())
    """
    return () if isinstance(keys, Sequence) and not keys else names_of(keys, "groupby()")


def aggregate(plan: Plan, keys: tuple[str, ...], aggs: Mapping[str, tuple[str, str]]) -> Plan:
    """One row per group of ``keys``: the aggregates ``out=(column, fn)`` of ``plan``'s rows
    (see :meth:`feedline.dataset.grouped.GroupedDataset.agg`).

    Examples
    --------
    >>> import feedline as fl
    >>> aggregate(fl.range(3).plan, (), {"n": ("*", "count")}).source.describe()
    "aggregate(keys=(), aggs=(('n', None, 'count'),))"
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
    return relational("aggregate", {"keys": keys, "aggs": tuple(specs)}, [plan])


def join(
    plan: Plan, other: Any, on: str | Sequence[str], how: str = "inner", suffix: str = "_right"
) -> Plan:
    """``plan``'s rows matched with the rows of the dataset ``other`` on ``on``.

    Examples
    --------
    >>> import feedline as fl
    >>> join(fl.range(3).plan, fl.range(2), on="id", how="semi").source.describe()
    "join(on=('id',), how='semi', suffix='_right')"
    """
    if how not in JOIN_HOWS:
        raise ConfigurationError(
            f"join(): how={how!r} is not a join type. Fix: use one of {list(JOIN_HOWS)}."
        )
    right = plan_of(other, "join()")
    params = {"on": names_of(on, "join(on=...)"), "how": how, "suffix": str(suffix)}
    return relational("join", params, [plan, right])


def union(plan: Plan, others: Sequence[Any]) -> Plan:
    """All rows of ``plan`` and of the datasets ``others``.

    Examples
    --------
    >>> import feedline as fl
    >>> union(fl.range(2).plan, [fl.range(3)]).source.describe()
    'union()'
    """
    rest = [plan_of(other, "union()") for other in others]
    return relational("union", {}, [plan, *rest])


def unique(plan: Plan, subset: str | Sequence[str] | None = None) -> Plan:
    """``plan``'s distinct rows (one per distinct value of ``subset``).

    Examples
    --------
    >>> import feedline as fl
    >>> unique(fl.range(2).plan).source.describe()
    'unique(subset=None)'
    """
    keys = None if subset is None else names_of(subset, "unique(subset=...)")
    return relational("unique", {"subset": keys}, [plan])


def random_shuffle(plan: Plan, seed: int = 0) -> Plan:
    """``plan``'s rows in an order keyed by a seeded hash of their content.

    Examples
    --------
    >>> import feedline as fl
    >>> random_shuffle(fl.range(2).plan, 3).source.describe()
    'random_shuffle(seed=3)'
    """
    return relational("random_shuffle", {"seed": _seed(seed)}, [plan])


def repartition(plan: Plan, n: int) -> Plan:
    """``plan``'s rows cut into ``n`` near-equal partitions.

    Examples
    --------
    >>> import feedline as fl
    >>> repartition(fl.range(2).plan, 2).source.describe()
    'repartition(n=2)'
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigurationError(
            f"repartition() needs a positive int, got {n!r}. Fix: e.g. ds.repartition(8)."
        )
    return relational("repartition", {"n": n}, [plan])


def split(
    plan: Plan, fractions: Sequence[float] | int, seed: int = 0, stratify: str | None = None
) -> list[Plan]:
    """One plan per piece of ``fractions`` (see :meth:`feedline.Dataset.split`).

    Examples
    --------
    >>> import feedline as fl
    >>> len(split(fl.range(10).plan, 4))
    4
    """
    values = split_fractions(fractions)
    if stratify is not None and not isinstance(stratify, str):
        raise ConfigurationError(
            f"split(): stratify={stratify!r} must be one column name. Fix: pass a str."
        )
    base = {"fractions": values, "seed": _seed(seed), "stratify": stratify}
    return [relational("split", {**base, "index": i}, [plan]) for i in range(len(values))]


def split_fractions(fractions: Any) -> tuple[float, ...]:
    """``split``'s ``fractions`` as floats: an int ``n`` (``n`` equal parts) or a sequence of
    real numbers in ``(0, 1]`` (not bools) summing to 1; anything else raises a
    :class:`~feedline.errors.ConfigurationError` naming the bad value.

    Examples
    --------
    >>> split_fractions([0.8, 0.2]), split_fractions(4)
    ((0.8, 0.2), (0.25, 0.25, 0.25, 0.25))
    >>> split_fractions([0.5, float("nan")])
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: split(): fraction 1 is nan, not a number in (0, 1] ...
    """
    if isinstance(fractions, bool | np.bool_):
        raise ConfigurationError(
            f"split({fractions!r}): fractions must be a list of fractions or an int number of "
            "parts, not a bool. Fix: e.g. split([0.8, 0.2]) or split(4)."
        )
    if isinstance(fractions, int | np.integer):
        if fractions < 1:
            raise ConfigurationError(
                f"split({fractions}) needs at least one part. Fix: pass e.g. split(4)."
            )
        return (1.0 / int(fractions),) * int(fractions)
    if isinstance(fractions, str | bytes) or not isinstance(fractions, Sequence | np.ndarray):
        raise ConfigurationError(
            f"split({fractions!r}): fractions must be a list of fractions summing to 1 (or an "
            f"int number of parts), not {type(fractions).__name__}. Fix: e.g. split([0.8, 0.2])"
            " or train_test_split(test_size=0.2)."
        )
    values = []
    for i, value in enumerate(fractions):
        real = isinstance(value, int | float | np.integer | np.floating)
        real = real and not isinstance(value, bool | np.bool_)
        number = float(value) if real and value <= 1 else math.inf  # nan, huge ints: inf
        if not real or not 0.0 < number <= 1.0:
            kind = f"{value!r:.60}" if real else f"{value!r:.60} ({type(value).__name__})"
            raise ConfigurationError(
                f"split(): fraction {i} is {kind}, not a number in (0, 1] (fractions: "
                f"{list(fractions)!r:.200}). Fix: pass positive numbers summing to 1, e.g. "
                "split([0.8, 0.1, 0.1])."
            )
        values.append(float(value))
    if not values or abs(math.fsum(values) - 1.0) > 1e-9:
        raise ConfigurationError(
            f"split(): fractions {values} must sum to 1 (they sum to {math.fsum(values)!r}). "
            "Fix: e.g. split([0.8, 0.1, 0.1])."
        )
    return tuple(values)


def train_test_fractions(test_size: float) -> list[float]:
    """The ``split`` fractions of ``train_test_split(test_size)``: ``[1 - t, t]``.

    Examples
    --------
    >>> train_test_fractions(0.25)
    [0.75, 0.25]
    """
    if not isinstance(test_size, float | int) or not 0.0 < test_size < 1.0:
        raise ConfigurationError(
            f"train_test_split(): test_size={test_size!r} must be a fraction in (0, 1). "
            "Fix: e.g. test_size=0.2."
        )
    return [1.0 - test_size, float(test_size)]


# ---------------------------------------------------------------------- column edits


def with_columns(
    plan: Plan, columns: Mapping[str, pc.Expression] | None, named: Mapping[str, pc.Expression]
) -> Plan:
    """``plan`` with columns added or replaced by pyarrow expressions.

    Examples
    --------
    >>> import feedline as fl, pyarrow.compute as pc
    >>> with_columns(fl.range(1).plan, None, {"d": pc.field("id") * 2}).ops[0].describe()
    'WithColumns(d=multiply_checked(id, 2))'
    """
    items = {**(columns or {}), **named}
    bad = [name for name, e in items.items() if not isinstance(e, pc.Expression)]
    if not items or bad:
        raise ConfigurationError(
            f"with_columns() needs pyarrow expressions, got {bad or 'none'}. Fix: e.g. "
            "ds.with_columns(c=pc.field('a') * 2) (use pc.scalar(v) for constants)."
        )
    return checked(plan.then(WithColumns(tuple(items.items()))))


def rename(plan: Plan, mapping: Mapping[str, str]) -> Plan:
    """``plan`` with columns renamed (``{"old": "new"}``).

    Examples
    --------
    >>> import feedline as fl
    >>> rename(fl.range(1).plan, {"id": "row"}).ops[0].describe()
    'Rename(id->row)'
    """
    pairs = tuple(dict(mapping).items())
    if not pairs or not all(isinstance(a, str) and isinstance(b, str) for a, b in pairs):
        raise ConfigurationError(
            f"rename() needs a mapping of old -> new names, got {mapping!r}. "
            "Fix: e.g. ds.rename({'x': 'price'})."
        )
    return checked(plan.then(Rename(pairs)))


def drop(plan: Plan, columns: str | Sequence[str]) -> Plan:
    """``plan`` without ``columns``.

    Examples
    --------
    >>> import feedline as fl, pyarrow.compute as pc
    >>> drop(fl.range(1).with_columns(x=pc.field("id")).plan, "x").ops[-1].describe()
    'Drop(x)'
    """
    return checked(plan.then(Drop(names_of(columns, "drop()"))))


def cast(plan: Plan, types: Mapping[str, pa.DataType | str]) -> Plan:
    """``plan`` with columns cast to Arrow types (given as types or their names).

    Examples
    --------
    >>> import feedline as fl
    >>> cast(fl.range(1).plan, {"id": "float32"}).ops[0].describe()
    'Cast(id:float)'
    """
    pairs = []
    for name, kind in dict(types).items():
        try:
            pairs.append((name, kind if isinstance(kind, pa.DataType) else pa.type_for_alias(kind)))
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"cast(): {kind!r} for column {name!r} is not an Arrow type. Fix: pass a "
                "pyarrow type (pa.float32()) or its name ('float32', 'string', 'int64')."
            ) from exc
    if not pairs:
        raise ConfigurationError("cast() needs at least one column. Fix: cast({'x': 'float32'}).")
    return checked(plan.then(Cast(tuple(pairs))))


# ---------------------------------------------------------------------- checks


def names_of(columns: str | Sequence[str], where: str) -> tuple[str, ...]:
    """``columns`` as a non-empty tuple of names, or ``ConfigurationError``.

    Examples
    --------
    >>> names_of("a", "sort()"), names_of(["a", "b"], "sort()")
    (('a',), ('a', 'b'))
    """
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    if not names or not all(isinstance(c, str) for c in names):
        raise ConfigurationError(
            f"{where} needs one or more column names, got {columns!r}. Fix: pass a str or a "
            "list of str."
        )
    return names


def checked(plan: Plan) -> Plan:
    """``plan``, after checking its schema when no user function has to run for that.

    Examples
    --------
    >>> import feedline as fl
    >>> checked(fl.range(1).plan.then(Drop(("nope",))))
    Traceback (most recent call last):
    ...
    feedline.errors.SchemaError: Drop(nope): column(s) ['nope'] are not in the rows from ...
    """
    if _cheap(plan):
        plan_schema(plan)
    return plan


def plan_of(other: Any, where: str) -> Plan:
    """The plan of the dataset ``other`` (an argument of ``where``), or ``ConfigurationError``.

    Examples
    --------
    >>> import feedline as fl
    >>> plan_of(fl.range(1), "union()").source.describe()
    'range: 1 rows'
    """
    if not hasattr(other, "plan") or not isinstance(other.plan, Plan):
        raise ConfigurationError(
            f"{where} takes feedline Datasets, got {type(other).__name__}. Fix: wrap it, e.g. "
            "fl.from_arrow(table) or fl.from_pandas(df)."
        )
    return other.plan


def _cheap(plan: Plan) -> bool:
    if plan.has_user_functions:
        return False
    source = plan.source
    return not isinstance(source, RelationalSource) or all(_cheap(p) for p in source.inputs)


def _seed(seed: Any) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigurationError(f"seed={seed!r} must be an int. Fix: pass e.g. seed=0.")
    return seed
