"""TFRecord files and specs that try to make feedline write wrong values or allocate without
bound (issue 23, items 4, 6 and 11): what a TFRecord cannot hold is refused with the column
named, a record length is checked against the file and a cap before anything is allocated,
and a ``FixedLen`` shape is checked when it is built.

The hostile-memory checks run in a child process under an address-space limit
(:func:`hostile.run_limited`), so a regression fails the test instead of the machine.
"""

from __future__ import annotations

import gzip
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hostile import run_limited

import feedline as fl
from feedline.io.tfrecord.frames import frame, masked_crc
from feedline.io.tfrecord.writer import encode_examples

# ---------------------------------------------------------------- item 4: what TFRecord can hold


def test_uint64_above_int64_is_refused_naming_the_column_and_value(tmp_path: Path) -> None:
    table = pa.table({"ok": [1, 2], "u": pa.array([5, 2**64 - 1], pa.uint64())})
    with pytest.raises(fl.DataError, match=r"'u'.*18446744073709551615.*row 1.*Fix:"):
        fl.from_arrow(table).write_tfrecord(tmp_path / "out")
    assert not list((tmp_path / "out").glob("part-*"))  # nothing half-written is published
    # the same inside a list and a tensor column
    nested = pa.table({"l": pa.array([[1], [3, 2**63]], pa.list_(pa.uint64()))})
    with pytest.raises(fl.DataError, match=r"'l'.*9223372036854775808"):
        fl.from_arrow(nested).write_tfrecord(tmp_path / "nested")
    # uint64 values that fit int64 are written exactly
    fits = pa.table({"u": pa.array([0, 2**63 - 1], pa.uint64())})
    fl.from_arrow(fits).write_tfrecord(tmp_path / "fits")
    back = fl.read_tfrecord(tmp_path / "fits", features={"u": "uint64"}).to_arrow()
    assert back["u"].to_pylist() == [0, 2**63 - 1]


def test_float64_beyond_float32_is_refused_unless_already_float32(tmp_path: Path) -> None:
    table = pa.table({"f": pa.array([1.5, -1e300], pa.float64())})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a NumPy overflow warning: an error
        with pytest.raises(fl.DataError, match=r"'f'.*-1e\+300.*row 1.*float32.*Fix:"):
            fl.from_arrow(table).write_tfrecord(tmp_path / "out")
    # in range: rounded to float32, the only float of an Example; inf and nan pass as they are
    fine = pa.table({"f": pa.array([0.1, float("inf"), float("nan"), 3.4e38], pa.float64())})
    fl.from_arrow(fine).write_tfrecord(tmp_path / "fine")
    back = fl.read_tfrecord(tmp_path / "fine").to_arrow()["f"].to_numpy()
    np.testing.assert_array_equal(back, np.array([0.1, np.inf, np.nan, 3.4e38], np.float32))
    # the opt-in: a column the user made float32 holds what the user made of it
    with np.errstate(over="ignore"):
        opted = pa.table({"f": pa.array(np.array([1e300], np.float64).astype(np.float32))})
    fl.from_arrow(opted).write_tfrecord(tmp_path / "opted")
    assert fl.read_tfrecord(tmp_path / "opted").to_arrow()["f"].to_pylist() == [float("inf")]


def test_a_null_string_is_a_missing_feature(tmp_path: Path) -> None:
    table = pa.table({"s": pa.array(["a", None, "é"]), "b": pa.array([None, b"x", b""])})
    fl.from_arrow(table).write_tfrecord(tmp_path)
    spec = {
        "s": fl.tfrecord.FixedLen((), "string", default="<none>"),
        "b": fl.tfrecord.VarLen("bytes"),
    }
    back = fl.read_tfrecord(tmp_path, features=spec).to_arrow()
    assert back["s"].to_pylist() == ["a", "<none>", "é"]
    assert back["b"].to_pylist() == [[], [b"x"], [b""]]
    large = pa.table({"s": pa.array([None, "z"], pa.large_string())})
    records = encode_examples(large.to_batches()[0])
    assert records[0] == b"\x0a\x00"  # an Example without features


