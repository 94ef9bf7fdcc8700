"""fl.read_tfrecord / Dataset.write_tfrecord against TensorFlow's own writer, reader and parser.

Files written by ``tf.io.TFRecordWriter`` (plain, GZIP, ZLIB) are read by feedline; files
written by feedline are read by ``tf.data.TFRecordDataset`` + ``tf.io.parse_example``; rows
must be equal. Corrupt and truncated files raise or are skipped and counted.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pytest

import feedline as fl
from feedline.io.tfrecord.frames import frame
from feedline.io.tfrecord.reader import INFER_RECORDS

tf = pytest.importorskip("tensorflow")

N = 50
TF_OPTIONS = {None: None, "GZIP": "GZIP", "ZLIB": "ZLIB"}


def _rows(n: int = N, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "label": int(rng.integers(-(2**40), 2**40)),
            "score": float(np.float32(rng.normal())),
            "embedding": rng.normal(size=3).astype(np.float32).tolist(),
            "tokens": rng.integers(0, 2**20, int(rng.integers(0, 6))).tolist(),
            "name": f"row-{i}-é".encode(),
            "tags": [f"t{j}".encode() for j in range(int(rng.integers(0, 3)))],
            "image": rng.integers(0, 256, (4, 4, 3), dtype=np.uint8),
        }
        for i in range(n)
    ]


def _example(row: dict) -> bytes:
    f = tf.train
    feature = {
        "label": f.Feature(int64_list=f.Int64List(value=[row["label"]])),
        "score": f.Feature(float_list=f.FloatList(value=[row["score"]])),
        "embedding": f.Feature(float_list=f.FloatList(value=row["embedding"])),
        "tokens": f.Feature(int64_list=f.Int64List(value=row["tokens"])),
        "name": f.Feature(bytes_list=f.BytesList(value=[row["name"]])),
        "tags": f.Feature(bytes_list=f.BytesList(value=row["tags"])),
        "image": f.Feature(bytes_list=f.BytesList(value=[row["image"].tobytes()])),
    }
    return f.Example(features=f.Features(feature=feature)).SerializeToString()


def _write_tf(path: Path, rows: list[dict], compression: str | None = None) -> Path:
    with tf.io.TFRecordWriter(str(path), options=TF_OPTIONS[compression]) as writer:
        for row in rows:
            writer.write(_example(row))
    return path


SPEC = {
    "label": "int64",
    "score": "float32",
    "embedding": fl.tfrecord.FixedLen((3,), "float32"),
    "tokens": fl.tfrecord.VarLen("int64"),
    "name": "string",
    "tags": fl.tfrecord.VarLen("bytes"),
    "image": fl.tfrecord.FixedLen((4, 4, 3), "uint8"),
}


def _check(table: pa.Table, rows: list[dict]) -> None:
    assert table.num_rows == len(rows)
    assert table["label"].to_pylist() == [r["label"] for r in rows]
    assert table["score"].to_pylist() == [r["score"] for r in rows]
    embedding = table["embedding"].combine_chunks().to_numpy_ndarray()
    np.testing.assert_array_equal(embedding, np.array([r["embedding"] for r in rows], np.float32))
    assert table["tokens"].to_pylist() == [r["tokens"] for r in rows]
    assert table["name"].to_pylist() == [r["name"].decode() for r in rows]
    assert table["tags"].to_pylist() == [r["tags"] for r in rows]
    images = table["image"].combine_chunks().to_numpy_ndarray()
    np.testing.assert_array_equal(images, np.stack([r["image"] for r in rows]))


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_reads_files_written_by_tensorflow(tmp_path: Path, compression: str | None) -> None:
    rows = _rows()
    _write_tf(tmp_path / "a.tfrecord", rows[:30], compression)
    _write_tf(tmp_path / "b.tfrecord", rows[30:], compression)
    table = fl.read_tfrecord(tmp_path, features=SPEC).to_arrow()  # compression="auto"
    _check(table, rows)
    given = fl.read_tfrecord(tmp_path, features=SPEC, compression=compression).to_arrow()
    assert given.equals(table)
    assert table.schema.field("image").type == pa.fixed_shape_tensor(pa.uint8(), [4, 4, 3])


def test_infers_features_from_the_first_records(tmp_path: Path) -> None:
    rows = _rows()
    for row in rows:  # every record with 2 tokens: inferred as FixedLen((2,))
        row["tokens"] = row["tokens"][:1] * 2 if row["tokens"] else [7, 7]
    _write_tf(tmp_path / "a.tfrecord", rows)
    ds = fl.read_tfrecord(tmp_path / "a.tfrecord")
    schema = ds.schema()
    assert schema.field("label").type == pa.int64()
    assert schema.field("score").type == pa.float32()
    assert schema.field("embedding").type == pa.fixed_shape_tensor(pa.float32(), [3])
    assert schema.field("tokens").type == pa.fixed_shape_tensor(pa.int64(), [2])
    assert schema.field("name").type == pa.binary()
    assert schema.field("tags").type == pa.list_(pa.binary())  # 0..2 values
    table = ds.to_arrow()
    assert table["label"].to_pylist() == [r["label"] for r in rows]
    assert table["name"].to_pylist() == [r["name"] for r in rows]
    assert ds.select(["tags", "label"]).to_arrow().column_names == ["tags", "label"]


def test_a_later_record_that_disagrees_with_the_inferred_schema(tmp_path: Path) -> None:
    rows = _rows(INFER_RECORDS + 20)
    rows[INFER_RECORDS + 5]["embedding"] = [1.0, 2.0]  # 2 values where 1000 records had 3
    _write_tf(tmp_path / "a.tfrecord", rows)
    with pytest.raises(fl.SchemaError, match=rf"record {INFER_RECORDS + 5} .*Fix: pass features="):
        fl.read_tfrecord(tmp_path / "a.tfrecord", on_error="skip").to_arrow()
    spec = dict(SPEC, embedding=fl.tfrecord.VarLen("float32"))
    assert fl.read_tfrecord(tmp_path / "a.tfrecord", features=spec).count() == len(rows)


def test_files_written_by_feedline_read_by_tensorflow(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 40
    images = rng.integers(0, 256, (n, 2, 3), dtype=np.uint8)
    table = pa.table(
        {
            "id": pa.array(np.arange(n) - 20, pa.int64()),
            "flag": pa.array(rng.random(n) > 0.5),
            "x": pa.array(rng.normal(size=n), pa.float64()),
            "vec": pa.FixedShapeTensorArray.from_numpy_ndarray(
                rng.normal(size=(n, 2)).astype("f4")
            ),
            "image": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
            "seq": pa.array([list(range(i % 4)) for i in range(n)], pa.list_(pa.int32())),
            "text": pa.array([f"é{i}" for i in range(n)]),
            "big": pa.array([2**62 + i for i in range(n)], pa.uint64()),
        }
    )
    for compression in (None, "GZIP", "ZLIB"):
        out = tmp_path / str(compression)
        info = fl.from_arrow(table).write_tfrecord(
            out, compression=compression, records_per_file=15
        )
        assert (info.rows, info.shards) == (n, 3)
        files = sorted(str(p) for p in out.iterdir())
        assert Path(files[0]).name.startswith("part-00000.tfrecord")
        spec = {
            "id": tf.io.FixedLenFeature([], tf.int64),
            "flag": tf.io.FixedLenFeature([], tf.int64),
            "x": tf.io.FixedLenFeature([], tf.float32),
            "vec": tf.io.FixedLenFeature([2], tf.float32),
            "image": tf.io.FixedLenFeature([2, 3], tf.int64),
            "seq": tf.io.VarLenFeature(tf.int64),
            "text": tf.io.FixedLenFeature([], tf.string),
            "big": tf.io.FixedLenFeature([], tf.int64),
        }
        got = {k: [] for k in spec}
        data = tf.data.TFRecordDataset(files, compression_type=compression or "")
        for serialized in data.batch(16):
            parsed = tf.io.parse_example(serialized, spec)
            for k in spec:
                value = parsed[k]
                if isinstance(value, tf.sparse.SparseTensor):
                    value = tf.RaggedTensor.from_sparse(value).to_list()
                    got[k].extend(value)
                else:
                    got[k].extend(value.numpy())
        assert [int(v) for v in got["id"]] == table["id"].to_pylist()
        assert [bool(v) for v in got["flag"]] == table["flag"].to_pylist()
        np.testing.assert_array_equal(np.array(got["x"]), table["x"].to_numpy().astype("f4"))
        np.testing.assert_array_equal(
            np.stack(got["vec"]), table["vec"].combine_chunks().to_numpy_ndarray()
        )
        np.testing.assert_array_equal(np.stack(got["image"]), images)
        assert got["seq"] == table["seq"].to_pylist()
        assert [v.decode() for v in got["text"]] == table["text"].to_pylist()
        assert [int(v) & (2**64 - 1) for v in got["big"]] == table["big"].to_pylist()
        # and feedline reads its own files back
        back = fl.read_tfrecord(out, features={"big": "uint64", "seq": fl.tfrecord.VarLen("int32"),
                                               "text": "string"}).to_arrow()  # fmt: skip
        assert back["big"].to_pylist() == table["big"].to_pylist()
        assert back["seq"].to_pylist() == table["seq"].to_pylist()
        assert back["text"].to_pylist() == table["text"].to_pylist()


def test_null_values_are_missing_features(tmp_path: Path) -> None:
    table = pa.table({"a": [1, None, 3], "b": [[1.5], None, []]})
    fl.from_arrow(table).write_tfrecord(tmp_path)
    spec = {"a": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
            "b": tf.io.VarLenFeature(tf.float32)}  # fmt: skip
    files = [str(p) for p in sorted(tmp_path.iterdir())]
    parsed = tf.io.parse_example(next(iter(tf.data.TFRecordDataset(files).batch(3))), spec)
    assert parsed["a"].numpy().tolist() == [1, -1, 3]
    assert tf.RaggedTensor.from_sparse(parsed["b"]).to_list() == [[1.5], [], []]
    ours = {"a": fl.tfrecord.FixedLen((), "int64", default=-1), "b": fl.tfrecord.VarLen("float32")}
    assert fl.read_tfrecord(tmp_path, features=ours).to_arrow().to_pydict() == {
        "a": [1, -1, 3], "b": [[1.5], [], []]}  # fmt: skip
    with pytest.raises(fl.DataError, match=r"record 1 \(byte offset \d+\) lacks feature 'a'"):
        fl.read_tfrecord(tmp_path, features={"a": "int64"}).to_arrow()
    ds = fl.read_tfrecord(tmp_path, features={"a": "int64"}, on_error="skip")
    assert ds.to_arrow()["a"].to_pylist() == [1, 3]
    assert ds.analyze().records_skipped == 1


# ---------------------------------------------------------------------------- bad files


def _records(path: Path) -> list[tuple[int, int]]:
    """(header offset, data length) of each record of a plain TFRecord file."""
    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, length))
        pos += 16 + length
    return out


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x55
    path.write_bytes(bytes(data))


def test_corrupt_data_crc(tmp_path: Path) -> None:
    rows = _rows(10)
    path = _write_tf(tmp_path / "a.tfrecord", rows)
    offset, _ = _records(path)[3]
    _flip(path, offset + 12 + 5)
    ds = fl.read_tfrecord(path, features=SPEC)
    with pytest.raises(fl.DataError, match=rf"a.tfrecord'.*record 3 at byte offset {offset} has "
                                            r"corrupt data \(CRC mismatch\).*Fix:"):  # fmt: skip
        ds.to_arrow()
    skipping = fl.read_tfrecord(path, features=SPEC, on_error="skip")
    _check(skipping.to_arrow(), rows[:3] + rows[4:])
    report = skipping.analyze()
    assert report.records_skipped == 1
    assert report.skipped[0]["where"].endswith(f"@{offset} (record 3)")


def test_corrupt_length_crc_resyncs_at_the_next_record(tmp_path: Path) -> None:
    rows = _rows(10)
    path = _write_tf(tmp_path / "a.tfrecord", rows)
    offset, _ = _records(path)[2]
    _flip(path, offset + 1)
    with pytest.raises(fl.DataError, match=r"record 2 at byte offset \d+ has a corrupt length"):
        fl.read_tfrecord(path, features=SPEC).to_arrow()
    skipping = fl.read_tfrecord(path, features=SPEC, on_error="skip")
    _check(skipping.to_arrow(), rows[:2] + rows[3:])
    assert skipping.analyze().records_skipped == 1


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_truncated_file(tmp_path: Path, compression: str | None) -> None:
    rows = _rows(10)
    path = _write_tf(tmp_path / "a.tfrecord", rows, compression)
    data = path.read_bytes()
    if compression:
        plain = gzip.decompress(data)
        plain = plain[: len(plain) - 30]  # the last record loses its end
        path.write_bytes(gzip.compress(plain))
        cut = tmp_path / "cut.tfrecord"
        cut.write_bytes(data[: len(data) - 20])  # a gzip stream without its end
        with pytest.raises(fl.DataError, match="damaged compressed stream"):
            fl.read_tfrecord(cut, features=SPEC).to_arrow()
    else:
        path.write_bytes(data[: len(data) - 30])
    with pytest.raises(fl.DataError, match=r"record 9 at byte offset \d+ is truncated"):
        fl.read_tfrecord(path, features=SPEC).to_arrow()
    skipping = fl.read_tfrecord(path, features=SPEC, on_error="skip")
    _check(skipping.to_arrow(), rows[:9])
    assert skipping.analyze().records_skipped == 1


def test_malformed_example_and_wrong_kind(tmp_path: Path) -> None:
    rows = _rows(5)
    good = [_example(r) for r in rows]
    records = [*good[:2], b"\x0a\x05\x0a\x03zzz", good[2], b"not a protobuf at all", *good[3:]]
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(frame(r) for r in records))
    with pytest.raises(fl.DataError, match=r"record 2 \(byte offset \d+\) is not a valid"):
        fl.read_tfrecord(path, features=SPEC).to_arrow()
    skipping = fl.read_tfrecord(path, features=SPEC, on_error="skip")
    _check(skipping.to_arrow(), rows)
    assert skipping.analyze().records_skipped == 2
    inferred = fl.read_tfrecord(path, on_error="skip")  # inferred from the valid records
    assert inferred.to_arrow()["label"].to_pylist() == [r["label"] for r in rows]
    with pytest.raises(fl.DataError, match=r"record 2 is not a valid tf\.train\.Example"):
        fl.read_tfrecord(path).schema()
    with pytest.raises(fl.DataError, match=r"'label' as int64_list, but the spec .* needs "
                                           r"float_list"):  # fmt: skip
        fl.read_tfrecord(tmp_path / "a.tfrecord", features={"label": "float32"}).to_arrow()
    with pytest.raises(fl.DataError, match="outside the range of int8"):
        fl.read_tfrecord(path, features={"label": "int8"}, on_error="raise").to_arrow()


def test_varints_of_every_size_and_sign(tmp_path: Path) -> None:
    values = [0, 1, 127, 128, 300, 2**31, 2**53 + 1, 2**63 - 1, -1, -(2**63), -300]
    f = tf.train
    with tf.io.TFRecordWriter(str(tmp_path / "a.tfrecord")) as writer:
        for i in range(len(values)):
            ex = f.Example(features=f.Features(feature={
                "v": f.Feature(int64_list=f.Int64List(value=values[: i + 1]))}))  # fmt: skip
            writer.write(ex.SerializeToString())
    got = fl.read_tfrecord(tmp_path).to_arrow()["v"].to_pylist()
    assert got == [values[: i + 1] for i in range(len(values))]


def test_fsspec_urls_and_bad_arguments(tmp_path: Path) -> None:
    url = "memory://tfrecord-test/out"
    fl.range(100).write_tfrecord(url, compression="ZLIB", overwrite=True)
    assert fl.read_tfrecord(url).to_arrow()["id"].to_pylist() == list(range(100))
    with pytest.raises(fl.ConfigurationError, match="already holds 1 part- files"):
        fl.range(3).write_tfrecord(url)
    fl.range(3).write_tfrecord(url, overwrite=True)
    assert fl.read_tfrecord(url).count() == 3
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.read_tfrecord(url, on_error="ignore")
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.read_tfrecord(url, features={"id": "complex64"})
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        fl.tfrecord.FixedLen((2,), "int64", default=[1, 2, 3])
    with pytest.raises(fl.SchemaError, match="cannot hold"):
        fl.from_arrow(pa.table({"t": pa.array([{"a": 1}])})).write_tfrecord(tmp_path / "s")


# ---------------------------------------------------------------------------- the two walks


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _entry(key: bytes, feature: bytes, value_first: bool = False) -> bytes:
    parts = [_field(1, key), _field(2, feature)]
    return _field(1, b"".join(parts[::-1] if value_first else parts))


def test_vectorized_walk_equals_the_record_by_record_walk() -> None:
    from feedline.io.tfrecord.decode import walk_records
    from feedline.io.tfrecord.scan import parse_records

    canonical = [_example(row) for row in _rows(20)]
    long_name = _example(dict(_rows(1)[0], name=b"x" * 300, tokens=list(range(200))))
    unpacked_floats = _field(1, _entry(b"score", _field(2, (b"\x0d" + struct.pack("<f", 2.5)) * 2)))
    unpacked_ints = _field(1, _entry(b"label", _field(3, b"\x08\x05\x08\xac\x02")))
    value_first = _field(1, _entry(b"label", _field(3, _field(1, b"\x07")), value_first=True))
    unknown_field = b"\x10\x01" + canonical[0] + b"\x18\x02"
    duplicated = _field(1, _entry(b"label", _field(3, _field(1, b"\x01")))
                        + _entry(b"label", _field(3, _field(1, b"\x02"))))  # fmt: skip
    empty_feature = _field(1, _entry(b"name", b""))
    records = [*canonical[:5], long_name, unpacked_floats, canonical[5], unpacked_ints,
               value_first, unknown_field, duplicated, b"", empty_feature, b"\x0a\x05\x0a\x03zz",
               b"garbage!", *canonical[5:]]  # fmt: skip
    buf = b"".join(records)
    stops = np.cumsum([len(r) for r in records]).tolist()
    starts = [0, *stops[:-1]]
    keys = {name.encode(): i for i, name in enumerate(SPEC)}
    slow = walk_records(buf, starts, stops, keys, extra=True)
    fast = parse_records(buf, starts, stops, keys, extra=True, known=set())
    for c in range(len(keys)):
        np.testing.assert_array_equal(fast.kinds[c], slow.kinds[c])
        np.testing.assert_array_equal(fast.starts[c], slow.starts[c])
        np.testing.assert_array_equal(fast.stops[c], slow.stops[c])
        np.testing.assert_array_equal(fast.rows[c], slow.rows[c])
    assert fast.malformed == slow.malformed and len(slow.malformed) == 2
    assert sorted(fast.extra) == sorted(slow.extra) == []


def test_records_protobuf_accepts_but_serializers_do_not_write(tmp_path: Path) -> None:
    records = [
        _field(1, _entry(b"score", _field(2, (b"\x0d" + struct.pack("<f", 2.5)) * 2))),
        _field(1, _entry(b"label", _field(3, b"\x08\x05\x08\xac\x02"))),  # unpacked
        _field(1, _entry(b"label", _field(3, _field(1, b"\x07")), value_first=True)),
        _field(
            1,
            _entry(b"label", _field(3, _field(1, b"\x01")))
            + _entry(b"label", _field(3, _field(1, b"\x02"))),
        ),  # the last one wins
        b"\x10\x01" + _field(1, _entry(b"label", _field(3, _field(1, b"\x09")))),
        b"",  # an empty Example
    ]
    path = tmp_path / "odd.tfrecord"
    path.write_bytes(b"".join(frame(r) for r in records))
    spec = {"label": fl.tfrecord.VarLen("int64"), "score": fl.tfrecord.VarLen("float32")}
    assert fl.read_tfrecord(path, features=spec).to_arrow().to_pylist() == [
        {"label": [], "score": [2.5, 2.5]}, {"label": [5, 300], "score": []},
        {"label": [7], "score": []}, {"label": [2], "score": []},
        {"label": [9], "score": []}, {"label": [], "score": []},
    ]  # fmt: skip
    parsed = [tf.train.Example.FromString(r) for r in records]  # protobuf agrees
    assert list(parsed[1].features.feature["label"].int64_list.value) == [5, 300]
    assert list(parsed[3].features.feature["label"].int64_list.value) == [2]


def test_batches_stay_bounded(tmp_path: Path) -> None:
    from feedline.io.source import ExecutionReport
    from feedline.io.tfrecord.reader import TfRecordSource

    fl.range(5000).write_tfrecord(tmp_path)
    source = TfRecordSource(tmp_path, batch_rows=700)
    (task,) = source.read_tasks(None, None)
    sizes = [batch.num_rows for batch in task.read(ExecutionReport())]
    assert sum(sizes) == 5000 and max(sizes) == 700
    tiny = [b.num_rows for b in fl.read_tfrecord(tmp_path).iter_batches(None)]
    assert sum(tiny) == 5000


def test_a_feature_that_appears_or_vanishes_after_the_sample(tmp_path: Path) -> None:
    n = INFER_RECORDS + 10
    late = [None] * (n - 3) + [1, 2, 3]
    fl.from_arrow(pa.table({"x": list(range(n)), "late": late})).write_tfrecord(tmp_path / "a")
    with pytest.raises(fl.SchemaError, match=rf"record {n - 3} .*has the feature 'late', unlike "
                                             r"the first 1000 records.*Fix:"):  # fmt: skip
        fl.read_tfrecord(tmp_path / "a").to_arrow()
    assert fl.read_tfrecord(tmp_path / "a", features={"x": "int64"}).count() == n  # ignored
    gone = [*range(n - 1), None]
    fl.from_arrow(pa.table({"x": gone})).write_tfrecord(tmp_path / "b")
    with pytest.raises(fl.SchemaError, match=rf"record {n - 1} .*lacks feature 'x'"):
        fl.read_tfrecord(tmp_path / "b").to_arrow()


@pytest.mark.parametrize("seed", range(4))
def test_round_trip_of_every_type(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    columns, spec = {}, {}
    for dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        info = np.iinfo(dtype)
        columns[dtype] = pa.array(rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True))
        spec[dtype] = dtype
    columns["bool"], spec["bool"] = pa.array(rng.random(n) > 0.5), "bool"
    for dtype in ("float16", "float32"):
        columns[dtype], spec[dtype] = pa.array(rng.normal(size=n).astype(dtype)), dtype
    columns["bytes"] = pa.array([rng.bytes(int(rng.integers(0, 200))) for _ in range(n)])
    columns["string"] = pa.array(["é" * int(rng.integers(0, 5)) for _ in range(n)])
    spec.update(bytes="bytes", string="string")
    lengths = rng.integers(0, 9, n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    columns["ints"] = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(-(2**62), 2**62,
                                               int(lengths.sum()))))  # fmt: skip
    columns["texts"] = pa.ListArray.from_arrays(offsets, pa.array([str(i) for i in
                                                range(int(lengths.sum()))]))  # fmt: skip
    spec.update(ints=fl.tfrecord.VarLen("int64"), texts=fl.tfrecord.VarLen("string"))
    shape = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(1, 4))))
    columns["tensor"] = pa.FixedShapeTensorArray.from_numpy_ndarray(
        rng.normal(size=(n, *shape)).astype(np.float32)
    )
    spec["tensor"] = fl.tfrecord.FixedLen(shape, "float32")
    table = pa.table(columns)
    # uint64 above 2**63 - 1 is refused (an int64_list reads it back negative) unless the user
    # opts in by writing its int64 bit pattern; the spec "uint64" then gives it back exactly
    bits = pa.compute.cast(table["uint64"], pa.int64(), safe=False)
    written = table.set_column(table.schema.get_field_index("uint64"), "uint64", bits)
    fl.from_arrow(written).write_tfrecord(tmp_path, records_per_file=int(rng.integers(1, 100)))
    back = fl.read_tfrecord(tmp_path, features=spec).to_arrow()
    assert back.combine_chunks().equals(table.combine_chunks()), seed
