"""A seeded fuzz pass over the WebDataset reader: random byte flips and truncations of a valid
shard (written by WebDataset's own ``TarWriter``, five member types, a sample without one of
them), plain and gzipped, read with ``on_error="skip"`` and ``"raise"``.

Every outcome must be correct data, a counted skip or a :class:`~feedline.errors.FeedlineError`:

- each returned sample is an original sample (its key, in order, never twice) with each of
  its fields equal to the original, null where the original has none; the one exception is
  the one no tar reader can see: a flipped byte inside a member's data in an uncompressed
  tar (tar has no checksum over data), and then the value must be exactly what the damaged
  file holds there. A gzipped shard has a CRC: there, no value may differ at all;
- a sample missing from the result means a counted skip (or an error);
- nothing else: no raw exception, no hang (the whole pass runs in a child process under an
  address-space limit and a timeout).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile import run_limited

wds = pytest.importorskip("webdataset")

SAMPLES = 10
FIELDS = {"cls": "int64", "txt": "string", "json": "string", "jpg": "binary", "seg.npy": "binary"}


def originals() -> list[dict[str, Any]]:
    """The samples, as WebDataset's TarWriter is given them (bytes per field)."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(SAMPLES):
        buf = io.BytesIO()
        np.save(buf, np.full((i + 1, 3), i, np.int16))
        sample = {
            "__key__": f"{i:06d}",
            "cls": str(i % 3).encode(),
            "json": json.dumps({"i": i, "tag": "t" * i}).encode(),
            "jpg": rng.integers(0, 256, int(rng.integers(100, 1500)), np.uint8).tobytes(),
            "seg.npy": buf.getvalue(),
        }
        if i % 4 != 1:  # samples 1, 5 and 9 have no caption
            sample["txt"] = f"caption {i}".encode()
        out.append(sample)
    return out


def convert(field: str, data: bytes) -> Any:
    """What feedline's column holds for these member bytes (ValueError when it cannot)."""
    if field == "cls":
        return int(data.decode("utf-8"))
    if field == "json":
        text = data.decode("utf-8")
        json.loads(text)
        return text
    if field == "txt":
        return data.decode("utf-8")
    return data


def shard_bytes(folder: str) -> bytes:
    path = os.path.join(folder, "original.tar")
    with wds.TarWriter(path) as sink:  # the default: a float mtime, so pax headers too
        for sample in originals():
            sink.write(sample)
    return Path(path).read_bytes()


def run_cases(seed: int, cases: int) -> dict[str, Any]:
    """Run ``cases`` fuzz cases; returns the outcome counts and every violation found."""
    from feedline.errors import FeedlineError
    from feedline.io.source import ExecutionReport
    from feedline.io.webdataset.reader import WebDatasetSource

    folder = tempfile.mkdtemp()
    plain = shard_bytes(folder)
    zipped = gzip.compress(plain, mtime=0)
    want = {}
    for sample in originals():
        want[sample["__key__"]] = {
            f: convert(f, sample[f]) if f in sample else None for f in FIELDS
        }
    keys = list(want)
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        spans = {m.name: (m.offset_data, m.size) for m in tar.getmembers()}
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    problems: list[str] = []
    for case in range(cases):
        gz = case % 2 == 1
        data = bytearray(zipped if gz else plain)
        flips: list[int] = []
        if rng.random() < 0.7:
            for _ in range(int(rng.integers(1, 4))):
                at = int(rng.integers(0, len(data)))
                data[at] = (data[at] + int(rng.integers(1, 256))) % 256
                flips.append(at)
            how = f"flips at {flips}"
        else:
            cut = int(rng.integers(0, len(data)))
            data = data[:cut]
            how = f"cut at {cut}"
        path = os.path.join(folder, f"case.tar{'.gz' if gz else ''}")
        Path(path).write_bytes(bytes(data))
        label = f"case {case} ({'tar.gz' if gz else 'tar'}, {how})"
        for on_error in ("skip", "raise"):
            report = ExecutionReport()
            try:
                source = WebDatasetSource(path, fields=FIELDS, on_error=on_error)
                rows = []
                for task in source.read_tasks(None, None):
                    for batch in task.read(report):
                        rows.extend(batch.to_pylist())
            except FeedlineError:
                counts[f"{on_error}: error"] = counts.get(f"{on_error}: error", 0) + 1
                continue
            except Exception:  # noqa: BLE001 - what the fuzz is looking for
                problems.append(f"{label} {on_error}: raw {traceback.format_exc()[-1500:]}")
                continue
            got = [r["__key__"] for r in rows]
            if got != [k for k in keys if k in got]:
                problems.append(f"{label} {on_error}: keys {got} are not originals in order")
                continue
            for row in rows:
                for field in FIELDS:
                    if row[field] == want[row["__key__"]][field]:
                        continue
                    name = f"{row['__key__']}.{field}"
                    start, size = spans.get(name, (0, 0))
                    inside = not gz and any(start <= at < start + size for at in flips)
                    try:
                        held = convert(field, bytes(data[start : start + size]))
                    except ValueError:
                        held = None
                    if inside and row[field] == held:
                        counts["data flip"] = counts.get("data flip", 0) + 1
                    else:
                        wrong = f"{row[field]!r:.80} != {want[row['__key__']][field]!r:.80}"
                        problems.append(f"{label} {on_error}: wrong value in {name}: {wrong}")
            if len(rows) < len(keys) and report.records_skipped == 0:
                problems.append(
                    f"{label} {on_error}: {len(keys) - len(rows)} sample(s) lost "
                    "without a counted skip"
                )
            kind = "whole" if len(rows) == len(keys) else "skips"
            counts[f"{on_error}: {kind}"] = counts.get(f"{on_error}: {kind}", 0) + 1
    return {"counts": counts, "problems": problems[:20], "n_problems": len(problems)}


@pytest.mark.timeout(400)
def test_flipped_and_cut_shards_give_correct_data_counted_skips_or_feedline_errors() -> None:
    body = f"""
    import sys
    sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
    from test_webdataset_fuzz import run_cases
    return run_cases(seed=2024, cases=300)
    """
    outcome = run_limited(body, memory=3 << 30, timeout=360)
    assert outcome.kind == "ok", (outcome.kind, outcome.error, outcome.message, outcome.stderr)
    result = outcome.value
    assert result["n_problems"] == 0, result["problems"]
    counts = result["counts"]
    # the pass saw every kind of outcome: intact reads, counted skips and errors
    assert counts.get("skip: skips", 0) > 20 and counts.get("raise: error", 0) > 20, counts
    assert counts.get("skip: whole", 0) > 0 and counts.get("raise: whole", 0) > 0, counts
