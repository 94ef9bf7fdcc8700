"""Datasets for the loader tests: real feedline datasets written into ``tmp_path``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl


def table_of(n: int) -> pa.Table:
    """``id``, ``x = id / 2`` (float32), ``vec`` (2x3 float32 tensor = id + 0..5), ``label``."""
    ids = np.arange(n, dtype=np.int64)
    vec = ids[:, None, None] + np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    return pa.table(
        {
            "id": ids,
            "x": (ids / 2).astype(np.float32),
            "vec": pa.FixedShapeTensorArray.from_numpy_ndarray(vec.astype(np.float32)),
            "label": ids % 7,
        }
    )


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., fl.Dataset]:
    """Factory: write ``table_of(n)`` (or ``table``) as a feedline dataset and open it."""
    count = iter(range(1000))

    def make(
        n: int = 1000,
        *,
        rows_per_shard: int | None = 250,
        row_group_rows: int | None = 50,
        table: pa.Table | None = None,
    ) -> fl.Dataset:
        path = tmp_path / f"ds{next(count)}"
        data = table if table is not None else table_of(n)
        options = {"rows_per_shard": rows_per_shard, "row_group_rows": row_group_rows}
        fl.from_arrow(data).write(path, **options)
        return fl.open(path)

    return make


@pytest.fixture(name="table_of")
def table_of_fixture() -> Callable[[int], pa.Table]:
    """The table writer used by ``write``, to build expected values."""
    return table_of
