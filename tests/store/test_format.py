"""The feedline dataset format: round trips, shard sizing, manifest, checksums, atomic commit."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.store.commit import STAGING_PREFIX
from feedline.store.manifest import MANIFEST_NAME

REPO = Path(__file__).resolve().parents[2]


def manifest_of(path: Path) -> dict:
    return json.loads((path / MANIFEST_NAME).read_text())


def shard_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("part-*.parquet"))


def shard_names(path: Path) -> list[str]:
    """The shard file names the manifest lists, in order (``part-NNNNN-<write id>.parquet``)."""
    return [shard["path"] for shard in manifest_of(path)["shards"]]


def write_id_of(path: Path) -> str:
    return manifest_of(path)["write"]["id"]


def every_type_table() -> pa.Table:
    tensors = np.arange(6 * 2 * 3, dtype=np.float32).reshape(6, 2, 3)
    return pa.table(
        {
            "i8": pa.array([1, -2, None, 4, 5, 6], pa.int8()),
            "i64": pa.array([2**40, None, 0, -1, 7, 8], pa.int64()),
            "u16": pa.array([1, 2, 3, None, 5, 65_535], pa.uint16()),
            "f32": pa.array([0.5, None, float("inf"), -1.25, 0.0, 3.0], pa.float32()),
            "f64": [0.1, 0.2, None, -2.5, 1e300, -0.0],
            "flag": [True, False, None, True, True, False],
            "s": ["a", None, "", "héllo", "日本", "x" * 1_000],
            "blob": [b"\x00\x01", None, b"", b"\x80pickle-looking", b"z", b"q"],
            "ints": pa.array([[1, 2], [], None, [3], [4, None], [5]], pa.list_(pa.int32())),
            "words": pa.array([["a"], None, [], ["b", "c"], [None], ["d"]], pa.list_(pa.string())),
            "st": pa.array(
                [{"k": 1, "v": "x"}, None, {"k": None, "v": "y"}, {"k": 4, "v": None}] + [None] * 2,
                pa.struct([("k", pa.int32()), ("v", pa.string())]),
            ),
            "day": pa.array([0, 1, None, 3, 4, 5], pa.date32()),
            "ts": pa.array([0, 10**12, None, 5, 6, 7], pa.timestamp("us", tz="UTC")),
            "dec": pa.array([1, 2, 3, None, 5, 6], pa.decimal128(10, 2)),
            "cat": pa.array(["x", "y", "x", None, "y", "x"]).dictionary_encode(),
            "tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(tensors),
        }
    )


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("compression", ["zstd", None, "snappy"])
def test_round_trip_of_common_types(tmp_path, compression):
    table = every_type_table()
    info = fl.from_arrow(table).write(tmp_path / "out", rows_per_shard=4, compression=compression)
    assert (info.rows, info.shards) == (6, 2)
    back = fl.open(tmp_path / "out")
    assert back.schema() == table.schema
    result = back.to_arrow()
    assert result.schema == table.schema
    assert result.equals(table)
    assert back.count() == 6


def test_nan_round_trip(tmp_path):
    values = np.array([np.nan, 1.0, -np.inf], dtype=np.float64)
    fl.from_arrow(pa.table({"v": values})).write(tmp_path / "out")
    np.testing.assert_array_equal(fl.open(tmp_path / "out").to_arrow()["v"].to_numpy(), values)


def test_fixed_shape_tensor_round_trip_to_numpy(tmp_path):
    images = np.random.default_rng(0).integers(0, 255, size=(10, 4, 5, 3), dtype=np.uint8)

    def attach(batch):
        ids = batch["id"].to_numpy()
        return {"id": ids, "image": images[ids]}

    fl.range(10, rows_per_task=3).map_batches(attach).write(tmp_path / "out", rows_per_shard=4)
    back = fl.open(tmp_path / "out").to_arrow()
    column = back["image"]
    assert column.type.extension_name == "arrow.fixed_shape_tensor"
    assert column.type.shape == [4, 5, 3]
    np.testing.assert_array_equal(column.combine_chunks().to_numpy_ndarray(), images)
    schema = manifest_of(tmp_path / "out")["schema"]
    assert "arrow.fixed_shape_tensor" in json.dumps(schema)


def test_opened_dataset_supports_pushdown(tmp_path):
    fl.range(10_000).write(tmp_path / "out", rows_per_shard=2_500, row_group_rows=500)
    ds = fl.open(tmp_path / "out").filter(pc.field("id") < 600)
    report = ds.analyze()
    assert report.row_groups_total == 20
    assert report.row_groups_skipped == 18
    assert ds.to_arrow()["id"].to_pylist() == list(range(600))


def test_empty_dataset_round_trip(tmp_path):
    info = fl.range(10).filter(pc.field("id") > 100).write(tmp_path / "out")
    assert (info.rows, info.shards) == (0, 0)
    back = fl.open(tmp_path / "out", verify=True)
    assert back.count() == 0
    table = back.to_arrow()
    assert table.num_rows == 0 and table.schema.names == ["id"]


# --------------------------------------------------------------------------- shard sizing


def test_rows_per_shard_gives_exact_shard_sizes(tmp_path):
    info = fl.range(1_000, rows_per_task=64).write(tmp_path / "out", rows_per_shard=300)
    assert (info.rows, info.shards) == (1_000, 4)
    manifest = manifest_of(tmp_path / "out")
    assert [s["rows"] for s in manifest["shards"]] == [300, 300, 300, 100]
    write_id = write_id_of(tmp_path / "out")
    expected = [f"part-{i:05d}-{write_id}.parquet" for i in range(4)]
    assert shard_files(tmp_path / "out") == shard_names(tmp_path / "out") == expected
    for shard in manifest["shards"]:
        meta = pq.read_metadata(tmp_path / "out" / shard["path"])
        assert meta.num_rows == shard["rows"]
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert groups == shard["row_groups"]
    assert fl.open(tmp_path / "out").to_arrow()["id"].to_pylist() == list(range(1_000))


def test_row_group_rows(tmp_path):
    fl.range(1_000).write(tmp_path / "out", rows_per_shard=450, row_group_rows=200)
    shards = manifest_of(tmp_path / "out")["shards"]
    assert [s["row_groups"] for s in shards] == [[200, 200, 50], [200, 200, 50], [100]]


def test_bytes_per_shard_rolls_shards(tmp_path):
    def noisy(batch):
        rng = np.random.default_rng(batch["id"][0].as_py())
        return {"id": batch["id"], "r": rng.random(batch.num_rows)}  # ~incompressible

    limit = 200_000
    info = (
        fl.range(100_000)
        .map_batches(noisy)
        .write(tmp_path / "out", bytes_per_shard=limit, row_group_rows=5_000)
    )
    shards = manifest_of(tmp_path / "out")["shards"]
    assert info.shards == len(shards) >= 4
    for shard in shards[:-1]:
        assert shard["bytes"] >= limit
        assert shard["bytes"] < 2 * limit
    assert sum(s["rows"] for s in shards) == 100_000
    sizes = [(tmp_path / "out" / s["path"]).stat().st_size for s in shards]
    assert sizes == [s["bytes"] for s in shards]
    assert fl.open(tmp_path / "out").to_arrow()["id"].to_pylist() == list(range(100_000))


def test_many_small_inputs_become_few_shards(tmp_path, parquet_folder):
    folder = parquet_folder(n_files=60, rows=20)
    info = fl.read_parquet(folder).write(tmp_path / "out")
    assert info.rows == 1_200
    assert info.shards == 1
    info = fl.read_parquet(folder).write(tmp_path / "out", rows_per_shard=500)
    assert info.shards == 3
    assert fl.open(tmp_path / "out").to_arrow()["id"].to_pylist() == list(range(1_200))


def test_bad_shard_options(tmp_path):
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.range(3).write(tmp_path / "out", rows_per_shard=0)
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.range(3).write(tmp_path / "out2", bytes_per_shard="huge")


# --------------------------------------------------------------------------- manifest


def identity(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def test_manifest_is_plain_json(tmp_path):
    table = every_type_table()
    fl.from_arrow(table).map_batches(identity).write(tmp_path / "out", rows_per_shard=4)
    raw = (tmp_path / "out" / MANIFEST_NAME).read_bytes()
    assert b"\x80" not in raw  # no pickle protocol header (nor any non-ASCII byte)
    raw.decode("ascii")
    assert b"pickle" not in raw.lower()
    doc = json.loads(raw)
    assert doc["format"] == "feedline"
    assert doc["format_version"] == 1
    assert doc["rows"] == 6
    assert [f["name"] for f in doc["schema"]["fields"]] == table.column_names
    assert {"source", "plan", "feedline_version", "created", "engine"} <= set(doc["lineage"])
    for shard in doc["shards"]:
        assert set(shard) >= {"path", "rows", "bytes", "row_groups", "checksum"}
        assert not shard["path"].startswith("/") and ".." not in shard["path"]

    def walk(value):
        if isinstance(value, dict):
            assert "pickle" not in " ".join(map(str, value)).lower()
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        else:
            assert value is None or isinstance(value, str | int | float | bool)

    walk(doc)


def test_shard_checksums_match_the_files(tmp_path):
    fl.range(5_000).write(tmp_path / "out", rows_per_shard=2_000)
    manifest = manifest_of(tmp_path / "out")
    assert len(manifest["shards"]) == 3
    for shard in manifest["shards"]:
        data = (tmp_path / "out" / shard["path"]).read_bytes()
        assert shard["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
        assert shard["bytes"] == len(data)
    assert fl.verify(tmp_path / "out").rows == 5_000
    assert fl.open(tmp_path / "out").manifest.rows == 5_000


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    index = len(data) // 2 if offset is None else offset
    data[index] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_byte_fails_verify_naming_the_shard(tmp_path):
    out = tmp_path / "out"
    fl.range(3_000).write(out, rows_per_shard=1_000)
    _flip_byte(out / shard_names(out)[1])
    with pytest.raises(fl.IntegrityError, match=r"part-00001-[0-9a-f]{12}\.parquet") as info:
        fl.verify(out)
    assert "Fix:" in str(info.value)
    with pytest.raises(fl.IntegrityError, match=r"part-00001-"):
        fl.open(out, verify=True)
    assert fl.open(out).count() == 3_000  # counting needs only the manifest


def test_truncated_or_missing_shard_fails_verify(tmp_path):
    out = tmp_path / "out"
    fl.range(3_000).write(out, rows_per_shard=1_000)
    shard = out / shard_names(out)[2]
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(fl.IntegrityError, match=r"part-00002-[0-9a-f]{12}\.parquet"):
        fl.verify(out)
    with pytest.raises(fl.IntegrityError, match=r"part-00002-[0-9a-f]{12}\.parquet"):
        fl.open(out, verify=True)
    with pytest.raises(fl.FeedlineError, match=r"part-00002-[0-9a-f]{12}\.parquet"):
        fl.open(out).to_arrow()
    shard.unlink()
    with pytest.raises(fl.IntegrityError, match=r"part-00002-[0-9a-f]{12}\.parquet.*missing"):
        fl.verify(out)


def test_shards_record_their_footer_digest_and_page_checksums(tmp_path):
    out = tmp_path / "out"
    fl.range(5_000).write(out, rows_per_shard=2_000)
    for shard in manifest_of(out)["shards"]:
        data = (out / shard["path"]).read_bytes()
        footer = data[-(int.from_bytes(data[-8:-4], "little") + 8) :]  # metadata, length, PAR1
        assert shard["footer"] == "sha256:" + hashlib.sha256(footer).hexdigest()
        assert shard["page_checksums"] is True


def _move_rows(doc: dict) -> None:
    first, second = doc["shards"][0], doc["shards"][1]
    first.update(rows=1_100, row_groups=[500, 600])
    second.update(rows=900, row_groups=[500, 400])


def _other_schema(doc: dict) -> None:
    from feedline.store.manifest import schema_to_json

    doc["schema"] = schema_to_json(pa.schema({"id": pa.int32()}))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_move_rows, id="rows-moved-between-shards"),
        pytest.param(lambda d: d["shards"][0].update(row_groups=[250, 750]), id="row-groups"),
        pytest.param(_other_schema, id="schema"),
        pytest.param(lambda d: d["shards"][0].update(footer="sha256:" + "0" * 64), id="footer"),
    ],
)
def test_verify_checks_the_footers_not_only_the_checksums(tmp_path, change):
    """A manifest whose checksums still match its shards but whose rows, row groups or schema
    do not: verify (and the CLI) must not say OK on a dataset open or the loader refuses."""
    from feedline.cli.main import main

    out = tmp_path / "out"
    fl.range(3_000).write(out, rows_per_shard=1_000, row_group_rows=500)
    doc = manifest_of(out)
    change(doc)
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises((fl.IntegrityError, fl.SchemaError), match=r"part-00000-") as info:
        fl.verify(out)
    assert "Fix:" in str(info.value)
    assert main(["verify", str(out), "--quiet"]) == 2
    with pytest.raises(fl.FeedlineError):
        fl.open(out).loader(batch_size=100, format="numpy")


def test_verify_accepts_types_parquet_stores_as_others(tmp_path):
    out = tmp_path / "out"
    table = pa.table({"t": pa.array([0, 1, None], pa.timestamp("s")), "d": [1.0, 2.0, 3.0]})
    fl.from_arrow(table).write(out)
    assert fl.verify(out).rows == 3  # timestamp[s] is stored as timestamp[ms]: no drift
    assert fl.open(out).to_arrow().equals(table)


def test_rerunning_a_write_replaces_the_dataset(tmp_path):
    out = tmp_path / "out"
    fl.range(10).write(out, rows_per_shard=3)
    assert len(shard_files(out)) == 4
    fl.from_arrow(pa.table({"id": [100, 101, 102]})).write(out)
    assert shard_names(out) == [f"part-00000-{write_id_of(out)}.parquet"]
    assert fl.open(out, verify=True).to_arrow()["id"].to_pylist() == [100, 101, 102]
    # the replaced version stays readable, its shards on disk, until it is vacuumed
    assert len(shard_files(out)) == 5
    assert fl.open(out, version=1, verify=True).count() == 10
    fl.vacuum(out, keep_versions=1)
    assert shard_files(out) == shard_names(out)
    assert sorted(os.listdir(out)) == [MANIFEST_NAME, "_versions", *shard_names(out)]


def test_writing_over_foreign_files_is_refused(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    (out / "data.parquet").write_bytes(b"also precious")
    with pytest.raises(fl.ConfigurationError, match=r"notes\.txt") as info:
        fl.range(5).write(out)
    assert "Fix:" in str(info.value)
    assert (out / "notes.txt").read_text() == "precious"
    assert (out / "data.parquet").read_bytes() == b"also precious"
    assert sorted(os.listdir(out)) == ["data.parquet", "notes.txt"]
    file_target = tmp_path / "file"
    file_target.write_text("x")
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.range(5).write(file_target)
    assert file_target.read_text() == "x"


def test_writing_over_a_plain_parquet_folder_is_refused(tmp_path):
    # pyarrow names its files part-{i}.parquet: without a manifest they are the user's data
    out = tmp_path / "theirs"
    pads.write_dataset(pa.table({"precious": [1, 2, 3]}), out, format="parquet")
    files = sorted(os.listdir(out))
    assert files == ["part-0.parquet"]
    with pytest.raises(fl.ConfigurationError, match=r"part-0\.parquet"):
        fl.range(5).write(out)
    assert sorted(os.listdir(out)) == files
    assert fl.open(out).to_arrow()["precious"].to_pylist() == [1, 2, 3]


@pytest.fixture
def written(tmp_path) -> Path:
    out = tmp_path / "out"
    fl.range(10).write(out, rows_per_shard=4)
    return out


def _rewrite_manifest(out: Path, change) -> None:
    doc = manifest_of(out)
    change(doc)
    (out / MANIFEST_NAME).write_text(json.dumps(doc))


def _set_shard_path(path):
    def change(doc):
        doc["shards"][0]["path"] = path

    return change


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda doc: doc.update(format_version=99), id="future-version"),
        pytest.param(lambda doc: doc.update(format_version=0), id="version-0"),
        pytest.param(lambda doc: doc.update(format_version="1"), id="version-string"),
        pytest.param(lambda doc: doc.update(format_version=True), id="version-bool"),
        pytest.param(lambda doc: doc.update(format="other"), id="not-feedline"),
        pytest.param(lambda doc: doc.pop("schema"), id="no-schema"),
        pytest.param(lambda doc: doc["schema"].update(arrow_ipc="!!"), id="bad-schema"),
        pytest.param(lambda doc: doc.update(rows=11), id="row-total"),
        pytest.param(lambda doc: doc["shards"][0].update(rows=5), id="row-groups-disagree"),
        pytest.param(_set_shard_path("../outside.parquet"), id="dotdot"),
        pytest.param(_set_shard_path("a/../../outside.parquet"), id="nested-dotdot"),
        pytest.param(_set_shard_path("/etc/passwd"), id="absolute"),
        pytest.param(_set_shard_path("C:\\data\\x.parquet"), id="windows-absolute"),
        pytest.param(_set_shard_path("s3://bucket/x.parquet"), id="url"),
        pytest.param(_set_shard_path(""), id="empty"),
    ],
)
def test_malformed_manifest_is_a_format_error(written, change):
    _rewrite_manifest(written, change)
    with pytest.raises(fl.FormatError, match="Fix:"):
        fl.open(written)
    with pytest.raises(fl.FormatError):
        fl.verify(written)


@pytest.mark.parametrize("text", ["{not json", "", "[]", "null", '"feedline"'])
def test_manifest_that_is_not_a_json_object_is_a_format_error(written, text):
    (written / MANIFEST_NAME).write_text(text)
    with pytest.raises(fl.FormatError, match=MANIFEST_NAME):
        fl.open(written)


def test_plain_parquet_folder_without_manifest_opens(tmp_path, parquet_folder):
    folder = parquet_folder(n_files=3, rows=5)
    ds = fl.open(folder)
    assert ds.manifest is None
    assert ds.count() == 15
    assert ds.to_arrow()["id"].to_pylist() == list(range(15))
    with pytest.raises(fl.FormatError, match="Fix:"):
        fl.verify(folder)
    with pytest.raises(fl.FormatError, match="does not exist"):
        fl.open(tmp_path / "nowhere")


# --------------------------------------------------------------------------- crash safety

WRITER = textwrap.dedent(
    """
    import sys, time
    import feedline as fl

    def slow(batch):
        time.sleep(0.02)
        return batch

    ds = fl.range(1_000_000, rows_per_task=1_000).map_batches(slow, batch_size=100)
    ds.write(sys.argv[1], row_group_rows=100, rows_per_shard=1_000)
    """
)


def _kill_writer_midway(out: Path) -> None:
    """Start a slow writer on ``out`` and SIGKILL it once a staged shard file exists."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob(f"{STAGING_PREFIX}*/part-*.parquet")):
            assert proc.poll() is None, "the writer exited before it was killed"
            assert time.monotonic() < deadline, "the writer never staged a shard"
            time.sleep(0.02)
        time.sleep(0.1)  # let it get further into the write
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_killed_write_leaves_no_manifest_and_open_refuses(tmp_path):
    out = tmp_path / "out"
    _kill_writer_midway(out)
    assert not (out / MANIFEST_NAME).exists()
    assert list(out.glob(f"{STAGING_PREFIX}*"))
    with pytest.raises(fl.IncompleteDatasetError) as info:
        fl.open(out)
    message = str(info.value)
    assert "interrupted" in message and MANIFEST_NAME in message and "Fix:" in message
    with pytest.raises(fl.IncompleteDatasetError):
        fl.verify(out)
    # a re-run completes the dataset and clears the leftovers
    fl.range(50).write(out)
    assert fl.open(out, verify=True).count() == 50
    assert not list(out.glob(f"{STAGING_PREFIX}*"))


def test_killed_rewrite_keeps_the_previous_dataset(tmp_path):
    out = tmp_path / "out"
    fl.from_arrow(pa.table({"id": [7, 8, 9]})).write(out)
    before = (out / MANIFEST_NAME).read_bytes()
    _kill_writer_midway(out)
    assert (out / MANIFEST_NAME).read_bytes() == before
    ds = fl.open(out, verify=True)
    assert ds.to_arrow()["id"].to_pylist() == [7, 8, 9]
    assert fl.read_parquet(out).count() == 3  # staged shards are hidden from plain readers too
