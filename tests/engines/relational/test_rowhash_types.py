"""The row hash takes every column type a dataset holds, booleans with nulls included."""

from __future__ import annotations

import pyarrow as pa

from feedline.plan.rowhash import row_hash


def test_boolean_columns_hash_with_nulls_apart_from_false():
    keys = row_hash(pa.table({"b": pa.array([True, None, False, True])}), seed=0).to_pylist()
    assert keys[0] == keys[3]
    assert len({keys[0], keys[1], keys[2]}) == 3
    chunked = pa.table({"b": pa.chunked_array([[True, None], [False, True]])})
    assert row_hash(chunked, seed=0).to_pylist() == keys
