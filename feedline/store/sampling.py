"""Row-group samples of Parquet inputs: read only the row groups a sample needs.

``fit(ds, fraction=f, seed=s)`` wants about ``f`` of the rows. Dropping rows after reading
everything costs a full scan; a Parquet file is read by row group, so the sample is drawn
at that level instead, *systematically*: the non-empty row groups of all files, in file
order (rows per row group come from the manifest, or from the footers of plain Parquet),
are cut into ``k`` equal strata and one row group is taken from each, at the same seeded
offset, with ``k`` the fewest (at least 2) whose row groups hold ``f`` of the rows. So the
sample spreads over every part of the input (its files, and each file's start and end)
instead of landing on a few neighbours. Inside the chosen row groups rows are kept with
probability ``target / chosen rows``, so the expected sample size stays ``f`` of the rows.
The choice is made once, on the driver, from metadata alone, so every engine reads the same
row groups and the same rows.

A row-group sample is still a *cluster* sample: on data clustered by a fitted column (files
written per day, one series per row group, rows sorted by price), a few row groups do not
represent the whole. The fit measures that from the rows it read
(:mod:`feedline.statistics.cluster_sample`) and, when needed, reads more row groups
(:meth:`RowGroupSample.enlarged`; see :mod:`feedline.dataset.fit`).

Examples
--------
>>> choice = choose_row_groups([[100, 100], [100, 100]], fraction=0.25, seed=0)
>>> choice.rows, choice.keep  # at least 2 row groups, thinned to the target
(200, 0.5)
>>> choice.groups  # one from each half of the input
{0: (1,), 1: (1,)}
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, IntegrityError
from feedline.io.parquet import ParquetSource, _file_reader, read_footer
from feedline.io.source import (
    ExecutionReport,
    ReadFn,
    ReadTask,
    Source,
    check_columns,
    fingerprint_of,
)
from feedline.store.footers import check_identity

__all__ = [
    "RowGroupChoice",
    "RowGroupSample",
    "check_sample_args",
    "choose_row_groups",
    "row_group_sample",
]

#: footers read at once for a plain Parquet input (remote reads are latency-bound)
FOOTER_THREADS = 16
#: mixed into the seed, so the row-group choice and ``Dataset.sample``'s rows are independent
_SALT = 0x7267  # "rg"


@dataclass(frozen=True)
class RowGroupChoice:
    """The row groups a sample reads.

    Attributes
    ----------
    groups:
        File index -> the chosen row-group indexes in that file (ascending).
    rows:
        Rows in the chosen row groups.
    keep:
        Probability with which each row of a chosen row group is kept (1.0: all of them).
    """

    groups: dict[int, tuple[int, ...]]
    rows: int
    keep: float


def choose_row_groups(
    row_counts: Sequence[Sequence[int]], fraction: float, seed: int, groups: int | None = None
) -> RowGroupChoice:
    """Choose row groups holding ``fraction`` of the rows, deterministically from ``seed``.

    ``row_counts[f][g]`` is the row count of row group ``g`` of file ``f``. The ``G``
    non-empty row groups, in file order, are cut into ``k`` strata of ``G / k`` row groups
    and the one at ``floor((u + i) * G / k)`` is taken from stratum ``i`` (``u`` uniform in
    ``[0, 1)`` from ``seed``): a systematic sample. ``k`` is the smallest number, at least
    ``groups`` and at least 2 (or ``G``), whose row groups hold ``fraction`` of all rows;
    ``keep`` then thins their rows to that target.

    Examples
    --------
    >>> c = choose_row_groups([[10] * 10], fraction=0.35, seed=1)
    >>> c.rows, round(c.keep, 3), c.groups[0]
    (40, 0.875, (1, 4, 6, 9))
    >>> choose_row_groups([[10] * 10], fraction=0.35, seed=1) == c
    True
    >>> choose_row_groups([[10] * 4, [10] * 4], fraction=0.1, seed=0).groups  # both files
    {0: (3,), 1: (3,)}
    >>> choose_row_groups([[10] * 10], fraction=0.1, seed=1, groups=5).groups[0]
    (1, 3, 5, 7, 9)
    >>> choose_row_groups([[5]], fraction=0.0, seed=0).groups
    {}
    """
    check_sample_args(fraction, seed)
    flat = [(f, g, int(n)) for f, counts in enumerate(row_counts) for g, n in enumerate(counts)]
    flat = [item for item in flat if item[2] > 0]
    sizes = np.array([n for _, _, n in flat], dtype=np.int64)
    target = fraction * float(sizes.sum())
    if target <= 0 or not flat:
        return RowGroupChoice({}, 0, 1.0)
    offset = float(np.random.default_rng([seed, _SALT]).random())
    count = len(flat)
    k = min(count, max(2, groups or 0, math.ceil(fraction * count)))
    while True:
        picked = np.floor((offset + np.arange(k)) * (count / k)).astype(np.int64)
        rows = int(sizes[picked].sum())
        if rows >= target or k == count:
            break
        k = min(count, max(k + 1, math.ceil(k * target / max(rows, 1))))
    chosen: dict[int, list[int]] = {}
    for index in picked.tolist():
        f, g, _ = flat[index]
        chosen.setdefault(f, []).append(g)
    keep = target / rows if rows > target else 1.0
    return RowGroupChoice({f: tuple(gs) for f, gs in sorted(chosen.items())}, rows, keep)


def check_sample_args(fraction: float, seed: int) -> None:
    """Raise :class:`ConfigurationError` unless ``0 <= fraction <= 1`` and ``seed >= 0``.

    Examples
    --------
    >>> check_sample_args(0.5, 0)
    """
    if not 0.0 <= fraction <= 1.0:
        raise ConfigurationError(
            f"A sample needs 0 <= fraction <= 1, got {fraction}. Fix: pass e.g. 0.05 for 5%."
        )
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool) or seed < 0:
        raise ConfigurationError(
            f"A sample needs a non-negative int seed, got {seed!r}. Fix: pass e.g. seed=0."
        )


class RowGroupSample(Source):
    """The rows of a :class:`~feedline.io.parquet.ParquetSource` sample: only chosen row groups.

    One read task per chosen row group, in file order; rows inside are kept with probability
    :attr:`RowGroupChoice.keep`, drawn from a generator seeded by ``(seed, file, row group)``,
    so the rows do not depend on the engine or on batch sizes. Shards of a feedline dataset
    are checked against the manifest (footer digest, rows of the row group) as a full read
    checks them.

    Examples
    --------
    >>> import feedline as fl, tempfile
    >>> out = tempfile.mkdtemp() + "/ds"
    >>> _ = fl.range(1000).write(out, rows_per_shard=250, row_group_rows=50)
    >>> sample = RowGroupSample(fl.open(out).plan.source, fraction=0.1, seed=0)
    >>> len(sample.read_tasks(None, None)), sample.choice.rows
    (2, 100)
    """

    kind = "row-group sample"
    prunes_with_predicate = True

    def __init__(
        self, base: ParquetSource, fraction: float, seed: int, groups: int | None = None
    ) -> None:
        check_sample_args(fraction, seed)
        self.base = base
        self.fraction = float(fraction)
        self.seed = int(seed)
        #: the least number of row groups to read (``None``: what ``fraction`` needs)
        self.groups = groups
        self._choice: RowGroupChoice | None = None
        self._counts: list[list[int]] | None = None

    @property
    def choice(self) -> RowGroupChoice:
        """The chosen row groups (footers are read the first time it is asked for)."""
        if self._choice is None:
            counts = self.row_counts()
            self._choice = choose_row_groups(counts, self.fraction, self.seed, self.groups)
        return self._choice

    @property
    def total_groups(self) -> int:
        """The input's non-empty row groups."""
        return sum(1 for counts in self.row_counts() for n in counts if n > 0)

    def enlarged(self, groups: int) -> RowGroupSample:
        """The same sample (``fraction``, ``seed``) drawn from at least ``groups`` row groups.

        Examples
        --------
        >>> import feedline as fl, tempfile
        >>> out = tempfile.mkdtemp() + "/ds"
        >>> _ = fl.range(1000).write(out, rows_per_shard=500, row_group_rows=100)
        >>> sample = RowGroupSample(fl.open(out).plan.source, fraction=0.2, seed=0)
        >>> len(sample.read_tasks(None, None)), len(sample.enlarged(5).read_tasks(None, None))
        (2, 5)
        """
        larger = RowGroupSample(self.base, self.fraction, self.seed, groups)
        larger._counts = self._counts
        return larger

    def row_counts(self) -> list[list[int]]:
        """Rows per row group of each file (from the manifest, or the footers, read once)."""
        if self._counts is None:
            self._counts = self._read_row_counts()
        return self._counts

    def _read_row_counts(self) -> list[list[int]]:
        manifest = getattr(self.base, "manifest", None)
        if manifest is not None:
            return [list(shard.row_groups) for shard in manifest.shards]
        files = self.base.files

        def counts(index: int) -> list[int]:
            meta = read_footer(files[index])
            return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]

        if len(files) <= 1:
            return [counts(i) for i in range(len(files))]
        with ThreadPoolExecutor(min(FOOTER_THREADS, len(files))) as pool:
            return list(pool.map(counts, range(len(files))))

    def schema(self) -> pa.Schema:
        return self.base.schema()

    def describe(self) -> str:
        more = f", at least {self.groups} row groups" if self.groups else ""
        return (
            f"{self.base.describe()}, row groups sampled (fraction={self.fraction}, "
            f"seed={self.seed}{more})"
        )

    def fingerprint(self) -> str:
        if self.groups:
            return fingerprint_of(self.base.fingerprint(), self.fraction, self.seed, self.groups)
        return fingerprint_of(self.base.fingerprint(), self.fraction, self.seed)

    def read_tasks(
        self, columns: Sequence[str] | None, predicate: pc.Expression | None
    ) -> list[ReadTask]:
        schema = self.schema()
        if columns is not None:
            check_columns(schema, columns, f"the Parquet input {self.base.describe()}")
        manifest = getattr(self.base, "manifest", None)
        target = getattr(self.base, "target", None)
        origin = self.base._schema_origin or f"the first file {self.base.files[0].url!r}"
        files = self.base.files
        choice = self.choice
        tasks = []
        for f, groups in choice.groups.items():
            loc = files[f]
            shard = manifest.shards[f] if manifest is not None else None
            for g in groups:
                read = _file_reader(loc, origin, schema, columns, predicate, (g,))
                rows = shard.row_groups[g] if shard is not None else None
                checked = (
                    (shard, target.child(shard.path), self.schema())
                    if shard is not None and target is not None
                    else None
                )
                label = f"{loc.url} (row group {g})"
                tasks.append(
                    ReadTask(
                        label,
                        _sampled(
                            read,
                            label,
                            (self.seed, f, g),
                            choice.keep,
                            checked,
                            rows if predicate is None else None,
                        ),
                    )
                )
        return tasks


