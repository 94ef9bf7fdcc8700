"""Packed columns: numeric columns of one dtype held row-major in one 2-D array.

A wide table (a CSV, a pandas frame or a Spark table: 32 float32 feature columns and an
int64 label) would cost one ``np.take`` and one tensor per column and batch. Instead the
loader holds the scalar columns of each dtype side by side in one ``(rows, width)`` array
(a *block*), gathered with one take per batch, and hands out:

- ``stack={"features": [...]}``: one ``(batch, F)`` array of those columns (``F`` = their
  total width; a tensor column adds its element count), the gathered block itself when the
  block holds nothing else;
- the per-column dict: column slices of the gathered block (strided views, no copy; when
  the caller gives ``out=`` buffers for those keys they are copied there).

A :class:`Packing` decides the blocks from the column specs, the stacks and the columns
asked for; :func:`column_views` gives every column's slice of the storage (what the cache
fill writes into) and :func:`gather_packed` gathers a batch.

Examples
--------
>>> import numpy as np, pyarrow as pa
>>> from feedline.loader.data.columns import column_specs
>>> specs = column_specs(pa.schema({"a": pa.float32(), "b": pa.float32(), "y": pa.int64()}))
>>> packing = plan_packing(specs, stack={"x": ["a", "b"]})
>>> [(b.key, b.width, str(b.dtype)) for b in packing.blocks], packing.order
([('x', 2, 'float32'), ('y', 1, 'int64')], ('y', 'x'))
>>> storage = packing.allocate(3)
>>> views = column_views(packing, storage)
>>> views["a"][:], views["b"][:], views["y"][:] = [1, 2, 3], [4, 5, 6], [7, 8, 9]
>>> out = gather_packed(packing, storage, np.array([2, 0]))
>>> out["x"].tolist(), out["y"].tolist()
([[3.0, 6.0], [1.0, 4.0]], [9, 7])
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from feedline.errors import ConfigurationError, SchemaError
from feedline.loader.data.bulk_arrays import LARGE, empty
from feedline.loader.data.columns import ColumnSpec

__all__ = ["Block", "Packing", "Slot", "column_views", "gather_packed", "plan_packing"]


@dataclass(frozen=True)
class Slot:
    """One batch key served by a block: columns ``start:stop`` of it, one sample's shape."""

    key: str
    start: int
    stop: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Block:
    """Columns of one dtype held side by side in a ``(rows, width)`` array.

    ``key`` names the block's buffer: the batch key covering the whole block (a stack, or
    a block of one column), else ``"\\x00packed:<dtype>"``.
    """

    key: str
    dtype: np.dtype
    columns: tuple[ColumnSpec, ...]
    offsets: tuple[int, ...]
    width: int
    slots: tuple[Slot, ...]

    @functools.cached_property
    def whole(self) -> Slot | None:
        """The first slot covering the whole block (a stack, or a block of one column)."""
        return next((s for s in self.slots if s.start == 0 and s.stop == self.width), None)

    def buffer_shape(self) -> tuple[tuple[int, ...], np.dtype]:
        """One row of the block's gather buffer (the served key's shape when it is whole)."""
        whole = self.whole
        return (whole.shape if whole is not None else (self.width,)), self.dtype


@dataclass(frozen=True)
class Packing:
    """Which columns are packed in which blocks, which are held alone, and the batch keys.

    Attributes
    ----------
    blocks:
        The packed blocks.
    singles:
        Columns held in their own array (tensors not stacked, strings).
    order:
        The batch's keys, in order.
    """

    blocks: tuple[Block, ...]
    singles: tuple[ColumnSpec, ...]
    order: tuple[str, ...]

    @property
    def specs(self) -> list[ColumnSpec]:
        """Every column to read, with the dtype it is held in."""
        return [c for b in self.blocks for c in b.columns] + list(self.singles)

    @property
    def row_bytes(self) -> int:
        """Bytes one row takes in the storage."""
        return sum(b.width * b.dtype.itemsize for b in self.blocks) + sum(
            s.row_bytes for s in self.singles
        )

    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per batch key: the shape of one sample and its dtype (a new dict each call)."""
        return dict(self._shapes)

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per gather buffer: one row's shape and dtype (see :func:`gather_packed`)."""
        return dict(self._buffer_shapes)

    @functools.cached_property
    def _shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        found = {s.key: (s.shape, b.dtype) for b in self.blocks for s in b.slots}
        found |= {c.name: (c.shape, c.dtype) for c in self.singles}
        return {k: found[k] for k in self.order}

    @functools.cached_property
    def _buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        out = {b.key: b.buffer_shape() for b in self.blocks}
        return out | {c.name: (c.shape, c.dtype) for c in self.singles}

    def allocate(self, rows: int, large: int = LARGE) -> dict[str, np.ndarray]:
        """Empty storage for ``rows`` rows: one array per block and per single column (those
        of ``large`` bytes or more in memory the kernel can populate in bulk, and that goes
        back to the system when dropped: :mod:`feedline.loader.data.bulk_arrays`).
        """
        out = {b.key: empty((rows, b.width), b.dtype, large) for b in self.blocks}
        return out | {c.name: empty((rows, *c.shape), c.dtype, large) for c in self.singles}


