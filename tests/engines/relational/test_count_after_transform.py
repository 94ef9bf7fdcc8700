"""``count()`` of a relational operator over a preprocessed input fits the input first."""

from __future__ import annotations

import feedline as fl


def test_count_of_a_sort_over_an_unfitted_preprocessor_fits_it() -> None:
    scaled = fl.range(100).transform(fl.StandardScaler("id"))
    assert scaled.sort("id").count() == 100
    train, test = scaled.train_test_split(test_size=0.2, seed=1)
    assert train.count() + test.count() == 100
    assert train.count() == train.to_arrow().num_rows
