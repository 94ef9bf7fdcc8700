"""Run the nodes before it in a background thread, a bounded number of batches ahead."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from feedline.loader.nodes.background import Prefetcher
from feedline.loader.nodes.node import Batch, Node, Stage

__all__ = ["Prefetch"]


class Prefetch(Stage):
    """Keep ``depth`` hand-overs of ``group`` batches ready, made by a background thread.

    The thread runs every node before this one (gathers, workers' results); it starts at the
    first :meth:`next` and stops (joined, never left behind) at the end of the epoch, on
    :meth:`reset`, :meth:`close`, or when an exception in it is handed to the caller with its
    original traceback. Small batches travel ``group`` at a time: one hand-over between
    threads costs more than gathering a small batch. The state is the caller's position,
    not the thread's.

    Examples
    --------
    >>> import feedline as fl
    >>> node = Prefetch(fl.range(10).loader(batch_size=4, shuffle=False).source_node(), depth=2)
    >>> [len(b) for b in node], node.get_state()
    ([4, 4, 2], {'epoch': 0, 'batches': 3})
    """

    def __init__(self, source: Node, depth: int = 2, *, group: int = 1) -> None:
        super().__init__(source)
        self.depth, self.group = max(1, int(depth)), max(1, int(group))
        self._thread: Prefetcher | None = None
        self._ready: deque[Batch] = deque()
        self._done = False
        self._blocked_before = 0.0  # blocked_s of the threads already stopped

    @property
    def blocked_s(self) -> float:
        """Seconds the background thread(s) spent blocked on a full queue, so far."""
        thread = self._thread
        return self._blocked_before + (0.0 if thread is None else thread.blocked_s)

    def resize(self, depth: int) -> None:
        """Keep ``depth`` hand-overs ready from now on (also in a running thread)."""
        self.depth = max(1, int(depth))
        thread = self._thread
        if thread is not None:
            thread.resize(self.depth)

    def _stop_thread(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._blocked_before += thread.blocked_s
            thread.close()

    def _groups(self) -> Iterator[list[Batch]]:
        source, group = self.source, self.group
        while True:
            items: list[Batch] = []
            try:
                while len(items) < group:  # whole groups from a node that makes them
                    items.extend(source.next_group())
            except StopIteration:
                if items:
                    yield items
                return
            yield items

    def produce(self) -> Batch:
        if self._ready:
            return self._ready.popleft()
        if self._done:
            raise StopIteration
        if self._thread is None:
            self._thread = Prefetcher(self._groups(), self.depth)
        try:
            items = next(self._thread)
        except StopIteration:
            self._stop_thread()
            self._done = True
            raise
        except BaseException:
            self._stop_thread()
            raise
        self._ready.extend(items)
        return self._ready.popleft()

    def occupancy(self) -> int:
        """Hand-overs (of ``group`` batches) ready in the queue now, out of ``depth``."""
        thread = self._thread
        return 0 if thread is None else thread.queued()

    def clear(self) -> None:
        self._stop_thread()
        self._ready.clear()
        self._done = False
