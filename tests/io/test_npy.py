"""``.npy`` values whose headers lie (issue 23, item 9): the header's shape × itemsize is
checked against the bytes the value holds before anything is allocated, everywhere ``.npy``
is parsed (feedline.io.npy: Petastorm's NdarrayCodec columns and fl.DecodeNdarray), and a
seeded fuzz of flipped and truncated values never gives a raw exception or a value other
than what the bytes say.

The hostile and fuzz checks run in a child process under an address-space limit
(:func:`hostile.run_limited`).
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile import run_limited

import feedline as fl
from feedline.io.npy import decode_npy, decode_npz, load_npy, read_header
from feedline.io.petastorm.codecs import sniff_plan

HERE = Path(__file__).resolve()


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def forged(shape: tuple, descr: str = "<f8", payload: bytes = b"\0" * 16) -> bytes:
    """A ``.npy`` value whose header claims ``shape`` over ``payload``."""
    buf = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + payload


# ---------------------------------------------------------------- item 9: the npy bomb


def test_a_header_claiming_4_tib_over_16_bytes_is_refused_before_allocating() -> None:
    out = run_limited(
        """
        import io, numpy as np
        from feedline.io.npy import load_npy
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
        try:
            load_npy(buf.getvalue() + b"\\0" * 16)
        except ValueError as exc:
            return str(exc)
        """,
        memory=1 << 30,
    )
    assert out.kind == "ok", out
    assert "shape (1099511627776,)" in out.value and "4,398,046,511,104 bytes" in out.value
    assert "holds 16" in out.value


def test_the_npy_bomb_in_a_column_names_row_column_shape_and_size(tmp_path: Path) -> None:
    """Through fl.DecodeNdarray over a Parquet file: a DataError naming the row, the column,
    the header's shape and the claimed size; skipped and counted with on_error='skip'."""
    bomb = forged((2**40,))
    path = tmp_path / "values.parquet"
    blobs = [npy(np.ones(2)), bomb, npy(np.zeros(2))]
    pq.write_table(pa.table({"id": [0, 1, 2], "x": pa.array(blobs, pa.binary())}), path)
    out = run_limited(
        f"""
        ds = fl.read_parquet({str(path)!r}).transform(fl.DecodeNdarray("x"))
        ds.to_arrow()
        """,
        memory=1 << 30,
    )
    assert (out.kind, out.error) == ("feedline", "DataError"), out
    for part in ("row 1", "'x'", "shape (1099511627776,)", "8,796,093,022,208 bytes", "Fix:"):
        assert part in out.message, (part, out.message)
    skip = run_limited(
        f"""
        ds = fl.read_parquet({str(path)!r}).transform(
            fl.DecodeNdarray("x", shape=(2,), on_error="skip"))
        return [ds.to_arrow()["id"].to_pylist(), ds.analyze().records_skipped]
        """,
        memory=1 << 30,
    )
    assert (skip.kind, skip.value) == ("ok", [[0, 2], 1]), skip


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (forged((2**40,)), r"shape \(1099511627776,\) of float64 claims 8,796,093,022,208"),
        (forged((2**62, 2**62)), r"claims 170,141,183,460,469,231,731,687,303,715,884,105,728"),
        (forged((4,), "|S1000000000"), r"claims 4,000,000,000 bytes"),
        (forged((2**40, 0), payload=b""), r"1,099,511,627,776 empty"),
        (forged((-1,), payload=b""), r"not a tuple of sizes"),
        (forged((2,), "|S0", payload=b""), r"has no size"),
        (forged((3,)), r"claims 24 bytes, but the value holds 16"),
        (npy(np.ones(3))[:-1], r"claims 24 bytes, but the value holds 23"),
        (npy(np.ones(3)) + b"\0", r"claims 24 bytes, but the value holds 25"),
    ],
)
def test_header_claims_are_checked_against_the_bytes(value: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        read_header(value)
    with pytest.raises(ValueError, match=reason):
        load_npy(value)
    cells = decode_npy(pa.array([npy(np.ones(2)), value], pa.binary()))
    assert list(cells.failed) == [1] and "not a readable .npy value" in cells.failed[1]
    assert sniff_plan("x", value).codec is None  # a Petastorm column it starts stays binary


def test_honest_values_still_load() -> None:
    for array in (
        np.arange(6, dtype=">i4").reshape(2, 3),
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        np.zeros((0, 3)),
        np.zeros((5, 0), np.int8),
        np.array(3.5),
        np.array(["ab", "c"]),
        np.array([b"x", b"yz"]),
        np.array([True, False]),
    ):
        got = load_npy(npy(array))
        np.testing.assert_array_equal(got, array)
        assert got.shape == array.shape  # a 0-d value stays 0-d
        assert got.dtype == array.dtype.newbyteorder("=") and got.flags.writeable
        assert got.flags.c_contiguous


def _zip_bomb(path: Path, claimed: int) -> None:
    """An ``.npz`` whose one member inflates to 1 GiB of zeros after a small ``.npy`` value
    while its zip headers claim ``claimed`` bytes (built from one compressed 64 MiB piece:
    after a full flush, each piece of zeros compresses alike)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = deflate.compress(npy(np.zeros(16))) + deflate.flush(zlib.Z_FULL_FLUSH)
    piece = deflate.compress(b"\0" * (64 << 20)) + deflate.flush(zlib.Z_FULL_FLUSH)
    data = head + piece * 16 + deflate.flush()
    name = b"arr.npy"
    fields = struct.pack("<HHHHHIII", 20, 0, 8, 0, 0, 0, len(data), claimed)
    local = b"PK\x03\x04" + fields + struct.pack("<HH", len(name), 0) + name
    central = (b"PK\x01\x02" + struct.pack("<H", 20) + fields
               + struct.pack("<HHHHHII", len(name), 0, 0, 0, 0, 0, 0) + name)  # fmt: skip
    end = b"PK\x05\x06" + struct.pack(
        "<HHHHIIH", 0, 0, 1, 1, len(central), len(local) + len(data), 0
    )
    path.write_bytes(local + data + central + end)


def test_an_npz_member_is_inflated_only_as_far_as_it_claims(tmp_path: Path) -> None:
    """A member whose zip headers claim 200 bytes but whose data inflates to 1 GiB: it is
    read up to its claim (and refused: the CRC does not match), never inflated whole."""
    path = tmp_path / "bomb.npz"
    _zip_bomb(path, 200)
    out = run_limited(
        f"""
        import pyarrow as pa
        from feedline.io.npy import decode_npz
        blob = open({str(path)!r}, "rb").read()
        cells = decode_npz(pa.array([blob], pa.binary()))
        return cells.failed[0]
        """,
        memory=1 << 30,
    )
    assert out.kind == "ok", out
    assert "not a readable .npz value" in out.value


# ---------------------------------------------------------------- the fuzz pass


def _bases() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [
        rng.normal(size=(3, 4)).astype(np.float32),
        np.asfortranarray(rng.integers(-100, 100, (2, 3, 2), dtype=np.int16)),
        rng.integers(0, 2**60, 5, dtype=np.uint64).astype(">u8"),
        np.array(2.5),
        np.zeros((0, 4), np.float64),
        np.array(["héllo", "x"]),
        np.array([b"ab", b"c"]),
        rng.random(7) > 0.5,
    ]


def fuzz_npy(seed: int, cases: int) -> dict[str, int]:
    """Flip, truncate and extend ``.npy`` values; every outcome is a ``ValueError`` (a
    refused value) or exactly what NumPy itself reads from the same bytes. Returns counts."""
    rng = np.random.default_rng(seed)
    arrays = _bases()
    bases = [npy(a) for a in arrays]
    counts = {"refused": 0, "decoded": 0, "npz_refused": 0, "npz_decoded": 0}
    for case in range(cases):
        blob = bytearray(bases[case % len(bases)])
        kind = rng.integers(0, 4)
        if kind < 2:  # flip bytes: in the header, or in the payload (all headers are 128 bytes)
            low, high = (0, 128) if kind == 0 or len(blob) == 128 else (128, len(blob))
            for _ in range(int(rng.integers(1, 4))):
                blob[int(rng.integers(low, high))] ^= int(rng.integers(1, 256))
        elif kind == 2:
            del blob[int(rng.integers(0, len(blob))) :]
        else:
            blob += bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        value = bytes(blob)
        try:
            got = load_npy(value)
        except ValueError:
            counts["refused"] += 1
        else:  # accepted: the same array NumPy reads (safe: the size was checked)
            want = np.load(io.BytesIO(value), allow_pickle=False)
            assert got.shape == want.shape, (got.shape, want.shape, value[:128])
            assert got.dtype == want.dtype.newbyteorder("="), (got.dtype, want.dtype, value[:128])
            np.testing.assert_array_equal(got, want)
            counts["decoded"] += 1
        column = pa.array([bases[0], value, None], pa.binary())
        cells = decode_npy(column)
        assert set(cells.failed) <= {1} and cells.present[0] and not cells.present[2]
        original = arrays[case % len(arrays)]
        zipped = io.BytesIO()
        np.savez_compressed(zipped, arr=original)
        archive = bytearray(zipped.getvalue())
        for _ in range(int(rng.integers(1, 3))):
            archive[int(rng.integers(0, len(archive)))] ^= int(rng.integers(1, 256))
        if rng.random() < 0.3:
            del archive[int(rng.integers(0, len(archive))) :]
        cells = decode_npz(pa.array([bytes(archive)], pa.binary()))
        if cells.failed:
            counts["npz_refused"] += 1
        else:  # the zip's CRC covers the member: what decodes is the original, exactly
            (value,) = cells.values()
            assert value.shape == original.shape and value.dtype == original.dtype.newbyteorder("=")
            np.testing.assert_array_equal(value, original)
            counts["npz_decoded"] += 1
    return counts


@pytest.mark.timeout(600)
def test_fuzzing_npy_values_gives_refusals_or_exact_values() -> None:
    out = run_limited(
        f"""
        import importlib.util, sys
        sys.path.insert(0, "tests")
        spec = importlib.util.spec_from_file_location("npy_fuzz", {str(HERE)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.fuzz_npy(seed=23, cases=600)
        """,
        memory=2 << 30,
        timeout=500,
    )
    assert out.kind == "ok", out
    counts = out.value
    assert sum(counts[k] for k in ("refused", "decoded")) == 600
    assert counts["refused"] > 100 and counts["decoded"] > 50  # both outcomes were exercised


def test_a_fuzzed_npy_column_through_decode_ndarray_raises_only_data_errors() -> None:
    rng = np.random.default_rng(5)
    base = npy(np.arange(6, dtype=np.float32).reshape(2, 3))
    for _ in range(50):
        blob = bytearray(base)
        blob[int(rng.integers(0, len(blob)))] ^= int(rng.integers(1, 256))
        batch = pa.record_batch({"x": pa.array([base, bytes(blob)], pa.binary())})
        try:
            out = fl.DecodeNdarray("x", shape=(2, 3)).transform_batch(batch)
        except fl.DataError as exc:
            assert "row 1" in str(exc) and "'x'" in str(exc)
        else:
            assert out.num_rows == 2
