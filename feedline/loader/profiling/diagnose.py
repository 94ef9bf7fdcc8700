"""``loader.diagnose(step_ms=...)``: would training wait for data, which stage bounds it, what
to change.

:func:`diagnose` builds a twin of the loader (same dataset and options; the loader itself is
not moved), times its fill (reading the data into the cache), runs it for a bounded time
against a simulated training step (``time.sleep(step_ms)`` per batch, or the caller's
``step(batch)``) and reads its :class:`~feedline.loader.profiling.report.Profile`. The first
batch (workers starting, imports, the first gather) is left out of the rates and of the
stage times.

The verdict, in order:

1. the loop waited less than ``WAIT_OK`` of its time: training would not wait (the headroom
   is the step over the slowest stage's time per batch);
2. ``prefetch=0``: the loop makes each batch itself, so its step and the batch's making add
   up; ``prefetch=2`` overlaps them;
3. the producing thread keeps up on average but the loop still waits (slow batches, epoch
   starts): a deeper prefetch;
4. the transform is the busiest stage: more workers, as many as make a batch within a step,
   at most the CPUs this process may use (``worker_type="process"`` when thread workers
   already fill them and are busy less than ``GIL_BUSY`` of the time: the GIL);
5. the gather is the busiest and the loader streams (``cache="none"``): ``cache="memory"``
   (reading each row group once) when the data fits ``memory_budget``, else ``cache="node"``.

The estimate of each change's speed-up is arithmetic on the measured stage times (a batch
takes the longer of the step and the slowest producing time); ``verify=True`` runs the
changed twin for the same bounded time and reports the measured ratio.

Examples
--------
>>> import feedline as fl
>>> loader = fl.range(512).loader(batch_size=32, format="numpy")
>>> d = loader.diagnose(step_ms=1, batches=10)
>>> d.waits, d.change
(False, {})
"""

from __future__ import annotations

import html
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedline.charts import plot_stage_times
from feedline.errors import ConfigurationError
from feedline.host import cpus_available
from feedline.loader.options import OPTION_NAMES
from feedline.loader.profiling.report import Profile, StageRow, build_profile
from feedline.ui.inert_text import inert

__all__ = ["GIL_BUSY", "WAIT_OK", "Diagnosis", "diagnose", "run_against_step", "usable_cpus"]

#: the share of the loop's time spent waiting for data below which training does not wait
WAIT_OK = 0.05
#: thread workers that are busy less than this share while filling the CPUs are GIL-bound
GIL_BUSY = 0.6
#: deepest prefetch suggested
MAX_PREFETCH = 16


def usable_cpus() -> int:
    """The CPUs this process may keep busy (:func:`~feedline.host.cpus_available`: its
    affinity, within its cgroup's CPU quota)."""
    return cpus_available()


@dataclass
class Diagnosis:
    """What :func:`diagnose` found (see the module docstring).

    ``verdict`` is the one sentence; ``change`` the options to pass the loader
    (``{}``: nothing to change); ``estimate`` the speed-up of samples/s it predicts, and
    ``measured`` the one a run of the changed loader gave (``verify=True``; else ``None``).
    ``bound`` names the stage that bounds throughput (``"step"`` when it is the training
    step); ``fill_s`` is the time the twin took to load its cache before the first batch.
    """

    verdict: str
    waits: bool
    bound: str
    change: dict[str, Any]
    estimate: float
    profile: Profile
    step_ms: float
    fill_s: float
    cache: str
    measured: float | None = None
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join([self.verdict, *self.notes])

    def _repr_html_(self) -> str:
        return self.profile._repr_html_().replace(
            "</strong>", "</strong><div><b>" + _escape(self.verdict) + "</b></div>", 1
        )

    def plot(self, path: str | os.PathLike[str]) -> Any:
        """A PNG of the stage times per batch against the step (:mod:`feedline.charts`)."""
        stages = [(row.name, row.ms_per_batch) for row in self.profile.stages
                  if row.batches and row.name != "prefetch"]  # fmt: skip
        return plot_stage_times(stages, self.step_ms, path, title=self.verdict)


def _escape(text: str) -> str:
    return html.escape(inert(text))


def twin(loader: Any, **changes: Any) -> Any:
    """A new loader over ``loader``'s dataset with its options (``changes`` replacing some)."""
    options = {name: getattr(loader.options, name) for name in OPTION_NAMES if name != "_"}
    options["track"] = False
    return type(loader)(loader.dataset, **(options | changes))


def run_against_step(
    loader: Any, step: Callable[[Any], Any], *, seconds: float | None, batches: int | None
) -> dict[tuple[int, str], Any]:
    """Iterate ``loader`` (epoch after epoch), calling ``step(batch)`` per batch, until
    ``seconds`` have passed since the first batch or ``batches`` were taken (whichever comes
    first); returns the stage counts after the first batch (one-off costs: workers
    starting, imports)."""
    end = None  # counted from the first batch: the start (imports, workers) is extra
    taken = 0
    first: dict[tuple[int, str], Any] = {}
    while True:
        got = False
        iterator: Iterator[Any] = iter(loader)
        for batch in iterator:
            got = True
            if not taken:
                first = loader._stages.snapshot()
                end = None if seconds is None else time.perf_counter() + seconds
            step(batch)
            taken += 1
            if (batches is not None and taken >= batches) or (
                end is not None and time.perf_counter() >= end
            ):
                loader.close()
                return first
        if not got:  # an empty epoch: nothing more to run
            loader.close()
            return first


