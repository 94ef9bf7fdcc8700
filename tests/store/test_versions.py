"""Dataset versions: history, time travel, appends, retention (vacuum) and their readers.

The crash tests of appends and vacuums (SIGKILL at every step) are in test_commit.py.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

import feedline as fl
from feedline.io.storage.paths import resolve
from feedline.store.commit import note_base, writing
from feedline.store.dataset_files import open_source
from feedline.store.shard_source import ShardSource


def _ids(ds: fl.Dataset) -> list[int]:
    return ds.to_arrow()["id"].to_pylist()


def _write(out: Path, ids: list[int], **options) -> None:
    fl.from_arrow(pa.table({"id": pa.array(ids, pa.int64())})).write(out, **options)


def _shards(out: Path) -> set[str]:
    return {n for n in os.listdir(out) if n.endswith(".parquet")}


def test_every_commit_is_a_version_and_older_ones_open_by_id_or_time(tmp_path):
    out = tmp_path / "ds"
    times = []
    for first in (0, 10, 20):
        _write(out, list(range(first, first + 3)))
        times.append(datetime.now(timezone.utc))
        time.sleep(0.01)
    _write(out, [99], mode="append")
    history = fl.history(out)
    assert [(v.version, v.operation, v.rows, v.current) for v in history] == [
        (1, "write", 3, False),
        (2, "overwrite", 3, False),
        (3, "overwrite", 3, False),
        (4, "append", 4, True),
    ]
    assert [v.time for v in history] == sorted(v.time for v in history)
    assert _ids(fl.open(out)) == [20, 21, 22, 99]
    assert _ids(fl.open(out, version=1, verify=True)) == [0, 1, 2]
    assert _ids(fl.open(out, version=3)) == [20, 21, 22]
    assert _ids(fl.open(out, as_of=times[0])) == [0, 1, 2]
    assert _ids(fl.open(out, as_of=times[1])) == [10, 11, 12]
    assert _ids(fl.open(out, as_of=datetime.now(timezone.utc))) == [20, 21, 22, 99]
    with pytest.raises(fl.ConfigurationError, match="no retained version committed at or before"):
        fl.open(out, as_of=history[0].time - timedelta(seconds=1))
    with pytest.raises(fl.ConfigurationError, match=r"Version 7 .* does not exist"):
        fl.open(out, version=7)
    with pytest.raises(fl.ConfigurationError, match="either version= or as_of="):
        fl.open(out, version=1, as_of=times[0])


def test_the_current_manifest_is_a_plain_manifest_old_readers_read(tmp_path):
    out = tmp_path / "ds"
    _write(out, [1, 2])
    _write(out, [3], mode="append")
    current = (out / "_feedline.json").read_bytes()
    assert current == (out / "_versions" / "v000002.json").read_bytes()
    manifest = fl.open(out).manifest
    assert manifest.format_version == 1 and manifest.version["operation"] == "append"


def test_append_with_other_columns_or_types_is_refused_naming_them(tmp_path):
    out = tmp_path / "ds"
    fl.from_arrow(pa.table({"id": [1, 2], "label": ["a", "b"]})).write(out)
    with pytest.raises(fl.SchemaError, match=r"missing: \['label'\].*not in the dataset: \['y'\]"):
        fl.from_arrow(pa.table({"id": [3], "y": [1.0]})).write(out, mode="append")
    with pytest.raises(fl.SchemaError, match=r"other types: \['label: string -> int64'\]"):
        fl.from_arrow(pa.table({"id": [3], "label": [7]})).write(out, mode="append")
    assert [v.version for v in fl.history(out)] == [1]  # nothing committed
    assert _shards(out) == {s.path for s in fl.open(out).manifest.shards}  # nothing left over
    fl.from_arrow(pa.table({"id": [3], "label": ["c"]})).write(out, mode="append")
    assert fl.open(out).to_arrow()["label"].to_pylist() == ["a", "b", "c"]


def test_append_applies_the_datasets_fitted_state_and_never_refits(tmp_path):
    out = tmp_path / "ds"
    fl.from_arrow(pa.table({"x": [1.0, 2.0, 3.0]})).transform(fl.StandardScaler("x")).write(out)
    state = fl.open(out).manifest.preprocessors
    # an unfitted scaler would be fitted to [10.0] alone (x -> 0.0); the dataset's state is kept
    fl.from_arrow(pa.table({"x": [10.0]})).transform(fl.StandardScaler("x")).write(
        out, mode="append"
    )
    values = fl.open(out).to_arrow()["x"].to_pylist()
    assert values[3] == pytest.approx((10.0 - 2.0) / (2 / 3) ** 0.5)
    assert fl.open(out).manifest.preprocessors == state
    refit = fl.StandardScaler("x").fit(fl.from_arrow(pa.table({"x": [10.0, 20.0]})))
    with pytest.raises(fl.ConfigurationError, match="never refits"):
        fl.from_arrow(pa.table({"x": [5.0]})).transform(refit).write(out, mode="append")
    with pytest.raises(fl.ConfigurationError, match="not those of"):
        fl.from_arrow(pa.table({"x": [5.0]})).write(out, mode="append")


def test_append_to_nothing_creates_the_dataset_and_bad_modes_are_refused(tmp_path):
    out = tmp_path / "ds"
    _write(out, [1], mode="append")
    assert [(v.version, v.operation) for v in fl.history(out)] == [(1, "write")]
    with pytest.raises(fl.ConfigurationError, match="not a write mode"):
        _write(out, [2], mode="upsert")


def test_of_two_appends_noted_at_once_exactly_one_commits(tmp_path):
    out = tmp_path / "ds"
    _write(out, [0])
    target = resolve(str(out))
    first, second = note_base(target), note_base(target)
    assert first == second
    _write(out, [1], mode="append")  # commits on top of the noted base
    # a write whose base was noted before that commit is refused, and commits nothing
    with pytest.raises(fl.ConcurrentWriteError), writing(target, second):
        pass
    assert _ids(fl.open(out)) == [0, 1]


def test_vacuum_keeps_the_newest_versions_and_every_shard_they_use(tmp_path):
    out = tmp_path / "ds"
    for first in (0, 100, 200):
        _write(out, list(range(first, first + 10)), rows_per_shard=4)
    _write(out, [-1], mode="append")  # version 4 shares version 3's shards
    report = fl.vacuum(out, keep_versions=2)
    assert (report.versions_removed, report.versions_kept) == ([1, 2], [3, 4])
    assert report.files_removed == 6  # versions 1 and 2 had 3 shards each
    assert _shards(out) == {s.path for s in fl.open(out).manifest.shards}
    assert _ids(fl.open(out, version=3, verify=True)) == list(range(200, 210))
    with pytest.raises(fl.ConfigurationError, match=r"Version 1 .* was vacuumed"):
        fl.open(out, version=1)
    # older_than keeps what is newer than the cutoff, whatever keep_versions says
    assert fl.vacuum(out, keep_versions=1, older_than=timedelta(hours=1)).versions_removed == []
    assert fl.vacuum(out, keep_versions=1, older_than=timedelta(0)).versions_removed == [3]
    with pytest.raises(fl.ConfigurationError, match="keep_versions"):
        fl.vacuum(out, keep_versions=0)


@pytest.mark.timeout(120)
def test_vacuum_never_breaks_a_reader_iterating_a_retained_version(tmp_path):
    out = tmp_path / "ds"
    _write(out, list(range(0, 400)), rows_per_shard=50)
    _write(out, list(range(1000, 1400)), rows_per_shard=50, row_group_rows=25)  # version 2
    source = ShardSource.from_source(open_source(out, version=2))
    read: list[int] = []
    errors: list[BaseException] = []
    started = threading.Event()

    def reader() -> None:
        try:
            for batch in source.iter_batches(["id"]):
                started.set()
                read.extend(batch.column(0).to_pylist())
                time.sleep(0.02)  # hold the version open while others commit and vacuum
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        started.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert started.wait(30)
    v1_only = _shards(out) - {s.path for s in source.shards}
    for first in (2000, 3000, 4000):
        _write(out, list(range(first, first + 100)), rows_per_shard=50)
        _write(out, [first + 999], mode="append")
        newest = fl.history(out)[-1].version
        report = fl.vacuum(out, keep_versions=newest - 1)  # drops version 1 ...
        assert 2 in report.versions_kept  # ... never the version being read
    thread.join(60)
    assert not errors, errors
    assert read == list(range(1000, 1400))
    assert not (v1_only & _shards(out))  # version 1's shards were deleted meanwhile
    assert fl.history(out)[0].version == 2


def test_history_of_a_plain_folder_or_a_missing_path_is_refused(tmp_path):
    with pytest.raises(fl.FormatError, match="not a feedline dataset"):
        fl.history(tmp_path)
    with pytest.raises(fl.FormatError, match="not a feedline dataset"):
        fl.vacuum(tmp_path / "nothing")
