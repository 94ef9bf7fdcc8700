"""cache="node" against a damaged, truncated or hostile cache folder (issue 23: 2, 12, 14, 15).

A node cache file is shared by every process of a node: whatever another program does to it
(flipped bytes, a truncation while it is mapped, a FIFO or a directory planted at its path,
a read-only folder) must give correct batches, a rebuilt file or a clear ``FeedlineError``:
never a wrong value, a hang, a raw ``OSError`` or a ``SIGBUS``. Hang- and crash-prone cases
run in a child process (tests/hostile.py).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hostile import run_limited

import feedline as fl
from feedline.loader.data import node_cache

ROWS, WIDTH = 12_000, 64  # 264 bytes a row: 3,971 rows a checksummed block, 4 blocks


def _x(rows: int = ROWS) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((rows, WIDTH), dtype=np.float32)


def _write(path: Path, rows: int = ROWS) -> Path:
    x = pa.FixedShapeTensorArray.from_numpy_ndarray(_x(rows))
    fl.from_arrow(pa.table({"id": np.arange(rows), "x": x})).write(path, row_group_rows=2_000)
    return path


def _loader(path: Path, cache_dir: Path, **kw: object) -> fl.Loader:
    options = {"cache": "node", "cache_dir": cache_dir, "format": "numpy", "batch_size": 500,
               "prefetch": 0, "seed": 4} | kw  # fmt: skip
    return fl.open(path).loader(**options)


def _assert_exact(loader: fl.Loader, rows: int = ROWS) -> None:
    """One epoch: every row once, each with its own values."""
    batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    x = np.concatenate([b["x"] for b in batches])
    np.testing.assert_array_equal(np.sort(ids), np.arange(rows))
    np.testing.assert_array_equal(x, _x(rows)[ids])


def _header(file: Path) -> dict:
    data = file.read_bytes()
    _, _, length, _ = node_cache._PREAMBLE.unpack_from(data)
    return json.loads(data[node_cache._PREAMBLE.size :][:length])


def _flip(file: Path, offsets: list[int]) -> None:
    """Flip the bytes at ``offsets`` of the data region, in place (a mapping sees it)."""
    base = _header(file)["data_offset"]
    with open(file, "r+b") as f:
        for at in offsets:
            f.seek(base + at)
            byte = f.read(1)[0]
            f.seek(base + at)
            f.write(bytes([byte ^ 0xA5]))


# ---------------------------------------------------------------- item 2: flipped bytes


@pytest.mark.parametrize("where", ["an id", "a value", "the last byte", "many"])
def test_flipped_data_bytes_are_never_served_and_the_file_is_rebuilt(tmp_path, caplog, where):
    path, cache_dir = _write(tmp_path / "ds"), tmp_path / "c"
    file = Path(_loader(path, cache_dir).stats()["node_cache_file"])
    arrays = {a["key"]: a for a in _header(file)["arrays"]}
    last = max(a["offset"] + a["nbytes"] for a in arrays.values()) - 1
    offsets = {
        "an id": [arrays["id"]["offset"] + 8 * 7_000],
        "a value": [arrays["x"]["offset"] + 4 * WIDTH * 123 + 5],
        "the last byte": [last],
        "many": list(np.random.default_rng(1).integers(0, last, 40)),
    }[where]
    _flip(file, offsets)
    loader = _loader(path, cache_dir)
    assert loader.stats()["node_cache_built"] is False  # the header and size are intact
    with caplog.at_level(logging.WARNING, logger="feedline.loader.data.node_cache"):
        _assert_exact(loader)
    stats = loader.stats()
    assert stats["node_cache_built"] is True and stats["node_cache_rebuilds"] == 1
    assert stats["node_cache_blocks_verified"] == stats["node_cache_blocks"] == 4
    assert "fails its CRC-32" in caplog.text and str(file) in caplog.text
    _assert_exact(_loader(path, cache_dir))  # the rebuilt file serves the next loader


def test_bytes_flipped_while_a_loader_maps_the_file_are_never_served(tmp_path):
    path, cache_dir = _write(tmp_path / "ds"), tmp_path / "c"
    _loader(path, cache_dir).stats()  # filled
    loader = _loader(path, cache_dir)
    file = Path(loader.stats()["node_cache_file"])  # mapped, nothing served yet
    _flip(file, [8 * 11_999])  # the last id: this mapping sees the change
    _assert_exact(loader)
    assert loader.stats()["node_cache_rebuilds"] == 1


def test_a_file_another_process_rebuilt_is_mapped_again_not_rebuilt_twice(tmp_path):
    path, cache_dir = _write(tmp_path / "ds"), tmp_path / "c"
    _loader(path, cache_dir).stats()
    first, second = _loader(path, cache_dir), _loader(path, cache_dir)
    file = Path(first.stats()["node_cache_file"])
    second.stats()
    _flip(file, [8 * 5])
    _assert_exact(second)  # rebuilds the file: a new inode at the path
    rebuilt = file.stat().st_ino
    _assert_exact(first)  # its own mapping is the damaged file: it maps the rebuilt one
    assert first.stats()["node_cache_built"] is False
    assert first.stats()["node_cache_rebuilds"] == 1 and file.stat().st_ino == rebuilt


def test_a_damaged_file_that_cannot_be_rebuilt_is_an_integrity_error(tmp_path):
    path, cache_dir = _write(tmp_path / "ds"), tmp_path / "c"
    _loader(path, cache_dir).stats()
    loader = _loader(path, cache_dir)
    _flip(Path(loader.stats()["node_cache_file"]), [100])
    for shard in path.glob("*.parquet"):  # the data to rebuild from is gone
        shard.unlink()
    with pytest.raises(fl.IntegrityError, match=r"damaged \(block 0 .*rebuilding it failed.*Fix:"):
        list(loader)


# ---------------------------------------------------------------- items 12, 14: in a child


def _child(tmp_path: Path, plant: str, rows: int = ROWS) -> str:
    """The body of a child: a dataset and a filled cache, ``plant`` done, then an epoch."""
    return f"""
    import os, numpy as np, pyarrow as pa
    from pathlib import Path
    tmp = Path({str(tmp_path)!r})
    x = np.random.default_rng(0).standard_normal(({rows}, {WIDTH}), dtype=np.float32)
    t = pa.table({{"id": np.arange({rows}), "x": pa.FixedShapeTensorArray.from_numpy_ndarray(x)}})
    fl.from_arrow(t).write(tmp / "ds", row_group_rows=2_000)
    kw = dict(cache="node", cache_dir=tmp / "c", format="numpy", batch_size=500, prefetch=0,
              shuffle=False)
    file = Path(fl.open(tmp / "ds").loader(**kw).stats()["node_cache_file"])
    loader = fl.open(tmp / "ds").loader(**kw)
{plant}
    got = [b for b in loader]
    ids = np.concatenate([b["id"] for b in got])
    same = bool(np.array_equal(ids, np.arange({rows})) and
                np.array_equal(np.concatenate([b["x"] for b in got]), x))
    return {{"same": same, "rebuilds": loader.stats()["node_cache_rebuilds"],
            "regular": file.is_file() and not file.is_symlink()}}
    """


@pytest.mark.timeout(120)
def test_a_fifo_at_the_cache_file_path_is_replaced_not_waited_on(tmp_path):
    plant = "    file.unlink(); os.mkfifo(file)"
    outcome = run_limited(_child(tmp_path, plant), timeout=90)
    assert outcome.kind == "ok", (outcome.kind, outcome.message, outcome.stderr[-2000:])
    assert outcome.value == {"same": True, "rebuilds": 0, "regular": True}


@pytest.mark.timeout(120)
def test_a_file_truncated_while_mapped_is_rebuilt_not_a_sigbus(tmp_path):
    """The loader has served a batch from its mapping when the file is cut to 8 KiB: the next
    gather would touch pages past the end of the file (SIGBUS); the size check sees it first."""
    plant = """    it = iter(loader)
    first = [next(it)]
    os.truncate(file, 8192)
    rest = list(it)
    loader_batches = first + rest
