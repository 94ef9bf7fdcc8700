"""A seeded fuzz of the TFRecord reader (issue 23, "Must show"): byte flips, truncations,
insertions and deletions of a valid multi-record file with every kind of feature.

Every outcome must be correct data, a counted skip or a FeedlineError: never a raw exception,
a hang or a wrong value. Every byte of a TFRecord file is covered by a CRC (the length's or
the data's), so with ``on_error="skip"`` the rows returned are exactly the original rows
minus the damaged records, in order, and each damaged record is counted; with
``on_error="raise"`` a damaged file raises :class:`~feedline.errors.DataError` (a file cut
exactly between two records is a shorter valid file: its rows are the original's first ones).

The fuzz runs in a child process under an address-space limit and a timeout
(:func:`hostile.run_limited`), so a length check that regresses fails the test instead of
taking the machine down.
"""

from __future__ import annotations

import gzip
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hostile import run_limited

import feedline as fl
from feedline.errors import FeedlineError
from feedline.io.source import ExecutionReport
from feedline.io.tfrecord.frames import frame
from feedline.io.tfrecord.reader import TfRecordSource
from feedline.io.tfrecord.writer import encode_examples

HERE = Path(__file__).resolve()
N = 40

SPEC = {
    "label": "int64",
    "score": fl.tfrecord.FixedLen((), "float32", default=-1.0),
    "embedding": fl.tfrecord.FixedLen((3,), "float32"),
    "tokens": fl.tfrecord.VarLen("int64"),
    "name": "string",
    "tags": fl.tfrecord.VarLen("bytes"),
    "image": fl.tfrecord.FixedLen((2, 2, 3), "uint8"),  # one raw bytes value a record
    "small": fl.tfrecord.FixedLen((2,), "int16"),
    "flag": "bool",
}


def _table(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, N)
    return pa.table(
        {
            "label": pa.array(rng.integers(-(2**62), 2**62, N)),
            "score": pa.array(
                [
                    None if i % 7 == 3 else float(np.float32(v))
                    for i, v in enumerate(rng.normal(size=N))
                ],
                pa.float32(),
            ),
            "embedding": pa.FixedShapeTensorArray.from_numpy_ndarray(
                rng.normal(size=(N, 3)).astype(np.float32)
            ),
            "tokens": pa.array([rng.integers(-300, 2**40, k).tolist() for k in lengths]),
            "name": pa.array([f"row-{i}-é" for i in range(N)]),
            "tags": pa.array([[rng.bytes(int(n)) for n in rng.integers(0, 9, k)] for k in lengths]),
            "image": pa.array([rng.bytes(12) for _ in range(N)], pa.binary()),
            "small": pa.array(rng.integers(-(2**15), 2**15, (N, 2)).tolist(), pa.list_(pa.int16())),
            "flag": pa.array(rng.random(N) > 0.5),
        }
    )


def _records() -> list[bytes]:
    return encode_examples(_table().to_batches(max_chunksize=N)[0])


def _read(
    path: Path, on_error: str, compression: str | None, batch_rows: int, skipped: list | None = None
) -> tuple[list, int]:
    source = TfRecordSource(
        str(path), features=SPEC, on_error=on_error, compression=compression,  # type: ignore[arg-type]
        batch_rows=batch_rows,
    )  # fmt: skip
    report = ExecutionReport()
    batches = [b for task in source.read_tasks(None, None) for b in task.read(report)]
    table = pa.Table.from_batches(batches, source.schema())
    if skipped is not None:
        skipped.extend(report.skipped)
    return table.to_pylist(), report.records_skipped


def _subsequence(rows: list, expected: list) -> list[int]:
    """The indices in ``expected`` of ``rows`` (in order); fails on a row that is not there."""
    at, found = 0, []
    for row in rows:
        while at < len(expected) and expected[at] != row:
            at += 1
        assert at < len(expected), f"a row that is not an original row, in order: {row}"
        found.append(at)
        at += 1
    return found