def _width(spec: ColumnSpec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64))


def _check_stack(stack: Mapping[str, Sequence[str]], specs: Mapping[str, ColumnSpec]) -> None:
    seen: dict[str, str] = {}
    for key, members in stack.items():
        if not isinstance(key, str) or not key or isinstance(members, str) or not members:
            raise ConfigurationError(
                f"Loader: stack={{{key!r}: {members!r}}} must map a key to a non-empty list of "
                "column names. Fix: e.g. stack={'features': ['a', 'b']}."
            )
        for name in members:
            if name in seen:
                raise ConfigurationError(
                    f"Loader: column {name!r} is in two stacks ({seen[name]!r} and {key!r}). "
                    "Fix: put each column in one stack."
                )
            seen[name] = key
            if specs[name].kind not in ("numeric", "tensor"):
                raise SchemaError(
                    f"Loader: stack {key!r} names the {specs[name].kind} column {name!r}; "
                    "stacks hold numeric columns. Fix: leave it out of the stack."
                )


def plan_packing(
    specs: Sequence[ColumnSpec],
    stack: Mapping[str, Sequence[str]] | None = None,
    outputs: Sequence[str] | None = None,
    stack_dtypes: Mapping[str, np.dtype] | None = None,
) -> Packing:
    """The blocks for ``specs``: each stack a block range, scalar columns packed by dtype.

    ``specs`` holds every column to read (stack members included); ``outputs`` the columns
    the batch dict holds (default: every column in no stack). A stack's dtype is
    ``stack_dtypes[key]`` or the common dtype of its members (``np.result_type``); its
    members are held in it. Tensor columns outside stacks and string columns are held alone.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.loader.data.columns import column_specs
    >>> specs = column_specs(pa.schema({"a": pa.float32(), "b": pa.float64()}))
    >>> p = plan_packing(specs, stack={"x": ["a", "b"]}, outputs=["a"])
    >>> p.order, p.shapes()["x"], p.shapes()["a"]
    (('a', 'x'), ((2,), dtype('float64')), ((), dtype('float64')))
    """
    by_name = {s.name: s for s in specs}
    stack = dict(stack or {})
    _check_stack(stack, by_name)
    stacked = {name for members in stack.values() for name in members}
    if outputs is None:
        outputs = [s.name for s in specs if s.name not in stacked]
    clash = sorted(set(stack) & (set(outputs) | (set(by_name) - stacked)))
    if clash:
        raise ConfigurationError(
            f"Loader: stack key(s) {clash} are also column names. Fix: name the stacks "
            "differently (e.g. 'features')."
        )
    # a block per stack (contiguous: the gathered block is the stack), then one per dtype
    # for the other scalar columns
    groups: dict[tuple[str, np.dtype], list[tuple[str | None, list[ColumnSpec]]]] = {}
    for key, members in stack.items():
        dtype = np.dtype((stack_dtypes or {}).get(key) or np.result_type(
            *[by_name[m].dtype for m in members]))  # fmt: skip
        held = [replace(by_name[m], dtype=dtype) for m in members]
        groups[(key, dtype)] = [(key, held)]
    singles = []
    for name in outputs:
        spec = by_name[name]
        if name in stacked:
            continue  # a view of its stack's block
        if spec.kind == "numeric":
            groups.setdefault(("", spec.dtype), []).append((None, [spec]))
        else:
            singles.append(spec)
    blocks = []
    for (_, dtype), parts in groups.items():
        columns, offsets, slots, at = [], [], [], 0
        for stack_key, held in parts:
            first = at
            for spec in held:
                columns.append(spec)
                offsets.append(at)
                at += _width(spec)
            if stack_key is not None:
                slots.append(Slot(stack_key, first, at, (at - first,)))
        for spec, offset in zip(columns, offsets, strict=True):
            if spec.name in outputs:
                slots.append(Slot(spec.name, offset, offset + _width(spec), spec.shape))
        block = Block("", dtype, tuple(columns), tuple(offsets), at, tuple(slots))
        name = block.whole.key if block.whole is not None else f"\x00packed:{dtype}"
        blocks.append(replace(block, key=name))
    order = tuple(dict.fromkeys([*outputs, *stack]))
    return Packing(tuple(blocks), tuple(singles), order)