"""
    body = _child(tmp_path, plant).replace("got = [b for b in loader]", "got = loader_batches")
    outcome = run_limited(body, timeout=90)
    assert outcome.kind == "ok", (outcome.kind, outcome.message, outcome.stderr[-2000:])
    assert outcome.value == {"same": True, "rebuilds": 1, "regular": True}


@pytest.mark.timeout(120)
def test_a_file_truncated_while_mapped_that_cannot_be_rebuilt_raises(tmp_path):
    plant = """    it = iter(loader)
    first = [next(it)]
    os.truncate(file, 8192)
    for shard in (tmp / "ds").glob("*.parquet"):
        shard.unlink()
    loader_batches = first + list(it)
"""
    body = _child(tmp_path, plant).replace("got = [b for b in loader]", "got = loader_batches")
    outcome = run_limited(body, timeout=90)
    assert (outcome.kind, outcome.error) == ("feedline", "IntegrityError"), (
        outcome.kind, outcome.message, outcome.stderr[-2000:],
    )  # fmt: skip
    assert "truncated in place" in outcome.message and "Fix:" in outcome.message


# ---------------------------------------------------------------- item 15: the folder


def _key(path: Path, tmp_path: Path) -> str:
    """The cache file name a loader of ``path`` uses (from a probe in another folder)."""
    return Path(_loader(path, tmp_path / "probe").stats()["node_cache_file"]).name


@pytest.mark.parametrize("what", ["an empty directory", "a symlink loop", "a dangling symlink",
                                  "a symlink to /dev/zero"])  # fmt: skip
def test_an_entry_planted_at_the_cache_file_path_is_replaced(tmp_path, what):
    path = _write(tmp_path / "ds")
    file = node_cache.node_cache_dir(tmp_path / "c") / _key(path, tmp_path)
    file.parent.mkdir(parents=True)
    if what == "an empty directory":
        file.mkdir()
    elif what == "a symlink loop":
        file.symlink_to(file)
    else:
        file.symlink_to(tmp_path / "nowhere" if what == "a dangling symlink" else "/dev/zero")
    loader = _loader(path, tmp_path / "c")
    _assert_exact(loader)
    assert loader.stats()["node_cache_built"] is True
    assert file.is_file() and not file.is_symlink()


def test_a_directory_with_files_at_the_cache_file_path_is_refused_and_kept(tmp_path):
    path = _write(tmp_path / "ds")
    file = node_cache.node_cache_dir(tmp_path / "c") / _key(path, tmp_path)
    (file / "keep").mkdir(parents=True)
    with pytest.raises(fl.ConfigurationError, match=r"directory with files in it.*Fix:"):
        _loader(path, tmp_path / "c").stats()
    assert (file / "keep").is_dir()


def test_a_lock_path_that_is_not_a_regular_file_is_a_clear_error(tmp_path):
    path = _write(tmp_path / "ds")
    locks = node_cache.node_cache_dir(tmp_path / "c") / ".locks"
    lock = locks / (_key(path, tmp_path).split(".")[0] + ".lock")
    lock.mkdir(parents=True)
    with pytest.raises(fl.ConfigurationError, match=r"node cache lock .*is a directory.*Fix:"):
        _loader(path, tmp_path / "c").stats()
    lock.rmdir()
    os.mkfifo(lock)
    with pytest.raises(fl.ConfigurationError, match=r"node cache lock .*a FIFO.*Fix:"):
        _loader(path, tmp_path / "c").stats()


@pytest.fixture
def sealable(tmp_path):
    """A folder and a function that remounts it read-only (a bind mount; root only)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = []

    def seal() -> None:
        for cmd in (["mount", "--bind", str(folder), str(folder)],
                    ["mount", "-o", "remount,ro,bind", str(folder)]):  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()}")
            mounted[:] = [folder]

    yield folder, seal
    gc.collect()  # a loader of the test may still map a file under the mount
    for m in mounted:  # lazily where still busy: no mount outlives the test
        if subprocess.run(["umount", str(m)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "--lazy", str(m)], capture_output=True, check=True)


