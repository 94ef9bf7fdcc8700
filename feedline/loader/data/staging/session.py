"""Serving a staged epoch: the batches taken in order from the rank's buckets.

A session serves one epoch of one rank. The loader asks for its plan's rows in order, so each
request is the next rows of the rank's staged epoch (:class:`~feedline.loader.data.staging.
buckets.Buckets`), checked against the plan; any other request (rows this rank does not read
this epoch, e.g. the content fingerprint of plain Parquet) is read from its row groups
(:class:`DirectRows`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from feedline.loader.data.memory_cache import FileLayout, _checked, fill_arrays
from feedline.loader.data.packed_columns import Packing, column_views, gather_packed
from feedline.loader.data.staging.buckets import Buckets
from feedline.loader.data.staging.report import StageReport

__all__ = ["DirectRows", "StagedSession"]


class StagedSession:
    """One epoch's gathers: the next rows of this rank's staged epoch (``handle()`` waits
    for it), checked against the requested row indices; ``upcoming``: the rows left to
    serve (all of them, or fewer after a resume mid-epoch)."""

    def __init__(self, handle: Callable[[], Buckets], report: StageReport, packing: Packing,
                 upcoming: int, layout: FileLayout) -> None:  # fmt: skip
        self._handle, self._report, self._packing = handle, report, packing
        self._upcoming, self._layout = upcoming, layout
        self._cursor: int | None = None
        self._scratch: dict[str, np.ndarray] = {}
        self._direct: DirectRows | None = None

    def gather(self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
               ) -> dict[str, np.ndarray]:  # fmt: skip
        staged = self._handle()
        ids, n = staged.ids, len(indices)
        if self._cursor is None:  # the rows left were counted before or after this request
            left = len(ids) - self._upcoming
            self._cursor = next((at for at in (left, left - n) if _follows(ids, at, indices)),
                                max(0, left))  # fmt: skip
        at = self._cursor
        if n and _follows(ids, at, indices):
            storage, waited = staged.rows(at, n)
            self._report.wait_s += waited
            self._cursor = at + n
            return gather_packed(self._packing, storage, np.arange(n), out,
                                 self._scratch if out else None)  # fmt: skip
        if self._direct is None:  # rows this rank does not read here, in this order
            self._direct = DirectRows(self._layout, self._packing)
        return self._direct.gather(indices, out)


def _follows(ids: np.ndarray, at: int, indices: np.ndarray) -> bool:
    """Whether ``indices`` are the plan's rows from position ``at`` on."""
    return (
        at >= 0
        and at + len(indices) <= len(ids)
        and np.array_equal(ids[at : at + len(indices)], indices)
    )


class DirectRows:
    """Gathers of any rows, read from their row groups (outside a staged epoch's plan: e.g.
    the content fingerprint of plain Parquet)."""

    def __init__(self, layout: FileLayout, packing: Packing) -> None:
        self._layout, self._packing = layout, packing
        self._starts = np.concatenate([[0], np.cumsum(layout.row_group_sizes, dtype=np.int64)])
        self._held: tuple[int, dict[str, np.ndarray]] | None = None

    def _group(self, g: int) -> dict[str, np.ndarray]:
        if self._held is None or self._held[0] != g:
            file_of, local, _ = self._layout.locate()
            rows = int(self._starts[g + 1] - self._starts[g])
            storage = self._packing.allocate(rows)
            f, i = int(file_of[g]), int(local[g])
            where = f"shard {self._layout.files[f].url!r}, row group {i}"
            names = [s.name for s in self._packing.specs]
            parts = _checked(self._layout.iter_read(f, [i], names), rows, where)
            fill_arrays(column_views(self._packing, storage), parts, self._packing.specs, 0, where)
            self._held = (g, storage)
        return self._held[1]

    def gather(self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
               ) -> dict[str, np.ndarray]:  # fmt: skip
        """Rows ``indices`` (any, in any order), one row group at a time."""
        idx = np.asarray(indices, np.int64)
        result = self._packing.allocate(len(idx))
        groups = np.searchsorted(self._starts, idx, side="right") - 1
        for g in np.unique(groups):
            sel = np.flatnonzero(groups == g)
            storage = self._group(int(g))
            for key, values in storage.items():
                result[key][sel] = values[idx[sel] - self._starts[g]]
        return gather_packed(self._packing, result, np.arange(len(idx)), out)
