"""``cast`` never changes a value silently (issue 23, item 5): a value the new type cannot
hold raises ``DataError`` naming the column and the value, floats included."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest

import feedline as fl
from feedline.errors import DataError


def cast(values: pa.Array, target: str | pa.DataType) -> list:
    return fl.from_arrow(pa.table({"f": values})).cast({"f": target}).to_arrow()["f"].to_pylist()


def test_a_finite_double_too_large_for_float32_is_refused() -> None:
    with pytest.raises(DataError, match=r"'f'.*1e\+40.*Fix:"):
        cast(pa.array([1.0, 1e40]), "float32")
    with pytest.raises(DataError, match=r"'f'.*-1e\+39"):
        cast(pa.array([-1e39]), pa.float32())


def test_float16_and_text_overflow_are_refused() -> None:
    with pytest.raises(DataError, match=r"'f'.*70000\.0"):
        cast(pa.array([70_000.0], pa.float32()), "float16")
    with pytest.raises(DataError, match=r"'f'.*'1e40'"):
        cast(pa.array(["1.5", "1e40"]), "float32")


def test_nested_floats_are_checked() -> None:
    with pytest.raises(DataError, match=r"'f'.*1e\+300"):
        cast(pa.array([[1.0], [2.0, 1e300]]), pa.list_(pa.float32()))
    values = pa.array([{"a": 1.0}, {"a": -1e300}])
    with pytest.raises(DataError, match=r"'f'.*-1e\+300"):
        cast(values, pa.struct([("a", pa.float32())]))


def test_infinities_nan_and_nulls_stay_as_they_are() -> None:
    out = cast(pa.array([1.5, float("inf"), float("-inf"), float("nan"), None]), "float32")
    assert out[:3] == [1.5, float("inf"), float("-inf")]
    assert math.isnan(out[3]) and out[4] is None
    assert cast(pa.array(["-inf", "Infinity", "2"]), "float32") == [
        float("-inf"),
        float("inf"),
        2.0,
    ]
    assert cast(pa.array([1e-50]), "float32") == [0.0]  # underflow is rounding, not overflow


def test_other_casts_are_safe_and_name_the_column() -> None:
    with pytest.raises(DataError, match=r"'f'.*300"):
        cast(pa.array([1, 300]), "int8")
    with pytest.raises(DataError, match=r"'f'.*1\.5"):
        cast(pa.array([1.5]), "int64")
    with pytest.raises(DataError, match=r"'f'.*abc"):
        cast(pa.array(["abc"]), "int64")
    stamp = pa.array([1_700_000_000_000_000_001], pa.timestamp("ns"))
    with pytest.raises(DataError, match=r"'f'.*lose data"):
        cast(stamp, pa.timestamp("s"))


def test_the_writer_refuses_a_later_batch_whose_float_does_not_fit(tmp_path: Path) -> None:
    """The first batch fixes the types written; a later double too large for its float32
    column must not be stored as inf."""

    def widen(batch: pa.RecordBatch) -> dict:
        first = batch["id"][0].as_py() == 0
        values = pa.array([0.5] * batch.num_rows, pa.float32()) if first else [1e40]
        return {"x": values}

    ds = fl.range(2, rows_per_task=1).map_batches(widen)
    with pytest.raises(DataError, match=r"'x'.*1e\+40"):
        ds.write(tmp_path / "out")
    assert not (tmp_path / "out" / "_feedline.json").exists()
