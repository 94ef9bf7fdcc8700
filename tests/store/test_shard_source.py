"""The seam between the dataset side and the loader: ``ShardSource`` / ``BatchStream``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.errors import ConfigurationError, IntegrityError, SchemaError
from feedline.loader import Loader
from feedline.store.shard_source import BatchStream, ShardSource, open_shard_source


def test_a_written_dataset_is_described_by_its_manifest(tmp_path: Path) -> None:
    fl.range(10).write(tmp_path / "ds", rows_per_shard=6, row_group_rows=4)
    source = open_shard_source(tmp_path / "ds")
    manifest = fl.open(tmp_path / "ds").manifest
    assert source.groups == ((4, 2), (4,)) and source.num_rows == 10
    assert source.has_checksums and source.checksums == tuple(s.checksum for s in manifest.shards)
    assert source.sizes == tuple(s.bytes for s in manifest.shards)
    assert source.fingerprint == fl.open(tmp_path / "ds").plan.source.fingerprint()
    assert source.schema().names == ["id"]


def test_a_parquet_folder_is_described_by_its_footers(tmp_path: Path) -> None:
    (tmp_path / "pq").mkdir()
    for i in range(2):
        table = pa.table({"x": np.arange(5) + 5 * i, "y": np.ones(5)})
        pq.write_table(table, tmp_path / "pq" / f"{i}.parquet", row_group_size=3)
    source = open_shard_source(tmp_path / "pq")
    assert source.groups == ((3, 2), (3, 2)) and not source.has_checksums
    assert source.fingerprint is None and source.checksums == ("", "")
    assert source.sizes == tuple((tmp_path / "pq" / f"{i}.parquet").stat().st_size for i in (0, 1))
    assert source.read_table(["x"])["x"].to_pylist() == list(range(10))


def test_datasets_give_shards_or_a_batch_stream(tmp_path: Path) -> None:
    fl.from_arrow(pa.table({"a": [1, 2, 3], "b": [4, 5, 6]})).write(tmp_path / "ds")
    opened = fl.open(tmp_path / "ds")
    selected = opened.select(["b"]).shard_source()
    assert isinstance(selected, ShardSource) and selected.schema().names == ["b"]
    assert opened.shard_source(["a"]).schema().names == ["a"]
    computed = opened.filter(lambda b: np.asarray(b["a"]) > 1).shard_source()
    assert isinstance(computed, BatchStream) and computed.num_rows is None
    assert computed.read_table(["b"])["b"].to_pylist() == [5, 6]
    assert isinstance(opened.limit(2).shard_source(), BatchStream)
    assert opened.limit(2).shard_source().num_rows == 2  # known from the manifest
    assert fl.range(7).limit(3).shard_source().num_rows == 3


def test_the_loader_takes_a_dataset_a_path_or_a_shard_source(tmp_path: Path) -> None:
    fl.range(12).write(tmp_path / "ds")
    reference = fl.open(tmp_path / "ds").loader(batch_size=4, seed=2, format="numpy")
    expected = [b["id"].tolist() for b in reference]
    for given in (tmp_path / "ds", str(tmp_path / "ds"), open_shard_source(tmp_path / "ds")):
        got = [b["id"].tolist() for b in Loader(given, batch_size=4, seed=2, format="numpy")]
        assert got == expected
    state = Loader(tmp_path / "ds", batch_size=4).state_dict()
    assert state["fingerprint"] == open_shard_source(tmp_path / "ds").fingerprint


def test_other_objects_are_refused_with_a_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read list objects.*Fix:"):
        len(Loader([1, 2, 3], batch_size=2))


def test_missing_columns_and_replaced_shards_are_named(tmp_path: Path) -> None:
    fl.range(6).write(tmp_path / "ds", row_group_rows=3)
    source = open_shard_source(tmp_path / "ds")
    with pytest.raises(SchemaError, match=r"\['nope'\].*Fix:"):
        source.select(["nope"])
    shard = source.files[0].path
    pq.write_table(pa.table({"id": np.arange(6)}), shard)  # another file under the same name
    with pytest.raises(IntegrityError, match=r"Fix:"):
        source.read_table()
