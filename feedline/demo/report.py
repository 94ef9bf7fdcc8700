"""What the demo prints and records: the summary table, MLflow runs and loader charts.

MLflow tracking (``feedline.tracking``) and the charts (``feedline.charts``) are optional:
without them (or without ``mlflow``/``matplotlib``) the demo still trains and reports, and
says what it left out.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from feedline import tracking
from feedline.charts import plot_loader_timeline
from feedline.demo.train import EpochResult

__all__ = ["EXPERIMENT", "PipelineResult", "Tracker", "summary_table"]

#: the MLflow experiment the demo's runs go to
EXPERIMENT = "feedline-demo"


@dataclass
class PipelineResult:
    """One pipeline's figures: data written, training curve, held-out and inference metrics."""

    name: str
    model: str
    train_rows: int
    heldout_rows: int
    skipped: list[dict[str, Any]]
    epochs: list[EpochResult]
    metric: str
    baseline: float
    prediction_metric: float
    predictions: str
    prediction_rows: int
    write_seconds: float
    notes: list[str] = field(default_factory=list)
    chart: str | None = None


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class Tracker:
    """MLflow runs in a local store under the demo's output folder (when tracking is there)."""

    def __init__(self, store: Path, console: Console) -> None:
        self.uri: str | None = None
        self.reason = ""
        self.console = console
        if not _available("feedline.tracking"):
            self.reason = "feedline.tracking is not available in this version"
        elif not _available("mlflow"):
            self.reason = "mlflow is not installed (pip install 'feedline[mlflow]')"
        else:
            self.uri = tracking.local_store(store)

    @property
    def enabled(self) -> bool:
        return self.uri is not None

    @contextlib.contextmanager
    def run(self, name: str, params: dict[str, Any]) -> Iterator[Any]:
        """An MLflow run (or nothing when tracking is off)."""
        uri = self.uri
        if uri is None:  # tracking is off (see enabled)
            yield None
            return
        import mlflow
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

        # The process's MLflow state (tracking URI, active experiment) is left as it was:
        # the demo may run inside a user's own session or test suite.
        previous = mlflow.get_tracking_uri() if is_tracking_uri_set() else None
        mlflow.set_tracking_uri(uri)
        try:
            client = mlflow.MlflowClient(uri)
            found = client.get_experiment_by_name(EXPERIMENT)
            experiment = found.experiment_id if found else client.create_experiment(EXPERIMENT)
            with mlflow.start_run(run_name=name, experiment_id=experiment) as active:
                mlflow.log_params(params)
                yield active
        finally:
            # None: no URI was set (mlflow takes it, and unsets its own; its annotation omits it)
            mlflow.set_tracking_uri(previous)  # type: ignore[arg-type]

    def log_dataset(self, path: str, name: str, context: str) -> None:
        if self.enabled:
            import warnings

            with warnings.catch_warnings():  # MLflow: "source can be interpreted in multiple
                warnings.simplefilter("ignore", UserWarning)  # ways" for a local folder
                tracking.log_dataset(path, name=name, context=context)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.enabled:
            import mlflow

            mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)


def loader_chart(loader: Any, path: Path, title: str) -> str | None:
    """Write the loader's timeline chart (PNG); ``None`` when charts are not available."""
    if not (_available("feedline.charts") and _available("matplotlib")):
        return None
    if not hasattr(loader, "timeline"):
        return None

    path.parent.mkdir(parents=True, exist_ok=True)
    return str(plot_loader_timeline(loader.timeline(), path, title=title) or path)


def summary_table(results: list[PipelineResult], seconds: float) -> Table:
    """The final summary: one column per pipeline, one row per figure."""
    table = Table(title=f"feedline demo: summary ({seconds:.0f} s)")
    table.add_column("")
    for r in results:
        table.add_column(f"{r.name}\n[dim]{r.model}[/]", justify="right")

    def row(label: str, values: list[str]) -> None:
        table.add_row(label, *values)

    def trained(r: PipelineResult) -> float:
        return sum(e.seconds for e in r.epochs) or 1.0

    row("rows train / held-out", [f"{r.train_rows:,} / {r.heldout_rows:,}" for r in results])
    row("records skipped", [str(len(r.skipped)) for r in results])
    row(
        "loss, first → last epoch",
        [f"{r.epochs[0].loss:.3f} → {r.epochs[-1].loss:.3f}" for r in results],
    )
    row("held-out metric", [f"{r.metric} {r.epochs[-1].metric:.3f}" for r in results])
    row("trivial baseline", [f"{r.baseline:.3f}" for r in results])
    row(
        "from written predictions",
        [f"{r.prediction_metric:.3f} ({r.prediction_rows:,} rows)" for r in results],
    )
    row(
        "training samples/s",
        [f"{sum(e.samples for e in r.epochs) / trained(r):,.0f}" for r in results],
    )
    row(
        "step time waiting for data",
        [f"{sum(e.data_wait * e.seconds for e in r.epochs) / trained(r):.1%}" for r in results],
    )
    return table


def epoch_table(result: PipelineResult) -> Table:
    """Per-epoch figures of one training run."""
    table = Table(title=f"{result.name}: {result.model}")
    extra = list(result.epochs[0].extra)
    for name in ("epoch", "loss", *extra, "samples/s", "data wait"):
        table.add_column(name, justify="right")
    for e in result.epochs:
        table.add_row(
            str(e.epoch),
            f"{e.loss:.4f}",
            *(f"{e.extra[k]:.3f}" for k in extra),
            f"{e.samples_per_s:,.0f}",
            f"{e.data_wait:.1%}",
        )
    return table
