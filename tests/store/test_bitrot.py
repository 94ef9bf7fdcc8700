"""Damage never reaches training silently: bit rot and swapped shards are detected by default.

Every shard carries Parquet page checksums (verified on every read) and the manifest records
the sha256 of every shard's footer (checked on open and whenever a footer is read), so a
flipped bit anywhere in a shard, or a shard swapped for another dataset's, raises a
FeedlineError on the default ``fl.open(path)`` path and in the loader: it never yields
other values than were written.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline as fl
from feedline.store.manifest import MANIFEST_NAME

ROWS = 4_000
LOADER_COLUMNS = ["id", "x", "label"]


def _table(seed: int = 0, rows: int = ROWS) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": pa.array(np.arange(rows), pa.int64()),
            "x": pa.array(rng.normal(size=rows).astype(np.float32)),
            "label": pa.array(rng.integers(0, 10, rows), pa.int32()),
            "s": [f"row {i}" for i in range(rows)],
        }
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A zstd dataset (the default compression): 4 shards of 2 row groups."""
    out = tmp_path_factory.mktemp("bitrot") / "ds"
    fl.from_arrow(_table()).write(out, rows_per_shard=1_000, row_group_rows=500)
    return out


def _loaded(ds: fl.Dataset, cache: str) -> dict[str, np.ndarray]:
    """The loader's numeric columns of ``ds`` in order (no shuffle), concatenated."""
    columns = [name for name in LOADER_COLUMNS if name in ds.schema().names]
    loader = ds.loader(
        batch_size=500,
        shuffle=False,
        format="numpy",
        columns=columns,
        drop_last=False,
        prefetch=0,
        cache=cache,
    )
    parts: dict[str, list[np.ndarray]] = {name: [] for name in columns}
    for batch in loader:
        for name in columns:
            parts[name].append(np.asarray(batch[name]))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def _flip_bit(path: Path, rng: random.Random) -> int:
    data = bytearray(path.read_bytes())
    bit = rng.randrange(len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))
    return bit


def test_single_bit_flips_never_read_silently(pristine, tmp_path):
    """40 random single-bit flips across the zstd shard files (a fixed seed): every read
    either raises a FeedlineError or gives exactly the values written, through a fresh
    ``fl.open(...).to_arrow()``, a dataset opened before the damage, and the loader
    (cached and streaming)."""
    expected = fl.open(pristine).to_arrow()
    expected_loaded = _loaded(fl.open(pristine), "memory")
    shards = sorted(p.name for p in pristine.glob("part-*.parquet"))
    rng = random.Random(11)
    outcomes: dict[str, int] = {}
    silent = []
    for trial in range(40):
        work = tmp_path / f"trial-{trial}"
        shutil.copytree(pristine, work)
        opened_before = fl.open(work)
        name = rng.choice(shards)
        bit = _flip_bit(work / name, rng)
        reads = {
            "open().to_arrow()": lambda w=work: fl.open(w).to_arrow().equals(expected),
            "opened before, to_arrow()": lambda d=opened_before: d.to_arrow().equals(expected),
        }
        for cache in ("memory", "none"):
            reads[f"loader cache={cache}"] = lambda d=opened_before, c=cache: all(
                np.array_equal(_loaded(d, c)[k], expected_loaded[k]) for k in LOADER_COLUMNS
            )
        for what, read in reads.items():
            try:
                outcome = "same values" if read() else "SILENT"
            except fl.FeedlineError as exc:
                assert "Fix:" in str(exc)
                outcome = type(exc).__name__
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome == "SILENT":
                silent.append(f"trial {trial}: bit {bit} of {name}, {what}")
        shutil.rmtree(work)
    assert not silent, f"{len(silent)} silent wrong reads: {silent[:5]} (all: {outcomes})"
    # most flips hit data the read decodes: they are caught, not harmless
    caught = sum(n for outcome, n in outcomes.items() if outcome in ("DataError", "IntegrityError"))
    assert caught >= 80, outcomes


def _swap(into: Path, source: Path, index: int) -> str:
    """Copy shard ``index`` of the dataset ``source`` over shard ``index`` of ``into``."""
    name = sorted(p.name for p in into.glob("part-*.parquet"))[index]
    theirs = sorted(source.glob("part-*.parquet"))[index]
    shutil.copyfile(theirs, into / name)
    return name


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_shard_swapped_in_from_another_dataset_raises_integrity_error(tmp_path, compression):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for out, seed in ((ours, 0), (theirs, 1)):
        table = _table(seed)
        if compression == "none":  # plain-encoded floats only: the two files are equally long
            table = table.select(["x"])
        fl.from_arrow(table).write(
            out, rows_per_shard=1_000, row_group_rows=500, compression=compression
        )
    opened_before = fl.open(ours)
    name = _swap(ours, theirs, 2)
    if compression == "none":  # only the footer tells the two shards apart
        assert (ours / name).stat().st_size == opened_before.manifest.shards[2].bytes
    with pytest.raises(fl.IntegrityError, match=name):
        fl.open(ours)
    with pytest.raises(fl.IntegrityError, match=name):
        opened_before.to_arrow()
    with pytest.raises(fl.IntegrityError, match=name):
        _loaded(opened_before, "none")
    with pytest.raises(fl.IntegrityError, match=name):
        fl.verify(ours)


def _old_style(out: Path) -> None:
    """Rewrite ``out`` as feedline wrote datasets before page checksums and footer digests."""
    doc = json.loads((out / MANIFEST_NAME).read_text())
    for shard in doc["shards"]:
        path = out / shard["path"]
        table = pq.read_table(path)
        pq.write_table(table, path, row_group_size=shard["row_groups"][0], compression="zstd")
        data = path.read_bytes()
        shard.update(bytes=len(data), checksum="sha256:" + hashlib.sha256(data).hexdigest())
        del shard["footer"], shard["page_checksums"]
    (out / MANIFEST_NAME).write_text(json.dumps(doc))


def test_datasets_written_without_page_checksums_still_open(tmp_path):
    out = tmp_path / "old"
    table = _table()
    fl.from_arrow(table).write(out, rows_per_shard=1_000, row_group_rows=500)
    _old_style(out)
    ds = fl.open(out)
    assert {(s.footer, s.page_checksums) for s in ds.manifest.shards} == {("", False)}
    assert ds.to_arrow().equals(fl.open(out).to_arrow())
    assert ds.to_arrow()["id"].to_pylist() == table["id"].to_pylist()
    assert _loaded(ds, "none")["id"].tolist() == list(range(ROWS))
    assert fl.verify(out).rows == ROWS