def _mutate(rng: np.random.Generator, data: bytes) -> tuple[bytes, str, list[int], int | None]:
    """``(mutated, kind, positions changed, cut)``: flips, a cut, an insertion, a deletion."""
    out = bytearray(data)
    kind = ["flip", "flip", "cut", "flip+cut", "insert", "delete"][int(rng.integers(0, 6))]
    touched: list[int] = []
    cut = None
    if "flip" in kind:
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, len(out)))
            out[at] ^= int(rng.integers(1, 256))
            touched.append(at)
    if "cut" in kind:
        cut = int(rng.integers(0, len(out)))
        del out[cut:]
    if kind == "insert":
        at = int(rng.integers(0, len(out)))
        out[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 20)), dtype=np.uint8))
        touched.append(at)
    if kind == "delete":
        at = int(rng.integers(0, len(out) - 1))
        del out[at : at + int(rng.integers(1, 20))]
        touched.append(at)
    return bytes(out), kind, touched, cut


def fuzz_tfrecord(seed: int, plain_cases: int, compressed_cases: int) -> dict[str, Any]:
    """Run the fuzz; returns outcome counts (assertions fail on any wrong outcome)."""
    rng = np.random.default_rng(seed)
    records = _records()
    framed = [frame(r) for r in records]
    data = b"".join(framed)
    ends = np.cumsum([len(f) for f in framed])
    starts = ends - [len(f) for f in framed]
    folder = Path(tempfile.mkdtemp())
    clean = folder / "clean.tfrecord"
    clean.write_bytes(data)
    expected, skipped = _read(clean, "raise", None, 8192)
    assert len(expected) == N and skipped == 0
    original = _table().to_pylist()
    assert [r["label"] for r in expected] == [r["label"] for r in original]
    assert [r["name"] for r in expected] == [r["name"] for r in original]
    counts: dict[str, Any] = {"cases": 0, "raised": 0, "skipped_records": 0, "rows": 0}
    path = folder / "fuzzed.tfrecord"
    for case in range(plain_cases + compressed_cases):
        compression = None if case < plain_cases else ("GZIP", "ZLIB")[case % 2]
        if compression is None:
            mutated, kind, touched, cut = _mutate(rng, data)
        else:
            packed = gzip.compress(data) if compression == "GZIP" else zlib.compress(data)
            mutated, kind, touched, cut = _mutate(rng, packed)
        path.write_bytes(mutated)
        batch_rows = int(rng.integers(1, 50))
        counts["cases"] += 1
        # on_error="skip": exact rows, each loss explained and counted
        try:
            rows, skips = _read(path, "skip", compression, batch_rows)
        except FeedlineError:  # e.g. a compressed stream so damaged no record can be found
            assert compression is not None, kind
            counts["raised"] += 1
            rows, skips = [], None
        kept = _subsequence(rows, expected)
        lost = sorted(set(range(N)) - set(kept))
        counts["rows"] += len(rows)
        counts["skipped_records"] += skips or 0
        if compression is None:
            damaged = {int(np.searchsorted(ends, at, side="right")) for at in touched}
            if kind in ("insert", "delete"):  # the record after it may be lost in the resync
                damaged |= {j + 1 for j in damaged if j + 1 < N}
            beyond: set[int] = set()
            boundary = True
            if cut is not None:
                whole = int(np.searchsorted(ends, cut, side="right"))  # records before the cut
                boundary = whole == N or cut == starts[whole]
                beyond = set(range(whole, N))
            assert set(lost) <= damaged | beyond, (kind, lost, damaged, beyond)
            if kind == "flip":  # every flipped record is lost and counted, nothing else
                assert set(lost) == damaged and skips == len(damaged), (lost, damaged, skips)
            if set(lost) - beyond or not boundary:
                assert skips and skips >= 1, (kind, lost, skips)
        elif lost and skips is not None:
            assert skips >= 1, (compression, kind, lost)
        # on_error="raise": all the rows, a boundary cut's first rows, or a DataError
        try:
            rows, _ = _read(path, "raise", compression, batch_rows)
        except FeedlineError as exc:
            assert "Fix:" in str(exc)
            counts["raised"] += 1
        else:
            assert rows == expected[: len(rows)], kind
            if len(rows) < N:
                assert "cut" in kind or compression is not None, kind
    return counts


