"""Footers during a cache fill (feedline/loader/data/file_footers.py): parsed once per file.

A fill reads a file one row group at a time; it used to read, hash and parse the whole footer
(which grows with the row groups) on every row group, on both the page copy and the pyarrow
path: quadratic in the row groups of a file (1M rows, 2 columns: 4.4 s in 1,000 row groups
against 0.12 s in 100). These tests count the footers hashed while a fill runs, and check a
file replaced or rewritten in the middle of a fill is still refused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
import feedline.store.footers as footer_module
from feedline.loader.data.columns import column_specs
from feedline.loader.data.memory_cache import FileLayout, load_cache
from feedline.loader.data.packed_columns import column_views, plan_packing
from feedline.loader.data.page_fill import PageFill
from feedline.store.shard_source import ShardSource, open_shard_source

ROWS, GROUP_ROWS, SHARD_ROWS = 2_000, 10, 1_000  # 2 shards of 100 row groups


def _table(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "x": rng.standard_normal(ROWS),  # uncompressed float64: copied from the pages
            "y": rng.integers(-100, 100, ROWS).astype(np.int8),  # int8: read by pyarrow
        }
    )


@pytest.fixture(scope="module")
def many_groups(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("footers") / "ds"
    fl.from_arrow(_table()).write(out, rows_per_shard=SHARD_ROWS, row_group_rows=GROUP_ROWS,
                                  compression=None)  # fmt: skip
    return out


@pytest.fixture
def parses(monkeypatch) -> list[int]:
    """Every footer parsed (:func:`feedline.store.footers.parse_footer` hashes each one it
    parses with ``footer_digest``): one entry per footer, its bytes."""
    seen: list[int] = []
    real = footer_module.footer_digest

    def counting(block: bytes) -> str:
        seen.append(len(block))
        return real(block)

    monkeypatch.setattr(footer_module, "footer_digest", counting)
    return seen


def test_a_fill_parses_each_footer_once_not_once_per_row_group(many_groups, parses):
    source = open_shard_source(many_groups)
    assert len(source.row_group_sizes) == ROWS // GROUP_ROWS
    parses.clear()  # the open checks every footer once; the fill must not check them again
    for threads in (1, 4):
        layout = FileLayout(source)
        pages = PageFill(layout, column_specs(source.schema()))
        assert set(pages.widths) == {"x"}  # both paths run: "x" copied, "y" through pyarrow
        cache = load_cache(source, column_specs(source.schema()), layout=layout, threads=threads)
        assert len(parses) == len(source.files), (threads, len(parses))
        assert layout.footers.parses == len(source.files)
        np.testing.assert_array_equal(cache.arrays["x"], _table()["x"].to_numpy())
        np.testing.assert_array_equal(cache.arrays["y"], _table()["y"].to_numpy())
        parses.clear()


def test_a_streamed_epoch_parses_each_footer_once(many_groups, parses):
    loader = fl.open(many_groups).loader(batch_size=100, cache="none", shuffle=True, seed=1,
                                         format="numpy", prefetch=0)  # fmt: skip
    parses.clear()
    got = np.concatenate([np.asarray(b["x"]) for b in loader])
    np.testing.assert_array_equal(np.sort(got), np.sort(_table()["x"].to_numpy()))
    assert len(parses) <= 2, len(parses)


def _fill_groups(source: ShardSource, between) -> None:
    """Copy row group 0 of file 0, run ``between()``, then copy row group 1 of file 0."""
    specs = column_specs(source.schema())
    layout = FileLayout(source)
    packing = plan_packing(specs)
    views = column_views(packing, packing.allocate(source.num_rows))
    pages = PageFill(layout, specs)
    for group in (0, 1):
        with layout.opened(0, None) as opened:
            assert pages.copy(0, group, group * GROUP_ROWS, views, opened) == {"x"}
        if group == 0:
            between()


@pytest.fixture
def pair(many_groups, tmp_path) -> tuple[Path, Path, Path]:
    """A copy of the dataset, its first shard, and another dataset's first shard of the same
    layout and size (other values)."""
    work, other = tmp_path / "ds", tmp_path / "other"
    shutil.copytree(many_groups, work)
    x = pa.array(-_table()["x"].to_numpy())
    fl.from_arrow(_table().set_column(0, "x", x)).write(
        other, rows_per_shard=SHARD_ROWS, row_group_rows=GROUP_ROWS, compression=None
    )
    mine = sorted(work.glob("part-*.parquet"))[0]
    theirs = sorted(other.glob("part-*.parquet"))[0]
    assert mine.stat().st_size == theirs.stat().st_size
    return work, mine, theirs


def test_a_shard_replaced_in_the_middle_of_a_fill_is_refused(pair):
    work, mine, theirs = pair
    spare = work.parent / "spare.parquet"
    with pytest.raises(fl.IntegrityError, match=mine.name):
        _fill_groups(open_shard_source(work), lambda: os.replace(shutil.copy(theirs, spare), mine))


def test_a_shard_rewritten_in_place_in_the_middle_of_a_fill_is_refused(pair):
    work, mine, theirs = pair
    inode = mine.stat().st_ino

    def rewrite() -> None:
        with open(mine, "r+b") as handle:  # the same file (inode), other bytes
            handle.write(theirs.read_bytes())
        assert mine.stat().st_ino == inode

    with pytest.raises(fl.IntegrityError, match=mine.name):
        _fill_groups(open_shard_source(work), rewrite)


def test_an_unchanged_shard_is_not_parsed_again(many_groups, parses):
    source = open_shard_source(many_groups)
    parses.clear()
    _fill_groups(source, lambda: os.utime(many_groups))  # the folder, not the shard
    assert len(parses) == 1
