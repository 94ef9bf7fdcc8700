"""A loader's checkpoint pins the dataset version: resuming after later commits reads it."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import feedline as fl


def _write(out, ids, **options) -> None:
    fl.from_arrow(pa.table({"id": pa.array(ids, pa.int64())})).write(
        out, rows_per_shard=10, row_group_rows=5, **options
    )


def _ids(batches) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


def test_resume_after_later_appends_reads_the_checkpoints_version(tmp_path):
    out = tmp_path / "ds"
    _write(out, list(range(40)))
    whole = _ids(fl.Loader(str(out), batch_size=4, seed=3, format="numpy"))
    first = fl.Loader(str(out), batch_size=4, seed=3, format="numpy")
    it = iter(first)
    head = _ids(next(it) for _ in range(3))
    state = json.loads(json.dumps(first.state_dict()))  # a checkpoint saved as JSON
    assert state["dataset_version"] == 1
    _write(out, list(range(1000, 1040)), mode="append")  # version 2: new data arrives
    _write(out, list(range(2000, 2040)))  # version 3 replaces everything
    resumed = fl.Loader(str(out), batch_size=4, format="numpy")  # opened at version 3
    resumed.load_state_dict(state)
    rest = _ids(resumed)
    assert head + rest == whole  # exactly version 1's samples, in the checkpoint's order
    assert resumed.state_dict()["dataset_version"] == 1
    fresh = fl.Loader(str(out), batch_size=4, format="numpy")
    assert sorted(_ids(fresh)) == list(range(2000, 2040))


def test_resume_on_a_vacuumed_version_is_refused_clearly(tmp_path):
    out = tmp_path / "ds"
    _write(out, list(range(20)))
    loader = fl.Loader(str(out), batch_size=4, format="numpy")
    next(iter(loader))
    state = loader.state_dict()
    _write(out, list(range(100, 120)))
    fl.vacuum(out, keep_versions=1)
    resumed = fl.Loader(str(out), batch_size=4, format="numpy")
    with pytest.raises(fl.ConfigurationError, match=r"Version 1 .* was vacuumed"):
        resumed.load_state_dict(state)
    with pytest.raises(fl.ConfigurationError, match="dataset_version"):
        resumed.load_state_dict(dict(state, dataset_version="one"))
