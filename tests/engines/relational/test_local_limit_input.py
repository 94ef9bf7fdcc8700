"""A limit inside a relational operator's input takes the first rows in task order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import feedline as fl


def test_limited_join_input_is_the_first_rows_in_file_order(tmp_path):
    rng = np.random.default_rng(3)
    files = []
    for i in range(3):
        keys = rng.integers(0, 40, 400)
        path = tmp_path / f"p{i}.parquet"
        table = pa.table({"k": keys, "v": np.arange(400) + 1000 * i})
        pq.write_table(table, path, row_group_size=50)
        files.append(str(path))
    ds = fl.read_parquet(files)
    first = pa.concat_tables([pq.read_table(f) for f in files]).slice(0, 130)
    wanted = set(first.column("k").to_pylist())
    whole = pa.concat_tables([pq.read_table(f) for f in files])
    expected = sum(1 for k in whole.column("k").to_pylist() if k not in wanted)
    counts = {ds.join(ds.select(["k"]).limit(130), on="k", how="anti").count() for _ in range(6)}
    assert counts == {expected}