def fuzz_examples(seed: int, cases: int) -> dict[str, Any]:
    """Damage the Examples themselves and frame them again with valid CRCs, so the damage
    reaches the protobuf walk (vectorized and record by record) and the column builders.

    Each record is then either returned or skipped and counted (once); the untouched
    records come back exactly; a damaged record that still parses gives what its bytes say
    (no checksum can tell), in the column's type. Returns outcome counts."""
    rng = np.random.default_rng(seed)
    records = _records()
    folder = Path(tempfile.mkdtemp())
    clean = folder / "clean.tfrecord"
    clean.write_bytes(b"".join(frame(r) for r in records))
    expected, _ = _read(clean, "raise", None, 8192)
    counts: dict[str, Any] = {"cases": 0, "skipped_records": 0, "damaged_rows_read": 0}
    path = folder / "examples.tfrecord"
    for _case in range(cases):
        damaged = sorted({int(i) for i in rng.integers(0, N, int(rng.integers(1, 6)))})
        out = list(records)
        for i in damaged:
            body = bytearray(out[i])
            how = rng.integers(0, 3)
            if how == 0:  # flip bytes
                for _ in range(int(rng.integers(1, 4))):
                    body[int(rng.integers(0, len(body)))] ^= int(rng.integers(1, 256))
            elif how == 1:  # cut the message short
                del body[int(rng.integers(0, len(body))) :]
            else:  # a forged varint length somewhere
                at = int(rng.integers(0, len(body)))
                body[at : at + 1] = bytes([0xFF, 0xFF, 0xFF, 0xFF, int(rng.integers(0, 128))])
            out[i] = bytes(body)
        path.write_bytes(b"".join(frame(r) for r in out))
        skipped: list = []
        rows, skips = _read(path, "skip", None, int(rng.integers(1, 50)), skipped)
        numbers = [int(s["where"].rsplit("(record ", 1)[1].rstrip(")")) for s in skipped]
        assert skips == len(numbers) == len(set(numbers)), skipped
        assert set(numbers) <= set(damaged), (numbers, damaged, skipped)
        kept = [i for i in range(N) if i not in set(numbers)]
        assert len(rows) == len(kept)
        for i, row in zip(kept, rows, strict=True):
            if i in damaged:
                counts["damaged_rows_read"] += 1
            else:
                assert row == expected[i], i
        try:
            rows, _ = _read(path, "raise", None, 8192)
        except FeedlineError as exc:
            assert "Fix:" in str(exc)
        else:
            assert not numbers and len(rows) == N
        counts["cases"] += 1
        counts["skipped_records"] += skips
    return counts


@pytest.mark.timeout(900)
def test_fuzzing_the_tfrecord_reader_gives_exact_rows_counted_skips_or_errors() -> None:
    out = run_limited(
        f"""
        import importlib.util, sys
        sys.path.insert(0, "tests")
        spec = importlib.util.spec_from_file_location("tfrecord_fuzz", {str(HERE)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.fuzz_tfrecord(seed=23, plain_cases=360, compressed_cases=120)
        """,
        memory=3 << 30,
        timeout=800,
    )
    assert out.kind == "ok", out
    counts = out.value
    assert counts["cases"] == 480
    assert counts["skipped_records"] > 300 and counts["raised"] > 300  # both paths exercised


@pytest.mark.timeout(900)
def test_fuzzing_the_examples_inside_valid_frames() -> None:
    out = run_limited(
        f"""
        import importlib.util, sys
        sys.path.insert(0, "tests")
        spec = importlib.util.spec_from_file_location("tfrecord_fuzz", {str(HERE)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.fuzz_examples(seed=23, cases=300)
        """,
        memory=3 << 30,
        timeout=800,
    )
    assert out.kind == "ok", out
    counts = out.value
    assert counts["cases"] == 300
    assert counts["skipped_records"] > 200 and counts["damaged_rows_read"] > 20