def test_a_read_only_cache_folder_is_a_clear_error_or_serves_its_file(tmp_path, sealable):
    folder, seal = sealable
    path = _write(tmp_path / "ds")
    built = _write(tmp_path / "ds2", rows=3_000)
    _loader(built, folder).stats()  # this one's file exists before the folder is sealed
    for sub in (".locks", ".tmp"):
        (folder / "node" / sub).mkdir(parents=True, exist_ok=True)
    seal()
    with pytest.raises(fl.ConfigurationError, match=r"read-only.*Fix:.*cache_dir"):
        _loader(path, folder).stats()
    loader = _loader(built, folder)  # a complete file needs no lock: it is mapped
    _assert_exact(loader, rows=3_000)
    assert loader.stats()["node_cache_built"] is False


def test_a_read_only_cache_folder_falls_back_to_memory_for_cache_auto(tmp_path, sealable,
                                                                     monkeypatch):  # fmt: skip
    from feedline.loader.data import backend

    folder, seal = sealable
    (folder / "node" / ".locks").mkdir(parents=True)
    (folder / "node" / ".tmp").mkdir()
    seal()
    monkeypatch.setattr(backend, "AUTO_NODE_BYTES", 1)  # small data picks the node cache
    path = _write(tmp_path / "ds")
    loader = _loader(path, folder, cache="auto", world_size=2, rank=0)
    assert loader.stats()["cache"] == "memory"
    assert len(np.concatenate([b["id"] for b in loader])) == ROWS // 2


def test_a_crashed_fillers_leftover_directory_does_not_stop_the_next_fill(tmp_path):
    path = _write(tmp_path / "ds")
    key = _key(path, tmp_path).split(".")[0]
    tmp = node_cache.node_cache_dir(tmp_path / "c") / ".tmp"
    (tmp / f"{key}.123.dead.tmp").mkdir(parents=True)
    _assert_exact(_loader(path, tmp_path / "c"))
    assert not list(tmp.iterdir())
