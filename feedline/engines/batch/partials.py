"""Merging partial aggregates in one fixed order, whatever the engine and partitioning.

Floating-point merges are not associative: ``merge(merge(a, b), c)`` and
``merge(a, merge(b, c))`` can differ in the last bit. For fitted state (a scaler's mean, a
quantile sketch, a value-count table's order) to be *bit-identical* on the local, Spark
and Ray engines, every engine merges the same partials in the same tree:

- **Leaves** are the read tasks, by index (``0 .. n-1`` in the source's task order). A
  leaf's partial is ``partial`` of each of the task's output batches, folded left to right
  (the batches a task yields are the same on every engine: the same reader and fused
  operators run them).
- **The tree** is the fixed binary tree over task indices: node ``(level, index)`` covers
  tasks ``[index * 2**level, (index + 1) * 2**level)`` and is ``merge(left, right)`` of its
  two children; a child without rows (``None``) is skipped. It does not depend on the
  number of tasks, on how tasks are grouped into partitions or on when they finish.

A worker that runs a contiguous range of tasks reduces them to the range's maximal
aligned blocks (at most ``2 log2 n`` of them) with :class:`TreeMerger`; whoever receives
the blocks, in task order, pushes them into another :class:`TreeMerger` and takes
:meth:`TreeMerger.result`. Either side holds ``O(log n)`` partials at a time.

Examples
--------
>>> from fractions import Fraction
>>> merge = lambda a, b: f"({a}+{b})"
>>> whole = TreeMerger(merge)
>>> for i in range(5):
...     whole.push(0, i, str(i))
>>> whole.result()
'(((0+1)+(2+3))+4)'
>>> left, right = TreeMerger(merge), TreeMerger(merge)  # the same tasks split 3 + 2
>>> for i in range(3):
...     left.push(0, i, str(i))
>>> for i in range(3, 5):
...     right.push(0, i, str(i))
>>> again = TreeMerger(merge)
>>> for level, index, value in left.blocks() + right.blocks():
...     again.push(level, index, value)
>>> again.result()
'(((0+1)+(2+3))+4)'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["TreeMerger", "fold", "merge_in_fixed_order"]


def fold(values: Iterable[Any], merge: Callable[[Any, Any], Any]) -> Any:
    """Left fold of ``values`` with ``merge``, skipping ``None`` (``None`` when empty).

    Examples
    --------
    >>> fold([1, None, 2, 3], lambda a, b: a + b)
    6
    >>> fold([], max) is None
    True
    """
    result = None
    for value in values:
        if value is not None:
            result = value if result is None else merge(result, value)
    return result


def merge_in_fixed_order(
    partials: Iterable[Any], merge: Callable[[Any, Any], Any], first: int = 0
) -> Any:
    """The tree merge of per-task ``partials`` (task ``first``, ``first + 1``, ...; ``None``
    for a task without rows). Over all tasks from 0 this is the fixed tree's root.

    Examples
    --------
    >>> merge_in_fixed_order(["a", "b", None, "d", "e"], lambda a, b: f"({a}+{b})")
    '(((a+b)+d)+e)'
    """
    tree = TreeMerger(merge)
    for offset, value in enumerate(partials):
        tree.push(0, first + offset, value)
    return tree.result()


class TreeMerger:
    """Merges blocks of the fixed task tree (see the module docstring) pushed in task order.

    ``push(level, index, value)`` adds the block covering tasks
    ``[index * 2**level, (index + 1) * 2**level)``; blocks must be pushed in increasing task
    order (gaps are tasks without rows), as leaves ``(0, i)`` and the output of
    :meth:`blocks` are. ``value`` is ``None`` for a block without rows.

    Examples
    --------
    >>> tree = TreeMerger(lambda a, b: a + b)
    >>> tree.push(0, 0, 1.0); tree.push(0, 1, None); tree.push(0, 2, 2.5)
    >>> tree.blocks()
    [(1, 0, 1.0), (0, 2, 2.5)]
    >>> tree.result()
    3.5
    """

    def __init__(self, merge: Callable[[Any, Any], Any]) -> None:
        self._merge = merge
        self._stack: list[tuple[int, int, Any]] = []

    def _combine(self, left: Any, right: Any) -> Any:
        if left is None:
            return right
        if right is None:
            return left
        return self._merge(left, right)

    def push(self, level: int, index: int, value: Any) -> None:
        """Add one block (after every block pushed so far); completed sibling pairs are
        merged at once."""
        while self._stack and index % 2 == 1:
            top_level, top_index, top_value = self._stack[-1]
            if top_level != level or top_index != index - 1:
                break
            self._stack.pop()
            value = self._combine(top_value, value)
            level, index = level + 1, index // 2
        self._stack.append((level, index, value))

    def blocks(self) -> list[tuple[int, int, Any]]:
        """The blocks pushed so far, sibling pairs merged, in task order."""
        return list(self._stack)

    def result(self) -> Any:
        """The root of the tree (``None`` without rows).

        Tasks that were never pushed (past the last one, or skipped as empty) hold no
        rows: a node whose one child holds nothing is its other child.
        """
        blocks = [b for b in self._stack if b[2] is not None]
        if not blocks:
            return None
        height = max(((i + 1) << lv).bit_length() for lv, i, _ in blocks)
        return self._node(height, 0, blocks)

    def _node(self, level: int, index: int, blocks: list[tuple[int, int, Any]]) -> Any:
        if not blocks:
            return None
        if len(blocks) == 1 and blocks[0][:2] == (level, index):
            return blocks[0][2]
        middle = (2 * index + 1) << (level - 1)
        split = next((k for k, (lv, i, _) in enumerate(blocks) if i << lv >= middle), len(blocks))
        left = self._node(level - 1, 2 * index, blocks[:split])
        return self._combine(left, self._node(level - 1, 2 * index + 1, blocks[split:]))
