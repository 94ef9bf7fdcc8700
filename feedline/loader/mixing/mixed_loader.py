"""Batches of a weighted mix of sources for one rank, with a tiny, exact and elastic checkpoint.

The mixed stream of an epoch is one global sequence of positions
(:class:`~feedline.loader.mixing.schedule.MixSchedule`: which source and which of its samples
each position reads). It is cut into global steps of ``batch_size * world_size`` positions;
rank ``r`` takes the ``r``-th ``batch_size`` positions of each step. So the checkpoint is a
global position (``start`` plus ``batches`` steps of the layout that recorded it), the
weights' segments of the epoch and each source's draws before the epoch (``offsets``): one
int per source and per weight change. A resume on another ``world_size`` (or ``batch_size``)
restarts the split at the global position consumed: every position is delivered once.
Given every old rank's state at its own step (a packing loader pulls documents at its own
pace), the positions only some ranks delivered are left as ``pending`` ranges, delivered
first (at most ``world_size`` ranges per step apart).

Each batch carries a ``source`` column (int codes; ``loader.sources`` names them), and
:meth:`MixedLoader.metrics` counts samples (and tokens of list columns) per source.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.data.buffers import BufferPool
from feedline.loader.mixing.combined_cache import combine_caches
from feedline.loader.mixing.draws_ahead import DrawsAhead
from feedline.loader.mixing.schedule import BLOCK_POSITIONS, LAYOUT, MixSchedule
from feedline.loader.nodes.collate import Format
from feedline.loader.nodes.map import Map
from feedline.loader.nodes.node import Batch, Node, parse_position
from feedline.loader.nodes.prefetch import Prefetch
from feedline.loader.nodes.worker_pools import make_workers
from feedline.loader.options import check_prefetch
from feedline.loader.profiling.autotune import Autotuner

__all__ = ["MIX_STATE_VERSION", "STOPS", "MixedLoader"]

#: the state's version is the schedule's window layout (1: feedline's first mixing release)
MIX_STATE_VERSION = LAYOUT
STOPS = ("first_exhausted", "all_exhausted")
#: a group's columns (in the batches' order) and each row's tokens
_Taken = tuple[dict[str, Any], np.ndarray | None]
_KEYS = ("version", "sources", "sizes", "window", "seed", "stop", "epoch", "offsets",
         "segments", "pending", "start", "batches", "rank", "world_size", "batch_size")  # fmt: skip


def _fail(what: str) -> ConfigurationError:
    return ConfigurationError(
        f"Mixed loader state: {what}. Fix: pass the dict MixedLoader.state_dict() returned, "
        "unchanged (any rank's: the ranks of a lock-step run hold the same position)."
    )


#: an epoch's end: samples (an int), a token budget (``{"tokens": n}``) or one of :data:`STOPS`
Stop = int | str | dict[str, int]


def check_stop(stop: Any) -> Stop:
    """``stop``: a number of samples per epoch (int > 0), ``{"tokens": n}`` (n > 0: the epoch
    ends at the sample whose tokens reach ``n``) or one of :data:`STOPS`.

    Examples
    --------
    >>> check_stop(100), check_stop({"tokens": 2048}), check_stop("all_exhausted")
    (100, {'tokens': 2048}, 'all_exhausted')
    """
    if isinstance(stop, int) and not isinstance(stop, bool) and stop > 0:
        return stop
    if stop in STOPS:
        return str(stop)
    if isinstance(stop, Mapping) and list(stop) == ["tokens"]:
        n = stop["tokens"]
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return {"tokens": n}
    raise ConfigurationError(
        f"fl.mix: stop={stop!r}; expected a number of samples per epoch (int > 0), a token "
        f"budget per epoch ({{'tokens': n}}, n > 0), {STOPS[0]!r} or {STOPS[1]!r}. Fix: pass "
        "one of those."
    )


class _MixedSource(Node):
    """The first node: this rank's mixed batches, gathered ``group`` batches at a time (one
    gather per source per group: the batches are the same whatever the group)."""

    def __init__(self, owner: MixedLoader, epoch: int, batch: int, group: int) -> None:
        self.owner, self.epoch, self.batch, self.group = owner, epoch, batch, group
        self._ready: deque[Batch] = deque()
        self._next = batch  # the next batch number to gather

    def _fill(self) -> None:
        if self.epoch != self.owner._epoch:
            raise StopIteration
        items = self.owner._gather_group(self.epoch, self._next, self.group)
        if not items:
            raise StopIteration
        self._next = items[-1].number + 1
        self._ready.extend(items)

    def next(self) -> Batch:
        if not self._ready:
            self._fill()
        item = self._ready.popleft()
        self.batch = item.number + 1
        return item

    def next_group(self) -> list[Batch]:
        if not self._ready:
            self._fill()
        items = list(self._ready)
        self._ready.clear()
        self.batch = items[-1].number + 1
        return items

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        position = parse_position(initial_state, "MixedSource")
        self.epoch, self.batch = (self.epoch, 0) if position is None else position
        self._next = self.batch
        self._ready.clear()

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batch}


class MixedLoader:
    """Batches of a weighted mix of sources (see the module docstring); ``fl.mix`` builds it.

    Parameters
    ----------
    names:
        The sources' names, in code order.
    loaders:
        One :class:`~feedline.loader.Loader` per source (its memory cache serves the
        samples; its ``rank`` and ``world_size`` are this loader's).
    weights:
        One weight >= 0 per source (normalized).
    seed, stop, window:
        The mix's seed; an epoch's end (samples, ``"first_exhausted"``,
        ``"all_exhausted"``); positions per window of the schedule.
    batch_size, drop_last, fmt, transform, batched, num_workers, worker_type, prefetch:
        As for (``fmt``: ``format``) :class:`~feedline.loader.Loader`.
    padding_mask:
        Add ``"_padded"``: True for a sample that repeats one so that every rank has as many
        batches (``drop_last=False``: a rank past the stream's end); a packer leaves them out.
    """

    def __init__(self, names: Sequence[str], loaders: Sequence[Any],
                 weights: Sequence[float] | Mapping[str, float],
                 *, seed: int, stop: Stop, window: int, batch_size: int, drop_last: bool,
                 fmt: str, transform: Callable[..., Any] | None, batched: bool,
                 num_workers: int | str, worker_type: str, prefetch: int | str,
                 padding_mask: bool = False) -> None:  # fmt: skip
        self.sources, self._loaders = list(names), list(loaders)
        self.rank, self.world_size = self._loaders[0].rank, self._loaders[0].world_size
        self.seed, self.stop, self.window = int(seed), check_stop(stop), int(window)
        self.batch_size, self.drop_last, self.format = int(batch_size), bool(drop_last), fmt
        self.transform, self.batched = transform, batched
        checked = check_prefetch(prefetch)
        auto_prefetch = checked == "auto"
        self.prefetch = 2 if isinstance(checked, str) else checked
        self.padding_mask = bool(padding_mask)
        self._workers = None if transform is None else make_workers(
            transform, num_workers, worker_type, None)  # fmt: skip
        auto_workers = num_workers == "auto" and transform is not None
        #: num_workers="auto" / prefetch="auto" (feedline.loader.profiling.autotune)
        self._tuner = Autotuner(workers=auto_workers, prefetch=auto_prefetch,
                                worker_type=worker_type, start_prefetch=self.prefetch) if (
            auto_workers or auto_prefetch) else None  # fmt: skip
        if self._workers is not None:  # closed with the loader, as a one-dataset loader's
            weakref.finalize(self, self._workers.close)
        self._backends = [loader._prepare() for loader in self._loaders]
        for name, backend in zip(self.sources, self._backends, strict=True):
            if backend.mode != "memory" or backend.arranged:
                raise ConfigurationError(
                    f"fl.mix: source {name!r} is read as {backend.mode!r} ({backend.reason}); "
                    "mixing reads any sample at any time, from a memory cache. Fix: raise "
                    "memory_budget (or pass cache='memory'), select fewer columns, or mix "
                    "without windows=."
                )
        self.sizes = [b.num_samples for b in self._backends]
        if any(n == 0 for n in self.sizes):
            empty = [n for n, s in zip(self.sources, self.sizes, strict=True) if not s]
            raise ConfigurationError(f"fl.mix: source(s) {empty} have no samples. Fix: leave "
                                     "them out of the mix.")  # fmt: skip
        self._sessions = [b.session(shuffle=True, seed=self.seed, epoch=0) for b in self._backends]
        if self._tuner is not None:  # the ready batches share what the caches leave, as in Loader
            cached = sum(b.nbytes for b in self._backends)
            self._tuner.room_bytes = max(0, self._loaders[0].memory_budget - cached) // 2
        # one cache over every source when they share a layout (one take per block per group)
        self._combined = combine_caches([b.source for b in self._backends])
        # gathers go into reused buffers (a set is reused once no batch refers to it)
        self._buffer_shapes = self._backends[0].buffer_shapes()
        self._pool: BufferPool | None = None
        self._scratch: dict[str, np.ndarray] = {}
        if self._combined is not None:  # the sources' own caches are released
            for loader in self._loaders:
                loader._backend = None
            self._backends, self._sessions = [], []
        # the stream's draws, a chunk at a time, the next one computed ahead
        bases = None if self._combined is None else self._combined[1]
        tokens = self._sample_tokens() if isinstance(self.stop, dict) else None
        self._draws = DrawsAhead(self.stop, bases=bases, sample_tokens=tokens)
        self._weights0 = self._check_weights(weights)
        self._windows_layout = LAYOUT  # a resumed run keeps its checkpoint's
        self._start_run()
        self._active: Node | None = None
        self._token: object = None  # the running iteration's
        #: per batch read ahead: its samples (row 0) and tokens (row 1) per source
        self._counts: dict[tuple[int, int], np.ndarray] = {}
        self._metrics: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ the schedule

    def _sample_tokens(self) -> list[np.ndarray]:
        """Per source: each sample's tokens (the lengths of its list columns' values), for a
        ``{"tokens": n}`` stop."""
        if self._combined is not None:
            cache, bases = self._combined
            columns: Mapping[str, Any] = cache.arrays
            ends = [*bases[1:].tolist(), cache.num_rows]
            spans = list(zip(bases.tolist(), ends, strict=True))
        else:
            spans, columns = [], {}
        out = []
        for s, name in enumerate(self.sources):
            if self._combined is not None:
                a, b = spans[s]
                got = _lengths({k: v[a:b] for k, v in columns.items()}, b - a)
            else:  # a few thousand samples at a time
                parts: list[np.ndarray] = []
                got = None
                for a in range(0, self.sizes[s], 4096):
                    n = min(4096, self.sizes[s] - a)
                    rows = self._sessions[s].gather(np.arange(a, a + n))
                    part = _lengths({k: _objects(list(v)) if isinstance(v, list) else v
                                     for k, v in rows.items()}, n)  # fmt: skip
                    if part is None:  # no list column
                        break
                    parts.append(part)
                else:
                    got = np.concatenate(parts)
            if got is None:
                raise ConfigurationError(
                    f"fl.mix: stop={self.stop!r} counts tokens, the lengths of list columns' "
                    f"values, and source {name!r} has no list column. Fix: select a token "
                    "column (columns=[...]) or stop after a number of samples."
                )
            out.append(got)
        return out

    def _check_weights(self, weights: Sequence[float] | Mapping[str, float]) -> tuple[float, ...]:
        if isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(self.sources))
            if unknown:
                raise ConfigurationError(
                    f"fl.mix: weights for unknown source(s) {unknown}; the sources are "
                    f"{self.sources}. Fix: name each source as given to fl.mix."
                )
            weights = [float(weights.get(name, 0.0)) for name in self.sources]
        w = tuple(float(x) for x in weights)
        if len(w) != len(self.sources):
            raise ConfigurationError(f"fl.mix: {len(w)} weights for sources {self.sources}. "
                                     "Fix: give one weight per source.")  # fmt: skip
        MixSchedule(self.sizes, [(0, w)], window=self.window, seed=0, epoch=0)  # checks them
        return w

    def _start_run(self) -> None:
        self._epoch, self._offsets = 0, [0] * len(self.sources)
        self._segments: list[tuple[int, tuple[float, ...]]] = [(0, self._weights0)]
        self._begin(0)
        self._restored = False

    def _begin(self, start: int, pending: Sequence[tuple[int, int]] = ()) -> None:
        """This layout's split starts with the ``pending`` ranges of positions (left over by
        an elastic resume), then goes on at global position ``start``."""
        self._start, self._batches, self._layout = start, 0, (self.world_size, self.batch_size)
        self._pending = [(int(a), int(b)) for a, b in pending if b > a]
        self._held = sum(b - a for a, b in self._pending)  # positions in the pending ranges
        self._schedule = self._draws.adopt(MixSchedule(
            self.sizes,
            self._segments,
            window=self.window,
            seed=self.seed,
            epoch=self._epoch,
            offsets=self._offsets,
            layout=self._windows_layout,
        ))  # fmt: skip
        self._length = self._draws.length(self._schedule)

    def _next_epoch(self) -> None:
        drawn = self._schedule.drawn_before(self._length)
        self._offsets = [int(a + b) for a, b in zip(self._offsets, drawn, strict=True)]
        self._epoch += 1
        self._segments = [(0, self._segments[-1][1])]
        self._begin(0)

    def _total(self) -> int:
        """Positions in this split's stream: the pending ones, then ``start`` to the end."""
        return self._held + max(0, self._length - self._start)

    def _position(self) -> int:
        """The global position of the main stream reached (every rank's, lock-step)."""
        step = self.batch_size * self.world_size
        consumed = min(self._total(), self._batches * step)
        return min(self._length, self._start + max(0, consumed - self._held))

    def _span(self, k: int) -> tuple[int, int] | None:
        """Stream indices (see :meth:`_positions`) of this rank's ``k``-th batch. Every rank
        has as many batches: with ``drop_last=False`` a rank with no position left in the
        last step gets the stream's last position once more (as the one-dataset loader
        does), so ranks in lock step (DDP) never wait on one another."""
        step, total = self.batch_size * self.world_size, self._total()
        base = k * step
        if base >= total or (self.drop_last and base + step > total):
            return None
        first = base + self.rank * self.batch_size
        if first >= total:
            return total - 1, total
        return first, min(first + self.batch_size, total)

    def _positions(self, a: int, b: int) -> np.ndarray:
        """Global positions of stream indices ``a`` to ``b``: the pending ranges' first."""
        parts, at = [], 0
        for lo, hi in self._pending:
            if at >= b:
                break
            n = hi - lo
            x, y = max(a, at), min(b, at + n)
            if x < y:
                parts.append(np.arange(lo + x - at, lo + y - at, dtype=np.int64))
            at += n
        if b > self._held:
            x = max(a, self._held) - self._held + self._start
            parts.append(np.arange(x, b - self._held + self._start, dtype=np.int64))
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def __len__(self) -> int:
        """Batches still to come in this epoch on this rank (the same on every rank)."""
        step, total = self.batch_size * self.world_size, self._total()
        steps = total // step if self.drop_last else -(-total // step)
        return max(0, steps - self._batches)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def weights(self) -> dict[str, float]:
        """The weights in force (normalized)."""
        w = np.asarray(self._segments[-1][1])
        return dict(zip(self.sources, (w / w.sum()).tolist(), strict=True))

    def set_weights(self, weights: Sequence[float] | Mapping[str, float]) -> None:
        """Use ``weights`` from the position reached (a curriculum): batches already
        delivered keep their sources; every rank must call it at the same step. Inside a
        running ``for batch in loader`` loop the iteration goes on with the new weights
        (batches read ahead are dropped and gathered again)."""
        w = self._check_weights(weights)
        self._close_active()
        position = self._position()
        self._segments = [s for s in self._segments if s[0] < position] + [(position, w)]
        if self._segments[0][0] != 0:
            self._segments.insert(0, (0, w))
        start, batches, pending = self._start, self._batches, self._pending
        self._begin(start, pending)
        self._batches = batches

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its start (kept right after a resume into it). Epochs
        after the current one assume the current weights throughout."""
        if self._restored and epoch == self._epoch:
            return
        self._close_active()
        self._token = None
        self._restored = False
        if epoch < self._epoch:
            self._start_run()
        if epoch == self._epoch:
            self._begin(0)
        while self._epoch < epoch:
            self._next_epoch()

    # ------------------------------------------------------------------ batches

    def _gather_group(self, epoch: int, k: int, group: int) -> list[Batch]:
        """This rank's batches ``k`` to ``k + group - 1`` (fewer at the epoch's end)."""
        spans = []
        for number in range(k, k + group):
            span = self._span(number)
            if span is None:
                break
            step = number * self.batch_size * self.world_size
            spans.append((number, *span, span[0] < step + self.rank * self.batch_size))
        if not spans:
            return []
        positions = self._positions(spans[0][1], spans[-1][2])
        if self.world_size > 1 or spans[-1][3]:  # this rank's parts of the steps
            v0 = spans[0][1]
            rel = np.concatenate([np.arange(a - v0, b - v0) for _, a, b, _ in spans])
            positions = positions[rel]
        codes, rows = self._draws.take(self._schedule, positions)
        codes = codes.astype(np.int64)  # the batches' own (a chunk's codes are shared)
        names = self.sources
        if self._combined is not None:
            columns, tokens = self._take_combined(rows)
        else:
            columns, tokens = self._take_each(codes, rows)
        counts = _per_batch_counts(codes, [b - a for _, a, b, _ in spans], len(names), tokens)
        objects = [name for name, col in columns.items() if col.dtype.kind == "O"]
        items, at = [], 0
        for j, (number, a, b, repeat) in enumerate(spans):
            end = at + (b - a)
            data = {name: col[at:end] for name, col in columns.items()}
            for name in objects:
                data[name] = data[name].tolist()
            data["source"] = codes[at:end]
            if not repeat:
                self._counts[(epoch, number)] = counts[j]
            items.append(Batch(epoch, number, positions[at:end], data=data,
                               padded=np.ones(b - a, bool) if repeat else None))  # fmt: skip
            at = end
        return items

    def _take_combined(self, idx: np.ndarray) -> _Taken:
        """Rows ``idx`` of the combined cache: one take per block."""
        assert self._combined is not None
        n = len(idx)
        if self._pool is None or self._pool.rows < n:
            self._pool = BufferPool(self._buffer_shapes, n, keep=4)
        columns = dict(self._combined[0].gather(idx, self._pool.get(n), self._scratch))
        return columns, _lengths(columns, n)

    def _take_each(self, codes: np.ndarray, rows: np.ndarray) -> _Taken:
        """Samples ``rows`` of sources ``codes``, gathered per source and put in place."""
        n, names = len(codes), self.sources
        columns: dict[str, Any] = {}
        drawn = 0
        for s in range(len(names)):
            where = codes == s
            if not where.any():
                continue
            drawn += 1
            got = self._sessions[s].gather(rows[where])
            for name, values in got.items():
                if name not in columns:
                    if drawn > 1:
                        raise _missing(name, names, codes)
                    columns[name] = _column(values, n)
                elif columns[name].dtype.kind != "O" and (
                    not isinstance(values, np.ndarray) or values.shape[1:] !=
                        columns[name].shape[1:]):  # fmt: skip
                    raise _shapes(name, names)
                target = columns[name]
                target[where] = _objects(list(values)) if target.dtype.kind == "O" else values
            if len(got) != len(columns):
                raise _missing(sorted(set(columns) - set(got))[0], names, codes)
        return columns, _lengths(columns, n)

    def _pipeline(self) -> Node:
        group = 1 if self.transform is not None else max(1, min(64, 8192 // self.batch_size))
        node: Node = _MixedSource(self, self._epoch, self._batches, group)
        if self.transform is not None:
            node = Map(node, self.transform, batched=self.batched, seed=self.seed,
                       workers=self._workers)  # fmt: skip
        if self.format != "numpy" or self.padding_mask:  # numpy batches need no conversion
            node = Format(node, self.format, padding_mask=self.padding_mask)
        if self.prefetch:
            node = Prefetch(node, depth=self.prefetch if group == 1 else 1, group=group)
        if self._tuner is not None:
            self._tuner.attach(node)
        return node

    def _close_active(self) -> None:
        node, self._active = self._active, None
        if node is not None:
            node.close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The rest of the current epoch (a complete epoch: the next one, except right after
        a resume, when a complete epoch yields nothing once)."""
        self._close_active()
        if self._span(self._batches) is None and not self._restored:
            self._next_epoch()
        self._restored = False
        return self._iterate()

    def _iterate(self) -> Iterator[dict[str, Any]]:
        node = self._active = self._pipeline()
        self._token = token = object()
        epoch, names = self._epoch, self.sources
        m = self._metrics.setdefault(epoch, {
            "batches": 0, "samples": 0, "seconds": 0.0,
            "per_source": np.zeros((2, len(names)), np.int64)})  # fmt: skip
        per_source = m["per_source"]
        tune = None if self._tuner is None else self._tuner.batch
        started = time.perf_counter()
        try:
            while True:
                if self._active is not node:  # set_weights: go on from the position reached
                    if self._token is not token or self._epoch != epoch:
                        break  # another iteration, or a resume, took over
                    node.close()
                    node = self._active = self._pipeline()
                asked = time.perf_counter()
                try:
                    item = node.next()
                except StopIteration:
                    break
                if tune is not None:
                    now = time.perf_counter()
                    tune(now - asked, now, item)
                self._batches = item.number + 1
                counts = self._counts.pop((epoch, item.number), None)
                if counts is not None:
                    per_source += counts
                m["batches"] += 1
                m["samples"] += len(item.indices) if item.padded is None else int(
                    (~item.padded).sum())  # fmt: skip
                m["seconds"] += time.perf_counter() - started
                yield item.data
                started = time.perf_counter()
        finally:
            node.close()
            if self._active is node:
                self._active = None

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The position: tiny and JSON-safe (one int per source and per weight change)."""
        start, batches, pending = self._start, self._batches, self._pending
        return {"version": self._windows_layout, "sources": list(self.sources),
                "sizes": list(self.sizes), "window": self.window, "seed": self.seed,
                "stop": self.stop, "epoch": self._epoch, "offsets": list(self._offsets),
                "segments": [[p, list(w)] for p, w in self._segments],
                "pending": [[a, b] for a, b in pending], "start": start,
                "batches": batches, "rank": self.rank, "world_size": self.world_size,
                "batch_size": self.batch_size}  # fmt: skip

    def load_state_dict(
        self,
        state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        weights: Sequence[float] | Mapping[str, float] | None = None,
    ) -> None:
        """Resume from ``state_dict()`` (one rank's, or every rank's in a list), on any
        ``world_size`` and ``batch_size``; ``weights`` changes the weights from there on."""
        states = [state] if isinstance(state, Mapping) else list(state)
        if not states:
            raise _fail("got no state")
        for s in states:
            if not isinstance(s, Mapping) or set(s) != set(_KEYS):
                raise _fail(f"expected a dict with keys {list(_KEYS)}, got {str(s)[:120]!r}")
        s = states[0]
        version = s["version"]
        if isinstance(version, bool) or not isinstance(version, int) or (
                version not in BLOCK_POSITIONS):  # fmt: skip
            raise _fail(f"version {version!r} is not one of {sorted(BLOCK_POSITIONS)}")
        for key, mine in (("sources", self.sources), ("sizes", self.sizes),
                          ("window", self.window), ("stop", self.stop)):  # fmt: skip
            if s[key] != mine:
                raise ConfigurationError(
                    f"Mixed loader state: {key} is {s[key]!r}, this mix has {mine!r}. Fix: "
                    "resume with the checkpoint's sources (same data, order and names), "
                    "window and stop."
                )
        world, size = int(s["world_size"]), int(s["batch_size"])
        if any(dict(x, batches=0, rank=0) != dict(s, batches=0, rank=0) for x in states):
            raise _fail("the states are of different runs or positions in them (pass the "
                        "states of one checkpoint)")  # fmt: skip
        self._close_active()
        self._token = None
        self.seed, self._epoch = int(s["seed"]), int(s["epoch"])
        self._windows_layout = version
        self._offsets = [int(x) for x in s["offsets"]]
        self._segments = [(int(p), tuple(float(x) for x in w)) for p, w in s["segments"]]
        self._layout = (world, size)
        old = [(int(a), int(b)) for a, b in s["pending"]]
        self._begin(int(s["start"]), old)
        done = sorted({int(x["batches"]) for x in states})
        if len(done) == 1 and (world, size) == (self.world_size, self.batch_size):
            self._batches = done[0]
        else:  # the stream left, split again from its start (elastic, or ranks apart)
            self._begin(*self._left(states, world, size))
        if weights is not None:
            self.set_weights(weights)
        self._restored = True

    def _left(self, states: list[Mapping[str, Any]], world: int,
              size: int) -> tuple[int, list[tuple[int, int]]]:  # fmt: skip
        """The stream no old rank delivered, as ``(start, pending ranges)``: each old rank
        ``r`` delivered its batches before ``states[r]["batches"]`` (one state: every rank
        the same); what only some ranks delivered is left as pending ranges."""
        counts = [int(states[0]["batches"])] * world  # one state: every rank alike
        if len(states) > 1:
            by_rank = {int(x["rank"]): int(x["batches"]) for x in states}
            if sorted(by_rank) != list(range(world)):
                raise _fail(f"got the states of ranks {sorted(by_rank)}; pass one state, or "
                            f"all {world} ranks' states")  # fmt: skip
            counts = [by_rank[r] for r in range(world)]
        step, total = size * world, self._total()
        low, high = min(counts), max(counts)
        ranges: list[tuple[int, int]] = []
        for g in range(low, high):  # steps some ranks delivered: the others' parts are left
            for r in range(world):
                a, b = g * step + r * size, min(g * step + (r + 1) * size, total)
                if counts[r] <= g and a < b:
                    ranges += _runs(self._positions(a, b))
        end = min(total, high * step)
        if end < total:
            ranges += _runs(self._positions(end, min(total, self._held)) if end < self._held
                            else np.empty(0, np.int64))  # fmt: skip
        start = self._start + max(0, end - self._held)
        return min(start, self._length), ranges

    # ------------------------------------------------------------------ reports

    def metrics(self) -> list[dict[str, Any]]:
        """Per epoch: ``batches``, ``samples``, ``seconds``, ``samples_per_s`` and
        ``per_source``: ``{name: {"samples": n, "tokens": t}}`` (tokens: the lengths of list
        columns' values, before the transform)."""
        out = []
        for epoch, m in sorted(self._metrics.items()):
            rate = m["samples"] / m["seconds"] if m["seconds"] else 0.0
            per = {n: {"samples": int(m["per_source"][0, s]), "tokens": int(m["per_source"][1, s])}
                   for s, n in enumerate(self.sources)}  # fmt: skip
            out.append(
                {
                    "epoch": epoch,
                    "batches": m["batches"],
                    "samples": m["samples"],
                    "seconds": m["seconds"],
                    "samples_per_s": rate,
                    "per_source": per,
                }
            )
        return out

    def stats(self) -> dict[str, Any]:
        """``{"autotune": ...}`` with ``num_workers="auto"`` or ``prefetch="auto"``: the tuner's
        values now and its decisions (:mod:`feedline.loader.profiling.autotune`); else ``{}``.
        """
        return {} if self._tuner is None else {"autotune": self._tuner.report()}

    def close(self) -> None:
        """Stop the current iteration and the transform's workers."""
        self._close_active()
        if self._workers is not None:
            self._workers.close()

    def __enter__(self) -> MixedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"MixedLoader(sources={self.sources}, weights={self.weights}, "
                f"batch_size={self.batch_size}, rank={self.rank}/{self.world_size}, "
                f"epoch={self._epoch})")  # fmt: skip


