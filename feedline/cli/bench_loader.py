"""``bench_loader``: loader throughput under a simulated training step.

The measurement behind ``feedline bench-loader``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from feedline.charts import plot_loader_timeline
from feedline.loader.adapters.tf import import_tensorflow
from feedline.loader.adapters.torch import import_torch
from feedline.loader.loader import Loader
from feedline.store.shard_source import open_shard_source

__all__ = ["bench_loader"]


def _peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def bench_loader(
    path: Any,
    batch_size: int = 256,
    step_ms: float = 0.0,
    epochs: int = 1,
    chart: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    **loader_kwargs: Any,
) -> dict[str, Any]:
    """Iterate a loader over ``path`` with a simulated training step and time it.

    Each batch is followed by ``time.sleep(step_ms / 1000)`` (the "training step"); the time
    spent waiting in ``next()`` for a batch is the data wait. The first batch (which includes
    opening the dataset and loading the cache) is timed separately as ``first_batch_s``;
    ``samples_per_s`` and ``wait_fraction`` are measured after it (steady state), the
    ``*_total`` figures over the whole run.

    Parameters
    ----------
    path:
        A dataset folder (``fl.open``) or a :class:`~feedline.dataset.dataset.Dataset`.
    batch_size, step_ms, epochs:
        Per-rank batch size, simulated step time in milliseconds, epochs to run.
    chart:
        Also write a PNG of throughput and data wait over time here
        (:func:`feedline.charts.plot_loader_timeline`; needs ``feedline[plots]``).
    storage_options:
        fsspec options for a ``path`` that is a URL (opening it is timed with the first batch).
    **loader_kwargs:
        Passed to :class:`~feedline.loader.Loader` (``shuffle``, ``cache``, ``prefetch``...).

    Returns
    -------
    dict
        ``samples``, ``batches``, ``seconds``, ``first_batch_s``, ``samples_per_s``,
        ``samples_per_s_total``, ``wait_s``, ``wait_fraction``, ``wait_fraction_total``,
        ``step_ms``, ``cache``, ``cache_bytes``, ``peak_rss_bytes`` (and ``chart``, the PNG's
        path, when asked).

    Examples
    --------
    >>> import feedline as fl
    >>> r = bench_loader(fl.range(1000), batch_size=100, step_ms=0, format="numpy")
    >>> r["samples"], r["batches"], 0 <= r["wait_fraction"] <= 1
    (1000, 10, True)
    """

    fmt = loader_kwargs.get("format", "torch")
    if fmt == "torch":  # a training script has its framework imported before it starts
        import_torch()
    elif fmt == "tf":
        import_tensorflow()
    start = time.perf_counter()
    if storage_options is not None and isinstance(path, str | os.PathLike):
        path = open_shard_source(path, storage_options)
    loader = Loader(path, batch_size=batch_size, **loader_kwargs)  # a path is opened here
    step_s = max(0.0, float(step_ms)) / 1000
    samples = batches = 0
    wait = first_wait = 0.0
    first_at: float | None = None
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        opened = time.perf_counter()
        iterator = iter(loader)  # the first one loads the cache
        opening = time.perf_counter() - opened
        while True:
            t0 = time.perf_counter() - opening  # count iter() with the first next()
            opening = 0.0
            try:
                next(iterator)
            except StopIteration:
                wait += time.perf_counter() - t0
                break
            t1 = time.perf_counter()
            if first_at is None:
                first_at, first_wait = t1, t1 - t0
            else:
                wait += t1 - t0
            batches += 1
            samples += batch_size
            if step_s:
                time.sleep(step_s)
    end = time.perf_counter()
    total = end - start
    steady = end - first_at if first_at is not None else 0.0
    stats = loader.stats()
    result = {
        "samples": samples,
        "batches": batches,
        "seconds": total,
        "first_batch_s": (first_at - start) if first_at is not None else None,
        "samples_per_s": (samples - batch_size) / steady if steady > 0 else 0.0,
        "samples_per_s_total": samples / total if total > 0 else 0.0,
        "wait_s": wait,
        "wait_fraction": wait / steady if steady > 0 else 0.0,
        "wait_fraction_total": (wait + first_wait) / total if total > 0 else 0.0,
        "step_ms": float(step_ms),
        "cache": stats["cache"],
        "cache_bytes": stats.get("cache_bytes"),
        "peak_rss_bytes": _peak_rss_bytes(),
    }
    if chart is not None:
        title = f"feedline loader: batch {batch_size}, step {float(step_ms):g} ms, {stats['cache']}"
        result["chart"] = str(plot_loader_timeline(loader.timeline(), chart, title=title))
    return result
