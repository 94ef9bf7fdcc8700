"""The training loader: exact shuffling, equal shards per rank, prefetch and exact resume.

Which rows each rank reads, in which order, is a pure function (:mod:`feedline.loader.order.sample_order`)
of (row-group sizes, seed, epoch, rank, world size); the data path only gathers them. The
requested columns are cached as NumPy arrays when they fit ``memory_budget`` (exact global
permutation); otherwise row groups stream pool by pool (two-level shuffle, memory bounded by
``shuffle_window``). A background thread keeps ``prefetch`` batches ready (small batches in
groups of about 1 MiB, gathered with one take into reused buffers).

The loader is a façade over a pipeline of nodes (:mod:`feedline.loader.nodes`): order →
gather → map (``transform=``, in thread or process workers) → format → pin → prefetch →
device. :meth:`Loader.source_node` starts a pipeline of your own.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.adapters.formats import FORMATS, can_pin
from feedline.loader.adapters.torch import distributed_defaults
from feedline.loader.checkpoints import LoaderCheckpoints
from feedline.loader.data.backend import Backend, as_source, open_backend
from feedline.loader.data.columns import parse_budget
from feedline.loader.data.shard_cache import default_cache_dir
from feedline.loader.data.windows import Windows, window_copier
from feedline.loader.nodes.base import Node
from feedline.loader.nodes.gather import Gather
from feedline.loader.nodes.indices import Order
from feedline.loader.nodes.skips import Skips
from feedline.loader.nodes.worker_pools import make_workers
from feedline.loader.order.ahead import OrderAhead
from feedline.loader.order.epochs import LoaderEpochs, int_option
from feedline.loader.order.sample_order import EpochPlan
from feedline.loader.pipeline import default_pipeline, group_size
from feedline.loader.timing import Timing
from feedline.loader.views import LoaderViews
from feedline.tracking import EpochLogger

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.store.shard_source import BatchStream, ShardSource

__all__ = ["Loader"]

CACHES = ("auto", "memory", "node", "none")


class Loader(LoaderEpochs, LoaderCheckpoints, LoaderViews):
    """Batches of a dataset for a training loop (see ``Dataset.loader``).

    Parameters
    ----------
    dataset:
        A :class:`~feedline.dataset.dataset.Dataset` (best: ``fl.open(path)`` of a written dataset), a
        path to open, or a :class:`~feedline.store.shard_source.ShardSource`.
    batch_size:
        Samples per batch on each rank.
    shuffle, seed:
        Shuffle every epoch (the training default); the order depends only on ``(seed,
        epoch)``. ``seed=None`` means 0, or the checkpoint's seed after
        :meth:`load_state_dict`; an explicit seed must match the checkpoint's.
    rank, world_size:
        This process's rank and the number of processes; ranks get disjoint, equally many
        batches that together cover the epoch. ``None`` (default): ``torch.distributed``'s
        rank and world size when it is initialized, else 0 and 1.
    drop_last:
        ``True`` drops the remainder (< ``world_size * batch_size`` samples); ``False`` keeps
        every sample: each rank's last batch is short (the last step's samples fill the
        ranks' last batches in rank order, so a later rank's may be shorter or empty) and
        every rank still yields ``len(loader)`` batches. ``None`` (default): ``True`` when
        shuffling (training: a different remainder each epoch), ``False`` with
        ``shuffle=False`` (evaluation: every sample, once). Evaluate with ``shuffle=False``.
    pad_last:
        With ``drop_last=False``: fill the last batches to ``batch_size`` by repeating
        samples from the start of the epoch instead (full batches on every rank; the repeats
        are marked in ``"_padded"`` with ``return_padding_mask=True``, which implies it).
    columns:
        Columns to load (default all). String columns need ``strings="list"`` (or a
        ``transform``).
    cache:
        ``"memory"`` loads the columns into NumPy arrays (exact permutation), ``"none"``
        streams row groups (two-level shuffle), ``"auto"`` caches when the estimate from the
        schema and row count fits ``memory_budget``. ``"node"``: one cache per machine, a
        file under ``<cache_dir>/node`` (default ``~/.cache/feedline/node``) that the first
        loader process fills once (verified as it reads) and every loader process of the node
        memory-maps read-only: 8 ranks hold one copy (the page cache's), a restarted job starts
        at once, the permutation stays exact, and data larger than RAM is paged by the OS
        (random reads from disk: slower than a memory cache when it does not fit). Works
        across separately started processes (torchrun, ``torch.multiprocessing``, Ray Train);
        numbers and tensors only; needs a written dataset. ``"auto"`` picks ``"node"`` when
        ``world_size > 1`` and those hold, for an estimate of 64 MiB up to ``memory_budget``.
        See :mod:`feedline.loader.data.node_cache`.
    prefetch:
        Batches a background thread keeps ready (at least). It gathers them in groups with one
        take per column (the batches are views of it): ``prefetch`` batches, or as many as make
        about 1 MiB when cached batches are small, at most 64. 0 gathers in the calling thread,
        one batch at a time.
    format:
        ``"torch"`` (dict of ``torch.Tensor`` via ``torch.from_numpy``), ``"numpy"`` or ``"tf"``.
        Dtypes: bool → ``torch.bool``; ints and floats kept; uint16/uint32 widened to
        int32/int64 for torch, uint64 refused (see :mod:`feedline.loader.data.columns`).
    pin_memory:
        Gather into page-locked tensors (``format="torch"``; ignored with a warning when no
        CUDA device is present).
    shuffle_window:
        Row groups per pool of the two-level shuffle. Default: exact permutation when cached,
        as many groups as fit a third of ``memory_budget`` when streaming.
    memory_budget:
        Bytes (or ``"2GB"``) the loader may hold.
    windows:
        A :class:`~feedline.loader.data.windows.Windows` to yield time-series windows instead of rows.
    strings:
        ``"raise"`` (default) refuses string columns; ``"list"`` yields them as Python lists.
    return_padding_mask:
        Add a ``"_padded"`` boolean key, True where a sample repeats one to pad the epoch.
    cache_dir, cache_limit:
        Remote shards (any non-local URL, e.g. ``s3://``) are downloaded ahead of use into
        the shard cache folder ``cache_dir`` (default ``~/.cache/feedline/shards``; shared
        safely by the processes of a node and across datasets: files are named by checksum),
        checked against the manifest's size and sha256 (once per loader), and read from
        there; ``cache_limit`` (bytes or ``"20GB"``) caps the folder by evicting the least
        recently used shards that no reader holds. ``cache_dir=False`` reads remote shards
        directly. Local datasets are never copied. See :mod:`feedline.loader.data.shard_cache`.
        ``cache="node"`` files go in ``<cache_dir>/node`` (``~/.cache/feedline/node`` when
        ``cache_dir`` is the default or ``False``); point it at a local disk with room.
    track:
        ``True`` logs :meth:`metrics` (``loader/samples_per_s``, ``loader/data_wait_fraction``,
        ``loader/batches``, ``loader/samples``, ``loader/seconds``) to the MLflow run active
        when the loader is created, with ``step=epoch``, each time an epoch completes; a run
        id logs to that run instead. Needs ``feedline[mlflow]``; see :mod:`feedline.tracking`.
    stack:
        ``{"features": ["a", "b", ...]}``: one ``(batch, F)`` array per key of those numeric
        columns side by side (``F`` = their total width; a tensor column adds its element
        count), held in their common dtype; the columns leave the batch dict unless
        ``columns=`` names them (then they come as views of the stack). Scalar columns of one
        dtype are held row-major in one block either way: a batch is one take per block.
    dtype:
        Convert as the cache fills: one dtype for every column of its family (``np.float32``
        turns float64 features into float32 and keeps an int64 label), or
        ``{column or stack: dtype}``.
    transform, batched:
        ``fn(sample: dict, rng: np.random.Generator) -> dict`` applied to every sample, or
        with ``batched=True`` ``fn(batch: dict, rngs) -> dict`` to every batch
        (:class:`~feedline.loader.nodes.Map`); ``rng`` is seeded by ``(seed, epoch, row
        index)`` (:func:`~feedline.loader.order.rng.sample_rng`): augmentation differs per epoch,
        repeats on a re-run and on an exact resume, whatever the workers. Results are stacked
        per batch (arrays of one shape, numbers; other values as lists). String and binary
        columns reach it as Python values (``strings="list"`` implied). A
        :class:`~feedline.preprocess.vision.augment.Skipped` result (e.g. an undecodable image under
        ``on_error="skip"``, see :class:`~feedline.loader.transforms.ImageTransform`) drops
        that sample: its batch is shorter (never refilled, so resume stays exact and every
        rank keeps ``len(loader)`` batches), and it is counted in :meth:`stats` and
        :meth:`metrics`.
    num_workers, worker_type:
        Run ``transform`` in ``num_workers`` ``"thread"`` workers (GIL-releasing work:
        Pillow decode, NumPy, tokenizers) or ``"process"`` workers (Python-heavy work; the
        transform must be importable, outputs come back through shared memory); 0 runs it
        in the prefetch thread. Workers start once per loader and stop on :meth:`close`,
        garbage collection or exit; batches come out in order regardless of worker timing.
    device:
        Move each batch to this torch device (``"cuda"``, ``"cuda:1"``) with
        ``non_blocking=True`` on a side CUDA stream, one batch ahead (pair with
        ``pin_memory=True``); ``None`` or a CPU device leaves batches where they are.
    shapes, ragged, pad_value:
        List columns (``list`` / ``large_list`` / ``fixed_size_list`` of numbers, nested or
        not, as Spark's ``ArrayType`` and pyarrow write arrays) load as tensors:
        ``shapes={"image": (3, 64, 64)}`` gives a column's per-sample shape, else it is
        that of the first row. Every row is checked as it loads; a row of another length
        or a null row raises :class:`~feedline.errors.DataError` naming it, unless
        ``ragged`` (one policy or ``{column: policy}``) is ``"pad"`` (short and null rows
        filled with ``pad_value``), ``"truncate"`` (long rows cut) or ``"pad_or_truncate"``
        (both; these need the shape in ``shapes``). See :mod:`feedline.arrow.list_tensors`.

    Notes
    -----
    Evaluation: ``loader(batch_size=..., shuffle=False)`` (``drop_last`` then defaults to
    ``False``): every sample once, in stored order, a short last batch.

    Examples
    --------
    >>> import feedline as fl
    >>> loader = fl.range(10).loader(batch_size=4, format="numpy", seed=1)
    >>> len(loader), [b["id"].shape for b in loader]
    (2, [(4,), (4,)])
    >>> evaluation = fl.range(10).loader(batch_size=4, shuffle=False, format="numpy")
    >>> [b["id"].tolist() for b in evaluation]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    def __init__(
        self,
        dataset: Dataset | ShardSource | str | os.PathLike[str],
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool | None = None,
        columns: Sequence[str] | None = None,
        cache: str = "auto",
        prefetch: int = 2,
        format: str = "torch",  # noqa: A002 - the documented public name
        pin_memory: bool = False,
        shuffle_window: int | None = None,
        memory_budget: int | str = "2GB",
        windows: Windows | None = None,
        *,
        strings: str = "raise",
        return_padding_mask: bool = False,
        track: bool | str = False,
        cache_dir: str | os.PathLike[str] | bool | None = None,
        cache_limit: int | str = "20GB",
        stack: Mapping[str, Sequence[str]] | None = None,
        dtype: Any = None,
        pad_last: bool = False,
        transform: Callable[..., Any] | None = None,
        batched: bool = False,
        num_workers: int = 0,
        worker_type: str = "thread",
        device: Any = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        ragged: str | Mapping[str, str] = "raise",
        pad_value: float = 0,
    ) -> None:
        if isinstance(dataset, str | os.PathLike):  # opened now: a wrong path fails here
            dataset = as_source(dataset)
        self.batch_size = int_option("batch_size", batch_size, 1)
        self._seed_given = seed is not None
        self.seed = 0 if seed is None else int_option("seed", seed, 0)
        rank, world_size = distributed_defaults(rank, world_size)
        self.world_size = int_option("world_size", world_size, 1)
        self.rank, self.prefetch = int_option("rank", rank, 0), int_option("prefetch", prefetch, 0)
        if self.rank >= self.world_size:
            raise ConfigurationError(
                f"Loader: rank={rank} is out of range for world_size={world_size}. Fix: pass "
                "torch.distributed.get_rank() and get_world_size()."
            )
        if format not in FORMATS or cache not in CACHES:
            raise ConfigurationError(
                f"Loader: format={format!r} / cache={cache!r}; format is one of {FORMATS}, cache "
                f"one of {CACHES}. Fix: pass one of those values."
            )
        if shuffle_window is not None:
            shuffle_window = int_option("shuffle_window", shuffle_window, 1)
        if windows is not None and (columns is not None or not isinstance(windows, Windows)):
            raise ConfigurationError(
                "Loader: windows= takes a fl.Windows(...) and picks its own columns "
                "(features=/targets=). Fix: drop columns= or pass a Windows."
            )
        if isinstance(columns, str):
            columns = [columns]
        self.dataset, self.shuffle = dataset, bool(shuffle)
        self.drop_last = self.shuffle if drop_last is None else bool(drop_last)
        self.columns, self.cache, self.format = columns, cache, format
        self.memory_budget = parse_budget(memory_budget)
        self.return_padding_mask = bool(return_padding_mask)
        self.pad_last = bool(pad_last) or self.return_padding_mask
        self.pin_memory = bool(pin_memory) and can_pin(format, stacklevel=5)
        self.transform, self.batched = transform, bool(batched)
        self.num_workers, self.worker_type = num_workers, worker_type
        self._workers = self._make_workers()
        if transform is not None and strings == "raise":
            strings = "list"  # the transform gets string and binary values (e.g. encoded images)
        self.windows, self.strings = windows, strings
        self.device = self._check_device(device)
        if cache_dir is True or cache_dir is None:
            cache_dir = default_cache_dir()
        elif cache_dir is not False and not os.fspath(cache_dir):
            raise ConfigurationError(
                "Loader: cache_dir='' names no folder. Fix: pass a folder for the shard cache, "
                "None for the default (~/.cache/feedline/shards) or False to read remote "
                "shards directly."
            )
        self.cache_dir = cache_dir or None
        self.cache_limit = parse_budget(cache_limit)
        self._requested_window = shuffle_window
        self._epoch, self._consumed, self._segments, self._restored = 0, 0, (), False
        self._backend: Backend | None = None
        self._resolved: ShardSource | BatchStream | None = None
        self.stack, self.dtype = stack, dtype
        self.lists = {"shapes": shapes, "ragged": ragged, "pad_value": pad_value}
        self._plan_cache: tuple[Any, EpochPlan] | None = None
        self._order_ahead: OrderAhead | None = None
        self._active: weakref.ref | None = None
        self._token: object = None
        self._timing = Timing(self.batch_size)
        self._skips = Skips()
        self._tracker = None
        if track is not False:
            self._tracker = EpochLogger(track)

    def _source(self) -> ShardSource | BatchStream:
        """What this loader reads (see :func:`~feedline.loader.data.backend.as_source`), once."""
        if self._resolved is None:
            self._resolved = as_source(self.dataset)
        return self._resolved

    def _prepare(self) -> Backend:
        """Decide cache or stream, and load the cache (once, on first need)."""
        if self._backend is None:
            self._backend = open_backend(
                self._source(), columns=self.columns, windows=self.windows, cache=self.cache,
                strings=self.strings, widen_unsigned=self.format == "torch",
                budget=self.memory_budget, window=self._requested_window,
                cache_dir=self.cache_dir, cache_limit=self.cache_limit, stack=self.stack,
                dtype=self.dtype, **self.lists, world_size=self.world_size,
                node_dir=self.cache_dir,
                window_copier=window_copier(self.format, self.prefetch),
            )  # fmt: skip
        return self._backend

    def _shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: the shape of one sample and its dtype."""
        shapes = self._prepare().shapes()
        if self.return_padding_mask:
            shapes["_padded"] = ((), np.dtype(bool))
        return shapes

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Batches of the current epoch from the loader's position.

        The position only moves forward: an iteration abandoned part-way (``break``) is
        continued by the next one, and iterating a complete epoch starts the next epoch (as
        ``set_epoch(epoch + 1)`` would), so a forgotten ``set_epoch`` never repeats an order.
        """
        return self._iterate(self.format)

    def _iterate(self, fmt: str) -> Iterator[dict[str, Any]]:
        asked = time.perf_counter()  # the caller waits from here (the first call loads the cache)
        self._timing.begin(asked)
        self._close_active()
        if self._workers is not None:
            self._workers.start()  # processes start while the cache loads
        plan = self._position()
        self._token = token = object()
        node = self._pipeline(fmt)
        gen = self._consume(node, plan, self._consumed, self._epoch, token, asked)
        self._active = weakref.ref(gen)
        return gen

    def _close_active(self) -> None:
        gen = self._active() if self._active is not None else None
        self._active, self._token = None, None
        if gen is not None:
            gen.close()

    def source_node(self) -> Node:
        """Order and gather over this loader's data, at its position: a pipeline's start.

        Wrap it in nodes of your own (:mod:`feedline.loader.nodes`); its state and
        ``reset(state)`` are exact (``{"epoch": e, "batch": k}``), and ``reset`` to another
        epoch follows this loader's order for that epoch.

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(5).loader(batch_size=2, shuffle=False)
        >>> [b.data["id"].tolist() for b in loader.source_node()]
        [[0, 1], [2, 3], [4]]
        """
        self._position()
        order = Order(self._plan, epoch=self._epoch, batch=self._consumed)
        return Gather(order, self._prepare(), shuffle=self.shuffle, seed=self.seed)

    def _pipeline(self, fmt: str) -> Node:
        """The default pipeline from the loader's position (:mod:`feedline.loader.pipeline`)."""
        backend = self._prepare()
        group = group_size(backend, self._shapes(), self.batch_size, self.prefetch)
        order = Order(self._plan, epoch=self._epoch, batch=self._consumed, ahead=self._draw_ahead)
        return default_pipeline(
            order, backend,
            shuffle=self.shuffle, seed=self.seed, fmt=fmt, group=group, transform=self.transform,
            batched=self.batched, workers=self._workers, padding_mask=self.return_padding_mask,
            pin=self.pin_memory, prefetch=self.prefetch, device=self.device,
        )  # fmt: skip

    def _consume(self, node: Node, plan: EpochPlan, start: int, epoch: int, token: object,
                 asked: float):  # fmt: skip
        # raw clock readings per batch (see feedline.loader.timing): asked, got, previous got
        timing, clock, got, tail = self._timing, time.perf_counter, None, None
        run, append = timing.start_run(epoch, reset=start == 0), timing.rows.append
        pull, limit, size = node.next, timing.limit, self.batch_size
        try:
            while True:
                try:
                    item = pull()
                except StopIteration:
                    break
                if len(timing.rows) > limit:
                    timing.trim()
                k = item.number
                if self._token is token:  # counted here, at the consumer: exact resume
                    self._consumed, self._restored = k + 1, False
                if len(item.indices) != size:  # a short batch (the last, or with skips)
                    timing.short(run, k, size - len(item.indices))
                    self._skips.add(epoch, item.skipped)
                now = clock()
                append((run, k, asked, now, got))
                got = now
                yield item.data
                asked = clock()
            tail = None if got is None else asked - got  # the step after the last batch
        finally:
            node.close()
            last = timing.end_run(run, tail)
            if self._tracker is not None and last + 1 == plan.num_batches:
                self._tracker.log_epoch(timing.metrics_of(epoch))

    def _make_workers(self) -> Any:
        """The transform's worker pool (started on first use, closed with the loader)."""
        if self.transform is None:
            return None
        if not callable(self.transform):
            raise ConfigurationError(
                f"Loader: transform={self.transform!r} is not callable. Fix: pass fn(sample, "
                "rng) -> dict (or fn(batch, rngs) -> dict with batched=True)."
            )
        workers = make_workers(self.transform, self.num_workers, self.worker_type)
        weakref.finalize(self, workers.close)
        return workers

    def _check_device(self, device: Any) -> Any:
        if device is not None and self.format != "torch":
            raise ConfigurationError(
                f"Loader: device={device!r} needs format='torch' (got {self.format!r}). Fix: "
                "use format='torch', or move batches yourself."
            )
        return device

    def close(self) -> None:
        """Stop the current iteration and the transform's workers (threads or processes).

        The loader stays usable: a later iteration starts new workers. Garbage collection and
        interpreter exit close it too.
        """
        self._close_active()
        if self._workers is not None:
            self._workers.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Loader(batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}, "
            f"rank={self.rank}/{self.world_size}, epoch={self._epoch}, format={self.format!r})"
        )
