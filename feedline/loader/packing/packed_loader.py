"""Packed batches over a loader's blocks of documents, with a tiny, exact, elastic checkpoint.

A :class:`PackedLoader` reads its rank's documents from a document loader (the loader's own
order, ``buffer_size`` documents per block), packs each block by itself
(:func:`~feedline.loader.packing.bins.plan_rows`) and cuts the stream of rows into batches of
``batch_size`` rows. Because a block's rows depend only on the block, the checkpoint is

- ``docs``: the document loader's state before the block the next row comes from,
- ``rows``: the rows of that block already delivered,
- ``carry``: after an elastic resume, the old ranks' states whose leftover rows this rank
  delivers first (the states of one checkpoint, themselves tiny), and ``taken`` of them.
- ``target``: with ``equal_batches``, the batches every rank yields this epoch (the most any
  rank packs, planned from every rank's documents at the epoch's start); a rank whose rows
  ran out yields batches of empty rows up to it.
- ``ended``: once a rank has delivered its epoch's last row (its state then names the next
  epoch's start), its document loader's state at the end of that epoch: an elastic resume
  from ranks of which only some had finished puts those at the end of the others' epoch.

Resume on as many ranks replays the block and skips ``rows``. Resume on another number of
ranks recomputes, from every old rank's state, that rank's rows not yet delivered (the rest
of its block and of its own carry), deals them out to the new ranks (row ``i`` to rank
``i % world_size``), and hands the documents no old rank had pulled to the document loader's
elastic resume. Every token of the epoch is delivered once: before, or after.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.adapters.formats import to_format
from feedline.loader.packing.blocks import Row, block_rows, rows_batch
from feedline.loader.packing.rows import row_arrays
from feedline.loader.packing.spec import Packing

__all__ = ["PACK_STATE_VERSION", "PackedLoader", "UnknownLength"]

PACK_STATE_VERSION = 3
_KEYS = ("version", "packing", "epoch", "batches", "rank", "world_size", "docs", "rows",
         "carry", "taken", "target", "ended")  # fmt: skip


class UnknownLength(ConfigurationError, TypeError):
    """``len()`` of a packing loader: its batches depend on the documents (a ``TypeError``
    too, so ``list(loader)`` and ``operator.length_hint`` treat it as having no length)."""


def _fail(what: str) -> ConfigurationError:
    return ConfigurationError(
        f"Packed loader state: {what}. Fix: pass the dicts PackedLoader.state_dict() returned "
        "(every old rank's, in rank order, when world_size changed), unchanged."
    )


class PackedLoader:
    """Batches of packed rows (see the module docstring); ``Loader(..., pack=...)`` uses it.

    ``docs`` is this rank's document loader (``batch_size=packing.buffer_size``, numpy
    format); ``make_docs(rank, world_size)`` builds the same loader for another layout (to
    recompute an old rank's leftover rows on an elastic resume).
    """

    def __init__(self, docs: Any, make_docs: Callable[[int, int], Any], packing: Packing, *,
                 batch_size: int, drop_last: bool, fmt: str) -> None:  # fmt: skip
        self.docs, self._make_docs, self.packing = docs, make_docs, packing
        self.batch_size, self.drop_last, self.format = batch_size, drop_last, fmt
        self.rank, self.world_size = docs.rank, docs.world_size
        self._epoch, self._batches, self._finished = 0, 0, False
        self._docs_state: dict[str, Any] | None = None  # None: the epoch's start
        self._rows = 0
        self._carry: dict[str, Any] | None = None
        self._taken = 0
        self._target: int | None = None  # equal_batches: every rank's batches this epoch
        self._dtype: Any = None  # the tokens' dtype (for batches of empty rows)
        self._restored = False
        self._metrics: dict[int, dict[str, float]] = {}

    # ------------------------------------------------------------------ epochs

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its start (kept right after a resume into that epoch)."""
        if self._restored and epoch == self._epoch:
            return
        self._restored = False
        self._start(epoch)

    def _start(self, epoch: int) -> None:
        self._epoch, self._batches, self._finished = epoch, 0, False
        self._docs_state, self._rows, self._carry, self._taken = None, 0, None, 0
        self._target = None
        self._ended: dict[str, Any] | None = None  # the documents' state once all are packed

    # ------------------------------------------------------------------ rows

    def _block_rows(self, block: Mapping[str, Any], counts: dict[str, float] | None) -> list[Row]:
        """The rows of one block of documents (each row with the block's documents)."""
        rows, plan, documents = block_rows(block, self.packing)
        if counts is not None:
            counts["documents"] += documents
            counts["documents_split"] += plan.split
            counts["documents_dropped"] += plan.dropped
            counts["tokens_dropped"] += plan.dropped_tokens
        return rows

    def _carried(self, carry: Mapping[str, Any] | None, rank: int, world_size: int) -> list[Row]:
        """The rows an elastic resume dealt to ``rank`` of ``world_size`` (recomputed)."""
        if carry is None:
            return []
        left: list[Row] = []
        for old in carry["from"]:
            left += self._carried(old["carry"], old["rank"], old["world_size"])[old["taken"] :]
            loader = self._make_docs(old["rank"], old["world_size"])
            self._position(loader, old)
            block = next(iter(loader), None)
            if block is not None:
                left += self._block_rows(block, None)[old["rows"] :]
        return left[rank::world_size]

    def _equal_target(self, epoch: int) -> int:
        """``equal_batches``: the most batches any rank yields in ``epoch`` (every rank's
        documents planned, from the epoch's start: a pure function of the order)."""
        most = 0
        for rank in range(self.world_size):
            loader = self._make_docs(rank, self.world_size)
            loader.set_epoch(epoch)
            rows = 0
            for block in loader:
                found, _, _ = block_rows(block, self.packing)
                rows += len(found)
                if self._dtype is None and found:
                    self._dtype = found[0][0][0].dtype
            most = max(most, rows // self.batch_size if self.drop_last
                       else -(-rows // self.batch_size))  # fmt: skip
        return most

    def _equal_rest(self, pulled: list[Any]) -> int:
        """``equal_batches`` after an elastic resume: the most batches any new rank yields from
        the resume point (its carried rows, then its documents no old rank had pulled)."""
        most = 0
        for rank in range(self.world_size):
            rows = len(self._carried(self._carry, rank, self.world_size))
            loader = self._make_docs(rank, self.world_size)
            loader.load_state_dict(pulled)
            rows += sum(len(block_rows(block, self.packing)[0]) for block in loader)
            most = max(most, rows // self.batch_size if self.drop_last
                       else -(-rows // self.batch_size))  # fmt: skip
        return most

    def _empty_batch(self) -> dict[str, Any]:
        """A batch of empty rows (``equal_batches``: a rank whose rows ran out)."""
        dtype = np.int64 if self._dtype is None else self._dtype
        empty = row_arrays([np.zeros(0, dtype=dtype)], [[]] * self.batch_size, self.packing)
        return to_format(empty, self.format)

    @staticmethod
    def _position(loader: Any, state: Mapping[str, Any]) -> None:
        if state["docs"] is None:
            loader.set_epoch(state["epoch"])
        else:
            loader.load_state_dict(state["docs"])

    def _batch(self, rows: list[Row]) -> dict[str, Any]:
        return to_format(rows_batch(rows, self.packing), self.format)

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._finished:
            self._start(self._epoch + 1)
        self._restored = False
        return self._iterate()

    def _iterate(self) -> Iterator[dict[str, Any]]:
        epoch, size = self._epoch, self.batch_size
        counts = self._metrics.setdefault(epoch, dict.fromkeys(
            ("batches", "rows", "tokens", "padding", "documents", "documents_split",
             "documents_dropped", "tokens_dropped", "rows_dropped", "batches_empty", "seconds"),
            0.0))  # fmt: skip
        if self.packing.equal_batches and self._target is None:
            self._target = self._equal_target(epoch)
        started = time.perf_counter()
        # the rows to deliver, each with the state that follows its delivery
        queue: list[tuple[Row, tuple[Any, int, int]]] = []
        carried = self._carried(self._carry, self.rank, self.world_size)
        queue += [(row, (self._docs_state, self._rows, i + 1))
                  for i, row in enumerate(carried) if i >= self._taken]  # fmt: skip
        docs = self.docs
        self._position(docs, {"docs": self._docs_state, "epoch": epoch})
        blocks = iter(docs)
        skip = self._rows
        exhausted = False
        try:
            while True:
                while len(queue) < size and not exhausted:
                    before = docs.state_dict()
                    block = next(blocks, None)
                    if block is None:
                        exhausted = True
                        break
                    rows = self._block_rows(block, counts)
                    queue += [(row, (before, j + 1, -1)) for j, row in enumerate(rows) if j >= skip]
                    skip = 0
                if not queue or (len(queue) < size and self.drop_last):
                    counts["rows_dropped"] += len(queue)
                    queue = []
                    if self._target is None or self._batches >= self._target:
                        break
                    self._batches += 1  # equal_batches: a batch of empty rows
                    counts["batches"] += 1
                    counts["batches_empty"] += 1
                    counts["rows"] += size
                    counts["padding"] += size * self.packing.seq_len
                    yield self._empty_batch()
                    continue
                take, queue = queue[:size], queue[size:]
                batch = self._batch([row for row, _ in take])
                docs_state, delivered, taken = take[-1][1]
                self._docs_state, self._rows = docs_state, delivered
                if taken < 0:  # past the carried rows
                    self._carry, self._taken = None, 0
                else:
                    self._taken = taken
                self._batches += 1
                real = sum(e - s for row, _ in take for _, s, e in row[1])
                counts["batches"] += 1
                counts["rows"] += len(take)
                counts["tokens"] += real
                counts["padding"] += len(take) * self.packing.seq_len - real
                counts["seconds"] += time.perf_counter() - started
                yield batch
                started = time.perf_counter()
            self._finished = True
            self._ended = docs.state_dict()
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The position: tiny and JSON-safe (no token is stored)."""
        if self._finished:
            epoch, docs, rows, carry, taken = self._epoch + 1, None, 0, None, 0
        else:
            epoch, docs, rows = self._epoch, self._docs_state, self._rows
            carry, taken = self._carry, self._taken
        return {"version": PACK_STATE_VERSION, "packing": self.packing.as_dict(),
                "epoch": epoch, "batches": 0 if self._finished else self._batches,
                "rank": self.rank, "world_size": self.world_size, "docs": docs, "rows": rows,
                "carry": carry, "taken": taken,
                "target": None if self._finished else self._target,
                "ended": self._ended if self._finished else None}  # fmt: skip

    def _parse(self, state: Any) -> list[dict[str, Any]]:
        states = [state] if isinstance(state, Mapping) else list(state)
        if not states:
            raise _fail("got no state")
        # a version-2 state (before ``ended``) is a version-3 state with nothing ended
        states = [_upgraded(s) for s in states]
        for s in states:
            if not isinstance(s, Mapping) or set(s) != set(_KEYS):
                raise _fail(f"expected a dict with keys {list(_KEYS)}, got {str(s)[:120]!r}")
            if s["version"] != PACK_STATE_VERSION:
                raise _fail(f"version {s['version']!r} is not {PACK_STATE_VERSION}")
            target = s["target"]
            if target is not None and (isinstance(target, bool) or not isinstance(target, int)
                                       or target < 0):  # fmt: skip
                raise _fail(f"target {target!r} is not None or a count")
            if s["packing"] != self.packing.as_dict():
                raise ConfigurationError(
                    f"Packed loader state: packed with {s['packing']}, this loader packs with "
                    f"{self.packing.as_dict()}. Fix: resume with the checkpoint's fl.Packing "
                    "(another packing would change which rows were delivered)."
                )
        return [dict(s) for s in states]

    def _one_epoch(self, states: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The old ranks' states in one epoch: a rank that had packed its last row (its state
        names the next epoch's start) while others had rows left is put at the end of the
        others' epoch (its document loader's state at that end, kept in ``ended``)."""
        epochs = sorted({s["epoch"] for s in states})
        if len(epochs) == 1:
            return states
        done = [s for s in states if s["epoch"] == epochs[-1]]
        if len(epochs) != 2 or epochs[1] != epochs[0] + 1 or any(s["ended"] is None
                                                                 for s in done):  # fmt: skip
            raise _fail(f"the states are of different epochs {[s['epoch'] for s in states]}")
        return [dict(s, epoch=epochs[0], docs=s["ended"], rows=0, carry=None, taken=0,
                     ended=None) if s["epoch"] == epochs[-1] else s for s in states]  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume from ``state_dict()``: this rank's own state on as many ranks, or every old
        rank's state (a list in rank order) on another number of ranks."""
        states = self._parse(state)
        old_world = states[0]["world_size"]
        if old_world == self.world_size:
            mine = [s for s in states if s["rank"] == self.rank]
            if not mine:
                raise _fail(f"no state of rank {self.rank} (ranks packed at different paces: "
                            "each rank resumes from its own state)")  # fmt: skip
            s = mine[0]
            self._start(s["epoch"])
            self._docs_state, self._rows = s["docs"], s["rows"]
            self._carry, self._taken, self._batches = s["carry"], s["taken"], s["batches"]
            self._target = s["target"]
        else:
            if [s["rank"] for s in states] != list(range(old_world)):
                raise _fail(f"world_size changed from {old_world} to {self.world_size}: pass all "
                            f"{old_world} old ranks' states in rank order")  # fmt: skip
            states = self._one_epoch(states)
            pulled = []
            for s in states:  # the documents each old rank pulled, its block included
                loader = self._make_docs(s["rank"], old_world)
                self._position(loader, s)
                blocks = iter(loader)
                next(blocks, None)
                pulled.append(loader.state_dict())
            self._start(states[0]["epoch"])
            self.docs.load_state_dict(pulled)
            self._docs_state = self.docs.state_dict()
            self._carry = {"from": states, "world_size": self.world_size}
            if self.packing.equal_batches:
                self._target = self._equal_rest(pulled)
        self._restored = True

    def metrics(self) -> list[dict[str, Any]]:
        """Per epoch: batches, rows, tokens, ``padding_fraction``, documents, split and dropped
        documents, ``tokens_per_s`` (from the caller's side)."""
        out = []
        for epoch, c in sorted(self._metrics.items()):
            slots = c["rows"] * self.packing.seq_len
            out.append({
                "epoch": epoch, "batches": int(c["batches"]), "rows": int(c["rows"]),
                "tokens": int(c["tokens"]), "padding_fraction": c["padding"] / slots if slots
                else 0.0, "documents": int(c["documents"]),
                "documents_split": int(c["documents_split"]),
                "documents_dropped": int(c["documents_dropped"]),
                "tokens_dropped": int(c["tokens_dropped"]), "rows_dropped": int(c["rows_dropped"]),
                "batches_empty": int(c.get("batches_empty", 0)),
                "seconds": c["seconds"],
                "tokens_per_s": c["tokens"] / c["seconds"] if c["seconds"] else 0.0,
            })  # fmt: skip
        return out


def _upgraded(state: Any) -> Any:
    """A version-2 state as version 3: the same keys and ``ended=None`` (version 2 kept no
    end state, so a rank that had finished its epoch resumes as version 2 did)."""
    if isinstance(state, Mapping) and state.get("version") == 2 and "ended" not in state:
        return dict(state, version=PACK_STATE_VERSION, ended=None)
    return state
