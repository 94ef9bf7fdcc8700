"""``feedline demo``: materialize a real dataset that ships inside a PyPI wheel and read it back.

The data is the Palmer penguins table (344 penguins, CC0) from the ``palmerpenguins``
package: nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

import feedline as fl
from feedline.errors import MissingDependencyError

__all__ = ["penguins_csv", "run_demo"]

FEATURES = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]


def penguins_csv() -> Path:
    """Path of ``penguins.csv`` inside the installed ``palmerpenguins`` wheel."""
    spec = importlib.util.find_spec("palmerpenguins")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("palmerpenguins", "demo", "The demo")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "penguins.csv"


def to_features(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """Assemble the numeric columns into one float32 (n, 4) tensor and index the species."""
    species = ["Adelie", "Chinstrap", "Gentoo"]
    features = np.stack(
        [batch[name].to_numpy(zero_copy_only=False).astype(np.float32) for name in FEATURES],
        axis=1,
    )
    label = pc.index_in(batch["species"], pa.array(species)).to_numpy(zero_copy_only=False)
    return {"features": features, "label": label.astype(np.int64)}


def run_demo(output: str | os.PathLike[str] = "demo-output", console: Console | None = None) -> int:
    """Run the demo; returns 0 on success (the exit status of ``feedline demo``)."""
    console = console or Console()
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    source = penguins_csv()
    console.rule("[bold]feedline demo")
    console.print(f"input: {source}", markup=False, highlight=False)
    console.print("(Palmer penguins, shipped inside the palmerpenguins wheel)")

    raw = fl.read_csv(source)
    complete = raw.filter(pc.is_valid(pc.field("body_mass_g")) & pc.is_valid(pc.field("sex")))
    pipeline = complete.map_batches(to_features, batch_size=128)
    console.print(pipeline.explain(), markup=False, highlight=False)

    start = time.perf_counter()
    info = pipeline.write(out / "penguins", rows_per_shard=100)
    console.print(
        f"wrote {info.rows} rows into {info.shards} shards ({info.bytes:,} bytes) "
        f"in {time.perf_counter() - start:.2f} s"
    )
    dataset = fl.open(out / "penguins", verify=True)
    table = Table(title="materialized dataset (checksums verified)")
    table.add_column("column")
    table.add_column("type")
    for field in dataset.schema():
        table.add_row(field.name, str(field.type))
    console.print(table)

    arrays = dataset.to_arrow()
    features = np.asarray(arrays["features"].combine_chunks().to_numpy_ndarray())
    labels = arrays["label"].to_numpy()
    raw_rows = raw.count()
    console.print(
        f"{raw_rows} raw rows → {len(labels)} complete rows; features {features.shape}, "
        f"classes {np.bincount(labels).tolist()}"
    )
    _train_if_possible(dataset, console)
    console.rule("[green]demo finished")
    return 0


def _train_if_possible(dataset: fl.Dataset, console: Console) -> None:
    """Train a tiny softmax classifier with the feedline loader (when torch is installed)."""
    try:
        import torch
    except ImportError:
        console.print("[yellow]torch is not installed: skipping the training step")
        return
    torch.manual_seed(0)
    data = dataset.to_arrow()
    x = np.array(data["features"].combine_chunks().to_numpy_ndarray())  # writable copy
    mean, std = x.mean(axis=0), x.std(axis=0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loader = dataset.loader(batch_size=32, shuffle=True, seed=0, format="torch")
    mean_t, std_t = torch.from_numpy(mean), torch.from_numpy(std)
    for epoch in range(20):
        loader.set_epoch(epoch)
        losses = []
        for batch in loader:
            inputs = (batch["features"] - mean_t) / std_t
            loss = torch.nn.functional.cross_entropy(model(inputs), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        if epoch in (0, 19):
            console.print(f"epoch {epoch:2d}: mean loss {np.mean(losses):.3f}")
    with torch.no_grad():
        logits = model((torch.from_numpy(x) - mean_t) / std_t)
        accuracy = (logits.argmax(1).numpy() == data["label"].to_numpy()).mean()
    console.print(f"training accuracy of a linear classifier fed by the loader: {accuracy:.3f}")
