"""Where a loader worker stands: the call of the transform running, and since when.

The loader reads it to enforce ``timeout=`` (see :mod:`feedline.loader.nodes.worker_pools`): a
call that has run longer than the timeout names its sample, and the worker running it is
abandoned (a thread) or killed (a process). A worker process keeps it in shared memory.
"""

from __future__ import annotations

import time
from collections.abc import MutableSequence

import numpy as np

__all__ = ["Progress", "stuck_message"]


class Progress:
    """Where a worker stands: ``(task, position in the chunk, since)`` of the call running.

    ``slots`` are three float64 values (a list, or a shared-memory array a worker process
    writes and the loader process reads): the task's id, the position of the sample in its
    chunk (0 for a batched call) and the ``time.monotonic()`` it started (0 while idle; the
    clock is the machine's, so the loader process can compare it). Written by one thread,
    read by another without a lock: the start time is cleared first and set last, so a
    reader that sees a start time sees the task and position that go with it.

    Examples
    --------
    >>> progress = Progress()
    >>> progress.running() is None
    True
    >>> progress.start_task(7); progress.begin(3)
    >>> task, position, since = progress.running()
    >>> (task, position), since > 0
    ((7, 3), True)
    """

    def __init__(self, slots: MutableSequence[float] | None = None) -> None:
        self.slots: MutableSequence[float] = slots if slots is not None else [0.0, 0.0, 0.0]

    def start_task(self, task: int) -> None:
        """A new task begins (its first call comes with :meth:`begin`)."""
        self.slots[2] = 0.0
        self.slots[0] = float(task)

    def begin(self, position: int) -> None:
        """The call on the sample at ``position`` of the chunk starts now."""
        slots = self.slots
        slots[2] = 0.0
        slots[1] = float(position)
        slots[2] = time.monotonic()

    def end(self) -> None:
        """No call running (the task is done)."""
        self.slots[2] = 0.0

    def running(self) -> tuple[int, int, float] | None:
        """``(task, position, started)`` of the call running, or ``None`` while idle."""
        slots = self.slots
        since = slots[2]
        if not since:
            return None
        return int(slots[0]), int(slots[1]), since


def stuck_message(fn_name: str, timeout: float, seconds: float, indices: np.ndarray,
                  position: int, batched: bool, epoch: int, worker: str) -> str:  # fmt: skip
    """What a timed-out call says: the transform, the sample (or batch), the worker (the
    raise site adds what became of the worker and the fix).

    Examples
    --------
    >>> stuck_message("crop", 5, 6.2, np.array([40, 41]), 1, False, 0, "worker thread 1")[:70]
    "The loader's transform crop has run for 6.2 s on the sample at row ind"
    """
    if batched:
        shown = ", ".join(str(int(i)) for i in indices[:8]) + (", ..." if len(indices) > 8 else "")
        what = f"the batch of {len(indices)} samples at row indices [{shown}]"
    else:
        what = f"the sample at row index {int(indices[position])}"
    return (
        f"The loader's transform {fn_name} has run for {seconds:.1f} s on {what} (epoch "
        f"{epoch}), more than timeout={timeout:g} s, in {worker}."
    )
