"""A spill onto a full disk is a ``StorageError`` saying so (issue 23, item 18), not an
out-of-memory ``ConfigurationError``: the README promises ``StorageError`` for a full disk.

The spill directory is a 2 MB tmpfs (mounted here; skipped where mounting is not allowed),
far too small for the sort's spill.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.engines.local.engine import LocalEngine
from feedline.errors import StorageError

ROWS = 3_000_000  # two 8-byte columns: about 48 MB, three times the 16 MB memory limit


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "spill"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode()[:200]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True, check=False)


@pytest.mark.timeout(300)
def test_a_spill_onto_a_full_disk_is_a_storage_error_naming_the_directory(
    small_disk: Path,
) -> None:
    rng = np.random.default_rng(0)
    table = pa.table({"a": rng.random(ROWS), "b": np.arange(ROWS)})
    engine = LocalEngine(parallelism=1, relational_memory="16MB", spill_directory=small_disk)
    ds = fl.from_arrow(table).sort("a")
    with pytest.raises(StorageError) as caught:
        ds.aggregate(lambda b: b.num_rows, lambda x, y: x + y, engine=engine)
    message = str(caught.value)
    assert "disk is full" in message and str(small_disk) in message
    assert "spill_directory=" in message and "Fix:" in message
    assert caught.value.url == str(small_disk)
