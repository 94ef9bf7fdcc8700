"""split() and train_test_split() refuse bad fractions with a ConfigurationError naming them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import feedline as fl


@pytest.mark.parametrize(
    "fractions, named",
    [
        (["a", "b"], "'a' (str)"),  # was a raw ValueError from float('a')
        (0.5, "not float"),  # was a raw TypeError: 'float' object is not iterable
        (True, "not a bool"),  # was a raw TypeError
        ([0.5, None], "None (NoneType)"),  # was a raw TypeError from float(None)
        ([0.5, 0.5, math.nan], "fraction 2 is nan"),  # reached DuckDB: column "nan" not found
        ([0.5, math.inf], "fraction 1 is inf"),
        ([0.5, True, 0.5], "True (bool)"),
        ([1.5, -0.5], "fraction 0 is 1.5"),
        ([0.5, -0.0, 0.5], "fraction 1 is -0.0"),
        ("ab", "not str"),
        ({0.5: 1}, "not dict"),
        ([0.3, 0.3], "sum to 1"),
        ([], "sum to 1"),
        (0, "at least one part"),
    ],
)
def test_split_refuses_bad_fractions_naming_them(fractions, named) -> None:
    with pytest.raises(fl.ConfigurationError, match="Fix:") as caught:
        fl.range(4).split(fractions)
    assert named in str(caught.value)


def test_split_takes_fractions_as_any_real_sequence() -> None:
    ds = fl.range(10)
    assert [p.count() for p in ds.split(np.array([0.5, 0.5]))] == [5, 5]
    assert [p.count() for p in ds.split((np.float32(0.5), 0.5))] == [5, 5]
    assert [p.count() for p in ds.split([1])] == [10]
    assert [p.count() for p in ds.split(np.int64(2))] == [5, 5]


def test_train_test_split_refuses_a_non_fraction_test_size() -> None:
    for bad in (math.nan, True, 0, 1, "0.2", None):
        with pytest.raises(fl.ConfigurationError, match="test_size"):
            fl.range(4).train_test_split(test_size=bad)
