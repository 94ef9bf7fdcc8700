"""Fitted partials merged in Ray tasks, in the fixed tree of :mod:`feedline.engines.batch.partials`.

The aggregation stage of the Ray engine emits one row ``(task, pickled partial)`` per read
task, in read-task order (``preserve_order``). The driver never loads them: it walks the
stage's output blocks by reference (``iter_internal_ref_bundles``), hands every
:data:`CHUNK` consecutive blocks to a Ray task (:func:`merge_chunk`) that reduces its
contiguous range of read tasks to the aligned blocks of the fixed tree
(:class:`~feedline.engines.batch.partials.TreeMerger`), and pushes the chunks' blocks, in order,
into its own ``TreeMerger``. So the driver holds block references and ``O(log n)``
partials, not one partial per task (a ``StringIndexer`` partial is a whole value-count
table), and the result is bit-identical to the local engine's, which merges the same
leaves in the same tree.

A read task whose output Ray split into several blocks (only after an actor stage, for
outputs over Ray's block size) yields several rows with its index: they are folded in
order into its leaf. When such a task straddles two chunks, the tree's shape is lost; the
rest is then folded in order (still every partial merged once, no longer the local
engine's bits; the local engine folds such plans' batches differently anyway).
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from feedline.engines.batch.partials import TreeMerger, fold

__all__ = ["CHUNK", "merge_chunk", "merge_in_tasks"]

#: output blocks of the aggregation stage merged by one Ray task
CHUNK = 16

#: a chunk's result: its first and last read-task index and its aligned tree blocks
Chunk = tuple[int, int, list[tuple[int, int, Any]]]


def merge_chunk(merge: Callable[[Any, Any], Any], *tables: pa.Table) -> Chunk | None:
    """Reduce consecutive aggregation-stage blocks (runs in a Ray task).

    Examples
    --------
    >>> rows = lambda *pairs: pa.table({"task": [p[0] for p in pairs],
    ...                                 "partial": [pickle.dumps(p[1]) for p in pairs]})
    >>> merge_chunk(lambda a, b: a + b, rows((0, 1), (1, 2)), rows((2, 4), (3, 8), (3, 16)))
    (0, 3, [(2, 0, 31)])
    """
    leaves: list[tuple[int, Any]] = []
    for table in tables:
        tasks = table.column("task").to_pylist()
        for index, blob in zip(tasks, table.column("partial").to_pylist(), strict=True):
            value = pickle.loads(blob)
            if leaves and leaves[-1][0] == index:  # one task split over several blocks
                leaves[-1] = (index, merge(leaves[-1][1], value))
            else:
                leaves.append((index, value))
    if not leaves:
        return None
    tree = TreeMerger(merge)
    for index, value in leaves:
        tree.push(0, index, value)
    return leaves[0][0], leaves[-1][0], tree.blocks()


class _Assembler:
    """The driver's side: chunk results pushed in order into one ``TreeMerger``."""

    def __init__(self, merge: Callable[[Any, Any], Any]) -> None:
        self.merge = merge
        self.tree = TreeMerger(merge)
        self.last = -1  # the last read task seen
        self.folded: list[Any] | None = None  # set once a task straddled two chunks

    def add(self, chunk: Chunk | None) -> None:
        if chunk is None:
            return
        first, last, blocks = chunk
        if self.folded is None and first <= self.last:
            self.folded = [self.tree.result()]
        if self.folded is None:
            for block in blocks:
                self.tree.push(*block)
        else:
            self.folded = [fold([*self.folded, *(value for _, _, value in blocks)], self.merge)]
        self.last = last

    def result(self) -> Any:
        return self.tree.result() if self.folded is None else self.folded[0]


def merge_in_tasks(bundles: Iterable[Any], merge: Callable[[Any, Any], Any]) -> Any:
    """Merge the partials of the aggregation stage's output ``bundles`` (Ray ``RefBundle``
    objects, in read-task order) in Ray tasks; ``None`` when there are none."""
    import ray

    remote = ray.remote(merge_chunk)
    assembler = _Assembler(merge)
    running: deque[Any] = deque()
    group: list[Any] = []

    def absorb(block: bool) -> None:
        while running and (block or ray.wait([running[0]], timeout=0)[0]):
            assembler.add(ray.get(running.popleft()))

    for bundle in bundles:
        group.extend(bundle.block_refs)
        if len(group) >= CHUNK:
            running.append(remote.remote(merge, *group))
            group = []
            absorb(block=False)
    if group:
        running.append(remote.remote(merge, *group))
    absorb(block=True)
    return assembler.result()
