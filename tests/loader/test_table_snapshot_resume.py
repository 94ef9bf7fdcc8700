"""A loader reading a Delta, Iceberg or Lance table directly pins the table snapshot in its
state and refuses to resume on another snapshot (issue 27, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lakehouse_tables import delta_table, iceberg_table, lance_dataset

import feedline as fl
from feedline.errors import ConfigurationError


def _checkpoint(ds: fl.Dataset) -> tuple[dict, list[list[int]]]:
    """A state after one batch, and the ids of the batches a resumed loader yields."""
    loader = ds.loader(batch_size=2, seed=3, format="numpy", columns=["id"])
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # JSON-safe
    rest = [b["id"].tolist() for b in it]
    return state, rest


def _resumed(ds: fl.Dataset, state: dict) -> list[list[int]]:
    loader = ds.loader(batch_size=2, format="numpy", columns=["id"])
    loader.load_state_dict(state)
    return [b["id"].tolist() for b in loader]


def test_delta_snapshot_in_state_and_another_refused(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    path, _ = delta_table(tmp_path)
    state, rest = _checkpoint(fl.read_delta(path, version=1))
    assert state["table_snapshot"] == {"kind": "delta", "table": path, "snapshot": "version 1"}
    assert _resumed(fl.read_delta(path, version=1), state) == rest
    with pytest.raises(ConfigurationError) as info:  # version 2 has fewer rows
        _resumed(fl.read_delta(path, version=2), state)
    message = str(info.value)
    assert "delta" in message and "version 1" in message and "version 2" in message
    assert "Fix:" in message
    with pytest.raises(ConfigurationError, match="does not read a table snapshot"):
        _resumed(fl.from_arrow(fl.read_delta(path, version=1).to_arrow()), state)


def test_iceberg_snapshot_in_state_and_another_refused(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    table, live = iceberg_table(tmp_path)
    first, second, _ = list(live)
    metadata = table.metadata_location
    state, rest = _checkpoint(fl.read_iceberg(metadata, snapshot_id=first))
    assert state["table_snapshot"]["snapshot"] == f"snapshot {first}"
    assert _resumed(fl.read_iceberg(metadata, snapshot_id=first), state) == rest
    with pytest.raises(ConfigurationError, match=f"snapshot {second}"):
        _resumed(fl.read_iceberg(metadata, snapshot_id=second), state)


def test_lance_same_row_count_other_version_refused(tmp_path: Path) -> None:
    lance = pytest.importorskip("lance")
    path, _ = lance_dataset(tmp_path)  # v2: 8 rows; v3: 7 rows
    state, rest = _checkpoint(fl.read_lance(path, version=2))
    assert state["table_snapshot"]["snapshot"] == "version 2"
    assert _resumed(fl.read_lance(path, version=2), state) == rest
    # version 4 holds as many rows as version 2 (one appended after the delete)
    lance.write_dataset(fl.read_lance(path, version=1).limit(1).to_arrow(), path, mode="append")
    assert fl.read_lance(path, version=4).count() == fl.read_lance(path, version=2).count()
    with pytest.raises(ConfigurationError, match=r"lance: .* @ version 4"):
        _resumed(fl.read_lance(path, version=4), state)