def _rate(loader: Any) -> tuple[float, float]:
    """(samples/s, data wait fraction) of the loop, its very first batch left out (workers
    starting, the first gather); later epochs' first batches count (the loop waits for them)."""
    rows = loader.timeline()[1:]
    seconds = sum(row["wait_s"] + row["step_s"] for row in rows)
    waited = sum(row["wait_s"] for row in rows)
    samples = sum(row["samples"] for row in rows)
    if seconds <= 0:
        return 0.0, 0.0
    return samples / seconds, waited / seconds


def _check(step_ms: float | None, seconds: float | None, batches: int | None) -> None:
    if step_ms is not None and (not math.isfinite(step_ms) or step_ms < 0):
        raise ConfigurationError(
            f"diagnose: step_ms={step_ms!r}; it is the training step's milliseconds per batch, "
            "a number >= 0. Fix: pass e.g. step_ms=50."
        )
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(
            f"diagnose: seconds={seconds!r}. Fix: pass a positive number of seconds to run."
        )
    if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int)
                                or batches < 2):  # fmt: skip
        raise ConfigurationError(
            f"diagnose: batches={batches!r}. Fix: pass an int >= 2 (the first batch is left "
            "out of the rates)."
        )


def diagnose(
    loader: Any,
    *,
    step_ms: float | None = None,
    step: Callable[[Any], Any] | None = None,
    seconds: float | None = 5.0,
    batches: int | None = None,
    verify: bool = False,
) -> Diagnosis:
    """Run a twin of ``loader`` against a training step and say what bounds it.

    Parameters
    ----------
    loader:
        The :class:`~feedline.loader.Loader` to diagnose (it is not iterated).
    step_ms:
        The simulated training step: ``time.sleep(step_ms / 1000)`` per batch (default 0).
    step:
        Your own step, ``step(batch)``, instead (its time is measured).
    seconds, batches:
        How long to run: whichever comes first (``batches=None``: time only).
    verify:
        Also run the twin with the suggested change and report the measured ratio.

    Examples
    --------
    >>> import feedline as fl
    >>> d = fl.range(256).loader(batch_size=16, prefetch=0, format="numpy").diagnose(
    ...     step_ms=1, batches=8)
    >>> d.bound in ("step", "gather", "order", "format")
    True
    """
    _check(step_ms, seconds, batches)
    if step is None:
        pause = (step_ms or 0.0) / 1e3

        def step(batch: Any) -> None:
            time.sleep(pause)

    probe = twin(loader)
    started = time.perf_counter()
    probe._prepare()  # the fill: reading the data into the cache
    fill_s = time.perf_counter() - started
    cache = str(probe.stats().get("cache", ""))
    first = run_against_step(probe, step, seconds=seconds, batches=batches)
    rate, wait = _rate(probe)
    rows = probe.timeline()[1:]
    spent = sum(row["wait_s"] + row["step_s"] for row in rows)
    loop = [{"seconds": spent, "samples": sum(row["samples"] for row in rows),
             "batches": len(rows), "data_wait_fraction": wait}]  # fmt: skip
    profile = build_profile(probe._stages.since(first), loop, probe.batch_size)
    steps = [row["step_s"] for row in probe.timeline() if row["step_s"] > 0]
    step_s = sorted(steps)[len(steps) // 2] if steps else (step_ms or 0.0) / 1e3
    found = _verdict(probe, profile, rate, wait, step_s, fill_s, cache)
    probe.close()
    if verify and found.change:
        trial = twin(loader, **found.change)
        trial._prepare()
        run_against_step(trial, step, seconds=seconds, batches=batches)
        trial.close()
        changed, _ = _rate(trial)
        found.measured = changed / rate if rate > 0 else None
    return found


def _per_batch(row: StageRow | None) -> float:
    return row.work_s / row.batches if row is not None and row.batches else 0.0


def _producing(profile: Profile) -> float:
    """Seconds per batch the stages that make batches take together (one thread)."""
    return sum(_per_batch(row) for row in profile.stages if row.name not in ("prefetch",))


def _verdict(loader: Any, profile: Profile, rate: float, wait: float, step_s: float,
             fill_s: float, cache: str) -> Diagnosis:  # fmt: skip
    busiest = profile.busiest
    produce = _producing(profile)
    prefetch = loader.prefetch
    head = (f"training waits for data {wait:.0%} of the time ({rate:,.0f} samples/s, a "
            f"{1e3 * step_s:.1f} ms step)")  # fmt: skip
    notes = []
    if fill_s >= 1.0:
        once = "; cache='node' would do it once per machine, not once per rank and run."
        fill = f"Filling the {cache} cache took {fill_s:.1f} s before the first batch"
        notes.append(fill + (once if cache == "memory" else "."))
    name = busiest.name if busiest is not None else "step"

    def done(verdict: str, bound: str, change: dict[str, Any], new_produce: float) -> Diagnosis:
        before = max(step_s, produce) if prefetch else step_s + produce
        after = max(step_s, new_produce)
        if "prefetch" in change and not prefetch:
            after = max(step_s, produce)
        estimate = before / after if after > 0 else 1.0
        return Diagnosis(verdict=verdict, waits=wait >= WAIT_OK, bound=bound, change=change,
                         estimate=estimate, profile=profile, step_ms=1e3 * step_s,
                         fill_s=fill_s, cache=cache, notes=notes)  # fmt: skip

    if wait < WAIT_OK:
        room = step_s / produce if produce > 0 else float("inf")
        return done(
            f"Training would not wait for data: the loop waited {wait:.0%} of the time "
            f"({rate:,.0f} samples/s); the busiest stage is {name} at "
            f"{1e3 * _per_batch(busiest):.2f} ms/batch against a {1e3 * step_s:.1f} ms step "
            f"({room:,.1f}x headroom). Nothing to change.",
            "step", {}, produce,
        )  # fmt: skip
    if not prefetch:
        return done(
            f"With prefetch=0 {head}: the loop makes each batch itself ({1e3 * produce:.1f} "
            f"ms/batch, mostly {name}) on top of its step; prefetch=2 overlaps the two: about "
            f"{(step_s + produce) / max(step_s, produce):.1f}x.",
            name, {"prefetch": 2}, produce,
        )  # fmt: skip
    if produce < step_s:
        deeper = min(MAX_PREFETCH, max(2, 2 * prefetch))
        return done(
            f"{head.capitalize()}, although making a batch takes {1e3 * produce:.1f} ms on "
            f"average (mostly {name}): the waits are slow batches and epoch starts that the "
            f"prefetch queue ({prefetch}) cannot absorb; prefetch={deeper} can.",
            "prefetch", {"prefetch": deeper}, produce,
        )  # fmt: skip
    if busiest is not None and busiest.name == "transform":
        return _more_workers(busiest, produce, step_s, head, done)
    if busiest is not None and busiest.name == "gather" and cache == "none":
        row_bytes = sum(int(np.prod(shape)) * (8 if d.kind == "O" else d.itemsize)
                        for shape, d in loader._shapes().values())  # fmt: skip
        fits = row_bytes * loader.num_samples <= loader.memory_budget
        target = "memory" if fits else "node"
        gather_ms = 1e3 * _per_batch(busiest)
        return done(
            f"{head.capitalize()}: reading rows from storage in the gather takes "
            f"{gather_ms:.1f} ms/batch (cache='none' streams every epoch); cache='{target}' "
            f"reads each row group once, then serves batches from {target}.",
            "gather", {"cache": target}, produce - _per_batch(busiest),
        )  # fmt: skip
    return done(
        f"{head.capitalize()}: {name} bounds throughput at "
        f"{1e3 * _per_batch(busiest):.1f} ms/batch; make it cheaper (the step takes "
        f"{1e3 * step_s:.1f} ms).",
        name, {}, produce,
    )  # fmt: skip


def _more_workers(row: StageRow, produce: float, step_s: float, head: str,
                  done: Callable[..., Diagnosis]) -> Diagnosis:  # fmt: skip
    workers = max(1, row.workers or 0)
    kind = row.worker_type if row.worker_type in ("thread", "process") else "thread"
    other = produce - _per_batch(row)
    per_sample = row.ms_per_sample
    busy_batch = row.busy_s / row.batches if row.batches else _per_batch(row)
    cpus = usable_cpus()
    room = max(step_s - other, 1e-4)
    wanted = max(workers + 1, math.ceil(busy_batch / room))
    how = f"{row.workers or 0} {'inline (in the prefetch thread)' if not row.workers else kind}"
    if workers >= cpus:
        if kind == "thread" and (row.utilisation or 0.0) < GIL_BUSY:
            return done(
                f"{head.capitalize()}: the transform takes {per_sample:.2f} ms/sample on "
                f"{how} workers busy {row.utilisation or 0:.0%} of the time (the GIL); "
                f"worker_type='process' runs them in parallel.",
                "transform", {"worker_type": "process"}, other + busy_batch / workers,
            )  # fmt: skip
        return done(
            f"{head.capitalize()}: the transform takes {per_sample:.2f} ms/sample on {how} "
            f"workers, as many as the {cpus} CPUs; make it cheaper (batched=True, a smaller "
            "image) or precompute it.",
            "transform", {}, produce,
        )  # fmt: skip
    count = min(wanted, cpus)
    new_produce = other + busy_batch / count
    estimate = max(step_s, produce) / max(step_s, new_produce)
    return done(
        f"{head.capitalize()}: the transform takes {per_sample:.2f} ms/sample on {how} "
        f"worker(s); num_workers={count} {kind} workers give about {estimate:.1f}x.",
        "transform", {"num_workers": count, "worker_type": kind}, new_produce,
    )  # fmt: skip
