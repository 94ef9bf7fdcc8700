"""Column edits never give two columns one name (issue 23, item 1).

Arrow lets a schema name two columns alike; ``to_pylist()`` then keeps one of them and a
Parquet file holding both cannot be read back. Every edit that names columns refuses it.
"""

from __future__ import annotations

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import feedline as fl
from feedline.errors import SchemaError


@pytest.fixture
def ds() -> fl.Dataset:
    return fl.from_arrow(pa.table({"k": [1, 2], "v": [3, 4], "s": ["a", "b"]}))


def test_rename_onto_an_existing_column_is_refused(ds: fl.Dataset) -> None:
    with pytest.raises(SchemaError, match=r"more than one column named \['s'\]"):
        ds.rename({"v": "s"})


def test_rename_of_two_columns_to_one_name_is_refused(ds: fl.Dataset) -> None:
    with pytest.raises(SchemaError, match=r"more than one column named \['z'\]"):
        ds.rename({"v": "z", "k": "z"})


def test_a_rename_after_a_user_function_is_refused_when_it_runs(ds: fl.Dataset) -> None:
    later = ds.map_batches(lambda b: b).rename({"v": "s"})  # checked when rows flow
    with pytest.raises(SchemaError, match=r"more than one column named \['s'\]"):
        later.to_arrow()


def test_swapping_two_names_is_fine(ds: fl.Dataset) -> None:
    out = ds.rename({"v": "k", "k": "v"}).to_arrow()
    assert out.schema.names == ["v", "k", "s"]
    assert out.to_pydict() == {"v": [1, 2], "k": [3, 4], "s": ["a", "b"]}


def test_select_naming_a_column_twice_is_refused(ds: fl.Dataset) -> None:
    with pytest.raises(SchemaError, match=r"more than one column named \['k'\]"):
        ds.select(["k", "v", "k"])


def test_map_batches_returning_two_columns_of_one_name_is_refused(ds: fl.Dataset) -> None:
    def twice(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([batch["k"], batch["v"]], names=["a", "a"])

    with pytest.raises(SchemaError, match=r"more than one column named \['a'\]"):
        ds.map_batches(twice).to_arrow()
    with pytest.raises(SchemaError, match=r"more than one column named \['a'\]"):
        ds.map_batches(twice).schema()


def test_map_batches_options_naming_a_column_twice_are_refused(ds: fl.Dataset) -> None:
    schema = pa.schema([("a", pa.int64()), ("a", pa.int64())])
    with pytest.raises(SchemaError, match="output_schema"):
        ds.map_batches(lambda b: b, output_schema=schema)
    with pytest.raises(SchemaError, match="passthrough"):
        ds.map_batches(lambda b: {"y": b["k"]}, passthrough=["k", "k"])


def test_with_columns_replaces_rather_than_repeats(ds: fl.Dataset) -> None:
    out = ds.with_columns(s=pc.field("k") * 10, x=pc.field("v")).to_arrow()
    assert out.schema.names == ["k", "v", "s", "x"]
    assert out["s"].to_pylist() == [10, 20]


def test_in_memory_inputs_with_a_repeated_name_are_refused() -> None:
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    with pytest.raises(SchemaError, match=r"from_arrow\(\).*\['a'\]"):
        fl.from_arrow(table)
    with pytest.raises(SchemaError, match=r"from_pandas\(\).*\['a'\]"):
        fl.from_pandas(pd.DataFrame([[1, 2]], columns=["a", "a"]))
    with pytest.raises(SchemaError, match=r"from_dict\(\).*\['1'\]"):
        fl.from_dict({1: [1], "1": [2]})  # both become the column '1'
    frame = pl.DataFrame({"a": [1]})
    assert fl.from_polars(frame).to_arrow().to_pydict() == {"a": [1]}


def test_the_write_of_a_renamed_collision_commits_nothing(ds: fl.Dataset, tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(SchemaError):
        ds.map_batches(lambda b: b).rename({"v": "s"}).write(out)
    assert not (out / "_feedline.json").exists()
