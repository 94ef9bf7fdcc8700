"""Time-series windows: a sampler over the cache yielding (inputs, targets) windows.

Rows are sorted by ``order_by`` within each series (``by``); window ``w`` starts at a row
``s`` of a series with ``s + size + horizon`` inside it, so no window crosses a series
boundary. The features and targets are stacked once into 2-d arrays; a batch is one
``np.take`` of window starts on a ``sliding_window_view`` (a zero-copy view) of each. Windows
are the loader's samples: the same pure order functions shuffle, shard and resume them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from feedline.errors import ConfigurationError, SchemaError
from feedline.loader.cache import FileLayout, read_table, take_rows
from feedline.loader.columns import ColumnSpec, chunk_to_numpy, column_specs

if TYPE_CHECKING:
    from feedline.dataset import Dataset

__all__ = ["WindowSampler", "Windows"]


def _names(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Windows:
    """Sliding windows over time series, for ``Dataset.loader(windows=...)``.

    Each sample is ``inputs`` (``size`` consecutive rows of ``features``) and ``targets``
    (the next ``horizon`` rows of ``targets``). A batch holds ``inputs`` of shape
    ``(batch, size, len(features))`` and ``targets`` of shape ``(batch, horizon,
    len(targets))``; a single column name instead of a list drops the last axis. Mixed
    feature dtypes are promoted to a common one (``np.result_type``).

    Parameters
    ----------
    size:
        Rows per input window (>= 1).
    horizon:
        Rows per target window, right after the input (>= 0; 0 gives no ``targets``).
    stride:
        Rows between consecutive window starts of a series (>= 1).
    by:
        The series id column; windows never cross from one series into another.
    order_by:
        The time column; rows are sorted by it within each series.
    features:
        Input columns (default: every numeric column but ``by`` and ``order_by``).
    targets:
        Target columns (default: the features).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> ds = fl.from_arrow(pa.table({"t": [2, 0, 1, 3], "v": [20.0, 0.0, 10.0, 30.0]}))
    >>> w = Windows(size=2, horizon=1, order_by="t", features="v")
    >>> batch = next(iter(ds.loader(windows=w, batch_size=2, shuffle=False, format="numpy")))
    >>> batch["inputs"].tolist(), batch["targets"].tolist()
    ([[0.0, 10.0], [10.0, 20.0]], [[20.0], [30.0]])
    """

    size: int
    horizon: int
    stride: int = 1
    by: str | None = None
    order_by: str | None = None
    features: str | Sequence[str] | None = None
    targets: str | Sequence[str] | None = None

    def __post_init__(self) -> None:
        for name, value, low in (("size", self.size, 1), ("horizon", self.horizon, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigurationError(
                    f"Windows: {name} must be an int >= {low}, got {value!r}. Fix: pass "
                    f"{name}={low} or more."
                )
        if not isinstance(self.stride, int) or self.stride < 1:
            raise ConfigurationError(
                f"Windows: stride must be an int >= 1, got {self.stride!r}. Fix: e.g. stride=1."
            )
        for name in ("features", "targets"):
            value = getattr(self, name)
            if value is not None and not _names(value):
                raise ConfigurationError(
                    f"Windows: {name} must name at least one column. Fix: pass a column name, "
                    "a list of them, or None for the default."
                )


def _series_starts(keys: list[np.ndarray], n: int) -> np.ndarray:
    """First row of each run of equal keys (rows already sorted), plus ``n`` at the end."""
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    return np.append(np.flatnonzero(change), n)


def _stack(table: pa.Table, specs: list[ColumnSpec], squeeze: bool) -> np.ndarray:
    """The columns of ``specs`` as one (rows, columns) array, or (rows,) when ``squeeze``."""
    arrays = [
        chunk_to_numpy(table.column(s.name).combine_chunks(), s, "the windows' source")
        for s in specs
    ]
    dtype = np.result_type(*[a.dtype for a in arrays])
    if squeeze:
        return np.ascontiguousarray(arrays[0], dtype=dtype)
    return np.stack(arrays, axis=1).astype(dtype, copy=False)


class WindowSampler:
    """The windows of a dataset held in memory; ``gather(window_ids)`` builds a batch."""

    def __init__(
        self,
        dataset: Dataset,
        windows: Windows,
        *,
        layout: FileLayout | None,
        widen_unsigned: bool,
    ) -> None:
        schema = dataset.schema()
        keys = [c for c in (windows.by, windows.order_by) if c is not None]
        missing = [c for c in keys if schema.get_field_index(c) < 0]
        if missing:
            raise SchemaError(
                f"Windows: column(s) {missing} not in the dataset (columns: {schema.names}). "
                "Fix: check by= / order_by=."
            )
        features = _names(windows.features) or tuple(
            f.name
            for f in schema
            if f.name not in keys and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))
        )
        targets = _names(windows.targets) or features
        self.windows = windows
        self.feature_specs = self._specs(schema, features, widen_unsigned)
        self.target_specs = self._specs(schema, targets, widen_unsigned) if windows.horizon else []
        needed = list(dict.fromkeys([*features, *targets, *keys]))
        table = read_table(dataset, needed, layout)
        if windows.by or windows.order_by:
            sort_keys = [(c, "ascending") for c in keys]
            table = table.take(pc.sort_indices(table, sort_keys=sort_keys))
        table = table.combine_chunks()
        n = table.num_rows
        squeeze_in = isinstance(windows.features, str)
        squeeze_out = squeeze_in if windows.targets is None else isinstance(windows.targets, str)
        self.inputs = _stack(table, self.feature_specs, squeeze_in)
        self.outputs = _stack(table, self.target_specs, squeeze_out) if self.target_specs else None
        by = [np.asarray(table.column(windows.by).to_numpy())] if windows.by else []
        bounds = _series_starts(by, n)
        span = windows.size + windows.horizon
        starts = [
            np.arange(lo, hi - span + 1, windows.stride, dtype=np.int64)
            for lo, hi in itertools.pairwise(bounds)
            if hi - lo >= span
        ]
        self.starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        self.num_series = len(bounds) - 1
        # (rows - size + 1, size, features...) views of the stacked arrays: no copy
        self._input_view = self._view(self.inputs, windows.size)
        self._output_view = (
            self._view(self.outputs, windows.horizon) if self.outputs is not None else None
        )

    @staticmethod
    def _specs(schema: pa.Schema, names: Sequence[str], widen: bool) -> list[ColumnSpec]:
        specs = column_specs(schema, names, widen_unsigned=widen)
        bad = [s.name for s in specs if s.kind != "numeric"]
        if bad:
            raise SchemaError(
                f"Windows: column(s) {bad} are not scalar numeric columns; windows stack scalar "
                "features over time. Fix: pass numeric columns as features= / targets=."
            )
        return specs

    @staticmethod
    def _view(values: np.ndarray, length: int) -> np.ndarray:
        if len(values) < length:
            return np.zeros((0, length, *values.shape[1:]), dtype=values.dtype)
        return np.moveaxis(sliding_window_view(values, length, axis=0), -1, 1)

    @property
    def num_rows(self) -> int:
        """The number of windows (the loader's samples)."""
        return int(self.starts.size)

    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per output key: the shape of one sample and the dtype."""
        out = {"inputs": (self._input_view.shape[1:], self.inputs.dtype)}
        if self._output_view is not None:
            out["targets"] = (self._output_view.shape[1:], self.outputs.dtype)
        return out

    def gather(
        self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Windows ``indices``: ``inputs`` and ``targets``, one take on each view."""
        first = self.starts[indices]
        views = {"inputs": (self._input_view, first)}
        if self._output_view is not None:
            views["targets"] = (self._output_view, first + self.windows.size)
        return {k: take_rows(view, at, out, k) for k, (view, at) in views.items()}
