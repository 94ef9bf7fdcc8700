"""The training loader: exact shuffling, equal shards per rank, prefetch and exact resume.

Which rows each rank reads, in which order, is a pure function
(:mod:`feedline.loader.order.sample_order`) of (row-group sizes, seed, epoch, rank, world
size); the data path only gathers them. The requested columns are cached as NumPy arrays
when they fit ``memory_budget`` (exact global permutation); otherwise row groups stream pool
by pool (two-level shuffle, memory bounded by ``shuffle_window``). A background thread keeps
``prefetch`` batches ready (small batches in groups of about 1 MiB, gathered with one take
into reused buffers).

The loader is a façade over a pipeline of nodes (:mod:`feedline.loader.nodes`): order →
gather → map (``transform=``, in thread or process workers) → format → pin → prefetch →
device. :meth:`Loader.source_node` starts a pipeline of your own.

:class:`Loader` is one class over its checked :class:`~feedline.loader.options.LoaderOptions`.
Its methods are thin; the work is in the modules named for it: the epochs' plans and orders
(:mod:`feedline.loader.order.resume`, :mod:`feedline.loader.order.ahead`), the checkpoint
(:mod:`feedline.loader.order.state`), the data path (:mod:`feedline.loader.data.backend`),
the pipeline (:mod:`feedline.loader.pipeline`), the framework views
(:mod:`feedline.loader.adapters`) and the measurements (:mod:`feedline.loader.timing`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.adapters.formats import can_pin
from feedline.loader.adapters.tf import batch_shapes, import_tensorflow, tf_dataset
from feedline.loader.adapters.torch import import_torch
from feedline.loader.adapters.torch_dataset import torch_dataloader, torch_dataset
from feedline.loader.data.backend import Backend, LoaderInput, as_source, open_backend
from feedline.loader.data.fingerprint import data_fingerprint
from feedline.loader.data.memory_budget import resolve_budget
from feedline.loader.data.shard_cache import default_cache_dir
from feedline.loader.data.staging.stager import StagedEpochs
from feedline.loader.data.windows import window_copier
from feedline.loader.nodes.gather import Gather
from feedline.loader.nodes.indices import Order
from feedline.loader.nodes.map import Map
from feedline.loader.nodes.node import Node
from feedline.loader.nodes.skips import Skips
from feedline.loader.nodes.worker_pools import make_workers
from feedline.loader.options import (
    OPTION_NAMES,
    check_epoch,
    loader_options,
    options_signature,
    ranks,
    ranks_per_node,
)
from feedline.loader.order.ahead import OrderAhead
from feedline.loader.order.resume import epoch_plan, restore
from feedline.loader.order.sample_order import EpochPlan
from feedline.loader.order.stage_routes import StagePlan, stage_plan
from feedline.loader.order.state import Segment, State, epoch_batches, parse_states
from feedline.loader.packing.packed_loader import PackedLoader, UnknownLength
from feedline.loader.pipeline import default_pipeline, group_size
from feedline.loader.profiling.autotune import Autotuner
from feedline.loader.profiling.diagnose import Diagnosis, diagnose
from feedline.loader.profiling.report import Profile, build_profile
from feedline.loader.profiling.stages import StageMeters
from feedline.loader.timing import Timing
from feedline.tracking import EpochLogger

if TYPE_CHECKING:
    import tensorflow as tf
    import torch.utils.data

    from feedline.store.shard_source import BatchStream, ShardSource

__all__ = ["AUTO_PREFETCH", "Loader"]

logger = logging.getLogger(__name__)

#: the prefetch ``prefetch="auto"`` starts at (and sizes the gather's groups by)
AUTO_PREFETCH = 2


class Loader:
    """Batches of a dataset for a training loop (see ``Dataset.loader``).

    Parameters
    ----------
    dataset:
        What to read: a :class:`~feedline.dataset.dataset.Dataset` (best: ``fl.open(path)``
        of a written dataset) or any object with a ``shard_source()`` method
        (:class:`~feedline.store.shard_source.SupportsShardSource`), a path to open, or a
        :class:`~feedline.store.shard_source.ShardSource` /
        :class:`~feedline.store.shard_source.BatchStream`.
    **options:
        ``batch_size=256, shuffle=True, seed=None, ...``: the loader's options, each
        documented (type, default, meaning) in :class:`~feedline.loader.options.LoaderOptions`
        and listed one by one in the signature ``help(Loader)`` and
        ``inspect.signature(Loader)`` show. They are checked when the loader is built (a wrong
        name raises ``TypeError`` naming the closest one); the first 14 may also be passed by
        position; ``loader.options`` holds them.

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

    @options_signature
    def __init__(self, dataset: LoaderInput, *args: Any, **options: Any) -> None:
        self.options = o = loader_options(args, options)  # every option checked, once
        # the options a checkpoint's must not override (see load_state_dict)
        self._given = {*options, *OPTION_NAMES[: len(args)]}
        if isinstance(dataset, str | os.PathLike):  # opened now: a wrong path fails here
            dataset = as_source(dataset)
        self.dataset = dataset
        # what this loader does with them, resolved against this process
        self.rank, self.world_size = ranks(o)
        self.ranks_per_node = ranks_per_node(o, self.world_size)
        self.batch_size, self.shuffle = o.batch_size, o.shuffle
        # "auto" (feedline.loader.profiling.autotune) starts at 2 batches, 1 worker
        self.prefetch = AUTO_PREFETCH if o.prefetch == "auto" else int(o.prefetch)
        self.seed = 0 if o.seed is None else o.seed
        self.drop_last = self.shuffle if o.drop_last is None else o.drop_last
        self.columns, self.cache, self.format = o.columns, o.cache, o.format
        # sizes come in bytes (LoaderOptions parses "2GB"); "auto" is this process's memory
        self.memory_budget = resolve_budget(o.memory_budget)
        self.cache_limit = cast(int, o.cache_limit)
        self.return_padding_mask = o.return_padding_mask
        self.pad_last = o.pad_last or o.return_padding_mask
        self.pin_memory = o.pin_memory and can_pin(o.format, stacklevel=5)
        self.transform, self.batched = o.transform, o.batched
        self.num_workers, self.worker_type = o.num_workers, o.worker_type
        self._workers = self._make_workers()
        # the transform gets string and binary values (e.g. encoded images)
        transformed = o.transform is not None and o.strings == "raise"
        self.windows, self.strings = o.windows, "list" if transformed else o.strings
        self.device = o.device
        self.cache_dir: str | os.PathLike[str] | None
        if o.cache_dir is True or o.cache_dir is None:
            self.cache_dir = default_cache_dir()
        else:
            self.cache_dir = o.cache_dir or None  # False: remote shards are read directly
        self._requested_window = o.shuffle_window
        self.stack, self.dtype = o.stack, o.dtype
        self.lists: dict[str, Any] = {"shapes": o.shapes, "ragged": o.ragged,
                                      "pad_value": o.pad_value}  # fmt: skip
        self._segments: tuple[Segment, ...] = ()
        self._epoch, self._consumed, self._restored = 0, 0, False
        self._backend: Backend | None = None
        self._resolved: ShardSource | BatchStream | None = None
        self._plan_cache: tuple[Any, EpochPlan] | None = None
        self._order_ahead: OrderAhead | None = None
        self._active: weakref.ref[Generator[dict[str, Any], None, None]] | None = None
        self._token: object = None
        self._timing = Timing(self.batch_size)
        self._stages = StageMeters()  # per-stage accounting (feedline.loader.profiling)
        self._skips = Skips()
        self._tuner = self._make_tuner()
        self._tracker = None if o.track is False else EpochLogger(o.track)
        self._packed = None if o.pack is None else self._packed_loader()

    def _packed_loader(self) -> PackedLoader:
        """``pack=``: packed batches over a loader of this one's documents, ``buffer_size`` of
        them per batch (see :mod:`feedline.loader.packing.packed_loader`)."""
        o, pack = self.options, self.options.pack
        assert pack is not None
        ragged = o.ragged if isinstance(o.ragged, Mapping) else {}
        tokens = {} if o.transform is not None else {
            "columns": [pack.column], "ragged": {**ragged, pack.column: "list"}}  # fmt: skip
        names = [f.name for f in dataclasses.fields(o)]
        base = {name: getattr(o, name) for name in names} | {
            # the packer leaves out the repeats marked in "_padded" (never a document twice)
            "batch_size": pack.buffer_size, "drop_last": False, "pad_last": False,
            "return_padding_mask": True, "format": "numpy", "pin_memory": False,
            "device": None, "track": False, "pack": None, "stack": None, "seed": self.seed,
        } | tokens  # fmt: skip

        def make_docs(rank: int, world_size: int) -> Loader:
            return Loader(self.dataset, **(base | {"rank": rank, "world_size": world_size}))

        return PackedLoader(make_docs(self.rank, self.world_size), make_docs, pack,
                            batch_size=self.batch_size, drop_last=self.drop_last,
                            fmt=self.format)  # fmt: skip

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
                batch_size=self.batch_size, shuffle=self.shuffle, rank=self.rank,
                ranks_per_node=self.ranks_per_node, stage_dir=self.options.stage_dir,
            )  # fmt: skip
            if isinstance(self._backend.source, StagedEpochs):  # stages this loader's order
                self._backend.source.planner = self._stage_plan
                weakref.finalize(self, self._backend.source.close)
            self._warn_if_empty(self._backend.num_samples)
        return self._backend

    def _warn_if_empty(self, samples: int) -> None:
        """Say so when ``drop_last`` drops every sample of an epoch (0 batches, each epoch)."""
        step = self.world_size * self.batch_size
        if self.drop_last and 0 < samples < step:
            ranks = f" x world_size={self.world_size}" if self.world_size > 1 else ""
            message = (
                f"Loader: batch_size={self.batch_size}{ranks} is more than the {samples} "
                "samples of an epoch, and drop_last=True drops the remainder: every epoch yields "
                "0 batches. Fix: pass a smaller batch_size, or drop_last=False to keep a short "
                "last batch."
            )
            logger.warning(message)
            warnings.warn(message, UserWarning, stacklevel=4)

    def _shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: the shape of one sample and its dtype."""
        shapes = self._prepare().shapes()
        if self.return_padding_mask:
            shapes["_padded"] = ((), np.dtype(bool))
        return shapes

    def _make_tuner(self) -> Autotuner | None:
        """The autotuner of ``num_workers="auto"`` / ``prefetch="auto"`` (else ``None``)."""
        o = self.options
        workers = o.num_workers == "auto" and o.transform is not None
        prefetch = o.prefetch == "auto"
        if not (workers or prefetch):
            return None
        return Autotuner(workers=workers, prefetch=prefetch, worker_type=o.worker_type,
                         start_prefetch=self.prefetch)  # fmt: skip

    def _make_workers(self) -> Any:
        """The transform's worker pool (started on first use, closed with the loader)."""
        if self.transform is None:
            return None
        workers = make_workers(self.transform, self.num_workers, self.worker_type,
                               self.options.timeout)  # fmt: skip
        weakref.finalize(self, workers.close)
        return workers

    # ------------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._epoch if self._packed is None else self._packed.epoch

    @property
    def num_samples(self) -> int:
        """Rows (or windows) in one epoch, before sharding."""
        return self._prepare().num_samples

    def __len__(self) -> int:
        """Batches per epoch on this rank (the rest of a resumed epoch after an elastic resume)."""
        if self._packed is not None:
            raise UnknownLength(
                "Loader: with pack=, the number of batches depends on the documents' lengths "
                "and is not known ahead. Fix: iterate the loader (or count steps yourself)."
            )
        if not self._segments:
            return epoch_batches(self.num_samples, self.world_size, self.batch_size,
                                 self.drop_last)  # fmt: skip
        return self._plan().num_batches

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration.

        Right after :meth:`load_state_dict`, setting the restored epoch keeps the restored
        position, so ``for epoch in range(state["epoch"], E): loader.set_epoch(epoch)``
        resumes exactly. A state taken after the last batch of epoch ``e`` records epoch
        ``e`` as complete (``{"epoch": e, "batches": len(loader)}``): the restored loader's
        next iteration (``set_epoch(e)`` or not) yields nothing, and ``set_epoch(e + 1)``
        starts the next epoch, so a loop that resumes at ``state["epoch"]`` or at
        ``state["epoch"] + 1`` never replays a batch.

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(6).loader(batch_size=3, format="numpy")
        >>> loader.set_epoch(1)
        >>> a = [b["id"].tolist() for b in loader]
        >>> loader.set_epoch(1)
        >>> a == [b["id"].tolist() for b in loader], loader.epoch
        (True, 1)
        """
        epoch = check_epoch(epoch)
        if self._packed is not None:
            self._packed.set_epoch(epoch)
            return
        if self._restored and epoch == self._epoch:
            return
        self._close_active()
        self._restored = False
        self._epoch, self._consumed, self._segments = epoch, 0, ()

    def _plan(self, epoch: int | None = None) -> EpochPlan:
        """This rank's plan of ``epoch`` (default: the current one, with its segments):
        :func:`~feedline.loader.order.resume.epoch_plan` of the epoch's order, cached."""
        backend = self._prepare()
        epoch = self._epoch if epoch is None else epoch
        segments = self._segments if epoch == self._epoch else ()
        key = (epoch, segments, self.shuffle, backend.window, self.seed)
        if self._plan_cache is None or self._plan_cache[0] != key:
            shuffle = self.shuffle and not backend.arranged  # contiguous windows shuffle runs
            order = self._orders().get(shuffle=shuffle, seed=self.seed, epoch=epoch,
                                       window=backend.window)  # fmt: skip
            plan = epoch_plan(
                order, segments, rank=self.rank, world_size=self.world_size,
                batch_size=self.batch_size, drop_last=self.drop_last, pad_last=self.pad_last,
            )  # fmt: skip
            self._plan_cache = (key, plan)
        return self._plan_cache[1]

    def _stage_plan(self, epoch: int) -> StagePlan:
        """Every rank's row indices of epoch ``epoch`` (``cache="staged"`` stages them): the
        plans :meth:`_plan` gives each rank, the current epoch's after its restored segments."""
        backend = self._prepare()
        return stage_plan(
            backend.sizes, epoch=epoch, shuffle=self.shuffle, seed=self.seed,
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            pad_last=self.pad_last, segments=self._segments if epoch == self._epoch else (),
        )  # fmt: skip

    def _orders(self) -> OrderAhead:
        """The epochs' orders, the next one drawn ahead (:mod:`feedline.loader.order.ahead`)."""
        if self._order_ahead is None:
            backend = self._prepare()  # an order drawn ahead may take an eighth of the cache
            self._order_ahead = OrderAhead(backend.sizes, max_bytes=backend.nbytes // 8)
        return self._order_ahead

    def _draw_ahead(self, epoch: int) -> None:
        """Start drawing epoch ``epoch``'s order (called by the gather, mid-epoch)."""
        backend = self._prepare()
        self._orders().ahead(shuffle=self.shuffle and not backend.arranged, seed=self.seed,
                             epoch=epoch, window=backend.window)  # fmt: skip

    def _position(self) -> EpochPlan:
        """The current epoch's plan, moving on to the next epoch when this one is complete
        (unless it was just restored: a restored complete epoch yields nothing once)."""
        plan = self._plan()
        if plan.num_batches and self._consumed >= plan.num_batches and not self._restored:
            self._epoch, self._consumed, self._segments = self._epoch + 1, 0, ()
            plan = self._plan()
        return plan

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Batches of the current epoch from the loader's position.

        The position only moves forward: an iteration abandoned part-way (``break``) is
        continued by the next one, and iterating a complete epoch starts the next epoch (as
        ``set_epoch(epoch + 1)`` would), so a forgotten ``set_epoch`` never repeats an order.
        Right after :meth:`load_state_dict` the iteration continues the restored epoch: after
        a state taken at the end of an epoch it yields nothing (see :meth:`set_epoch`).
        """
        if self._packed is not None:
            return iter(self._packed)
        return self._iterate(self.format)

    def _iterate(self, fmt: str) -> Iterator[dict[str, Any]]:
        asked = time.perf_counter()  # the caller waits from here (the first call loads the cache)
        self._timing.begin(asked)
        self._close_active()
        if self._workers is not None:
            self._workers.start()  # processes start while the cache loads
        plan = self._position()
        self._restored = False  # the restored position is used: set_epoch starts over again
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
        ``reset(state)`` are exact (``{"epoch": e, "batches": k}``, the names of
        :meth:`state_dict`), and ``reset`` to another
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
        node = default_pipeline(
            order, backend,
            shuffle=self.shuffle, seed=self.seed, fmt=fmt, group=group, transform=self.transform,
            batched=self.batched, workers=self._workers, padding_mask=self.return_padding_mask,
            pin=self.pin_memory, prefetch=self.prefetch, device=self.device,
        )  # fmt: skip
        if self._tuner is not None:  # the ready batches share what the cache leaves
            self._tuner.room_bytes = max(0, self.memory_budget - backend.nbytes) // 2
            self._tuner.attach(node)
        return self._stages.instrument(node)

    def _consume(self, node: Node, plan: EpochPlan, start: int, epoch: int, token: object,
                 asked: float) -> Generator[dict[str, Any], None, None]:  # fmt: skip
        # raw clock readings per batch (see feedline.loader.timing): asked, got, previous got
        timing, clock, got, tail = self._timing, time.perf_counter, None, None
        run, append = timing.start_run(epoch, reset=start == 0), timing.rows.append
        pull, limit, size = node.next, timing.limit, self.batch_size
        tune = None if self._tuner is None else self._tuner.batch
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
                    if item.skipped and not len(item.indices):
                        continue  # the transform skipped every sample: counted, not yielded
                now = clock()
                if tune is not None:
                    tune(now - asked, now, item)
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

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: tiny and JSON-safe (batches yielded to the caller so far).

        ``"epoch"`` and ``"batches"``: ``batches`` of epoch ``epoch`` were yielded (after the
        last batch of an epoch, ``batches`` is ``len(loader)``: the epoch is complete, see
        :meth:`set_epoch`); ``"fingerprint"`` names the data (see
        :mod:`feedline.loader.data.fingerprint`); the rest is the order and the layout.

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=2, format="numpy")
        >>> _ = next(iter(loader))
        >>> loader.state_dict()["batches"]
        1
        """
        if self._packed is not None:
            return self._packed.state_dict()
        state = State(
            seed=self.seed, epoch=self._epoch, batches=self._consumed, rank=self.rank,
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            shuffle=self.shuffle, shuffle_window=self._prepare().window,
            num_samples=self.num_samples, history=self._segments, fingerprint=self._fingerprint,
        ).as_dict()  # fmt: skip
        version = getattr(self._source(), "version", None)
        if version is not None:
            state[DATASET_VERSION] = version
        snapshot = getattr(self._source(), "snapshot", None)
        if snapshot is not None:  # a lakehouse table read directly: pin its snapshot
            state[TABLE_SNAPSHOT] = dict(snapshot)
        return state

    @functools.cached_property
    def _fingerprint(self) -> str:
        """The data's fingerprint: its manifest's (shard checksums), else one of the data
        (:func:`~feedline.loader.data.fingerprint.data_fingerprint`)."""
        return data_fingerprint(self._source(), self._prepare())

    def load_state_dict(
        self,
        state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        check_dataset: bool = True,
    ) -> None:
        """Resume from ``state_dict()``: the next iteration yields exactly the unseen batches.

        Seed, shuffle and window come from the state (the order must be the checkpoint's);
        a ``seed``, ``shuffle`` or ``shuffle_window`` given explicitly to this loader must be
        the state's (else ConfigurationError: leave them unset to adopt the state's).
        With a different ``world_size``, ``batch_size`` or ``drop_last`` the samples no old
        rank yielded are split over the new ranks (elastic resume). One state stands for all
        old ranks having yielded as many batches (lock-step training); pass every old rank's
        state otherwise.

        Every field is validated first (types, ranges, keys, version), then the state must
        have been taken on this dataset (its fingerprint and the sample count) at a position
        its epoch holds. A state taken on another version of this feedline dataset (its
        ``dataset_version``) reads that version's shards from then on, while the version is
        retained (a vacuumed one raises ConfigurationError); one taken on a Delta, Iceberg
        or Lance table read directly (its ``table_snapshot``) is refused on another snapshot
        of it, with a message naming both; anything else raises
        :class:`ConfigurationError` naming the field and leaves the loader as it was (see
        :mod:`feedline.loader.order.state`). A state without a fingerprint (version 1, or
        taken by an earlier feedline on in-memory data) is refused; ``check_dataset=False``
        accepts it, or one of another fingerprint, when you know it was taken on this very
        data (the sample count is still checked).

        Examples
        --------
        >>> import feedline as fl
        >>> ds = fl.range(8)
        >>> first = ds.loader(batch_size=2, format="numpy", seed=5)
        >>> it = iter(first)
        >>> head = [next(it)["id"].tolist() for _ in range(2)]
        >>> resumed = ds.loader(batch_size=2, format="numpy")
        >>> resumed.load_state_dict(first.state_dict())
        >>> whole = [b["id"].tolist() for b in ds.loader(batch_size=2, format="numpy", seed=5)]
        >>> head + [b["id"].tolist() for b in resumed] == whole
        True
        """
        if self._packed is not None:
            self._packed.load_state_dict(state)
            return
        version = _dataset_version(state)
        states = parse_states(_without_version(state))  # before loading any data
        source = self._source()
        if check_dataset:
            _check_table_snapshot(state, getattr(source, "snapshot", None))
        if version is not None and getattr(source, "version", None) not in (None, version):
            # the checkpoint's version of the dataset, not the one committed since
            self._resolved = cast("ShardSource", source).at_version(version)
            self._backend = None
            self.__dict__.pop("_fingerprint", None)
        backend = self._prepare()
        backend.check_states(states)
        given = self._given
        at = restore(
            states, num_samples=backend.num_samples, streaming=backend.mode == "none",
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            fingerprint=self._fingerprint, check_dataset=check_dataset,
            seed=self.options.seed if "seed" in given else None,
            shuffle=self.options.shuffle if "shuffle" in given else None,
            window=backend.clamped_window or self._requested_window,
        )  # fmt: skip
        self._close_active()
        self.seed, self.shuffle, backend.window = at.seed, at.shuffle, at.window
        self._epoch, self._segments, self._consumed = at.epoch, at.segments, at.batches
        self._restored = True

    # ------------------------------------------------------------------ views and reports

    def to_tf_dataset(self, label: str | None = None) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of this loader's batches (each pass iterates the loader).

        Elements are dicts of tensors with a fixed batch dimension, or ``(features, label)``
        pairs with ``label`` (ready for ``keras.Model.fit``); each pass is the loader's next
        epoch. Needs ``feedline[tf]``.

        Examples
        --------
        >>> import feedline as fl
        >>> ds = fl.range(64).loader(batch_size=16).to_tf_dataset()  # doctest: +SKIP
        >>> ds.element_spec  # doctest: +SKIP
        {'id': TensorSpec(shape=(16,), dtype=tf.int64, name='id')}
        """

        import_tensorflow()
        whole = not self._segments and (self._consumed == 0 or self._consumed >= len(self))
        passes = len(self) if whole else None  # then every pass is a whole epoch
        short = self.transform is not None or not (self.drop_last or self.pad_last)
        rows = None if short else self.batch_size
        return tf_dataset(lambda: self._iterate("numpy"), self._output_shapes(), rows, label,
                          cardinality=passes)  # fmt: skip

    def _output_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: one sample's shape and dtype (a transform's: from a first batch)."""
        if self.transform is None:
            return self._shapes()
        order = Order(self._plan, epoch=self._epoch, batch=0)
        node = Map(Gather(order, self._prepare(), shuffle=self.shuffle, seed=self.seed),
                   self.transform, batched=self.batched, seed=self.seed)  # fmt: skip
        with node:
            first = next(node, None)
        shapes = {} if first is None else batch_shapes(first.data)
        if self.return_padding_mask:
            shapes["_padded"] = ((), np.dtype(bool))
        return shapes

    def as_torch_dataset(self) -> torch.utils.data.IterableDataset:
        """This loader as a ``torch.utils.data.IterableDataset`` (DataLoader, Lightning).

        Use ``DataLoader(ds, batch_size=None)`` (batches are made here) with
        ``num_workers=0`` (the loader has its own workers); ``len(ds)`` and
        ``ds.set_epoch(e)`` follow the loader. See :mod:`feedline.loader.adapters.torch_dataset`.

        Examples
        --------
        >>> import feedline as fl
        >>> from torch.utils.data import DataLoader
        >>> ds = fl.range(6).loader(batch_size=3, shuffle=False).as_torch_dataset()
        >>> [b["id"].tolist() for b in DataLoader(ds, batch_size=None)]
        [[0, 1, 2], [3, 4, 5]]
        """

        import_torch()  # a clear error when torch is not installed
        return torch_dataset(self)

    def as_torch_dataloader(self) -> torch.utils.data.DataLoader:
        """This loader as a ready ``torch.utils.data.DataLoader`` that frameworks checkpoint.

        Its ``state_dict()`` / ``load_state_dict()`` are this loader's exact position, so
        PyTorch Lightning keeps it in checkpoints and ``fit(ckpt_path=...)`` resumes mid-epoch;
        every ``iter()`` is a whole pass (an abandoned pass is dropped). Return it from
        ``train_dataloader()`` / ``val_dataloader()``. See
        :func:`~feedline.loader.adapters.torch_dataset.torch_dataloader`.

        Examples
        --------
        >>> import feedline as fl
        >>> dl = fl.range(6).loader(batch_size=3, shuffle=False).as_torch_dataloader()
        >>> [b["id"].tolist() for b in dl], len(dl)
        ([[0, 1, 2], [3, 4, 5]], 2)
        """

        import_torch()  # a clear error when torch is not installed
        return torch_dataloader(self)

    def timeline(self) -> list[dict[str, Any]]:
        """Per batch delivered so far (the last 100,000): when, and where the time went.

        Each entry: ``epoch``, ``batch``, ``time`` (seconds since the loader first started
        iterating), ``samples``, ``wait_s`` (the caller blocked in ``next()`` for it, the
        first batch of an iteration counting from ``iter()``) and ``step_s`` (the caller's
        time between the previous batch and asking for this one; 0 for an iteration's first).

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=4, format="numpy")
        >>> _ = list(loader)
        >>> [(t["epoch"], t["batch"], t["samples"], t["step_s"]) for t in loader.timeline()][0]
        (0, 0, 4, 0.0)
        """
        return self._timing.timeline()

    def metrics(self) -> list[dict[str, Any]]:
        """Per epoch iterated so far: ``epoch``, ``batches``, ``samples``, ``seconds``,
        ``samples_per_s`` and ``data_wait_fraction`` (wait / (wait + step)), from the caller's
        side (see :meth:`timeline`; ``seconds`` leaves out pauses between iterations), and
        ``skipped``: samples the transform dropped from the batches delivered. With
        ``cache="staged"``: ``stage_s`` (seconds staging the epoch took), ``stage_wait_s``
        (seconds the loader waited for it) and ``stage_hidden`` (it waited less than 5% of it:
        the epoch was staged while the one before trained).

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=4, format="numpy")
        >>> _ = list(loader)
        >>> m = loader.metrics()[0]
        >>> m["batches"], m["samples"], 0 <= m["data_wait_fraction"] <= 1, m["skipped"]
        (2, 8, True, 0)
        """
        if self._packed is not None:
            return self._packed.metrics()
        staged = self._backend.source if self._backend is not None else None
        out = []
        for m in self._timing.metrics():
            m = m | {"skipped": self._skips.of(m["epoch"])}
            if isinstance(staged, StagedEpochs):  # cache="staged": the epoch's staging
                report = staged.epoch_report(m["epoch"])
                if report is not None:
                    m |= {k: report[k] for k in ("stage_s", "stage_wait_s", "stage_hidden")}
            out.append(m)
        return out

    def profile(self) -> Profile:
        """Where the time went, per pipeline stage, over every iteration so far.

        One row per node (prefetch, format, transform, gather, order...): its own work and
        its wait for input, batches, samples and bytes through it, how full a prefetch
        queue was, and the transform workers' utilisation; with the loop's samples/s and data
        wait. Shows as a table (``print``, Rich, notebooks). See
        :mod:`feedline.loader.profiling.report`; :meth:`diagnose` says what to change.

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(64).loader(batch_size=8, format="numpy", prefetch=0)
        >>> _ = list(loader)
        >>> p = loader.profile()
        >>> [(row.name, row.batches) for row in p.stages], p.samples
        ([('gather', 8), ('order', 8)], 64)
        """
        tuned = None if self._tuner is None else self._tuner.report()
        return build_profile(list(self._stages.stages.values()), self.metrics(),
                             self.batch_size, tuned)  # fmt: skip

    def diagnose(
        self,
        step_ms: float | None = None,
        *,
        step: Callable[[Any], Any] | None = None,
        seconds: float | None = 5.0,
        batches: int | None = None,
        verify: bool = False,
    ) -> Diagnosis:
        """Would training wait for data, which stage bounds it, and what to change.

        Runs a twin of this loader (this one does not move) for ``seconds=5`` (or
        ``batches=``) against a training step of ``step_ms`` (or your ``step=fn(batch)``)
        and answers in one sentence with numbers (``str(d)``), the options to change
        (``d.change``), the speed-up it predicts, measured too with ``verify=True``, and a
        chart (``d.plot(path)``). See :mod:`feedline.loader.profiling.diagnose`.

        Examples
        --------
        >>> import feedline as fl
        >>> d = fl.range(512).loader(batch_size=32, format="numpy").diagnose(1, batches=10)
        >>> d.waits, d.change
        (False, {})
        """
        return diagnose(
            self, step_ms=step_ms, step=step, seconds=seconds, batches=batches, verify=verify
        )

    def stats(self) -> dict[str, Any]:
        """How the data is held: cache mode, cached bytes, window and streaming counters.

        ``shuffle_mode`` is ``"exact"`` (a global permutation of the cached data),
        ``"two-level"`` (row groups permuted, rows shuffled in pools of ``shuffle_window`` row
        groups: what ``cache="auto"`` falls back to when the columns are over
        ``memory_budget`` and the epochs cannot be staged, with an INFO line on the
        ``feedline`` logger) or ``"none"``
        (``shuffle=False``); ``shuffle_reason`` says why, and what to pass for the exact one.

        With a ``transform``: ``num_workers`` (now), ``worker_type``, ``skipped`` (samples it
        dropped from the batches delivered so far) and ``skipped_examples`` (the first 20, each
        naming its epoch, sample and reason).

        With ``num_workers="auto"`` or ``prefetch="auto"``: ``autotune``, the tuner's values
        now (``num_workers``, ``prefetch``; ``None`` for a knob not tuned), their bounds
        (``max_workers``: the CPUs this process may use; ``max_prefetch``: what the memory
        budget holds), ``batch_bytes``, ``batches_seen`` and ``history``: each change with the
        batch it came after and the reason, with the window's numbers (see
        :mod:`feedline.loader.profiling.autotune`).

        ``cache="staged"`` (``stats()["cache"] == "staged"``, ``shuffle_mode`` ``"exact"``)
        adds ``staged_dir``, ``stage_nodes``, ``stage_node``, ``stage_bucket_rows`` and
        ``staged_epochs``: per epoch asked for, ``stage_s``, ``stage_wait_s``,
        ``stage_hidden`` (the loop waited for pass 1 and for buckets less than 5% of the
        staging time), ``staged_here`` (this process ran pass 1 for its node, rather than
        finding the node's inbox complete), ``stage_rows_read`` and ``stage_bytes_read``
        (rows this node read from the dataset, and their bytes as loader arrays),
        ``stage_bytes_sent`` and ``stage_buckets`` (this rank's), and ``stage_source``:
        ``"dataset"``, or ``"epoch before"`` where one rank on one node staged the epoch
        from the epoch before's buckets as it read them (no dataset read; ``stage_s`` is then
        that routing's time) (see :mod:`feedline.loader.data.staging.stager` and
        :mod:`~feedline.loader.data.staging.recycle`).

        A remote dataset read through the shard cache adds its folder, limit and counters
        (``shard_hits``, ``shard_downloads``, ``shard_download_bytes``, ``shard_evictions``,
        ``shard_corrupt``, ``shard_prefetch_errors``; see
        :class:`~feedline.loader.data.shard_cache.CacheStats`).

        Examples
        --------
        >>> import feedline as fl
        >>> s = fl.range(10).loader(batch_size=2).stats()
        >>> s["cache"], s["cache_bytes"], s["num_samples"], s["shuffle_mode"]
        ('memory', 80, 10, 'exact')
        """
        backend = self._prepare()
        out = backend.describe()
        mode = "exact" if backend.window is None else "two-level"
        mode = mode if self.shuffle else "none"
        window = "" if backend.window is None or not self.shuffle else (
            f"; pools of {backend.window} row groups (shuffle_window)"
        )  # fmt: skip
        out |= {"shuffle_mode": mode, "shuffle_reason": backend.reason + window}
        if self.transform is not None:
            out |= {"num_workers": self._workers.num_workers, "worker_type": self._workers.kind,
                    "skipped": self._skips.total,
                    "skipped_examples": list(self._skips.examples)}  # fmt: skip
        if self._tuner is not None:
            out["autotune"] = self._tuner.report()
        return out

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the current iteration, the transform's workers (threads or processes) and,
        with ``cache="staged"``, the staging of epochs not yet begun.

        The loader stays usable: a later iteration starts new workers (and stages again).
        Garbage collection and interpreter exit close it too.
        """
        self._close_active()
        if self._workers is not None:
            self._workers.close()
        staged = self._backend.source if self._backend is not None else None
        if isinstance(staged, StagedEpochs):
            staged.close()
        if self._packed is not None:
            self._packed.docs.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Loader(batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}, "
            f"rank={self.rank}/{self.world_size}, epoch={self._epoch}, format={self.format!r})"
        )


#: the key of a loader state that names the dataset version it was taken on
DATASET_VERSION = "dataset_version"
#: the key of a loader state that names the lakehouse table snapshot it was taken on
TABLE_SNAPSHOT = "table_snapshot"


def _check_table_snapshot(
    state: Mapping[str, Any] | Sequence[Mapping[str, Any]], current: Mapping[str, str] | None
) -> None:
    """Refuse a state taken on one snapshot of a Delta/Iceberg/Lance table when this loader
    reads another (or reads no table snapshot at all)."""
    first = state if isinstance(state, Mapping) else next(iter(state), None)
    taken = first.get(TABLE_SNAPSHOT) if isinstance(first, Mapping) else None
    if taken is None:
        return
    if not isinstance(taken, Mapping) or not all(
        isinstance(taken.get(k), str) for k in ("kind", "table", "snapshot")
    ):
        raise ConfigurationError(
            f"Loader state field {TABLE_SNAPSHOT!r} is {taken!r}; expected a table snapshot "
            "({'kind', 'table', 'snapshot'}). Fix: pass the dict Loader.state_dict() returned, "
            "unchanged."
        )
    where = f"{taken['kind']}: {taken['table']} @ {taken['snapshot']}"
    if current is None:
        raise ConfigurationError(
            f"The loader state was taken on the table {where}, but this loader does not read "
            "a table snapshot. Fix: read the table at that snapshot (fl.read_delta(path, "
            "version=...), fl.read_iceberg(table, snapshot_id=...), fl.read_lance(path, "
            "version=...)) and resume a loader of it."
        )
    if (current["kind"], current["snapshot"]) != (taken["kind"], taken["snapshot"]):
        raise ConfigurationError(
            f"The loader state was taken on {where}, but this loader reads "
            f"{current['kind']}: {current['table']} @ {current['snapshot']}; its positions "
            "would name other rows. Fix: read the checkpoint's snapshot (fl.read_delta(path, "
            "version=...), fl.read_iceberg(table, snapshot_id=...) or fl.read_lance(path, "
            "version=...) with the id above) and resume a loader of it."
        )


def _dataset_version(state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> int | None:
    """The dataset version a state (or the first of several ranks' states) was taken on."""
    first = state if isinstance(state, Mapping) else next(iter(state), None)
    version = first.get(DATASET_VERSION) if isinstance(first, Mapping) else None
    if version is None:
        return None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigurationError(
            f"Loader state field {DATASET_VERSION!r} is {version!r}; expected a dataset version "
            "(an int >= 1). Fix: pass the dict Loader.state_dict() returned, unchanged."
        )
    return version


def _without_version(
    state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> Mapping[str, Any] | Sequence[Mapping[str, Any]]:
    """``state`` without its :data:`DATASET_VERSION` and :data:`TABLE_SNAPSHOT` key(s)."""
    extra = (DATASET_VERSION, TABLE_SNAPSHOT)
    if isinstance(state, Mapping):
        return {k: v for k, v in state.items() if k not in extra}
    if isinstance(state, Sequence) and not isinstance(state, str | bytes):
        return [
            {k: v for k, v in one.items() if k not in extra} if isinstance(one, Mapping) else one
            for one in state
        ]
    return state