def _sampled(
    read: ReadFn,
    label: str,
    seed: tuple[int, ...],
    keep: float,
    checked: Any,
    rows: int | None,
) -> ReadFn:
    """``read``'s batches, rows kept with probability ``keep``; checked like a shard read."""

    def run(report: ExecutionReport) -> Iterator[pa.RecordBatch]:
        if checked is not None:
            shard, location, stored = checked
            check_identity(location, shard, stored)
        rng = np.random.default_rng([*seed, _SALT]) if keep < 1.0 else None
        seen = 0
        for batch in read(report):
            seen += batch.num_rows
            if rng is not None:
                batch = batch.filter(pa.array(rng.random(batch.num_rows) < keep))
            yield batch
        if rows is not None and seen != rows:
            raise IntegrityError(
                f"{label} holds {seen} rows; the manifest says {rows}. The shard was replaced "
                "or damaged. Fix: restore it or re-run the write."
            )

    return run


def row_group_sample(source: Source, fraction: float, seed: int) -> RowGroupSample | None:
    """A row-group sample of ``source``, or ``None`` when it is not read by row group.

    Parquet inputs and feedline datasets are; other sources (CSV, in-memory tables...) are
    sampled row by row after a full read (``Dataset.sample``).

    Examples
    --------
    >>> import feedline as fl
    >>> row_group_sample(fl.range(10).plan.source, 0.5, 0) is None
    True
    """
    if isinstance(source, ParquetSource) and source.files:
        return RowGroupSample(source, fraction, seed)
    return None
