"""Streaming pools decoded by several threads: the same arrays, batches and order as one thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.errors import DataError
from feedline.loader.data.backend import as_source
from feedline.loader.data.columns import column_specs
from feedline.loader.data.memory_cache import FileLayout
from feedline.loader.data.row_group_stream import PoolReader
from feedline.loader.order.sample_order import block_shuffle_order, block_shuffle_pools

SHAPE = (3, 4, 4)
FILES, ROWS_PER_FILE, GROUP = 3, 240, 40  # 18 row groups of 40 rows


@dataclass(frozen=True)
class ThreadNoting(FileLayout):
    """The real layout, noting the thread each row-group read runs on."""

    threads: list[str] = field(default_factory=list, compare=False)

    def iter_read(
        self, file: int, groups: Sequence[int], columns: Sequence[str], rows: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        self.threads.append(threading.current_thread().name)
        yield from super().iter_read(file, groups, columns, rows)


def _lists_folder(tmp_path: Path, bad_row: int | None = None) -> tuple[Path, np.ndarray]:
    """Plain Parquet of ``list<uint8>`` images (as pyarrow writes arrays) and an ``id``."""
    images = np.random.default_rng(5).integers(0, 256, (FILES * ROWS_PER_FILE, *SHAPE), np.uint8)
    folder = tmp_path / "lists"
    folder.mkdir()
    width = int(np.prod(SHAPE))
    for f in range(FILES):
        ids = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        rows = [images[i].reshape(-1).tolist() for i in ids]
        if bad_row is not None and bad_row in ids:
            rows[bad_row - ids[0]] = rows[bad_row - ids[0]][: width - 1]
        table = pa.table({"image": pa.array(rows, pa.list_(pa.uint8())), "id": ids})
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=GROUP)
    return folder, images


def _epoch(folder: Path, threads: int, window: int = 5) -> tuple[dict[str, np.ndarray], list]:
    source = as_source(fl.read_parquet(folder))
    layout = ThreadNoting(source)
    specs = column_specs(source.schema(), ["image", "id"], shapes={"image": SHAPE})
    sizes = layout.row_group_sizes
    reader = PoolReader(layout, specs, block_shuffle_pools(sizes, 3, 1, window), threads=threads)
    order = block_shuffle_order(sizes, 3, 1, window)
    batches = [reader.gather(order[i : i + 32]) for i in range(0, len(order), 32)]
    assert reader.stats.row_groups_read == len(sizes)  # every row group read once
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}, layout.threads


def test_parallel_pool_reads_give_the_batches_and_order_of_a_sequential_one(
    tmp_path: Path,
) -> None:
    folder, images = _lists_folder(tmp_path)
    one, one_threads = _epoch(folder, threads=1)
    four, four_threads = _epoch(folder, threads=4)
    order = block_shuffle_order([GROUP] * (FILES * ROWS_PER_FILE // GROUP), 3, 1, 5)
    np.testing.assert_array_equal(one["id"], order)
    for key in ("image", "id"):
        np.testing.assert_array_equal(four[key], one[key])
    np.testing.assert_array_equal(four["image"], images[order])
    assert set(one_threads) == {threading.current_thread().name}
    # one read per row group, all on the pool's threads (several of them may serve)
    assert len(four_threads) == FILES * ROWS_PER_FILE // GROUP
    assert all(name.startswith("feedline-pool") for name in four_threads)
    assert not [t for t in threading.enumerate() if t.name.startswith("feedline-pool")]


@pytest.mark.parametrize("threads", [1, 4])
def test_a_ragged_row_read_by_a_pool_thread_names_the_dataset_row(
    tmp_path: Path, threads: int
) -> None:
    folder, _ = _lists_folder(tmp_path, bad_row=533)  # file 2, row group 1 (rows 520..559)
    with pytest.raises(DataError, match=r"row 533\b") as info:
        _epoch(folder, threads=threads, window=18)
    assert "part-2.parquet" in str(info.value) and "Fix:" in str(info.value)
