"""A seeded fuzz pass over the Petastorm reader: random byte flips and truncations of the
fixture dataset written by Petastorm itself (tests/fixtures/petastorm/): its Parquet files and
its ``_common_metadata`` (the Parquet footer holding the pickled Unischema).

Every outcome must be correct data, a counted skip or a :class:`~feedline.errors.FeedlineError`:
each returned row equals the row of the intact dataset with the same ``id`` (every column),
no row comes twice, and a row missing from the result means a counted skip (or an error);
never a raw exception or a hang (the whole pass runs in a child process under an
address-space limit and a timeout). Parquet pages carry CRCs (Spark's writer adds them) and
the reader checks them; a refused or damaged Unischema falls back to codecs detected from the
data, with a warning.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hostile import run_limited

DATASET = Path(__file__).parents[1] / "fixtures" / "petastorm" / "dataset"


def _scalar(value: Any) -> Any:
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def canonical_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch's rows in a comparable form: an array value (a tensor, or nested lists) as
    its shape and flat values, whatever type carries it (a refused Unischema gives fixed
    shapes where it said variable ones); NaN equal to NaN."""
    columns: dict[str, list[Any]] = {}
    for field, column in zip(batch.schema, batch.columns, strict=True):
        values = column.to_pylist()
        if isinstance(field.type, pa.FixedShapeTensorType):
            shape = tuple(field.type.shape)
            columns[field.name] = [
                None if v is None else (shape, tuple(map(_scalar, v))) for v in values
            ]
        elif pa.types.is_list(field.type):
            arrays = [None if v is None else np.array(v) for v in values]
            columns[field.name] = [
                None if a is None else (a.shape, tuple(map(_scalar, a.ravel().tolist())))
                for a in arrays
            ]
        else:
            columns[field.name] = [_scalar(v) for v in values]
    return [{name: columns[name][i] for name in columns} for i in range(batch.num_rows)]


def rows_of(source: Any, task_index: int) -> tuple[list[dict[str, Any]], Any]:
    from feedline.io.source import ExecutionReport

    report = ExecutionReport()
    task = source.read_tasks(None, None)[task_index]
    rows = [row for batch in task.read(report) for row in canonical_rows(batch)]
    return rows, report


def run_cases(seed: int, cases: int) -> dict[str, Any]:
    """Run ``cases`` fuzz cases; returns the outcome counts and every violation found."""
    from feedline.errors import FeedlineError
    from feedline.io.petastorm.reader import PetastormSource

    warnings.simplefilter("ignore")  # a refused Unischema warns; the fallback is checked here
    root = Path(tempfile.mkdtemp()) / "ds"
    shutil.copytree(DATASET, root)
    parts = sorted(p.name for p in root.glob("part-*.parquet"))
    intact = PetastormSource(root)
    want: dict[int, dict[str, Any]] = {}
    per_file: list[int] = []
    for index in range(len(parts)):
        rows, _ = rows_of(intact, index)
        per_file.append(len(rows))
        for row in rows:
            want[row["id"]] = row
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    problems: list[str] = []

    def count(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    for case in range(cases):
        target = "_common_metadata" if rng.random() < 0.3 else parts[int(rng.integers(0, 3))]
        original = (DATASET / target).read_bytes()
        data = bytearray(original)
        if rng.random() < 0.75:
            flips = [int(rng.integers(0, len(data))) for _ in range(int(rng.integers(1, 4)))]
            for at in flips:
                data[at] = (data[at] + int(rng.integers(1, 256))) % 256
            how = f"flips at {flips}"
        else:
            cut = int(rng.integers(0, len(data)))
            data = data[:cut]
            how = f"cut at {cut}"
        (root / target).write_bytes(bytes(data))
        on_error = "skip" if case % 2 else "raise"
        index = parts.index(target) if target in parts else int(rng.integers(0, 3))
        label = f"case {case} ({target}, {how}, {on_error}, file {index})"
        try:
            source = PetastormSource(root, on_error=on_error)
            rows, report = rows_of(source, index)
        except FeedlineError:
            count(f"{on_error}: error")
            rows = None
        except Exception:  # noqa: BLE001 - what the fuzz is looking for
            problems.append(f"{label}: raw {traceback.format_exc()[-1500:]}")
            rows = None
        finally:
            (root / target).write_bytes(original)
        if rows is None:
            continue
        ids = [row.get("id") for row in rows]
        if len(set(ids)) != len(ids):
            problems.append(f"{label}: ids come twice: {ids}")
        for row in rows:
            expected = want.get(row.get("id"))
            if row != expected:
                bad = [k for k in row if expected is None or row[k] != expected.get(k)]
                problems.append(f"{label}: wrong row id={row.get('id')!r:.40} in {bad}")
        if len(rows) < per_file[index] and report.records_skipped == 0:
            problems.append(f"{label}: {per_file[index] - len(rows)} row(s) lost, none counted")
        count(f"{on_error}: {'whole' if len(rows) == per_file[index] else 'skips'}")
    return {"counts": counts, "problems": problems[:20], "n_problems": len(problems)}


@pytest.mark.timeout(400)
def test_flipped_and_cut_petastorm_files_give_correct_rows_counted_skips_or_errors() -> None:
    body = f"""
    import sys
    sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
    from test_petastorm_fuzz import run_cases
    return run_cases(seed=11, cases=240)
    """
    outcome = run_limited(body, memory=3 << 30, timeout=360)
    assert outcome.kind == "ok", (outcome.kind, outcome.error, outcome.message, outcome.stderr)
    result = outcome.value
    assert result["n_problems"] == 0, result["problems"]
    counts = result["counts"]
    assert counts.get("raise: error", 0) > 20 and counts.get("skip: whole", 0) > 10, counts
