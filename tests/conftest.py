"""Shared helpers for the foundation tests: small input files written into ``tmp_path``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl


@pytest.fixture
def engine() -> fl.LocalEngine:
    """A local engine with a fixed, small number of workers (the same on every machine)."""
    return fl.LocalEngine(parallelism=4, memory_budget="64MB")


@pytest.fixture
def parquet_folder(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``n_files`` Parquet files holding consecutive ``id`` values.

    File ``i`` holds ids ``i * rows .. (i + 1) * rows - 1`` and a float column ``x = id / 2``,
    written with ``row_group_size`` rows per row group. Returns the folder.
    """

    def make(
        n_files: int = 3,
        rows: int = 100,
        row_group_size: int | None = None,
        name: str = "pq",
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for i in range(n_files):
            ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
            table = pa.table({"id": ids, "x": ids / 2})
            pq.write_table(table, folder / f"part-{i:04d}.parquet", row_group_size=row_group_size)
        return folder

    return make
