"""The demo's training loop: one loop for both models, timing what the loader costs.

Per epoch it records the mean loss, a held-out metric, samples/s and the fraction of the
epoch's time the training loop spent waiting for the next batch (``data_wait``), as the
loader measures them (``Loader.metrics()``; timed here around ``next()`` for loaders without).
With MLflow tracking available the loader is created with ``track=True`` and the epoch's
figures are logged as metrics of the active run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.progress import Progress

__all__ = ["EpochResult", "fit"]


@dataclass
class EpochResult:
    """One epoch: ``loss`` (mean over batches), ``metric`` (held out), throughput and wait."""

    epoch: int
    loss: float
    metric: float
    samples: int
    seconds: float
    data_wait: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def fit(
    loader: Any,
    step: Callable[[dict[str, Any]], float],
    evaluate: Callable[[], dict[str, float]],
    epochs: int,
    progress: Progress,
    label: str,
    log_metrics: Callable[[dict[str, float], int], None] | None = None,
) -> list[EpochResult]:
    """Train for ``epochs`` epochs over ``loader``; ``step(batch) -> loss`` does one update.

    ``evaluate()`` returns the held-out metrics (its first value is the headline metric).

    Examples
    --------
    >>> import numpy as np, pyarrow as pa, feedline as fl, tempfile
    >>> from rich.progress import Progress
    >>> path = tempfile.mkdtemp() + "/d"
    >>> _ = fl.from_arrow(pa.table({"x": np.arange(8.0)})).write(path)
    >>> loader = fl.open(path).loader(batch_size=4, format="numpy")
    >>> with Progress(disable=True) as p:
    ...     out = fit(loader, lambda b: float(b["x"].sum()), lambda: {"m": 1.0}, 2, p, "toy")
    >>> [(r.epoch, r.loss, r.samples) for r in out]
    [(0, 14.0, 8), (1, 14.0, 8)]
    """
    results = []
    task = progress.add_task(label, total=epochs * len(loader))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        losses: list[float] = []
        samples = 0
        wait = 0.0
        start = time.perf_counter()
        iterator = iter(loader)
        while True:
            before = time.perf_counter()
            batch = next(iterator, None)
            wait += time.perf_counter() - before
            if batch is None:
                break
            losses.append(step(batch))
            samples += len(next(iter(batch.values())))
            progress.advance(task)
        seconds = time.perf_counter() - start
        waiting = wait / seconds if seconds > 0 else 0.0
        if hasattr(loader, "metrics") and loader.metrics():  # the loader's own timing
            timing = loader.metrics()[-1]
            seconds, waiting = timing["seconds"], timing["data_wait_fraction"]
        metrics = evaluate()
        headline = next(iter(metrics.values()))
        result = EpochResult(
            epoch, sum(losses) / max(len(losses), 1), headline, samples, seconds, waiting, metrics
        )
        results.append(result)
        progress.update(
            task,
            description=f"{label} · epoch {epoch + 1}/{epochs} · loss "
            f"{result.loss:.3f} · {_fmt(metrics)}",
        )
        if log_metrics is not None:
            log_metrics({"loss": result.loss, **metrics}, epoch)  # the loader logs its own
    return results


def _fmt(metrics: dict[str, float]) -> str:
    return " · ".join(f"{k} {v:.3f}" for k, v in metrics.items())
