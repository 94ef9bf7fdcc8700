"""The training loader: exact shuffling, equal shards per rank, prefetch and exact resume.

Which rows each rank reads, in which order, is a pure function (:mod:`feedline.loader.order`)
of (row-group sizes, seed, epoch, rank, world size); the data path only gathers them. The
requested columns are cached as NumPy arrays when they fit ``memory_budget`` (exact global
permutation); otherwise row groups stream pool by pool (two-level shuffle, memory bounded by
``shuffle_window``). A background thread keeps ``prefetch`` batches ready (small batches in
groups of about ``GROUP_BYTES``, gathered with one take into reused buffers).
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.backend import Backend, open_backend
from feedline.loader.buffers import BufferPool
from feedline.loader.cache import as_batch_value
from feedline.loader.columns import parse_budget
from feedline.loader.formats import FORMATS, can_pin, to_format
from feedline.loader.order import EpochPlan, global_order
from feedline.loader.prefetch import Prefetcher
from feedline.loader.resume import epoch_plan, restore
from feedline.loader.state import State, parse_states
from feedline.loader.timing import Timing
from feedline.loader.windows import Windows

if TYPE_CHECKING:
    from feedline.dataset import Dataset

__all__ = ["Loader"]

CACHES = ("auto", "memory", "none")
#: bytes of batches the prefetch thread gathers with one take (see ``Loader._group_size``)
GROUP_BYTES = 1 << 20
#: most batches gathered with one take
MAX_GROUP = 64


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigurationError(
            f"Loader: {name} must be an int >= {low}, got {value!r}. "
            f"Fix: pass {name}={low} or more."
        )
    return int(value)


class Loader:
    """Batches of a dataset for a training loop (see ``Dataset.loader``).

    Parameters
    ----------
    dataset:
        A :class:`~feedline.dataset.Dataset` (best: ``fl.open(path)`` of a written dataset) or
        a path to open.
    batch_size:
        Samples per batch on each rank.
    shuffle, seed:
        Shuffle every epoch; the order depends only on ``(seed, epoch)``.
    rank, world_size:
        This process's rank and the number of processes; ranks get disjoint, equally many
        batches that together cover the epoch.
    drop_last:
        ``True`` drops the remainder (< ``world_size * batch_size`` samples); ``False`` pads
        the last batches by repeating samples, marked in ``"_padded"`` when
        ``return_padding_mask=True``.
    columns:
        Columns to load (default all). String columns need ``strings="list"``.
    cache:
        ``"memory"`` loads the columns into NumPy arrays (exact permutation), ``"none"``
        streams row groups (two-level shuffle), ``"auto"`` caches when the estimate from the
        schema and row count fits ``memory_budget``.
    prefetch:
        Batches a background thread keeps ready (at least). It gathers them in groups with one
        take per column (the batches are views of it): ``prefetch`` batches, or as many as make
        about 1 MiB when cached batches are small, at most 64. 0 gathers in the calling thread,
        one batch at a time.
    format:
        ``"torch"`` (dict of ``torch.Tensor`` via ``torch.from_numpy``), ``"numpy"`` or ``"tf"``.
        Dtypes: bool → ``torch.bool``; ints and floats kept; uint16/uint32 widened to
        int32/int64 for torch, uint64 refused (see :mod:`feedline.loader.columns`).
    pin_memory:
        Gather into page-locked tensors (``format="torch"``; ignored with a warning when no
        CUDA device is present).
    shuffle_window:
        Row groups per pool of the two-level shuffle. Default: exact permutation when cached,
        as many groups as fit a third of ``memory_budget`` when streaming.
    memory_budget:
        Bytes (or ``"2GB"``) the loader may hold.
    windows:
        A :class:`~feedline.loader.windows.Windows` to yield time-series windows instead of rows.
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
        directly. Local datasets are never copied. See :mod:`feedline.loader.shard_cache`.
    track:
        ``True`` logs :meth:`metrics` (``loader/samples_per_s``, ``loader/data_wait_fraction``,
        ``loader/batches``, ``loader/samples``, ``loader/seconds``) to the MLflow run active
        when the loader is created, with ``step=epoch``, each time an epoch completes; a run
        id logs to that run instead. Needs ``feedline[mlflow]``; see :mod:`feedline.tracking`.

    Examples
    --------
    >>> import feedline as fl
    >>> loader = fl.range(10).loader(batch_size=4, format="numpy", seed=1)
    >>> len(loader), [b["id"].shape for b in loader]
    (2, [(4,), (4,)])
    """

    def __init__(
        self,
        dataset: Dataset | str | os.PathLike[str],
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
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
    ) -> None:
        if isinstance(dataset, str | os.PathLike):
            from feedline.readers import open as open_dataset

            dataset = open_dataset(dataset)
        self.batch_size = _int("batch_size", batch_size, 1)
        self.seed, self.world_size = _int("seed", seed, 0), _int("world_size", world_size, 1)
        self.rank, self.prefetch = _int("rank", rank, 0), _int("prefetch", prefetch, 0)
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
            shuffle_window = _int("shuffle_window", shuffle_window, 1)
        if windows is not None and (columns is not None or not isinstance(windows, Windows)):
            raise ConfigurationError(
                "Loader: windows= takes a fl.Windows(...) and picks its own columns "
                "(features=/targets=). Fix: drop columns= or pass a Windows."
            )
        if isinstance(columns, str):
            columns = [columns]
        self.dataset, self.shuffle, self.drop_last = dataset, bool(shuffle), bool(drop_last)
        self.columns, self.cache, self.format = columns, cache, format
        self.memory_budget = parse_budget(memory_budget)
        self.windows, self.strings = windows, strings
        self.return_padding_mask = bool(return_padding_mask)
        self.pin_memory = bool(pin_memory) and can_pin(format, stacklevel=5)
        if cache_dir is True or cache_dir is None:
            from feedline.loader.shard_cache import default_cache_dir

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
        self._plan_cache: tuple[Any, EpochPlan] | None = None
        self._active: weakref.ref | None = None
        self._token: object = None
        self._timing = Timing(self.batch_size)
        self._tracker = None
        if track is not False:
            from feedline.tracking import EpochLogger

            self._tracker = EpochLogger(track)

    def _prepare(self) -> Backend:
        """Decide cache or stream, and load the cache (once, on first need)."""
        if self._backend is None:
            self._backend = open_backend(
                self.dataset, columns=self.columns, windows=self.windows, cache=self.cache,
                strings=self.strings, widen_unsigned=self.format == "torch",
                budget=self.memory_budget, window=self._requested_window,
                cache_dir=self.cache_dir, cache_limit=self.cache_limit,
            )  # fmt: skip
        return self._backend

    def _shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: the shape of one sample and its dtype."""
        shapes = self._prepare().shapes()
        if self.return_padding_mask:
            shapes["_padded"] = ((), np.dtype(bool))
        return shapes

    # ------------------------------------------------------------------ order

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._epoch

    @property
    def num_samples(self) -> int:
        """Rows (or windows) in one epoch, before sharding."""
        return self._prepare().num_samples

    def _plan(self) -> EpochPlan:
        backend = self._prepare()
        key = (self._epoch, self._segments, self.shuffle, backend.window, self.seed)
        if self._plan_cache is None or self._plan_cache[0] != key:
            order = global_order(
                backend.sizes, shuffle=self.shuffle, seed=self.seed, epoch=self._epoch,
                window=backend.window,
            )  # fmt: skip
            plan = epoch_plan(
                order, self._segments, rank=self.rank, world_size=self.world_size,
                batch_size=self.batch_size, drop_last=self.drop_last,
            )  # fmt: skip
            self._plan_cache = (key, plan)
        return self._plan_cache[1]

    def __len__(self) -> int:
        """Batches per epoch on this rank (the rest of a resumed epoch after an elastic resume)."""
        if not self._segments:
            n, step = self.num_samples, self.world_size * self.batch_size
            return n // step if self.drop_last else -(-n // step)
        return self._plan().num_batches

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration.

        Right after :meth:`load_state_dict`, setting the restored epoch keeps the restored
        position, so ``for epoch in range(state["epoch"], E): loader.set_epoch(epoch)``
        resumes exactly.

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
        epoch = _int("epoch", epoch, 0)
        if self._restored and epoch == self._epoch:
            return
        self._close_active()
        self._restored = False
        self._epoch, self._consumed, self._segments = epoch, 0, ()

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
        plan = self._plan()
        if plan.num_batches and self._consumed >= plan.num_batches:
            self._epoch, self._consumed, self._segments = self._epoch + 1, 0, ()
            plan = self._plan()
        self._token = token = object()
        gen = self._consume(plan, self._consumed, self._epoch, fmt, token, asked)
        self._active = weakref.ref(gen)
        return gen

    def _close_active(self) -> None:
        gen = self._active() if self._active is not None else None
        self._active, self._token = None, None
        if gen is not None:
            gen.close()

    def _consume(self, plan: EpochPlan, start: int, epoch: int, fmt: str, token: object,
                 asked: float):  # fmt: skip
        produced = self._produce(plan, start, epoch, fmt, self._group_size())
        stream = Prefetcher(produced, 1) if self.prefetch else produced
        # raw clock readings per batch (see feedline.loader.timing): asked, got, previous got
        timing, clock, got, tail = self._timing, time.perf_counter, None, None
        run, append = timing.start_run(epoch, reset=start == 0), timing.rows.append
        try:
            for group in stream:
                if len(timing.rows) > timing.limit:
                    timing.trim()
                for k, batch in group:
                    if self._token is token:  # counted here, at the consumer: exact resume
                        self._consumed, self._restored = k + 1, False
                    now = clock()
                    append((run, k, asked, now, got))
                    got = now
                    yield batch
                    asked = clock()
            tail = None if got is None else asked - got  # the step after the last batch
        finally:
            stream.close()
            last = timing.end_run(run, tail)
            if self._tracker is not None and last + 1 == plan.num_batches:
                self._tracker.log_epoch(timing.metrics_of(epoch))

    def _group_size(self) -> int:
        """Batches gathered with one take: ``prefetch``, or about ``GROUP_BYTES`` of batches.

        One hand-over between the prefetch thread and the training loop costs far more than
        gathering a small batch, so small cached batches travel in groups (streaming keeps
        ``prefetch``: a larger group would span, and hold, more shuffle pools).
        """
        if not self.prefetch or self._prepare().mode != "memory":
            return max(1, self.prefetch)
        row = sum(int(np.prod(s)) * (8 if d.kind == "O" else d.itemsize)
                  for s, d in self._shapes().values())  # fmt: skip
        fit = GROUP_BYTES // max(1, row * self.batch_size)
        return max(self.prefetch, min(MAX_GROUP, fit))

    def _produce(self, plan: EpochPlan, start: int, epoch: int, fmt: str, size: int):
        """Groups of ``size`` (batch number, batch) pairs; runs in the prefetch thread.

        A group is gathered with one take per column; its batches are row slices (views).
        """
        b, backend = self.batch_size, self._prepare()
        session = backend.session(shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                                  indices=plan.indices[start * b :])  # fmt: skip
        # unpinned groups are gathered into reused buffers (see BufferPool): the batches in
        # the queue, the one the caller holds and the one being gathered each hold a set
        pool = None if self.pin_memory else BufferPool(backend.shapes(), size * b, keep=4)
        for first in range(start, plan.num_batches, size):
            ks = range(first, min(first + size, plan.num_batches))
            indices = plan.indices[first * b : (ks[-1] + 1) * b]
            tensors: dict[str, Any] = {}
            if pool is None:  # gather straight into page-locked tensors
                from feedline.loader.torch import batch_buffers

                tensors, views = batch_buffers(backend.shapes(), len(indices), pin=True)
                arrays = session.gather(indices, out=views)
            else:
                arrays = session.gather(indices, out=pool.get(len(indices)))
            group = []
            for j, k in enumerate(ks):
                rows = slice(j * b, (j + 1) * b)
                batch = {n: as_batch_value(tensors.get(n, a)[rows]) for n, a in arrays.items()}
                if self.return_padding_mask:
                    batch["_padded"] = plan.padded[k * b : (k + 1) * b].copy()
                group.append((k, to_format(batch, fmt)))
            yield group

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: tiny and JSON-safe (batches yielded to the caller so far).

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=2, format="numpy")
        >>> _ = next(iter(loader))
        >>> loader.state_dict()["batches"]
        1
        """
        return State(
            seed=self.seed, epoch=self._epoch, batches=self._consumed, rank=self.rank,
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            shuffle=self.shuffle, shuffle_window=self._prepare().window,
            num_samples=self.num_samples, history=self._segments, fingerprint=self._fingerprint,
        ).as_dict()  # fmt: skip

    @functools.cached_property
    def _fingerprint(self) -> str | None:
        """The dataset's fingerprint (its manifest's shard checksums); ``None`` if unwritten."""
        if getattr(self.dataset, "manifest", None) is None:
            return None
        return self.dataset.plan.source.fingerprint()

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume from ``state_dict()``: the next iteration yields exactly the unseen batches.

        Seed, shuffle and window come from the state (the order must be the checkpoint's).
        With a different ``world_size``, ``batch_size`` or ``drop_last`` the samples no old
        rank yielded are split over the new ranks (elastic resume). One state stands for all
        old ranks having yielded as many batches (lock-step training); pass every old rank's
        state otherwise.

        Every field is validated first (types, ranges, keys, version), then the state must
        have been taken on this dataset (the manifest's fingerprint and the sample count) at
        a position its epoch holds; anything else raises :class:`ConfigurationError` naming
        the field and leaves the loader as it was (see :mod:`feedline.loader.state`).

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
        states = parse_states(state)  # before loading any data
        backend = self._prepare()
        at = restore(
            states, num_samples=backend.num_samples, streaming=backend.mode == "none",
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            fingerprint=self._fingerprint,
        )  # fmt: skip
        self._close_active()
        self.seed, self.shuffle, backend.window = at.seed, at.shuffle, at.window
        self._epoch, self._segments, self._consumed = at.epoch, at.segments, at.batches
        self._restored = True

    # ------------------------------------------------------------------ views and stats

    def to_tf_dataset(self, label: str | None = None) -> Any:
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
        from feedline.loader.tf import import_tensorflow, tf_dataset

        import_tensorflow()
        whole = not self._segments and (self._consumed == 0 or self._consumed >= len(self))
        passes = len(self) if whole else None  # then every pass is a whole epoch
        return tf_dataset(lambda: self._iterate("numpy"), self._shapes(), self.batch_size,
                          label, cardinality=passes)  # fmt: skip

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
        side (see :meth:`timeline`; ``seconds`` leaves out pauses between iterations).

        Examples
        --------
        >>> import feedline as fl
        >>> loader = fl.range(8).loader(batch_size=4, format="numpy")
        >>> _ = list(loader)
        >>> m = loader.metrics()[0]
        >>> m["batches"], m["samples"], 0 <= m["data_wait_fraction"] <= 1
        (2, 8, True)
        """
        return self._timing.metrics()

    def stats(self) -> dict[str, Any]:
        """How the data is held: cache mode, cached bytes, window and streaming counters.

        A remote dataset read through the shard cache adds its folder, limit and counters
        (``shard_hits``, ``shard_downloads``, ``shard_download_bytes``, ``shard_evictions``,
        ``shard_corrupt``, ``shard_prefetch_errors``; see
        :class:`~feedline.loader.shard_cache.CacheStats`).

        Examples
        --------
        >>> import feedline as fl
        >>> s = fl.range(10).loader(batch_size=2).stats()
        >>> s["cache"], s["cache_bytes"], s["num_samples"]
        ('memory', 80, 10)
        """
        return self._prepare().describe()

    def __repr__(self) -> str:
        return (
            f"Loader(batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}, "
            f"rank={self.rank}/{self.world_size}, epoch={self._epoch}, format={self.format!r})"
        )
