"""The loader's default pipeline of nodes, and how many small batches travel together."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from feedline.loader.data.backend import Backend
from feedline.loader.nodes.collate import Format
from feedline.loader.nodes.device import AwaitDevice, CopyToDevice, Pin, ToDevice
from feedline.loader.nodes.gather import Gather
from feedline.loader.nodes.map import Map
from feedline.loader.nodes.node import Node
from feedline.loader.nodes.prefetch import Prefetch

__all__ = ["GROUP_BYTES", "MAX_GROUP", "SPLIT_GROUP_BYTES", "default_pipeline", "group_size"]

#: bytes of batches the prefetch thread gathers with one take (see ``group_size``)
GROUP_BYTES = 1 << 20
#: bytes of batches gathered together when the gather may be split across threads (fresh
#: arrays, GIL-free copies: windows); parts this large keep the hand-overs few (see
#: feedline.loader.nodes.gather_threads for the measurements)
SPLIT_GROUP_BYTES = 8 << 20
#: most batches gathered with one take
MAX_GROUP = 64


def group_size(
    backend: Backend, shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]], batch_size: int,
    prefetch: int,
) -> int:  # fmt: skip
    """Batches gathered with one take: ``prefetch``, or about ``GROUP_BYTES`` of batches.

    One hand-over between the prefetch thread and the training loop costs far more than
    gathering a small batch, so small cached batches travel in groups (streaming keeps
    ``prefetch``: a larger group would span, and hold, more shuffle pools). A gather the
    loader may split across threads (into fresh arrays: windows) takes about
    ``SPLIT_GROUP_BYTES``, so each thread's part is large.
    """
    if not prefetch or backend.mode != "memory":
        return max(1, prefetch)
    row = sum(int(np.prod(s)) * (8 if d.kind == "O" else d.itemsize)
              for s, d in shapes.values())  # fmt: skip
    source = backend.source
    split = getattr(source, "thread_safe_gather", False) and not getattr(
        source, "fills_buffers", True
    )
    fit = (SPLIT_GROUP_BYTES if split else GROUP_BYTES) // max(1, row * batch_size)
    return max(prefetch, min(MAX_GROUP, fit))


def default_pipeline(
    order: Node,
    backend: Backend,
    *,
    shuffle: bool,
    seed: int,
    fmt: str,
    group: int,
    transform: Callable[..., Any] | None,
    batched: bool,
    workers: Any,
    padding_mask: bool,
    pin: bool,
    prefetch: int,
    device: Any,
) -> Node:
    """order → gather → [map] → [format] → [pin] → [copy to device] → [prefetch] → [await device].

    Without a transform, cached batches are gathered ``group`` at a time straight into
    reused (or page-locked) buffers, made tensors once per group (``fmt="torch"``) and
    handed over as one group; with one, the transform's workers (``workers``, shared across
    epochs) map each batch and ``prefetch`` batches are kept ready.
    """
    mapped = transform is not None
    direct = not mapped and fmt == "torch"  # tensors made by the gather, once per group
    node: Node = Gather(order, backend, shuffle=shuffle, seed=seed, group=1 if mapped else group,
                        pin=pin and not mapped, fmt="torch" if direct else None)  # fmt: skip
    if transform is not None:
        node = Map(node, transform, batched=batched, seed=seed, workers=workers)
    if mapped or padding_mask or fmt == "tf":  # numpy and direct tensors need no Format
        node = Format(node, fmt, padding_mask=padding_mask)
    if pin and mapped:
        node = Pin(node)
    to_device = device is not None and fmt == "torch"
    if prefetch:
        if to_device:  # copies issued in the prefetch thread; the loop only waits on events
            node = CopyToDevice(node, device)
        node = Prefetch(node, depth=prefetch if mapped else 1, group=1 if mapped else group)
        if to_device:
            node = AwaitDevice(node, device)
    elif to_device:
        node = ToDevice(node, device)
    return node