def _per_batch_counts(codes: np.ndarray, sizes: list[int], sources: int,
                      tokens: np.ndarray | None) -> np.ndarray:  # fmt: skip
    """``(batches, 2, sources)``: each batch's samples (row 0) and tokens (row 1) per source,
    for a group's ``codes`` cut into batches of ``sizes``.

    Examples
    --------
    >>> _per_batch_counts(np.array([0, 1, 1, 1, 0]), [2, 3], 2, None)[:, 0].tolist()
    [[1, 1], [1, 2]]
    """
    batches = len(sizes)
    counts = np.zeros((batches, 2, sources), np.int64)
    if tokens is None and sources == 2 and len(set(sizes)) == 1:  # equal batches: one sum
        ones = codes.reshape(batches, sizes[0]).sum(axis=1)
        counts[:, 0, 1], counts[:, 0, 0] = ones, sizes[0] - ones
        return counts
    cells = batches * sources
    key = np.repeat(np.arange(batches) * sources, sizes) + codes
    counts[:, 0] = np.bincount(key, minlength=cells).reshape(batches, -1)
    if tokens is not None:
        counts[:, 1] = np.bincount(key, tokens, minlength=cells).reshape(batches, -1)
    return counts


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """``positions`` (ascending) as ranges ``[a, b)`` of consecutive positions."""
    if not len(positions):
        return []
    cuts = np.flatnonzero(np.diff(positions) != 1) + 1
    return [(int(p[0]), int(p[-1]) + 1) for p in np.split(positions, cuts)]


