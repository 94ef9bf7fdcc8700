"""Column edits (with_columns, rename, drop, cast) as batch operators on the local engine."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import feedline as fl
from feedline.errors import DataError, FeedlineError, SchemaError


def _ds() -> fl.Dataset:
    return fl.from_arrow(pa.table({"a": [1, 2, None], "b": ["x", "y", "z"]}))


def test_with_columns_adds_and_replaces_on_the_input_rows() -> None:
    ds = _ds().with_columns(a=pc.field("a") * 10, c=pc.field("a") + 1)
    assert ds.schema().names == ["a", "b", "c"]
    assert ds.to_arrow().to_pydict() == {
        "a": [10, 20, None],
        "b": ["x", "y", "z"],
        "c": [2, 3, None],
    }
    assert ds.schema() == ds.to_arrow().schema


def test_rename_drop_cast_chain_and_schema_without_running() -> None:
    ds = _ds().rename({"a": "n"}).drop("b").cast({"n": pa.float32()})
    assert ds.schema() == pa.schema([("n", pa.float32())])
    assert ds.to_arrow()["n"].to_pylist() == [1.0, 2.0, None]
    assert "Rename(a->n)" in ds.explain() and "Cast(n:float)" in ds.explain()


def test_column_edits_feed_a_relational_operator() -> None:
    out = _ds().with_columns(k=pc.field("b") == "y").groupby("k").agg(n=("*", "count"))
    assert sorted(out.to_arrow().to_pylist(), key=str) == [
        {"k": False, "n": 2},
        {"k": True, "n": 1},
    ]


def test_column_edit_errors_have_a_fix() -> None:
    for bad in (
        lambda: _ds().drop("nope"),
        lambda: _ds().rename({"nope": "x"}),
        lambda: _ds().cast({"nope": "int8"}),
        lambda: _ds().cast({"a": "no-such-type"}),
        lambda: _ds().with_columns(c=pc.field("nope") + 1),
        lambda: _ds().with_columns(c=3),
    ):
        with pytest.raises(FeedlineError, match="Fix:"):
            bad()
    with pytest.raises(SchemaError):
        _ds().drop("nope")
    with pytest.raises(DataError, match="Fix:"):
        fl.from_arrow(pa.table({"s": ["1", "x"]})).cast({"s": "int64"}).to_arrow()