# ---------------------------------------------------------------- item 6: claimed record lengths


def _header(length: int) -> bytes:
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc(raw))


def _good_records(n: int = 3) -> list[bytes]:
    return encode_examples(pa.record_batch({"x": list(range(n))}))


@pytest.mark.parametrize("claimed", [2**33, 2**40, 2**62, 2**64 - 1])
@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_a_huge_record_length_with_a_valid_crc(
    tmp_path: Path, claimed: int, compression: str | None
) -> None:
    good = _good_records()
    plain = frame(good[0]) + _header(claimed) + b"\0" * 16 + frame(good[1]) + frame(good[2])
    data = {None: plain, "GZIP": gzip.compress(plain), "ZLIB": zlib.compress(plain)}[compression]
    path = tmp_path / "hostile.tfrecord"
    path.write_bytes(data)
    out = run_limited(
        f"""
        ds = fl.read_tfrecord({str(path)!r}, features={{"x": "int64"}})
        ds.to_arrow()
        """,
        memory=2 << 30,
    )
    assert (out.kind, out.error) == ("feedline", "DataError"), out
    assert "hostile.tfrecord" in out.message and "record 1" in out.message
    assert "record length" in out.message and f"{claimed:,}" in out.message
    assert "Fix:" in out.message
    skip = run_limited(
        f"""
        ds = fl.read_tfrecord({str(path)!r}, features={{"x": "int64"}}, on_error="skip")
        return [ds.to_arrow()["x"].to_pylist(), ds.analyze().records_skipped]
        """,
        memory=2 << 30,
    )
    assert skip.kind == "ok", skip
    assert skip.value == [[0, 1, 2], 1]  # the records after it are found again (resync)


def test_a_gzip_record_length_under_the_cap_is_read_only_as_far_as_the_data_goes(
    tmp_path: Path,
) -> None:
    """1.5 GiB claimed inside a few hundred compressed bytes: never a 1.5 GiB buffer."""
    good = _good_records(1)
    path = tmp_path / "claim.tfrecord.gz"
    path.write_bytes(gzip.compress(frame(good[0]) + _header(3 << 29) + b"\1" * 100))
    out = run_limited(
        f"""
        ds = fl.read_tfrecord({str(path)!r}, features={{"x": "int64"}})
        ds.to_arrow()
        """,
        memory=1536 << 20,
    )
    assert (out.kind, out.error) == ("feedline", "DataError"), out
    assert "record 1" in out.message and "truncated" in out.message


def test_a_zlib_bomb_is_inflated_only_as_far_as_needed(tmp_path: Path) -> None:
    """3 GiB of zeros behind one good record, in 3 MiB of ZLIB: the reader inflates a chunk
    at a time, finds the damage and stops; it never holds the whole inflated stream."""
    good = frame(_good_records(1)[0])
    piece = zlib.compressobj(9)
    head = piece.compress(good) + piece.flush(zlib.Z_FULL_FLUSH)
    zeros = piece.compress(b"\0" * (64 << 20)) + piece.flush(zlib.Z_FULL_FLUSH)
    again = piece.compress(b"\0" * (64 << 20)) + piece.flush(zlib.Z_FULL_FLUSH)
    assert again == zeros  # after a full flush, each 64 MiB of zeros compresses alike
    path = tmp_path / "bomb.tfrecord.zlib"
    path.write_bytes(head + zeros * 48 + piece.flush())
    out = run_limited(
        f"""
        ds = fl.read_tfrecord({str(path)!r}, features={{"x": "int64"}}, compression="ZLIB")
        ds.to_arrow()
        """,
        memory=2 << 30,
    )
    assert (out.kind, out.error) == ("feedline", "DataError"), out
    assert "record 1" in out.message and "corrupt length" in out.message


