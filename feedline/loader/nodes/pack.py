"""``Pack``: a node that packs its source's documents into rows of exactly ``seq_len`` tokens.

Each batch of the source is one buffer of documents (a dict of columns holding
``packing.column``, one token list per document: ``loader.source_node()`` of a loader with
``batch_size=packing.buffer_size``, ``drop_last=False``, as ``ds.loader(pack=...)`` reads
them). Each buffer is packed by itself (:func:`~feedline.loader.packing.blocks.block_rows`, the
code ``ds.loader(pack=...)`` runs), and the stream of rows is cut into batches of
``batch_size`` rows, so for the same documents the node yields the batches
``ds.loader(pack=...)`` yields. A :class:`~feedline.loader.nodes.Batch` of packed rows has
the arrays of :func:`~feedline.loader.packing.rows.row_arrays` (numpy; wrap the node in
:class:`~feedline.loader.nodes.Format` for tensors) and, as ``indices``, the rows' numbers in
this rank's epoch.

The state is ``{"epoch": e, "batches": k, "blocks": b, "rows": r}``: ``k`` packed batches
delivered, and the next row is row ``r`` of the source's batch ``b``. ``reset`` with all four
moves the source to its batch ``b`` and skips ``r`` rows; ``reset`` with only ``epoch`` and
``batches`` (what a node wrapped around this one reports) replays the epoch's documents from
its start up to the position (planning their rows: no array is built), so it is exact too,
at the cost of reading those documents again. Documents the source marks ``padded`` (repeats
that pad the epoch) are left out, as ``ds.loader(pack=...)`` leaves them out.

Examples
--------
>>> import feedline as fl, pyarrow as pa
>>> from feedline.loader.packing.spec import Packing
>>> ds = fl.from_arrow(pa.table({"input_ids": pa.array([[1, 2, 3], [4, 5], [6, 7, 8, 9]],
...                                                     pa.list_(pa.int32()))}))
>>> docs = ds.loader(batch_size=2, shuffle=False, drop_last=False, format="numpy",
...                   ragged={"input_ids": "list"})
>>> node = Pack(docs.source_node(), Packing(seq_len=5, buffer_size=2), batch_size=1)
>>> [b.data["input_ids"].tolist() for b in node]
[[[1, 2, 3, 4, 5]], [[6, 7, 8, 9, 0]]]
>>> node.reset({"epoch": 0, "batches": 1})
>>> next(node).data["input_ids"].tolist(), node.get_state()
([[6, 7, 8, 9, 0]], {'epoch': 0, 'batches': 2, 'blocks': 2, 'rows': 0})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError
from feedline.loader.checks import checked_int
from feedline.loader.nodes.node import Batch, Node, parse_position
from feedline.loader.packing.blocks import Row, block_rows, rows_batch
from feedline.loader.packing.spec import Packing

__all__ = ["Pack"]

#: a queued row and where it stands: (row, source batch it came from, its number there)
_Queued = tuple[Row, int, int]


class Pack(Node):
    """Batches of ``batch_size`` packed rows from a source of document buffers.

    Parameters
    ----------
    source:
        A node whose batches are buffers of documents (see the module docstring).
    packing:
        How to pack (:class:`~feedline.loader.packing.spec.Packing`, ``fl.Packing``).
    batch_size:
        Rows per batch.
    drop_last:
        Drop the epoch's last batch when it has fewer than ``batch_size`` rows.

    Examples
    --------
    >>> from feedline.loader.nodes.indices import Order
    >>> Pack(Order.of([4], batch_size=2), Packing(seq_len=4), batch_size=0)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Pack: batch_size must be an int >= 1, got 0. Fix: ...
    """

    def __init__(
        self, source: Node, packing: Packing, *, batch_size: int, drop_last: bool = False
    ) -> None:
        if not isinstance(source, Node):
            raise ConfigurationError(
                f"Pack takes a feedline node as its source, got {type(source).__name__}. Fix: "
                "pass loader.source_node() of a loader of documents (batch_size=buffer_size)."
            )
        if not isinstance(packing, Packing):
            raise ConfigurationError(
                f"Pack: packing must be an fl.Packing, got {type(packing).__name__}. Fix: "
                "pass fl.Packing(seq_len=...)."
            )
        self.batch_size = checked_int(batch_size, 1, fail=_batch_size_error(batch_size))
        self.source, self.packing, self.drop_last = source, packing, bool(drop_last)
        position = parse_position(source.get_state(), type(source).__name__)
        assert position is not None  # a node's state is never None
        if position[1]:
            raise ConfigurationError(
                f"Pack: its source stands at batch {position[1]} of epoch {position[0]}, not at "
                "an epoch's start (a packed batch's number would not say where it stands). "
                "Fix: build the source at an epoch's start and resume with pack.reset(state)."
            )
        self._start(position[0])

    def _start(self, epoch: int) -> None:
        self._epoch, self._batches, self._blocks, self._rows = epoch, 0, 0, 0
        self._read = 0  # source batches read (those queued included)
        self._queue: list[_Queued] = []
        self._exhausted = False

    # ------------------------------------------------------------------ iteration

    def _fill(self) -> None:
        """Read source batches until a batch of rows is queued or the epoch ends."""
        while len(self._queue) < self.batch_size and not self._exhausted:
            try:
                block = self.source.next()
            except StopIteration:
                self._exhausted = True
                break
            number = self._read
            self._read += 1
            rows = block_rows(block.data, self.packing, block.padded)[0]
            skip = self._rows if number == self._blocks else 0
            self._queue += [(row, number, j) for j, row in enumerate(rows) if j >= skip]

    def next(self) -> Batch:
        self._fill()
        queue = self._queue
        if not queue or (len(queue) < self.batch_size and self.drop_last):
            self._queue = []
            raise StopIteration
        take, self._queue = queue[: self.batch_size], queue[self.batch_size :]
        number, first = self._batches, self._batches * self.batch_size
        data = rows_batch([row for row, _, _ in take], self.packing)
        if self._queue:
            _, self._blocks, self._rows = self._queue[0]
        else:
            self._blocks, self._rows = self._read, 0
        self._batches += 1
        indices = np.arange(first, first + len(take), dtype=np.int64)
        return Batch(self._epoch, number, indices, None, data)

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches": self._batches, "blocks": self._blocks,
                "rows": self._rows}  # fmt: skip

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        position = parse_position(initial_state, "Pack")
        epoch, batches = (self._epoch, 0) if position is None else position
        where = None if initial_state is None else _block_position(initial_state)
        self._start(epoch)
        if initial_state is None:  # the epoch's start
            where = (0, 0)
        if where is not None:  # the exact position is given
            self._blocks, self._rows = where
            self._batches = batches
            self.source.reset({"epoch": epoch, "batches": where[0]})
            self._read = where[0]
            return
        self.source.reset({"epoch": epoch, "batches": 0})
        self._replay(batches)

    def _replay(self, batches: int) -> None:
        """Move to the ``batches``-th packed batch of the epoch by packing lengths only."""
        skip = batches * self.batch_size  # rows delivered
        while skip:
            try:
                block = self.source.next()
            except StopIteration:
                self._exhausted = True
                break
            number = self._read
            self._read += 1
            rows = block_rows(block.data, self.packing, block.padded)[0]
            if len(rows) > skip:  # the next row is in this block: queue its rows from there
                self._blocks, self._rows = number, skip
                self._queue = [(row, number, j) for j, row in enumerate(rows) if j >= skip]
                break
            skip -= len(rows)
        if not self._queue:
            # every delivered row is passed: stand at the next block boundary, before any
            # blocks that pack to no row, as next() does when a batch empties its queue
            self._blocks, self._rows = self._read, 0
        self._batches = batches

    def close(self) -> None:
        self._queue = []
        self.source.close()


def _block_position(state: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(blocks, rows)`` when the state has both, validated; ``None`` when it has neither."""
    has = [key in state for key in ("blocks", "rows")]
    if not any(has):
        return None
    values: list[Any] = [state.get(key) for key in ("blocks", "rows")]
    if not all(has) or not all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise ConfigurationError(
            f"Pack.reset() got {dict(state)!r}; a Pack state has 'blocks' and 'rows' (non-"
            "negative ints) with 'epoch' and 'batches', or neither. Fix: pass what get_state() "
            "returned, or only {'epoch': e, 'batches': k}."
        )
    return int(values[0]), int(values[1])


def _batch_size_error(value: Any) -> Any:
    def fail(expected: str) -> ConfigurationError:
        return ConfigurationError(
            f"Pack: batch_size must be {expected}, got {value!r}. Fix: pass batch_size=1 or more."
        )

    return fail
