"""The compact manifest (format version 2) of datasets of many shards (issue 25, item 5):
one table row per shard, same checks, versions and vacuum unchanged, old manifests readable."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import feedline as fl
import feedline.store.manifest as manifest_module
from feedline.store.manifest import MANIFEST_NAME, Manifest, ShardInfo


@pytest.fixture
def compact(monkeypatch):
    """Datasets of more than 2 shards get the compact manifest."""
    monkeypatch.setattr(manifest_module, "COMPACT_SHARDS", 2)


def _doc(path) -> dict:
    return json.loads((path / MANIFEST_NAME).read_text())


def test_compact_manifest_round_trip_versions_and_vacuum(tmp_path, compact):
    out = tmp_path / "ds"
    fl.range(50).write(out, rows_per_shard=10, row_group_rows=5)
    doc = _doc(out)
    assert doc["format_version"] == 2 and "shards" not in doc
    assert doc["shard_table"]["columns"][:3] == ["path", "rows", "bytes"]
    assert [row[1] for row in doc["shard_table"]["rows"]] == [10] * 5
    assert fl.open(out).to_arrow()["id"].to_pylist() == list(range(50))
    assert fl.verify(out).rows == 50
    fl.range(20).write(out, mode="append", rows_per_shard=10)
    assert fl.open(out).count() == 70 and fl.open(out, version=1).count() == 50
    versions = json.loads((out / "_versions" / "v000002.json").read_text())
    assert versions["format_version"] == 2 and len(versions["shard_table"]["rows"]) == 7
    fl.vacuum(out, keep_versions=1)
    with pytest.raises(fl.ConfigurationError):
        fl.open(out, version=1)
    assert sorted(fl.open(out, verify=True).to_arrow()["id"].to_pylist()) == sorted(
        list(range(50)) + list(range(20))
    )


def test_few_shards_keep_format_1_and_old_manifests_still_open(tmp_path, compact):
    small = tmp_path / "small"
    fl.range(10).write(small, rows_per_shard=5)
    assert _doc(small)["format_version"] == 1 and "shards" in _doc(small)
    big = tmp_path / "big"
    fl.range(30).write(big, rows_per_shard=5)
    doc = _doc(big)
    columns = doc["shard_table"]["columns"]
    # the same dataset described as a version-1 manifest (what older feedline wrote) opens
    doc["shards"] = [dict(zip(columns, row, strict=True)) for row in doc.pop("shard_table")["rows"]]
    doc["format_version"] = 1
    (big / MANIFEST_NAME).write_text(json.dumps(doc))
    assert fl.open(big).to_arrow()["id"].to_pylist() == list(range(30))
    fl.verify(big)


def test_compact_manifest_is_smaller_and_parses_to_the_same_shards(monkeypatch):
    shards = [
        ShardInfo(f"part-{i:05d}-0a1b2c3d4e5f.parquet", 100, 5_000, (50, 50),
                  "sha256:" + "a" * 64, "sha256:" + "b" * 64, True)
        for i in range(100)
    ]  # fmt: skip
    manifest = Manifest(pa.schema({"x": pa.int64()}), shards)
    monkeypatch.setattr(manifest_module, "COMPACT_SHARDS", 10**6)
    wide = manifest.to_json()
    monkeypatch.setattr(manifest_module, "COMPACT_SHARDS", 10)
    narrow = manifest.to_json()
    assert len(narrow) < 0.7 * len(wide)
    assert Manifest.from_json(narrow, "m").shards == Manifest.from_json(wide, "m").shards == shards


def _rows(doc):
    return doc["shard_table"]["rows"]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: _rows(d)[1].pop(), id="short-row"),
        pytest.param(lambda d: _rows(d).__setitem__(0, {"path": "x"}), id="row-not-a-list"),
        pytest.param(lambda d: d["shard_table"]["columns"].remove("path"), id="no-path"),
        pytest.param(lambda d: d["shard_table"]["columns"].__setitem__(6, "evil"), id="unknown"),
        pytest.param(lambda d: d["shard_table"]["columns"].__setitem__(6, "rows"), id="twice"),
        pytest.param(lambda d: d["shard_table"].update(rows={"a": 1}), id="rows-not-a-list"),
        pytest.param(lambda d: d.update(shard_table=[]), id="table-not-an-object"),
        pytest.param(lambda d: d.pop("shard_table"), id="no-table"),
        pytest.param(lambda d: d.update(shards=[]), id="both-forms"),
        pytest.param(lambda d: _rows(d)[0].__setitem__(1, "10"), id="rows-a-string"),
        pytest.param(lambda d: _rows(d)[0].__setitem__(0, "../x.parquet"), id="path-escapes"),
        pytest.param(lambda d: _rows(d)[0].__setitem__(3, [1, 2]), id="row-groups-disagree"),
        pytest.param(lambda d: _rows(d)[0].__setitem__(4, "md5:00"), id="bad-checksum"),
        pytest.param(lambda d: _rows(d)[2].__setitem__(0, _rows(d)[1][0]), id="path-twice"),
        pytest.param(lambda d: _rows(d)[0].__setitem__(6, "yes"), id="page-checksums-str"),
    ],
)
def test_a_corrupt_compact_shard_table_is_a_format_error(tmp_path, compact, damage):
    out = tmp_path / "ds"
    fl.range(30).write(out, rows_per_shard=10)
    doc = _doc(out)
    damage(doc)
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(fl.FormatError, match="Fix:"):
        fl.open(out)
