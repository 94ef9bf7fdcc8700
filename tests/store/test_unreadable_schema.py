"""A write never commits a schema that cannot be read back; open and verify refuse one
(issue 23, item 1): two columns of one name make every Parquet read fail."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import FormatError, SchemaError
from feedline.io.storage.paths import resolve
from feedline.store.commit import commit, writing
from feedline.store.dataset_files import write_batches
from feedline.store.manifest import MANIFEST_NAME, Manifest, schema_to_json
from feedline.store.shards import ShardWriter

TWICE = pa.RecordBatch.from_arrays(
    [pa.array([1, 2]), pa.array([3, 4]), pa.array(["a", "b"])], names=["k", "s", "s"]
)


def test_the_writer_refuses_batches_naming_a_column_twice(tmp_path: Path) -> None:
    target = resolve(tmp_path / "ds")
    with pytest.raises(SchemaError, match=r"more than one column named \['s'\]"):
        write_batches(
            target,
            [TWICE],
            schema_hint=lambda: TWICE.schema,
            lineage={},
            writer_options={},
        )
    assert not (tmp_path / "ds" / MANIFEST_NAME).exists()
    assert not list((tmp_path / "ds").glob("part-*"))


def test_commit_refuses_a_manifest_naming_a_column_twice(tmp_path: Path) -> None:
    target = resolve(tmp_path / "ds")
    with writing(target) as write:
        shards = ShardWriter(write.staging, write_id=write.write_id)
        shards.write(pa.record_batch({"k": [1, 2], "s": [3, 4]}))
        manifest = Manifest(shards.schema, shards.close())
        with pytest.raises(SchemaError, match="nothing was committed"):
            commit(write, dataclasses.replace(manifest, schema=TWICE.schema))
    assert not (tmp_path / "ds" / MANIFEST_NAME).exists()


def test_open_and_verify_refuse_a_committed_schema_naming_a_column_twice(
    tmp_path: Path,
) -> None:
    """A dataset written by a feedline that did not check (or a forged manifest)."""
    out = tmp_path / "ds"
    fl.from_arrow(pa.table({"k": [1, 2], "v": [3, 4], "s": ["a", "b"]})).write(out)
    doc = json.loads((out / MANIFEST_NAME).read_text())
    doc["schema"] = schema_to_json(TWICE.schema)
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"more than one column \['s'\]"):
        fl.verify(out)
    with pytest.raises(FormatError, match=r"more than one column \['s'\]"):
        fl.open(out)
