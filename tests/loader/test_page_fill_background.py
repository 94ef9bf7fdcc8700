"""A memory cache whose data pages are copied in the background
(feedline/loader/data/page_tasks.py).

``load_cache(..., background=True)`` returns once the small columns and every page header
are read; a gather waits only for the pages its rows lie in. These tests check the values,
that a gather waits for exactly its pages (no fill threads: nothing else copies), that a
damaged page never reaches a gather, resume, and a child forked in the middle of the fill.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.loader.data.columns import column_specs
from feedline.loader.data.memory_cache import FileLayout, load_cache
from feedline.loader.data.packed_columns import column_views, plan_packing
from feedline.loader.data.page_fill import OpenFiles, PageFill
from feedline.loader.data.page_tasks import PageTasks
from feedline.store.page_copy import read_struct
from feedline.store.shard_source import open_shard_source

ROWS = 2_000


def _table() -> pa.Table:
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (ROWS, 4, 64, 64), dtype=np.uint8)  # 16 KiB rows
    return pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
                     "label": rng.integers(0, 10, ROWS)})  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """2 shards of 2 row groups, pages of 64 rows (1 MiB): 32 pages."""
    out = tmp_path_factory.mktemp("background") / "ds"
    fl.from_arrow(_table()).write(out, rows_per_shard=1000, row_group_rows=500, compression=None)
    return out


def _expected() -> np.ndarray:
    return _table()["image"].combine_chunks().to_numpy_ndarray()


def _idle_fill(path: Path) -> tuple[PageTasks, dict[str, np.ndarray], OpenFiles]:
    """The page tasks of a fill with no fill thread: only gathers copy pages."""
    source = open_shard_source(path)
    layout = FileLayout(source)
    specs = column_specs(source.schema())
    packing = plan_packing(specs)
    views = column_views(packing, packing.allocate(source.num_rows))
    pages, files, tasks = PageFill(layout, specs), OpenFiles(layout), []
    for f, g, start in zip(*source.locate(), strict=True):
        names, found = pages.plan(int(f), int(g), int(start), views, files.get(int(f)))
        assert names == {"image"}
        tasks += found
    return PageTasks(tasks, 0, files.close), views, files


def test_the_pages_are_64_rows_as_the_writer_makes_them(data):
    tasks, _, _ = _idle_fill(data)
    pages = [t.page.rows for t in tasks._tasks]
    assert pages[:8] == [64] * 7 + [500 - 7 * 64] and len(pages) == 32
    tasks.wait()


def test_a_gather_waits_for_exactly_the_pages_of_its_rows(data):
    tasks, views, _ = _idle_fill(data)
    rows = np.array([5, 70, 1999, 1003])  # pages 0 and 1 of group 0, the last page, page 0 of 2
    tasks.ensure(rows)
    assert int((tasks._state == 2).sum()) == 4
    np.testing.assert_array_equal(views["image"][rows], _expected()[rows])
    tasks.ensure(rows)  # nothing more to do
    assert int((tasks._state == 2).sum()) == 4
    tasks.wait()  # copies the rest here
    assert tasks.complete
    np.testing.assert_array_equal(views["image"], _expected())


@pytest.mark.parametrize("threads", [1, 2])
def test_a_background_cache_gathers_the_written_values(data, threads):
    source = open_shard_source(data)
    cache = load_cache(source, column_specs(source.schema()), background=True, threads=threads)
    rng = np.random.default_rng(threads)
    for _ in range(5):
        rows = rng.permutation(ROWS)[:100]
        got = cache.gather(rows)
        np.testing.assert_array_equal(got["image"], _expected()[rows])
        np.testing.assert_array_equal(got["label"], _table()["label"].to_numpy()[rows])
    np.testing.assert_array_equal(cache.wait().arrays["image"], _expected())


def _damage(path: Path, tmp_path: Path) -> Path:
    """A copy of ``path`` with one flipped bit in the values of page 3 of the first shard."""
    work = tmp_path / "ds"
    shutil.copytree(path, work)
    shard = sorted(work.glob("part-*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    offset = 4  # the first page of the first column chunk
    for _ in range(3):  # skip 3 pages: header, then the body (levels and values)
        header, body = read_struct(data, offset)
        offset = body + header[3]
    header, body = read_struct(data, offset)
    data[body + header[3] - 100] ^= 0x04  # page 3's values, rows 192..255
    shard.write_bytes(bytes(data))
    return work


def test_a_damaged_page_raises_at_the_gather_that_needs_it_and_every_later_one(data, tmp_path):
    tasks, views, _ = _idle_fill(_damage(data, tmp_path))
    tasks.ensure(np.array([0, 600]))  # pages 0 of groups 0 and 1: intact
    np.testing.assert_array_equal(views["image"][[0, 600]], _expected()[[0, 600]])
    with pytest.raises(fl.DataError, match=r"Page 3 of column 'image' in row group 0 .*CRC-32"):
        tasks.ensure(np.array([250]))
    with pytest.raises(fl.DataError, match="CRC-32"):
        tasks.ensure(np.array([0]))  # the fill failed: no gather is served any more
    with pytest.raises(fl.DataError, match="CRC-32"):
        tasks.wait()


def test_a_damaged_page_never_reaches_a_loader_batch(data, tmp_path):
    work = _damage(data, tmp_path)
    source = open_shard_source(work)
    cache = load_cache(source, column_specs(source.schema()), background=True, threads=2)
    with pytest.raises(fl.DataError, match="CRC-32"):
        for start in range(0, ROWS, 100):
            rows = np.arange(start, start + 100)
            got = cache.gather(rows)["image"]  # served only if every row's page is intact
            np.testing.assert_array_equal(got, _expected()[rows])


def test_a_child_forked_in_the_middle_of_the_fill_copies_the_rest_itself(data):
    tasks, views, _ = _idle_fill(data)
    tasks.ensure(np.array([0]))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            tasks.ensure(np.arange(ROWS))
            os._exit(0 if np.array_equal(views["image"], _expected()) else 1)
        except BaseException:  # noqa: BLE001 - the child must exit, whatever happened
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert int((tasks._state == 2).sum()) == 1  # the parent's fill is its own
    tasks.wait()


def test_resume_is_exact_with_a_background_fill(data, monkeypatch):
    import feedline.loader.data.memory_cache as cache_module

    monkeypatch.setattr(cache_module, "BACKGROUND_BYTES", 1)  # this small dataset too

    def make():
        return fl.open(data).loader(batch_size=64, shuffle=True, seed=3, format="numpy")

    def batches(loader, n=None):
        it = iter(loader)
        taken = it if n is None else (next(it) for _ in range(n))
        return [np.asarray(batch["image"]).copy() for batch in taken]

    full = batches(make())
    first = make()
    assert first._prepare().source._filling is not None  # the pages copy in the background
    head = batches(first, 3)
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(head) + len(rest) == len(full) == ROWS // 64
    for a, b in zip(head + rest, full, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_cache_dropped_while_it_fills_stops_its_fill_threads(data):
    import gc
    import threading

    source = open_shard_source(data)
    cache = load_cache(source, column_specs(source.schema()), background=True, threads=2)
    tasks = cache._filling
    del cache
    gc.collect()
    for thread in threading.enumerate():
        if thread.name.startswith("feedline-fill-"):
            thread.join(30)
    assert tasks._cancelled
    assert not [t for t in threading.enumerate() if t.name.startswith("feedline-fill-")]
    assert tasks._on_done is None  # the files are closed
