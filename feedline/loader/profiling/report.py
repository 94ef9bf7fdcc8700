"""``loader.profile()``: where the time of each pipeline stage went, as a table.

:func:`stage_rows` turns the meters' inclusive times (:mod:`feedline.loader.profiling.stages`)
into each stage's own work and its wait for input: a stage waits for its source while the
source runs in the same thread; a :class:`~feedline.loader.nodes.Prefetch` waits on its
queue (its sources run in its thread). :class:`Profile` holds the rows with the loop's side
(samples/s, data wait) and shows them as text, a Rich table and a notebook table.

Examples
--------
>>> import feedline as fl
>>> loader = fl.range(4096).loader(batch_size=64, format="numpy")
>>> _ = list(loader)
>>> p = loader.profile()
>>> [row.name for row in p.stages]
['prefetch', 'gather', 'order']
>>> p.samples, p.stages[1].samples
(4096, 4096)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from feedline.loader.profiling.stages import StageStats
from feedline.ui.inert_text import inert, safe_text
from feedline.ui.notebook import table, view

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["Profile", "StageRow", "build_profile", "stage_rows"]

#: stages that hand batches over rather than make them (never "the bound")
HAND_OVERS = ("prefetch", "device wait")


@dataclass(frozen=True)
class StageRow:
    """One stage of the pipeline (see :func:`stage_rows`).

    ``work_s``: time in the stage itself; ``input_wait_s``: time it waited for its source
    (for a prefetch: the loop waited on its queue); ``queue_occupancy``: the mean share of a
    prefetch queue that was full when looked at; ``utilisation``: the transform workers'
    busy time over ``workers`` times the wall time (inline: one worker).
    """

    name: str
    kind: str
    thread: str
    batches: int
    samples: int
    bytes: int
    work_s: float
    input_wait_s: float
    queue_occupancy: float | None = None
    workers: int | None = None
    worker_type: str | None = None
    busy_s: float = 0.0
    utilisation: float | None = None

    @property
    def ms_per_batch(self) -> float:
        """Milliseconds of the stage's own work per batch."""
        return 1e3 * self.work_s / self.batches if self.batches else 0.0

    @property
    def ms_per_sample(self) -> float:
        """Milliseconds of the stage's own work per sample (the workers' busy time for a
        transform: per worker-sample)."""
        if not self.samples:
            return 0.0
        return 1e3 * (self.busy_s or self.work_s) / self.samples


def stage_rows(stats: Sequence[StageStats], wall_s: float) -> list[StageRow]:
    """Each stage's own work and input wait from the meters' inclusive times, top first."""
    ordered = sorted(stats, key=lambda s: s.depth)
    rows = []
    for i, s in enumerate(ordered):
        source = ordered[i + 1] if i + 1 < len(ordered) else None
        if source is not None and source.thread == s.thread:
            wait, work = source.seconds, max(0.0, s.seconds - source.seconds)
        elif source is not None:  # a prefetch: its source runs in its thread
            wait, work = s.seconds, 0.0
        else:
            wait, work = 0.0, s.seconds
        utilisation = None
        if s.workers is not None and wall_s > 0:
            utilisation = min(1.0, s.busy_s / (max(1, s.workers) * wall_s))
        rows.append(StageRow(
            s.name, s.kind, s.thread, s.batches, s.samples, s.bytes, work, wait,
            s.queue_occupancy, s.workers, s.worker_type, s.busy_s, utilisation,
        ))  # fmt: skip
    return rows


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f}"


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


