"""Helpers of the cache="staged" tests: loader options with many small buckets, and batches
read and compared column by column."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline.loader.data.staging.stager import BUCKET_SHARE, RECYCLED_BUCKET_SHARE

#: bytes of one row of the loader conftest's table (id, x, vec, label)
ROW = 8 + 4 + 24 + 8


def staged_options(tmp_path: Any, **extra: Any) -> dict[str, Any]:
    """Loader options: a budget so small that a bucket is 37 rows (many buckets; a gather of
    whole batches often spans two), with one rank (whose buckets are a bigger share of the
    budget: its epochs are staged from the epoch before) or several."""
    share = RECYCLED_BUCKET_SHARE if extra.get("world_size", 1) == 1 else BUCKET_SHARE
    return {"batch_size": 8, "format": "numpy", "memory_budget": ROW * 37 * share,
            "cache_dir": tmp_path / "cache"} | extra  # fmt: skip


def batches(loader: Any, n: int | None = None) -> list[dict[str, np.ndarray]]:
    """The loader's next ``n`` batches (the rest of its epoch by default), copied."""
    out = []
    for batch in loader:
        out.append({k: np.array(v) for k, v in batch.items()})
        if n is not None and len(out) == n:
            break
    return out


def same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> None:
    """Assert the same batches: every column of every batch equal."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)
