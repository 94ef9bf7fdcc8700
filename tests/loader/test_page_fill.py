"""The cache fill's page copy (feedline/store/page_copy.py, feedline/loader/data/page_fill.py).

Uncompressed fixed-width columns are read straight into the cache with their page CRC-32s
checked here instead of by pyarrow: these tests check the copy is taken, gives the same
values as pyarrow, falls back where it must, and never lets a damaged byte through.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.loader.data.columns import column_specs
from feedline.loader.data.memory_cache import FileLayout, load_cache
from feedline.loader.data.packed_columns import column_views, plan_packing
from feedline.loader.data.page_fill import PageFill
from feedline.store.page_copy import read_struct
from feedline.store.shard_source import open_shard_source

ROWS = 600


def _table(rows: int = ROWS, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (rows, 3, 4, 5), dtype=np.uint8)
    return pa.table(
        {
            "image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
            "x": rng.standard_normal(rows),
            "label": rng.integers(0, 10, rows),
        }
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """An uncompressed dataset: 3 shards of 2 row groups (pages of about 30 rows)."""
    out = tmp_path_factory.mktemp("pagefill") / "ds"
    fl.from_arrow(_table()).write(out, rows_per_shard=200, row_group_rows=100, compression=None)
    return out


def _copied(path: Path, then=None) -> tuple[list[set[str]], dict[str, np.ndarray]]:
    """Per row group, the columns :class:`PageFill` copies; and the arrays it filled
    (``then()`` runs after the dataset is opened, before the copy)."""
    source = open_shard_source(path)
    if then is not None:
        then()
    specs = column_specs(source.schema())
    packing = plan_packing(specs)
    storage = packing.allocate(source.num_rows)
    views = column_views(packing, storage)
    layout = FileLayout(source)
    fill = PageFill(layout, specs)
    names = []
    for f, g, s in zip(*source.locate(), strict=True):  # file, row group in it, first row
        with layout.opened(int(f), None) as opened:
            names.append(fill.copy(int(f), int(g), int(s), views, opened))
    return names, views


def _loaded(path: Path, **options) -> dict[str, np.ndarray]:
    loader = fl.open(path).loader(
        batch_size=64, shuffle=False, format="numpy", drop_last=False, prefetch=0, **options
    )
    parts: dict[str, list[np.ndarray]] = {}
    for batch in loader:
        for key, values in batch.items():
            parts.setdefault(key, []).append(np.asarray(values))
    return {key: np.concatenate(v) for key, v in parts.items()}


def _expected(table: pa.Table) -> dict[str, np.ndarray]:
    return {
        "image": table["image"].combine_chunks().to_numpy_ndarray(),
        "x": table["x"].to_numpy(),
        "label": table["label"].to_numpy(),
    }


def test_tensor_and_float_columns_are_copied_from_pages(plain):
    names, views = _copied(plain)
    assert all({"image", "x"} <= copied for copied in names), names
    expected = _expected(_table())
    np.testing.assert_array_equal(views["image"], expected["image"])
    np.testing.assert_array_equal(views["x"], expected["x"])


def test_loader_gives_the_written_values(plain):
    expected = _expected(_table())
    for cache in ("memory", "node"):
        options = {"cache_dir": plain.parent / "node"} if cache == "node" else {}
        got = _loaded(plain, cache=cache, **options)
        for key, values in expected.items():
            np.testing.assert_array_equal(got[key], values, err_msg=f"{cache} {key}")


def _page_values_offset(path: Path, column: str = "image") -> tuple[int, int]:
    """File offset of the first value byte of the first page of ``column``, and the bytes."""
    meta = pq.ParquetFile(path).metadata
    j = meta.schema.names.index(column)
    start = meta.row_group(0).column(j).data_page_offset
    data = path.read_bytes()
    header, body = read_struct(data, start)  # the page's body follows its header
    (levels,) = np.frombuffer(data, "<u4", 1, body)
    return body + 4 + int(levels), header[3] - 4 - int(levels)


def test_a_flipped_bit_in_a_copied_page_raises_before_any_batch(plain, tmp_path):
    work = tmp_path / "ds"
    shutil.copytree(plain, work)
    shard = sorted(work.glob("part-*.parquet"))[1]
    offset, size = _page_values_offset(shard)
    data = bytearray(shard.read_bytes())
    data[offset + size // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    loader = fl.open(work).loader(batch_size=64, shuffle=True, format="numpy", prefetch=0)
    with pytest.raises(fl.DataError, match=r"Page 0 of column 'image' in row group 0 .*CRC-32"):
        next(iter(loader))


def test_random_bit_flips_in_an_uncompressed_dataset_never_reach_a_batch(plain, tmp_path):
    """30 random single-bit flips (fixed seed): the memory-cache loader raises a
    FeedlineError or gives exactly the values written."""
    expected = _expected(_table())
    rng = random.Random(5)
    outcomes: dict[str, int] = {}
    for trial in range(30):
        work = tmp_path / f"t{trial}"
        shutil.copytree(plain, work)
        shard = rng.choice(sorted(work.glob("part-*.parquet")))
        data = bytearray(shard.read_bytes())
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        shard.write_bytes(bytes(data))
        try:
            got = _loaded(work, cache="memory")
            same = all(np.array_equal(got[k], v) for k, v in expected.items())
            outcome = "same values" if same else "SILENT"
        except fl.FeedlineError as exc:
            assert "Fix:" in str(exc)
            outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        shutil.rmtree(work)
    assert "SILENT" not in outcomes, outcomes
    assert outcomes.get("DataError", 0) + outcomes.get("IntegrityError", 0) >= 20, outcomes


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("nullable", [True, False])
def test_plain_parquet_pages_v1_v2_required_and_optional(tmp_path, version, nullable):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(500).astype(np.float32)
    y = rng.integers(0, 1 << 40, 500)
    schema = pa.schema([pa.field("x", pa.float32(), nullable), pa.field("y", pa.int64(), nullable)])
    out = tmp_path / "pq"
    out.mkdir()
    pq.write_table(
        pa.table({"x": x, "y": y}, schema=schema), out / "a.parquet", compression="none",
        use_dictionary=False, write_page_checksum=True, data_page_version=version,
        row_group_size=200, data_page_size=256,
    )  # fmt: skip
    names, views = _copied(out)
    assert all(copied == {"x", "y"} for copied in names), names
    np.testing.assert_array_equal(views["x"], x)
    np.testing.assert_array_equal(views["y"], y)
    got = _loaded(out)
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["y"], y)


def test_pages_without_checksums_or_with_nulls_go_through_pyarrow(tmp_path):
    out = tmp_path / "pq"
    out.mkdir()
    x = np.arange(300, dtype=np.float64)
    pq.write_table(pa.table({"x": x}), out / "a.parquet", compression="none",
                   use_dictionary=False, write_page_checksum=False)  # fmt: skip
    names, _ = _copied(out)
    assert names == [set()]
    np.testing.assert_array_equal(_loaded(out)["x"], x)
    nulls = tmp_path / "nulls"
    nulls.mkdir()
    pq.write_table(pa.table({"x": pa.array([1.0, None, 3.0])}), nulls / "a.parquet",
                   compression="none", use_dictionary=False, write_page_checksum=True)  # fmt: skip
    assert _copied(nulls)[0] == [set()]
    with pytest.raises(fl.DataError, match="null"):
        _loaded(nulls)


def test_compressed_tensors_are_read_by_pyarrow_as_before(tmp_path):
    out = tmp_path / "ds"
    zeros = np.zeros((300, 8, 8), np.uint8)  # compresses well: zstd is kept
    table = pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(zeros)})
    fl.from_arrow(table).write(out)
    assert _copied(out)[0] == [set()]
    np.testing.assert_array_equal(_loaded(out)["image"], zeros)


def test_resume_is_exact_on_a_page_copied_cache(plain):
    def batches(loader, n=None):
        it = iter(loader)
        taken = it if n is None else (next(it) for _ in range(n))
        return [np.asarray(batch["image"]).copy() for batch in taken]

    def make():
        return fl.open(plain).loader(batch_size=64, shuffle=True, seed=3, format="numpy")

    full = batches(make())
    first = make()
    head = batches(first, 3)
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full, strict=True):
        np.testing.assert_array_equal(a, b)


def test_load_cache_counts_nothing_extra(plain):
    """The page copy fills the same cache as before: same keys, shapes and dtypes."""
    source = open_shard_source(plain)
    cache = load_cache(source, column_specs(source.schema()))
    assert cache.arrays["image"].shape == (ROWS, 3, 4, 5)
    assert cache.arrays["image"].dtype == np.uint8
    np.testing.assert_array_equal(cache.arrays["label"], _table()["label"].to_numpy())


def test_zlib_checks_the_pages_when_isal_is_missing(plain, tmp_path, monkeypatch):
    """Without the isal package the same CRC-32 comes from zlib: same values, same catch."""
    import zlib

    import feedline.store.page_copy as page_copy

    monkeypatch.setattr(page_copy, "crc32", zlib.crc32)
    names, views = _copied(plain)
    assert all("image" in copied for copied in names), names
    np.testing.assert_array_equal(views["image"], _expected(_table())["image"])
    work = tmp_path / "ds"
    shutil.copytree(plain, work)
    shard = sorted(work.glob("part-*.parquet"))[0]
    offset, _ = _page_values_offset(shard)
    data = bytearray(shard.read_bytes())
    data[offset] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(fl.DataError, match="CRC-32"):
        _copied(work)


def test_a_shard_swapped_after_open_is_refused_by_the_page_copy(plain, tmp_path):
    """The footer of the file the pages are copied from is checked against the manifest."""
    work, other = tmp_path / "ds", tmp_path / "other"
    shutil.copytree(plain, work)
    fl.from_arrow(_table(seed=1)).write(other, rows_per_shard=200, row_group_rows=100,
                                        compression=None)  # fmt: skip
    mine = sorted(work.glob("part-*.parquet"))[0]
    theirs = sorted(other.glob("part-*.parquet"))[0]
    with pytest.raises(fl.IntegrityError, match=mine.name):
        _copied(work, then=lambda: shutil.copyfile(theirs, mine))
