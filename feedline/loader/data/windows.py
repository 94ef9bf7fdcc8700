"""Time-series windows: a sampler yielding (inputs, targets) windows, gathered per batch.

Rows are sorted by ``order_by`` within each series (``by``); window ``w`` starts at a row
``s`` of a series with ``s + size + horizon`` inside it, so no window crosses a series
boundary. The features (and targets) are packed once, row-major, into one contiguous
``(rows, width)`` array (:mod:`feedline.loader.data.series`), so a window is one contiguous block.

The interface the loader uses is small: :class:`WindowSampler` numbers the windows (the
loader's samples, shuffled, sharded and resumed by the pure functions of
:mod:`feedline.loader.order.sample_order`), :meth:`WindowSampler.window_starts` maps window ids to
start rows (:func:`window_starts`: O(series) memory, not O(windows)), and :func:`gather_windows`
copies only the batch's windows (indexing a strided view of every window with the start
rows): memory is O(data + batch), never the ``(windows, size, width)`` tensor. A batch
indexes :func:`window_blocks`, every window as one opaque item, so each window is one
``memcpy`` (indexing :func:`strided_windows` copies it row by row: ~15% more CPU).

With NumPy, a batch's windows are gathered into fresh arrays, not into the loader's reused
buffers: a strided view indexed by start rows has no ``out=``, so filling a buffer costs
either a second copy or a row-by-row ``np.take`` (one index per time step). Torch batches
gathered on the loop's thread are copied by ``torch.index_select`` into reused buffers
instead (:func:`window_copier`). Measured in the loader
(2,000 series x 5,000 steps x 8 features, window 96 + 8, batch 256, 2 cores), CPU per batch:
fresh arrays 190-202 us, ``np.take`` into reused buffers 235-245 us, fresh arrays copied
into reused buffers 256-440 us. The allocator hands the freed batches' memory straight back.
The fancy-index copy releases the GIL, so the loader may gather a group's batches on several
threads, whole batches each (:mod:`feedline.loader.nodes.gather_threads`).

What bounds it is the random reads from memory, not per-window work: on the 2-core VM the
same gather runs at ~2.3M windows/s over 10M rows but ~11M/s over 4,096 cache-resident rows,
while memcpy bandwidth (13 GB/s, 3,328 bytes a window of 96 + 8 steps of 8 float32) would
allow ~4M/s (``bench/loader.py --case W`` prints these).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, SchemaError
from feedline.loader.data.column_dtypes import with_dtypes
from feedline.loader.data.columns import ColumnSpec, column_specs
from feedline.loader.data.series import load_series
from feedline.loader.data.window_gather import (
    gather_windows,
    strided_windows,
    torch_gather_windows,
    torch_window_blocks,
    window_blocks,
)
from feedline.loader.data.window_runs import WindowRuns

if TYPE_CHECKING:
    from feedline.loader.data.memory_cache import FileLayout
    from feedline.store.shard_source import BatchStream, ShardSource

__all__ = [
    "EpochRuns",
    "WindowSampler",
    "Windows",
    "window_copier",
    "window_counts",
    "window_starts",
]


def _names(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Windows:
    """Sliding windows over time series, for ``Dataset.loader(windows=...)``.

    Each sample is ``inputs`` (``size`` consecutive rows of ``features``) and ``targets``
    (the next ``horizon`` rows of ``targets``). A batch holds ``inputs`` of shape
    ``(batch, size, F)`` and ``targets`` of shape ``(batch, horizon, T)``: the listed columns
    are gathered together, side by side, ``F`` (``T``) being their total width (a scalar
    column takes 1, a packed fixed-shape tensor or fixed-size list column its element count).
    A single column name instead of a list gives that column's own shape: ``(batch, size)``
    for a scalar, ``(batch, size, 8)`` for a packed column of 8 features. Mixed dtypes are
    promoted to a common one (``np.result_type``).

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
        Input columns, scalar numeric or packed (``arrow.fixed_shape_tensor`` / fixed-size
        list) (default: every scalar numeric column but ``by`` and ``order_by``).
    targets:
        Target columns (default: the features).
    contiguous:
        Every batch is ``batch_size`` consecutive windows of one series (``stride`` rows
        apart, in time order) from a random start, for a recurrent model that carries its
        state along the batch. Each epoch the series are cut into such runs from a random
        offset and the runs shuffled (see :mod:`feedline.loader.data.window_runs`); the fewer
        than ``batch_size`` windows left over at a series' ends sit that epoch out.
    stream_batches:
        Truncated back-propagation through time: every batch holds ``batch_size`` streams,
        and row ``i`` of batch ``b + 1`` is the window right after row ``i`` of batch ``b``
        (the next ``stride`` rows; ``stride=size`` makes the inputs follow on exactly), for
        ``stream_batches`` batches; then every row starts a new stream from a random start
        (reset the state when ``batch % stream_batches == 0``, counting the epoch's batches).
        Streams are dealt to the ranks whole. Not with ``contiguous``.

    Both are deterministic from ``(seed, epoch, rank, world_size)``, sharded equally and
    resumed exactly like plain windows; a resume keeps the checkpoint's ``batch_size``
    (and, with ``stream_batches``, its ``world_size``). For evaluation use plain windows
    (every window once).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> ds = fl.from_arrow(pa.table({"t": [2, 0, 1, 3], "v": [20.0, 0.0, 10.0, 30.0]}))
    >>> w = Windows(size=2, horizon=1, order_by="t", features="v")
    >>> batch = next(iter(ds.loader(windows=w, batch_size=2, shuffle=False, format="numpy")))
    >>> batch["inputs"].tolist(), batch["targets"].tolist()
    ([[0.0, 10.0], [10.0, 20.0]], [[20.0], [30.0]])

    Several feature columns come as one ``(batch, size, F)`` tensor:

    >>> ds = fl.from_arrow(pa.table({"a": [0.0, 1.0, 2.0], "b": [5.0, 6.0, 7.0]}))
    >>> w = Windows(size=2, horizon=1, features=["a", "b"], targets="b")
    >>> batch = next(iter(ds.loader(windows=w, batch_size=1, format="numpy")))
    >>> batch["inputs"].shape, batch["targets"].tolist()
    ((1, 2, 2), [[7.0]])

    A recurrent model's batches: consecutive windows from a random start.

    >>> ds = fl.from_arrow(pa.table({"v": np.arange(20.0)}))
    >>> w = Windows(size=3, horizon=1, features="v", contiguous=True)
    >>> batch = next(iter(ds.loader(windows=w, batch_size=4, seed=0, format="numpy")))
    >>> bool((np.diff(batch["inputs"][:, 0]) == 1).all())
    True
    """

    size: int
    horizon: int
    stride: int = 1
    by: str | None = None
    order_by: str | None = None
    features: str | Sequence[str] | None = None
    targets: str | Sequence[str] | None = None
    contiguous: bool = False
    stream_batches: int | None = None

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
        if not isinstance(self.contiguous, bool | np.bool_):
            raise ConfigurationError(
                f"Windows: contiguous must be True or False, got {self.contiguous!r}. Fix: "
                "contiguous=True for batches of consecutive windows."
            )
        k = self.stream_batches
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise ConfigurationError(
                f"Windows: stream_batches must be an int >= 1 or None, got {k!r}. Fix: e.g. "
                "stream_batches=8 (each stream goes on for 8 batches)."
            )
        if k is not None and self.contiguous:
            raise ConfigurationError(
                "Windows: contiguous=True and stream_batches= are two layouts of consecutive "
                "windows (along a batch, or along the rows of successive batches). Fix: pass "
                "one of them."
            )
        for name in ("features", "targets"):
            value = getattr(self, name)
            if value is not None and not _names(value):
                raise ConfigurationError(
                    f"Windows: {name} must name at least one column. Fix: pass a column name, "
                    "a list of them, or None for the default."
                )


def window_copier(fmt: str, prefetch: int) -> str:
    """What copies a loader's window batches: ``"torch"`` or ``"numpy"`` (see
    :class:`WindowSampler`).

    ``"torch"`` (``index_select`` into reused buffers, split across torch's intra-op
    threads) only for torch batches gathered on the training loop's own thread
    (``prefetch=0``). From the prefetch thread it runs a second OpenMP team beside the loop's:
    measured on the 2-core VM (case W, 3 x 3,000 batches, the loop having run a torch op), the
    prefetch thread gave 1.13-1.50M windows/s with it against 1.43-1.78M with NumPy's copy into
    fresh arrays; on the loop's thread 2.1-2.5M against 1.7-1.8M. That holds while the other
    CPUs are idle: when other processes keep them busy each call waits for all of torch's
    threads to be scheduled, and ``prefetch=0`` fell to 19k-450k windows/s against 0.9-2.9M
    with the default prefetch (``bench/thread_workers.py``, issue 24).

    Examples
    --------
    >>> window_copier("torch", prefetch=0), window_copier("torch", prefetch=2)
    ('torch', 'numpy')
    """
    return "torch" if fmt == "torch" and prefetch == 0 else "numpy"


def window_counts(bounds: np.ndarray, span: int, stride: int) -> np.ndarray:
    """Windows of ``span`` rows each series holds: ``bounds`` are the series' first rows + end.

    Examples
    --------
    >>> window_counts(np.array([0, 10, 12, 20]), span=3, stride=2).tolist()
    [4, 0, 3]
    """
    lengths = np.diff(np.asarray(bounds, dtype=np.int64))
    return np.where(lengths >= span, (lengths - span) // stride + 1, 0)


def window_starts(
    ids: np.ndarray, bounds: np.ndarray, first_ids: np.ndarray, stride: int
) -> np.ndarray:
    """The first row of windows ``ids``; window ids run series after series.

    ``first_ids[k]`` is the id of series ``k``'s first window (``[0, *cumsum(counts)]``,
    one entry per series and the total at the end); a series with no window takes no id.

    Examples
    --------
    >>> bounds, counts = np.array([0, 10, 12, 20]), np.array([4, 0, 3])
    >>> first_ids = np.concatenate([[0], np.cumsum(counts)])
    >>> window_starts(np.array([0, 3, 4, 6]), bounds, first_ids, stride=2).tolist()
    [0, 6, 12, 16]
    """
    ids = np.asarray(ids, dtype=np.int64)
    series = np.searchsorted(first_ids, ids, side="right") - 1
    return bounds[series] + (ids - first_ids[series]) * stride


class WindowSampler:
    """The windows of a dataset held in memory: ids to start rows, and batches gathered.

    The features (and the targets, when they differ) are packed row-major, sorted by
    ``(by, order_by)`` (see :mod:`feedline.loader.data.series`). Window ids run series after
    series, in time order; the loader shuffles, shards and resumes them with the pure order
    functions of :mod:`feedline.loader.order.sample_order` over ``[num_rows]`` samples. A batch is
    :meth:`gather` of its ids: memory is the data plus the batches, never every window.
    ``copier="numpy"``: a batch's windows go into fresh arrays (``fills_buffers`` is
    ``False``); ``"torch"`` (the loader's choice for torch batches): ``torch.index_select``
    copies them into the loader's reused buffers, in one call split across torch's threads
    (see :mod:`feedline.loader.data.window_gather`). The same windows either way.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.store.shard_source import BatchStream
    >>> v = [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    >>> source = BatchStream.from_table(pa.table({"s": [0, 0, 0, 1, 1, 1], "v": v}))
    >>> sampler = WindowSampler(source, Windows(2, 1, by="s", features="v"), layout=None,
    ...                         widen_unsigned=False)
    >>> sampler.num_rows, sampler.window_starts(np.array([0, 1])).tolist()
    (2, [0, 3])
    >>> batch = sampler.gather(np.array([1, 0]))
    >>> batch["inputs"].tolist(), batch["targets"].tolist()
    ([[10.0, 11.0], [0.0, 1.0]], [[12.0], [2.0]])
    """

    #: whether the loader's gather passes reused buffers (``copier="torch"``) or none
    fills_buffers = False
    #: :meth:`gather` only reads shared state: the loader may split a group's batches across
    #: threads (the fancy-index copy releases the GIL; see loader.nodes.gather_threads)
    thread_safe_gather = True

    def __init__(
        self,
        dataset: ShardSource | BatchStream,
        windows: Windows,
        *,
        layout: FileLayout | None,
        widen_unsigned: bool,
        dtype: Any = None,
        copier: str = "numpy",
        batch_size: int = 1,
        world_size: int = 1,
    ) -> None:
        if copier not in ("numpy", "torch"):
            raise ConfigurationError(
                f"WindowSampler: copier={copier!r}; it is 'numpy' or 'torch'. Fix: pass one."
            )
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
        if not features:
            raise SchemaError(
                f"Windows: no numeric feature column besides by= / order_by= (columns: "
                f"{schema.names}). Fix: pass features= naming the input columns."
            )
        targets = _names(windows.targets) or features
        self.windows = windows
        self.feature_specs = self._specs(schema, features, widen_unsigned, dtype)
        self.target_specs = (
            self._specs(schema, targets, widen_unsigned, dtype) if windows.horizon else []
        )
        if isinstance(dtype, Mapping):  # every named column is a feature or a target
            with_dtypes(column_specs(schema, [*features, *targets]), dtype)
        blocks = {"inputs": self.feature_specs}
        if self.target_specs:
            blocks["targets"] = self.target_specs
        series = load_series(dataset, blocks, by=windows.by, order_by=windows.order_by,
                             layout=layout)  # fmt: skip
        single_out = windows.features if windows.targets is None else windows.targets
        #: per key: the packed (rows, width) array reshaped to one time step per row
        self.arrays = {
            "inputs": self._step_view(series.arrays["inputs"], self.feature_specs,
                                      isinstance(windows.features, str)),
        }  # fmt: skip
        if self.target_specs:
            self.arrays["targets"] = self._step_view(
                series.arrays["targets"], self.target_specs, isinstance(single_out, str)
            )
        lengths = {"inputs": windows.size, "targets": windows.horizon}
        #: per key: every window as a strided view (made once: a batch only indexes it)
        self._views = {k: strided_windows(a, lengths[k]) for k, a in self.arrays.items()}
        #: per key: every window as one opaque item (what a batch indexes; see window_blocks)
        self._blocks = {k: window_blocks(a, lengths[k]) for k, a in self.arrays.items()}
        #: per key: every window as a row of bytes of a torch view (``copier="torch"``)
        self._torch_blocks = {
            k: torch_window_blocks(a, lengths[k]) for k, a in self.arrays.items()
        } if copier == "torch" else {}  # fmt: skip
        self.fills_buffers = copier == "torch"
        self.nbytes, self.resorted = series.nbytes, series.resorted
        self.num_series = len(series.bounds) - 1
        counts = window_counts(series.bounds, windows.size + windows.horizon, windows.stride)
        #: series k starts at row bounds[k]; its first window has id first_ids[k]
        self.bounds = series.bounds[:-1]
        self.first_ids = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        #: window w of series k starts at row w * stride + _offsets[k]
        self._offsets = self.bounds - self.first_ids[:-1] * windows.stride
        #: windows per series when every series has as many (then w's series is w // it)
        self._per_series = int(counts[0]) if len(counts) and counts[0] and (
            counts == counts[0]).all() else None  # fmt: skip
        #: contiguous windows: the loader's samples are positions, mapped to windows per epoch
        self.runs: WindowRuns | None = None
        self.layout = (int(world_size), int(batch_size))
        if windows.contiguous:
            self.runs = WindowRuns(counts, batch_size)
        elif windows.stream_batches is not None:
            self.runs = WindowRuns(counts, windows.stream_batches, world_size * batch_size)

    @staticmethod
    def _specs(
        schema: pa.Schema, names: Sequence[str], widen: bool, dtype: Any = None
    ) -> list[ColumnSpec]:
        specs = column_specs(schema, names, widen_unsigned=widen)
        bad = [s.name for s in specs if s.kind not in ("numeric", "tensor")]
        if bad:
            raise SchemaError(
                f"Windows: column(s) {bad} are not numeric columns; windows stack numeric "
                "features (scalars or fixed-shape tensors) over time. Fix: pass numeric columns "
                "as features= / targets=."
            )
        if isinstance(dtype, Mapping):  # the names of this block only (all checked above)
            dtype = {k: v for k, v in dtype.items() if k in names} or None
        return with_dtypes(specs, dtype, torch=widen)[0]

    @staticmethod
    def _step_view(packed: np.ndarray, specs: list[ColumnSpec], single: bool) -> np.ndarray:
        """One time step per row: a single column keeps its own shape, several are packed."""
        if single:
            return packed.reshape(len(packed), *specs[0].shape)
        return packed

    @property
    def num_rows(self) -> int:
        """The number of windows."""
        return int(self.first_ids[-1])

    @property
    def num_samples(self) -> int:
        """The loader's samples per epoch: the windows, or with ``contiguous`` /
        ``stream_batches`` the positions that runs of windows fill (see :attr:`arranged`)."""
        return self.num_rows if self.runs is None else self.runs.num_samples

    @property
    def arranged(self) -> bool:
        """Whether the loader's samples are positions this sampler maps to windows itself,
        epoch by epoch (``contiguous`` / ``stream_batches``): the loader then orders them
        sequentially and this sampler shuffles (:meth:`session`)."""
        return self.runs is not None

    def session(self, *, shuffle: bool, seed: int, epoch: int) -> Any:
        """What serves one epoch's batches: this sampler, or for contiguous windows an
        :class:`EpochRuns` mapping the loader's positions to that epoch's windows."""
        if self.runs is None:
            return self
        return EpochRuns(self, self.runs.epoch(shuffle=shuffle, seed=seed, epoch=epoch))

    def check_states(self, states: Sequence[Any]) -> None:
        """Refuse checkpoints taken with another run layout (contiguous windows only): the
        positions of another ``batch_size`` (or, for streams, ``world_size``) are other
        windows.

        ``states`` are parsed loader states (:func:`~feedline.loader.order.state.parse_states`).
        """
        if self.runs is None:
            return
        world, batch = self.layout
        streams = self.windows.stream_batches is not None
        for state in states:
            layouts = [(state.world_size, state.batch_size)] + [
                (seg.world_size, seg.batch_size) for seg in state.history]  # fmt: skip
            for old_world, old_batch in layouts:
                if old_batch != batch or (streams and old_world != world):
                    what = "world_size and batch_size" if streams else "batch_size"
                    raise ConfigurationError(
                        f"Loader state: windows with "
                        f"{'stream_batches' if streams else 'contiguous=True'} resume only "
                        f"with the checkpoint's {what} (it was taken with world_size="
                        f"{old_world}, batch_size={old_batch}; this loader has world_size="
                        f"{world}, batch_size={batch}): the runs of windows are cut to the "
                        f"batches. Fix: build the loader with the checkpoint's {what}, or "
                        "start the epoch over without the state."
                    )

    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per output key: the shape of one sample and the dtype."""
        lengths = {"inputs": self.windows.size, "targets": self.windows.horizon}
        return {k: ((lengths[k], *a.shape[1:]), a.dtype) for k, a in self.arrays.items()}

    def describe(self) -> dict[str, int | bool]:
        """``num_series``, ``num_windows`` and ``rows_resorted`` (the rows were not stored in
        time order)."""
        return {"num_series": self.num_series, "num_windows": self.num_rows,
                "rows_resorted": self.resorted}  # fmt: skip

    def window_starts(self, ids: np.ndarray) -> np.ndarray:
        """The first row (in the sorted, packed arrays) of windows ``ids``.

        The same rows as :func:`window_starts`, in fewer NumPy calls (one per batch counts:
        a batch's gather is ~100 us): a division instead of the binary search when every
        series has as many windows.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if self._per_series is not None:
            series = ids // self._per_series
        else:
            series = self.first_ids.searchsorted(ids, side="right") - 1
        return ids * self.windows.stride + self._offsets[series]

    def gather(
        self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Windows ``indices``: ``inputs`` and ``targets``, in fresh arrays (see the module
        docstring), or into ``out`` where it has the key."""
        first = self.window_starts(indices)
        got = {}
        for key, view in self._views.items():
            at = first if key == "inputs" else first + self.windows.size
            buffer = out.get(key) if out else None
            if buffer is not None and key in self._torch_blocks:
                got[key] = torch_gather_windows(self._torch_blocks[key], at, buffer)
            elif buffer is None:  # one memcpy per window (see window_blocks), typed back
                values = self.arrays[key]
                got[key] = (
                    self._blocks[key][at].view(values.dtype).reshape(len(at), *view.shape[1:])
                )
            else:
                got[key] = gather_windows(self.arrays[key], at, view.shape[1], buffer)
        return got


class EpochRuns:
    """One epoch of contiguous windows: the loader's positions gathered as their windows.

    Made by :meth:`WindowSampler.session`; ``plan`` is the epoch's run order and offsets
    (:meth:`~feedline.loader.data.window_runs.WindowRuns.epoch`), drawn once per epoch.
    """

    #: reads shared state only (see WindowSampler.thread_safe_gather)
    thread_safe_gather = True

    def __init__(self, sampler: WindowSampler, plan: tuple[np.ndarray, np.ndarray]) -> None:
        assert sampler.runs is not None  # made for contiguous windows only
        self.sampler, self.runs, self.plan = sampler, sampler.runs, plan
        self.fills_buffers = sampler.fills_buffers

    def window_ids(self, positions: np.ndarray) -> np.ndarray:
        """The windows at the loader's ``positions`` this epoch."""
        return self.runs.windows(positions, self.plan)

    def gather(
        self, indices: np.ndarray, out: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """The windows at positions ``indices`` (see :meth:`WindowSampler.gather`)."""
        return self.sampler.gather(self.window_ids(indices), out)
