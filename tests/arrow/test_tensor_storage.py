"""Fixed-shape tensor columns are stored as fixed-size binary (a memory copy to read), typed
back when read through feedline, and datasets written with list-encoded tensors still load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.arrow.tensor_codec import TENSOR_KEY
from feedline.errors import DataError, SchemaError
from feedline.io.storage.paths import resolve
from feedline.store.footers import footer_of
from feedline.store.manifest import MANIFEST_NAME, Manifest, ShardInfo
from feedline.store.shards import file_checksum


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3, 4, 5), dtype=np.uint8)


def tensor_table(n: int = 40) -> pa.Table:
    vectors = np.random.default_rng(1).standard_normal((n, 6)).astype(np.float32)
    tensor = pa.fixed_shape_tensor(pa.uint8(), [3, 4, 5], dim_names=["c", "h", "w"])
    storage = pa.FixedSizeListArray.from_arrays(pa.array(images(n).reshape(-1)), 60)
    return pa.table(
        {
            "image": pa.ExtensionArray.from_storage(tensor, storage),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 6),
            "emb": pa.array(
                [[float(i), -1.0] for i in range(n)],
                pa.list_(pa.field("value", pa.float64(), nullable=False), 2),
            ),
            "label": np.arange(n),
        }
    )


def shards(path: Path) -> list[Path]:
    return sorted(path.glob("part-*.parquet"))


def test_tensors_are_stored_as_plain_fixed_size_binary(tmp_path: Path) -> None:
    fl.from_arrow(tensor_table()).write(tmp_path / "ds", row_group_rows=16)
    shard = pq.ParquetFile(shards(tmp_path / "ds")[0])
    stored = shard.schema_arrow
    for name, width in (("image", 60), ("vec", 24), ("emb", 16)):
        assert stored.field(name).type == pa.binary(width)
        described = json.loads(stored.field(name).metadata[TENSOR_KEY])
        assert described["order"] == "C" and described["byte_order"] == "little"
        column = shard.metadata.row_group(0).column(stored.get_field_index(name))
        assert column.physical_type == "FIXED_LEN_BYTE_ARRAY"
        assert not column.has_dictionary_page and "PLAIN" in column.encodings
        assert column.statistics is None  # kilobytes per value: no min/max kept
    assert json.loads(stored.field("image").metadata[TENSOR_KEY])["shape"] == [3, 4, 5]
    assert stored.field("label").type == pa.int64()


def test_reading_through_feedline_gives_the_tensor_types_back(tmp_path: Path) -> None:
    table = tensor_table()
    fl.from_arrow(table).write(tmp_path / "ds", rows_per_shard=15, row_group_rows=7)
    back = fl.open(tmp_path / "ds").to_arrow()
    assert back.schema.equals(table.schema) and back.equals(table)
    assert back.schema.field("image").type.dim_names == ["c", "h", "w"]
    # the shards read as a plain Parquet folder (no manifest): typed from the field metadata
    plain = fl.read_parquet([str(p) for p in shards(tmp_path / "ds")]).to_arrow()
    assert plain.schema.equals(table.schema, check_metadata=False) and plain.equals(table)


def test_null_tensors_and_sliced_arrays_round_trip(tmp_path: Path) -> None:
    values = images(10)
    validity = pa.array([i % 3 != 1 for i in range(10)])
    storage = pa.FixedSizeListArray.from_arrays(
        pa.array(values.reshape(-1)), 60, mask=pa.compute.invert(validity)
    )
    tensor = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.uint8(), [3, 4, 5]), storage)
    table = pa.table({"image": tensor, "k": np.arange(10)}).slice(2, 7)  # an offset
    fl.from_arrow(table).write(tmp_path / "ds")
    back = fl.open(tmp_path / "ds").to_arrow()
    assert back.equals(table)
    assert back["image"].null_count == table["image"].null_count > 0


def test_other_readers_decode_the_bytes_as_documented(tmp_path: Path) -> None:
    table = tensor_table(12)
    fl.from_arrow(table).write(tmp_path / "ds")
    raw = pq.read_table(shards(tmp_path / "ds")[0])
    column = raw["image"].combine_chunks()
    described = json.loads(raw.schema.field("image").metadata[TENSOR_KEY])
    n = int(np.prod(described["shape"]))
    flat = np.frombuffer(column.buffers()[1], described["value_type"])
    decoded = flat[column.offset * n :][: len(column) * n].reshape(-1, *described["shape"])
    assert np.array_equal(decoded, images(12))
    frame = raw.to_pandas()  # pandas: a column of bytes
    from_pandas = np.frombuffer(b"".join(frame["vec"]), "float32").reshape(-1, 6)
    assert np.array_equal(from_pandas, table["vec"].combine_chunks().flatten().to_numpy()
                          .reshape(-1, 6))  # fmt: skip


def test_the_loader_reads_stored_tensors_cached_and_streamed(tmp_path: Path) -> None:
    table = tensor_table(64)
    fl.from_arrow(table).write(tmp_path / "ds", rows_per_shard=32, row_group_rows=8)
    ds = fl.open(tmp_path / "ds")
    for cache in ("memory", "none"):
        batches = list(ds.loader(batch_size=16, shuffle=False, format="numpy", cache=cache))
        got = np.concatenate([b["image"] for b in batches])
        assert got.shape == (64, 3, 4, 5) and np.array_equal(got, images(64))
        assert np.array_equal(np.concatenate([b["emb"] for b in batches])[:, 0], np.arange(64))


def _write_list_encoded(folder: Path, table: pa.Table) -> None:
    """A feedline dataset as written before tensors were stored as binary: list-encoded
    tensors (pyarrow's default), a manifest naming the shard with its checksums."""
    folder.mkdir()
    name = "part-00000.parquet"
    pq.write_table(table, folder / name, row_group_size=16, write_page_checksum=True)
    loc = resolve(folder / name)
    size, checksum = file_checksum(loc)
    footer = footer_of(loc)
    shard = ShardInfo(name, table.num_rows, size, footer.row_groups, checksum, footer.digest, True)
    (folder / MANIFEST_NAME).write_text(Manifest(table.schema, [shard]).to_json())


def test_datasets_with_list_encoded_tensors_still_load(tmp_path: Path) -> None:
    table = tensor_table(40)
    _write_list_encoded(tmp_path / "old", table)
    stored = pq.read_schema(tmp_path / "old" / "part-00000.parquet")
    assert isinstance(stored.field("image").type, pa.FixedShapeTensorType)  # list storage
    ds = fl.open(tmp_path / "old", verify=True)
    assert ds.to_arrow().equals(table)
    batch = next(iter(ds.loader(batch_size=40, shuffle=False, format="numpy")))
    assert np.array_equal(batch["image"], images(40))


def test_nulls_inside_a_tensor_are_refused_with_a_fix(tmp_path: Path) -> None:
    vec = pa.array([[1.0, None], [2.0, 3.0]], pa.list_(pa.float32(), 2))
    with pytest.raises(DataError, match=r"null elements.*Fix:"):
        fl.from_arrow(pa.table({"vec": vec})).write(tmp_path / "ds")


def test_tensor_columns_are_compressed_only_where_it_pays(tmp_path: Path) -> None:
    n = 2000
    noise = np.random.default_rng(0).integers(0, 256, (n, 64), dtype=np.uint8)
    table = pa.table(
        {
            "noise": pa.FixedShapeTensorArray.from_numpy_ndarray(noise),
            "flat": pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((n, 64), np.uint8)),
            "label": np.zeros(n, dtype=np.int64),
        }
    )
    fl.from_arrow(table).write(tmp_path / "ds", compression="zstd")
    meta = pq.ParquetFile(shards(tmp_path / "ds")[0]).metadata.row_group(0)
    codecs = {meta.column(i).path_in_schema: meta.column(i).compression for i in range(3)}
    assert codecs == {"noise": "UNCOMPRESSED", "flat": "ZSTD", "label": "ZSTD"}


def test_a_damaged_tensor_description_raises_a_schema_error(tmp_path: Path) -> None:
    meta = {TENSOR_KEY: json.dumps({"type": "arrow.fixed_shape_tensor", "value_type": "float32",
                                    "shape": [4], "order": "C"})}  # fmt: skip
    field = pa.field("t", pa.binary(8), metadata=meta)  # 8 bytes cannot hold 4 float32
    table = pa.Table.from_arrays([pa.array([b"\0" * 8], pa.binary(8))], schema=pa.schema([field]))
    pq.write_table(table, tmp_path / "f.parquet")
    with pytest.raises(SchemaError, match=r"does not fit the stored type.*Fix:"):
        fl.read_parquet(tmp_path / "f.parquet").schema()
