"""The relational and column-editing methods of :class:`feedline.Dataset` (a mixin).

Each method returns a new lazy ``Dataset``. Relational operators (``sort``, ``groupby``,
``join``, ``union``, ``unique``, ``random_shuffle``, ``repartition``, ``split``) become the
source of a new plan (:mod:`feedline.plan.relational`); column edits (``with_columns``,
``rename``, ``drop``, ``cast``) are batch operators run in the fused batch stage.
Arguments are checked at once; column names too, when that needs no user function to run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from feedline.dataset.grouped import GroupedDataset
from feedline.engines.local.engine import plan_schema
from feedline.errors import ConfigurationError
from feedline.plan.plan import Cast, Drop, Plan, Rename, WithColumns
from feedline.plan.relational import JOIN_HOWS, Relational, RelationalSource

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.dataset.grouped import GroupedDataset

__all__ = ["RelationalMethods", "checked", "names_of"]


class RelationalMethods:
    """Mixed into :class:`feedline.Dataset`; see each method."""

    _plan: Plan

    def _then(self, op: Any) -> Dataset:  # provided by Dataset
        raise NotImplementedError

    def _relational(self, op: str, params: dict[str, Any], *others: Dataset) -> Dataset:
        inputs = (self._plan, *(other.plan for other in others))
        source = RelationalSource(Relational(op, tuple(params.items())), inputs, plan_schema)
        return checked(type(self)(Plan(source)))  # type: ignore[call-arg]

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
        keys = names_of(by, "sort(by=...)")
        flags = (descending,) * len(keys) if isinstance(descending, bool) else tuple(descending)
        if len(flags) != len(keys) or not all(isinstance(f, bool) for f in flags):
            raise ConfigurationError(
                f"sort(): descending={descending!r} must be one bool or one per column of "
                f"{list(keys)}. Fix: e.g. descending=[True, False]."
            )
        return self._relational(
            "sort", {"by": keys, "descending": flags, "nulls_last": bool(nulls_last)}
        )

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

        names = () if isinstance(keys, Sequence) and not keys else names_of(keys, "groupby()")
        return GroupedDataset(self, names)  # type: ignore[arg-type]

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
        if how not in JOIN_HOWS:
            raise ConfigurationError(
                f"join(): how={how!r} is not a join type. Fix: use one of {list(JOIN_HOWS)}."
            )
        _check_dataset(other, "join()")
        params = {"on": names_of(on, "join(on=...)"), "how": how, "suffix": str(suffix)}
        return self._relational("join", params, other)

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
        for other in others:
            _check_dataset(other, "union()")
        return self._relational("union", {}, *others)

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
        keys = None if subset is None else names_of(subset, "unique(subset=...)")
        return self._relational("unique", {"subset": keys})

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
        return self._relational("random_shuffle", {"seed": _seed(seed)})

    def repartition(self, n: int) -> Dataset:
        """The same rows cut into ``n`` partitions of near-equal size (the local engine
        yields ``n`` batches; Spark and Ray ``n`` partitions/blocks), order unspecified.

        Examples
        --------
        >>> import feedline as fl
        >>> [b.num_rows for b in fl.range(10).repartition(3).iter_batches()]
        [4, 3, 3]
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigurationError(
                f"repartition() needs a positive int, got {n!r}. Fix: e.g. ds.repartition(8)."
            )
        return self._relational("repartition", {"n": n})

    def split(
        self,
        fractions: Sequence[float] | int,
        seed: int = 0,
        stratify: str | None = None,
    ) -> list[Dataset]:
        """Disjoint datasets that together hold every row exactly once.

        ``fractions`` (positive, summing to 1; or an int ``n`` for ``n`` equal parts) are
        cut by rank of a seeded row-content key (see :meth:`random_shuffle`): in a stratum
        of ``n`` rows, piece ``i`` gets the ranks ``floor(c_(i-1) * n) <= r < floor(c_i * n)``
        with ``c`` the cumulative fractions, so sizes are exact and the partition is the
        same on every engine and file layout. ``stratify`` names a column whose every value
        (null included) is cut separately, keeping its proportions in every piece.

        Examples
        --------
        >>> import feedline as fl
        >>> parts = fl.range(10).split([0.5, 0.3, 0.2], seed=0)
        >>> [p.count() for p in parts]
        [5, 3, 2]
        """
        if isinstance(fractions, int) and not isinstance(fractions, bool):
            if fractions < 1:
                raise ConfigurationError(
                    f"split({fractions}) needs at least one part. Fix: pass e.g. split(4)."
                )
            fractions = [1.0 / fractions] * fractions
        values = tuple(float(f) for f in fractions)
        if not values or min(values) <= 0 or abs(sum(values) - 1.0) > 1e-9:
            raise ConfigurationError(
                f"split(): fractions {list(values)} must be positive and sum to 1. "
                "Fix: e.g. split([0.8, 0.1, 0.1])."
            )
        if stratify is not None and not isinstance(stratify, str):
            raise ConfigurationError(
                f"split(): stratify={stratify!r} must be one column name. Fix: pass a str."
            )
        base = {"fractions": values, "seed": _seed(seed), "stratify": stratify}
        return [self._relational("split", {**base, "index": i}) for i in range(len(values))]

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
        if not isinstance(test_size, float | int) or not 0.0 < test_size < 1.0:
            raise ConfigurationError(
                f"train_test_split(): test_size={test_size!r} must be a fraction in (0, 1). "
                "Fix: e.g. test_size=0.2."
            )
        train, test = self.split([1.0 - test_size, float(test_size)], seed, stratify)
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
        items = {**(columns or {}), **named}
        bad = [name for name, e in items.items() if not isinstance(e, pc.Expression)]
        if not items or bad:
            raise ConfigurationError(
                f"with_columns() needs pyarrow expressions, got {bad or 'none'}. Fix: e.g. "
                "ds.with_columns(c=pc.field('a') * 2) (use pc.scalar(v) for constants)."
            )
        return checked(self._then(WithColumns(tuple(items.items()))))

    def rename(self, mapping: Mapping[str, str]) -> Dataset:
        """Rename columns (``{"old": "new"}``); the others keep their names and places.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(1).rename({"id": "row"}).schema().names
        ['row']
        """
        pairs = tuple(dict(mapping).items())
        if not pairs or not all(isinstance(a, str) and isinstance(b, str) for a, b in pairs):
            raise ConfigurationError(
                f"rename() needs a mapping of old -> new names, got {mapping!r}. "
                "Fix: e.g. ds.rename({'x': 'price'})."
            )
        return checked(self._then(Rename(pairs)))

    def drop(self, columns: str | Sequence[str]) -> Dataset:
        """Remove ``columns``.

        Examples
        --------
        >>> import feedline as fl, pyarrow as pa
        >>> fl.from_arrow(pa.table({"a": [1], "b": [2]})).drop("a").schema().names
        ['b']
        """
        return checked(self._then(Drop(names_of(columns, "drop()"))))

    def cast(self, types: Mapping[str, pa.DataType | str]) -> Dataset:
        """Cast columns to Arrow types (``{"x": pa.float32()}`` or ``{"x": "float32"}``);
        a value the new type cannot hold raises ``DataError``.

        Examples
        --------
        >>> import feedline as fl
        >>> fl.range(2).cast({"id": "float32"}).schema().field("id").type
        DataType(float)
        """
        pairs = []
        for name, kind in dict(types).items():
            try:
                pairs.append(
                    (name, kind if isinstance(kind, pa.DataType) else pa.type_for_alias(kind))
                )
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(
                    f"cast(): {kind!r} for column {name!r} is not an Arrow type. Fix: pass a "
                    "pyarrow type (pa.float32()) or its name ('float32', 'string', 'int64')."
                ) from exc
        if not pairs:
            raise ConfigurationError(
                "cast() needs at least one column. Fix: cast({'x': 'float32'})."
            )
        return checked(self._then(Cast(tuple(pairs))))


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


def checked(dataset: Dataset) -> Dataset:
    """``dataset``, after checking its schema when no user function has to run for that."""
    if _cheap(dataset.plan):
        dataset.schema()
    return dataset


def _cheap(plan: Plan) -> bool:
    if plan.has_user_functions:
        return False
    source = plan.source
    return not isinstance(source, RelationalSource) or all(_cheap(p) for p in source.inputs)


def _check_dataset(other: Any, where: str) -> None:
    if not hasattr(other, "plan") or not isinstance(other.plan, Plan):
        raise ConfigurationError(
            f"{where} takes feedline Datasets, got {type(other).__name__}. Fix: wrap it, e.g. "
            "fl.from_arrow(table) or fl.from_pandas(df)."
        )


def _seed(seed: Any) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigurationError(f"seed={seed!r} must be an int. Fix: pass e.g. seed=0.")
    return seed
