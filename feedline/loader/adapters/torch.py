"""PyTorch output: batches as tensors sharing memory with the gathered arrays.

``torch.from_numpy`` wraps each freshly gathered array without a copy. The NumPy → torch
dtype mapping is the identity for bool (``torch.bool``), int8/16/32/64, uint8 and
float16/32/64; the loader widens uint16/uint32 to int32/int64 when it caches for torch and
refuses uint64 (see :mod:`feedline.loader.data.columns`). With ``pin_memory=True`` a batch is
gathered straight into page-locked tensors (one copy, not two).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline.errors import MissingDependencyError

__all__ = ["batch_buffers", "distributed_defaults", "import_torch", "pin_supported", "to_torch"]


def import_torch() -> Any:
    """Import torch or raise :class:`MissingDependencyError` naming the ``torch`` extra."""
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError("torch", "torch", "The loader's format='torch'") from exc
    return torch


def to_torch(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Arrays → tensors with ``torch.from_numpy`` (no copy); lists and tensors pass through.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.arange(3.0)
    >>> t = to_torch({"a": a})["a"]
    >>> t.data_ptr() == a.ctypes.data
    True
    """
    torch = import_torch()
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def pin_supported() -> bool:
    """True when page-locked memory can be allocated (a CUDA device is present)."""
    torch = import_torch()
    return bool(torch.cuda.is_available())


def batch_buffers(
    shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]], rows: int, *, pin: bool
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Empty tensors for one batch and NumPy views of them to gather into.

    Object (string) columns get no buffer.

    Examples
    --------
    >>> import numpy as np
    >>> tensors, views = batch_buffers({"x": ((2,), np.dtype("float32"))}, 4, pin=False)
    >>> tuple(tensors["x"].shape), views["x"].ctypes.data == tensors["x"].data_ptr()
    ((4, 2), True)
    """
    torch = import_torch()
    tensors = {
        name: torch.from_numpy(np.empty(0, dtype=dtype)).new_empty((rows, *shape), pin_memory=pin)
        for name, (shape, dtype) in shapes.items()
        if dtype.kind != "O"
    }
    return tensors, {name: t.numpy() for name, t in tensors.items()}


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[Any, Any]:
    """``rank`` and ``world_size``, each ``None`` taken from ``torch.distributed`` when it is
    initialized, else 0 and 1. torch is not imported for this (if it is not imported, no
    process group can be initialized).

    Examples
    --------
    >>> distributed_defaults(None, None), distributed_defaults(1, 4)
    ((0, 1), (1, 4))
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if rank is None:
            rank = dist.get_rank()
        if world_size is None:
            world_size = dist.get_world_size()
        return rank, world_size
    return (0 if rank is None else rank), (1 if world_size is None else world_size)