def test_a_record_length_past_the_end_of_a_plain_file_is_refused_before_reading(
    tmp_path: Path,
) -> None:
    good = _good_records(2)
    path = tmp_path / "a.tfrecord"
    path.write_bytes(frame(good[0]) + _header(1 << 30) + b"\0" * 40)
    claim = r"a.tfrecord'.*record 1 .*record length claims 1,073,741,824 bytes.*only 40 bytes"
    with pytest.raises(fl.DataError, match=claim + r" .*Fix:"):
        fl.read_tfrecord(path, features={"x": "int64"}).to_arrow()


def test_example_lengths_are_checked_against_the_record(tmp_path: Path) -> None:
    """Varint lengths inside an Example (features, entries, lists, bytes) that claim more
    than the record holds make the record malformed: a DataError naming it, or a skip."""
    base = encode_examples(pa.record_batch({"s": [b"abc"], "v": [[1, 2]]}))[0]
    huge = b"\xff\xff\xff\xff\x0f"  # a 5-byte varint: 2**32 - 1
    bombs = [
        b"\x0a" + huge + base[2:],  # the Features length
        base[:2] + b"\x0a" + huge + base[4:],  # one map entry's length
        b"\x0a\x0e\x0a\x0c\x0a\x01s\x12\x07\x0a\x05\x0a" + huge,  # a bytes_list value length
        b"\x0a\x0b\x0a\x09\x0a\x01v\x12\x04\x1a" + huge[:2],  # an int64_list length, cut short
    ]
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(frame(r) for r in [base, *bombs, base]))
    spec = {"s": fl.tfrecord.VarLen("bytes"), "v": fl.tfrecord.VarLen("int64")}
    with pytest.raises(fl.DataError, match=r"record 1 .*not a valid tf\.train\.Example"):
        fl.read_tfrecord(path, features=spec).to_arrow()
    skipping = fl.read_tfrecord(path, features=spec, on_error="skip")
    back = skipping.to_arrow()
    assert back["s"].to_pylist() == [[b"abc"], [b"abc"]]
    assert back["v"].to_pylist() == [[1, 2], [1, 2]]
    assert skipping.analyze().records_skipped == len(bombs)


# ---------------------------------------------------------------- item 11: FixedLen shapes


@pytest.mark.parametrize(
    "shape",
    [
        (2**31,),
        (2**31, 2**31),
        (65536, 65536),
        (2**40,),
        (0,),
        (3, 0),
        (-1,),
        (True,),
        (2.0,),
        ("3",),
    ],
)
def test_a_fixed_len_shape_is_checked_when_built(shape: tuple) -> None:
    with pytest.raises(fl.ConfigurationError, match=r"FixedLen.*shape.*Fix:"):
        fl.tfrecord.FixedLen(shape, "int64")


def test_fixed_len_shapes_that_are_accepted() -> None:
    assert fl.tfrecord.FixedLen(np.int64(3), "uint8").shape == (3,)
    assert fl.tfrecord.FixedLen((np.int32(2), 5), "bytes").size == 10
    assert fl.tfrecord.FixedLen((2**20, 2**10), "uint8").size == 2**30
    with pytest.raises(fl.ConfigurationError, match=r"more than 2 GiB.*Fix:"):
        fl.tfrecord.FixedLen((2**20, 2**10), "float64")  # 8 GiB per record


def test_an_oversized_fixed_len_never_reaches_arrow(tmp_path: Path) -> None:
    fl.from_arrow(pa.table({"x": [[1, 2], [3, 4]], "b": [b"ab", b"cd"]})).write_tfrecord(tmp_path)
    out = run_limited(
        f"""
        spec = fl.tfrecord.FixedLen((2**31,), "int64", default=0)
        fl.read_tfrecord({str(tmp_path)!r}, features={{"x": spec}}).to_arrow()
        """
    )
    assert (out.kind, out.error) == ("feedline", "ConfigurationError"), out