def column_views(packing: Packing, storage: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every column's ``(rows, *shape)`` slice of ``storage`` (views: writes land in it)."""
    views = {}
    for block in packing.blocks:
        values = storage[block.key]
        for spec, offset in zip(block.columns, block.offsets, strict=True):
            part = values[:, offset : offset + _width(spec)]
            views[spec.name] = part.reshape(len(values), *spec.shape)
    return views | {c.name: storage[c.name] for c in packing.singles}


def _rows_view(array: np.ndarray, rows: int, width: int) -> np.ndarray | None:
    """``array`` seen as ``(rows, width)`` without a copy, or ``None`` when it cannot be."""
    try:
        view = array.reshape(rows, width)
    except ValueError:
        return None
    # reshape copies when no view can do (assigning .shape, which raised instead, is
    # deprecated since NumPy 2.5): keep only a true view of the same memory
    if view.size and not np.shares_memory(view, array):
        return None
    return view


def gather_packed(
    packing: Packing,
    storage: Mapping[str, np.ndarray],
    indices: np.ndarray,
    out: Mapping[str, np.ndarray] | None = None,
    scratch: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Rows ``indices`` of every batch key: one ``np.take`` per block and per single column.

    ``out`` may hold buffers keyed by :meth:`Packing.buffer_shapes` (a block's key) or by
    batch key (:meth:`Packing.shapes`). A block is taken into its buffer when ``out`` has
    one (its batch keys are then views of it); a batch key present in ``out`` comes back
    as that very buffer, filled. Without a buffer a block is taken into fresh memory, or
    into ``scratch`` (reused across calls) when its keys are copied into ``out`` anyway.
    """
    idx = np.asarray(indices, dtype=np.int64)
    n = idx.size
    result: dict[str, np.ndarray] = {}
    for block in packing.blocks:
        values = storage[block.key]
        if not out:  # the common case without buffers: views of a fresh block
            got = values.take(idx, axis=0)
            for slot in block.slots:
                whole = slot.start == 0 and slot.stop == block.width
                view = got if whole else got[:, slot.start : slot.stop]
                if view.shape[1:] != slot.shape:
                    view = view.reshape(n, *slot.shape)
                result[slot.key] = view
            continue
        dst, filled = None, None
        covering = block.whole
        for key in (block.key, None if covering is None else covering.key):
            if dst is None and key is not None and key in out:
                dst, filled = _rows_view(out[key], n, block.width), out[key]
        if dst is None and scratch is not None and any(s.key in out for s in block.slots):
            held = scratch.get(block.key)
            if held is None or len(held) < n:
                held = scratch[block.key] = np.empty((n, block.width), block.dtype)
            dst = held[:n]
        if dst is None:
            got = values.take(idx, axis=0)
        else:
            got = values.take(idx, axis=0, out=dst, mode="clip")
        for slot in block.slots:
            target = out.get(slot.key)
            if target is not None and target is filled:
                result[slot.key] = target  # the very buffer the block was taken into
                continue
            view = got[:, slot.start : slot.stop].reshape(n, *slot.shape)
            if target is not None:
                np.copyto(target, view)
                view = target
            result[slot.key] = view
    for spec in packing.singles:
        values = storage[spec.name]
        if out and spec.name in out:
            result[spec.name] = values.take(idx, axis=0, out=out[spec.name], mode="clip")
        else:
            result[spec.name] = values.take(idx, axis=0)
    return {k: result[k] for k in packing.order}