@dataclass(frozen=True)
class Profile:
    """What :meth:`Loader.profile` returns: the loop's side and one row per stage.

    ``seconds``, ``samples``, ``samples_per_s`` and ``data_wait_fraction`` are the loop's
    (as in ``loader.metrics()``, all epochs together); ``stages`` runs from the node the loop
    pulls from (first) to the order (last).
    """

    batch_size: int
    seconds: float
    samples: int
    samples_per_s: float
    data_wait_fraction: float
    stages: list[StageRow] = field(default_factory=list)
    #: ``num_workers="auto"`` / ``prefetch="auto"``: the tuner's values and decisions
    #: (``stats()["autotune"]``, see :mod:`feedline.loader.profiling.autotune`); else ``None``
    autotune: dict[str, Any] | None = None

    def stage(self, name: str) -> StageRow | None:
        """The first stage called ``name`` (``"gather"``, ``"transform"``...), or ``None``."""
        return next((row for row in self.stages if row.name == name), None)

    @property
    def busiest(self) -> StageRow | None:
        """The stage with the most work of its own (hand-overs left out), or ``None``."""
        working = [row for row in self.stages if row.name not in HAND_OVERS and row.batches]
        return max(working, key=lambda row: row.work_s, default=None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return asdict(self)

    def _cells(self) -> list[list[str]]:
        return [
            [inert(row.name), row.thread, f"{row.batches:,}", f"{row.samples:,}",
             f"{row.bytes / 1e6:,.1f}", _ms(row.work_s), _ms(row.input_wait_s),
             f"{row.ms_per_batch:,.3f}", _share(row.queue_occupancy),
             "" if row.workers is None else f"{row.workers} {row.worker_type}",
             _share(row.utilisation)]
            for row in self.stages
        ]  # fmt: skip

    _HEAD = ("stage", "thread", "batches", "samples", "MB", "work ms", "input wait ms",
             "ms/batch", "queue full", "workers", "busy")  # fmt: skip

    def _summary(self) -> str:
        line = (
            f"{self.samples:,} samples in {self.seconds:,.2f} s: {self.samples_per_s:,.0f} "
            f"samples/s, the loop waited for data {self.data_wait_fraction:.0%} of the time"
        )
        tuned = self.autotune
        if tuned is None:
            return line
        picked = [f"{k}={tuned[k]}" for k in ("num_workers", "prefetch") if tuned[k] is not None]
        changes = sum(d["old"] != d["new"] for d in tuned["history"])
        return f"{line}; autotuned to {', '.join(picked)} ({changes} changes)"

    def table(self) -> Table:
        """A Rich table of the stages."""
        from rich.table import Table

        out = Table(title=self._summary(), title_justify="left")
        for name in self._HEAD:
            out.add_column(name, justify="left" if name in ("stage", "thread") else "right")
        for cells in self._cells():
            out.add_row(safe_text(cells[0]), *cells[1:])
        return out

    def __rich__(self) -> Table:
        return self.table()

    def _repr_html_(self) -> str:
        return view("feedline loader profile", [self._summary()], table(self._HEAD, self._cells()))

    def __str__(self) -> str:
        cells = [list(self._HEAD), *self._cells()]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self._HEAD))]
        lines = [self._summary()]
        for row in cells:
            pairs = enumerate(zip(row, widths, strict=True))
            lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs))
        return "\n".join(lines)

    def __repr__(self) -> str:
        names = ", ".join(inert(row.name) for row in self.stages)
        return f"Profile({self.samples_per_s:,.0f} samples/s, stages: {names})"


def build_profile(
    stats: Sequence[StageStats], metrics: Sequence[dict[str, Any]], batch_size: int,
    autotune: dict[str, Any] | None = None,
) -> Profile:  # fmt: skip
    """The :class:`Profile` of a loader's meters and ``loader.metrics()`` (epochs summed).

    Examples
    --------
    >>> build_profile([], [], 4).samples_per_s
    0.0
    """
    seconds = sum(m["seconds"] for m in metrics)
    samples = sum(m["samples"] for m in metrics)
    wait = sum(m["seconds"] * m["data_wait_fraction"] for m in metrics)
    stats = [replace(s, seconds=wait, batches=sum(m["batches"] for m in metrics),
                     samples=samples) if s.from_loop else s for s in stats]  # fmt: skip
    return Profile(
        batch_size, seconds, samples, samples / seconds if seconds > 0 else 0.0,
        wait / seconds if seconds > 0 else 0.0, stage_rows(stats, seconds), autotune,
    )  # fmt: skip