def _lengths(columns: Mapping[str, Any], n: int) -> np.ndarray | None:
    """Per row: the total length of its list values (the tokens of list columns); ``None``
    when no column holds lists."""
    tokens = None
    for values in columns.values():
        if isinstance(values, np.ndarray) and values.dtype.kind == "O" and n and isinstance(
                values[0], np.ndarray | list):  # fmt: skip
            lengths = np.fromiter((len(v) for v in values), np.int64, n)
            tokens = lengths if tokens is None else tokens + lengths
    return tokens


def _column(values: Any, n: int) -> np.ndarray:
    """An empty column of ``n`` rows for ``values`` (object for lists and strings)."""
    if isinstance(values, np.ndarray) and values.dtype.kind != "O":
        return np.empty((n, *values.shape[1:]), values.dtype)
    return np.empty(n, object)


def _objects(values: list[Any]) -> np.ndarray:
    """``values`` as a 1-D object array (each value one element, even a sequence)."""
    out = np.empty(len(values), object)
    out[:] = [None] * len(values)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _missing(name: str, sources: list[str], codes: np.ndarray) -> ConfigurationError:
    drawn = [sources[s] for s in np.unique(codes).tolist()]
    return ConfigurationError(
        f"fl.mix: column {name!r} is not in every source drawn ({drawn}). Fix: pass "
        "columns=[...] that every source has."
    )


def _shapes(name: str, sources: list[str]) -> ConfigurationError:
    return ConfigurationError(
        f"fl.mix: column {name!r} has different sample shapes or kinds in the sources "
        f"{sources}. Fix: make them equal (e.g. resize images when writing, or store them "
        "encoded and decode in transform=)."
    )