def test_a_fixed_len_that_does_not_match_the_records_names_the_feature(tmp_path: Path) -> None:
    fl.from_arrow(pa.table({"x": [[1, 2], [3, 4]], "b": [b"ab", b"cd"]})).write_tfrecord(tmp_path)
    for name, spec in [
        ("x", fl.tfrecord.FixedLen((3, 5), "int64")),
        ("b", fl.tfrecord.FixedLen((3,), "uint8")),
        ("b", fl.tfrecord.FixedLen((2,), "bytes")),
    ]:
        with pytest.raises(fl.DataError, match=rf"record 0 .*feature {name!r}.*Fix:"):
            fl.read_tfrecord(tmp_path, features={name: spec}).to_arrow()


def test_defaults_of_a_large_fixed_len_fill_bounded_batches(tmp_path: Path) -> None:
    """Many records lacking a 256 MiB feature with a default: the batches are cut so each
    stays within the reader's batch budget instead of holding every record's default."""
    fl.from_arrow(pa.table({"k": list(range(6))})).write_tfrecord(tmp_path)
    out = run_limited(
        f"""
        spec = {{"k": "int64", "big": fl.tfrecord.FixedLen((2**28,), "uint8", default=7)}}
        ds = fl.read_tfrecord({str(tmp_path)!r}, features=spec)
        rows = 0
        for batch in ds.iter_batches():
            rows += batch.num_rows
            assert batch.num_rows == 1
        return rows
        """,
        memory=3 << 30,
        timeout=120,
    )
    assert (out.kind, out.value) == ("ok", 6), out


# ---------------------------------------------------------------- found by the fuzz pass


def _int64_example(payload: bytes) -> bytes:
    """An Example with one feature ``v``: an int64_list whose packed bytes are ``payload``."""
    packed = b"\x0a" + bytes([len(payload)]) + payload
    feature = b"\x1a" + bytes([len(packed)]) + packed
    entry = b"\x0a\x01v\x12" + bytes([len(feature)]) + feature
    features = b"\x0a" + bytes([len(entry)]) + entry
    return b"\x0a" + bytes([len(features)]) + features


def test_a_broken_varint_does_not_condemn_the_next_record(tmp_path: Path) -> None:
    """Record 0's packed varints end mid-varint; record 1 holds one valid 6-byte varint.
    Decoded together, the two looked like one 11-byte varint and record 1 was dropped too."""
    path = tmp_path / "a.tfrecord"
    records = [_int64_example(b"\x01\xff\xff\xff\xff\xff"), _int64_example(b"\xff" * 5 + b"\x01")]
    path.write_bytes(b"".join(frame(r) for r in records))
    skipping = fl.read_tfrecord(path, features={"v": fl.tfrecord.VarLen("int64")}, on_error="skip")
    assert skipping.to_arrow()["v"].to_pylist() == [[2**36 - 1]]
    report = skipping.analyze()
    assert report.records_skipped == 1 and report.skipped[0]["where"].endswith("(record 0)")


def test_batches_are_cut_by_record_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch holds at most BATCH_BYTES of records (at least one record), so one huge record
    never shares a batch whose binary values would overflow 32-bit offsets."""
    from feedline.io.source import ExecutionReport
    from feedline.io.tfrecord import reader

    sizes = [10, 300, 5, 900, 20, 20, 20, 2000, 1]
    table = pa.table({"b": [b"x" * n for n in sizes]})
    fl.from_arrow(table).write_tfrecord(tmp_path)
    monkeypatch.setattr(reader, "BATCH_BYTES", 1000)
    source = reader.TfRecordSource(tmp_path, features={"b": "bytes"})
    (task,) = source.read_tasks(None, None)
    batches = list(task.read(ExecutionReport()))
    assert [len(v) for b in batches for v in b.column("b").to_pylist()] == sizes
    for batch in batches:
        assert batch.num_rows == 1 or sum(len(v) for v in batch.column("b").to_pylist()) < 1000
    assert [b.num_rows for b in batches] == [3, 3, 1, 1, 1]  # records: values + ~14 bytes
