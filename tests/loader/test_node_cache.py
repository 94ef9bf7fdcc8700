"""cache="node": one memory-mapped cache file per node, shared by separately started ranks.

The multi-process tests start real Python processes (``python tests/loader/test_node_cache.py
worker ...``), not forks, as torchrun or Ray Train would, and measure what the node holds
with the kernel's proportional set size (PSS: a page shared by 4 processes counts a quarter
in each), summed over the ranks.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.loader.data import node_cache

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 256  # float32 features per row: 1 KiB a row


def _table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, WIDTH), dtype=np.float32)
    return pa.table({
        "id": np.arange(rows, dtype=np.int64),
        "x": pa.FixedShapeTensorArray.from_numpy_ndarray(x),
        "label": rng.integers(0, 10, rows),
    })  # fmt: skip


def _x(rows: int, seed: int = 0) -> np.ndarray:
    """The ``x`` column :func:`_table` writes."""
    return np.random.default_rng(seed).standard_normal((rows, WIDTH), dtype=np.float32)


def _write(path: Path, rows: int, seed: int = 0) -> Path:
    fl.from_arrow(_table(rows, seed)).write(path, rows_per_shard=rows // 4, row_group_rows=5_000)
    return path


def _ids(loader: fl.Loader) -> np.ndarray:
    return np.concatenate([np.asarray(b["id"]) for b in loader] or [np.zeros(0, np.int64)])


# ---------------------------------------------------------------- separate processes


def _worker(path: str, cache_dir: str, cache: str, rank: int, world: int, out: str) -> None:
    """One rank: wait for "go", load an epoch, save its ids, report, wait to be released."""
    ds = fl.open(path)
    for _ in fl.range(1000).loader(batch_size=100, format="numpy"):  # the loader's imports
        pass
    print("ready", flush=True)
    sys.stdin.readline()
    loader = ds.loader(batch_size=500, cache=cache, cache_dir=cache_dir, rank=rank,
                       world_size=world, seed=3, format="numpy", prefetch=0)  # fmt: skip
    ids = _ids(loader)
    np.save(out, ids)
    stats = loader.stats()
    report = {"built": stats.get("node_cache_built"), "cache": stats["cache"],
              "bytes": stats["cache_bytes"], "file": stats.get("node_cache_file")}  # fmt: skip
    print("done " + json.dumps(report), flush=True)
    sys.stdin.readline()


def _pss(pids: list[int]) -> int:
    import psutil

    return sum(psutil.Process(pid).memory_full_info().pss for pid in pids)


def _run_ranks(path: Path, cache_dir: Path, cache: str, world: int, out: Path) -> dict:
    """Start ``world`` rank processes at once; their ids, reports and the node's PSS growth."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    for r in range(world):
        cmd = [sys.executable, __file__, "worker", str(path), str(cache_dir), cache, str(r),
               str(world), str(out / f"{cache}-{r}.npy")]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=env, cwd=ROOT))  # fmt: skip
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        before = _pss([p.pid for p in procs])  # interpreters, imports, the opened dataset
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = []
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("done "), line
            reports.append(json.loads(line[5:]))
        after = _pss([p.pid for p in procs])  # all ranks alive, their caches mapped
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    ids = [np.load(out / f"{cache}-{r}.npy") for r in range(world)]
    return {"ids": ids, "reports": reports, "growth": after - before}


@pytest.mark.timeout(300)
def test_four_ranks_hold_one_copy_and_read_disjoint_exact_ids(tmp_path):
    """4 separately started ranks on one node: the node's PSS grows by <= 1.2x one copy of the
    data (cache="memory" grows by ~4 copies), exactly one rank fills the file, the others map
    it, and the ranks' ids are disjoint and exactly one process's shuffled epoch split."""
    rows, world = 160_000, 4
    path = _write(tmp_path / "ds", rows)
    copy = rows * (WIDTH * 4 + 8 + 8)  # x, id, label
    node = _run_ranks(path, tmp_path / "cache", "node", world, tmp_path)
    assert sorted(r["built"] for r in node["reports"]) == [False] * (world - 1) + [True]
    assert len({r["file"] for r in node["reports"]}) == 1
    assert {r["bytes"] for r in node["reports"]} == {copy}
    assert node["growth"] <= 1.2 * copy, (node["growth"] / copy, node["reports"])
    expected = [_ids(fl.open(path).loader(batch_size=500, cache="memory", rank=r,
                                          world_size=world, seed=3, format="numpy"))
                for r in range(world)]  # fmt: skip
    for got, want in zip(node["ids"], expected, strict=True):
        np.testing.assert_array_equal(got, want)
    everything = np.concatenate(node["ids"])
    assert len(np.unique(everything)) == len(everything) == rows // (500 * world) * 500 * world
    memory = _run_ranks(path, tmp_path / "cache", "memory", world, tmp_path)
    assert memory["growth"] >= 3 * copy, memory["growth"] / copy  # the problem this solves


def _hold_lock_and_die(folder: Path, key: str) -> None:
    """A filler that takes the key's lock, starts a temp file and is then killed."""
    (folder / ".locks").mkdir(parents=True, exist_ok=True)
    (folder / ".tmp").mkdir(parents=True, exist_ok=True)
    with node_cache._locked(folder, key):
        (folder / ".tmp" / f"{key}.{os.getpid()}.dead.tmp").write_bytes(b"\0" * 4096)
        print("locked", flush=True)
        sys.stdin.readline()


def test_a_killed_filler_neither_blocks_nor_leaves_its_temp_file(tmp_path):
    path = _write(tmp_path / "ds", 20_000)
    cache_dir = tmp_path / "cache"
    probe = fl.open(path).loader(cache="node", cache_dir=cache_dir, format="numpy")
    key = Path(probe.stats()["node_cache_file"]).name.split(".")[0]
    Path(probe.stats()["node_cache_file"]).unlink()
    folder = node_cache.node_cache_dir(cache_dir)
    holder = subprocess.Popen(
        [sys.executable, __file__, "hold", str(folder), key], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "locked"
    assert list((folder / ".tmp").glob(f"{key}.*.tmp"))
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    loader = fl.open(path).loader(cache="node", cache_dir=cache_dir, format="numpy",
                                  shuffle=False)  # fmt: skip
    assert loader.stats()["node_cache_built"] is True
    assert not list((folder / ".tmp").glob("*.tmp"))
    np.testing.assert_array_equal(_ids(loader), np.arange(20_000))


# ---------------------------------------------------------------- one process


def test_resume_is_exact_and_a_restart_maps_the_file(tmp_path):
    path = _write(tmp_path / "ds", 20_000)
    kw = {"batch_size": 300, "seed": 9, "format": "numpy", "cache_dir": tmp_path / "c"}
    whole = _ids(fl.open(path).loader(cache="memory", **{k: v for k, v in kw.items()
                                                          if k != "cache_dir"}))  # fmt: skip
    first = fl.open(path).loader(cache="node", **kw)
    it = iter(first)
    head = np.concatenate([next(it)["id"] for _ in range(7)])
    state = json.loads(json.dumps(first.state_dict()))
    again = fl.open(path).loader(cache="node", **kw)  # a restarted job
    again.load_state_dict(state)
    assert first.stats()["node_cache_built"] and not again.stats()["node_cache_built"]
    np.testing.assert_array_equal(np.concatenate([head, _ids(again)]), whole)


def test_values_match_the_memory_cache_with_stack_and_dtype(tmp_path):
    path = _write(tmp_path / "ds", 3_000)
    kw = {"batch_size": 128, "seed": 2, "format": "numpy", "stack": {"f": ["x", "label"]},
          "dtype": np.float32}  # fmt: skip
    node = list(fl.open(path).loader(cache="node", cache_dir=tmp_path / "c", **kw))
    memory = list(fl.open(path).loader(cache="memory", **kw))
    assert len(node) == len(memory) > 0
    for a, b in zip(node, memory, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_another_dataset_or_column_set_never_reuses_a_file(tmp_path):
    cache_dir = tmp_path / "c"
    a, b = _write(tmp_path / "a", 2_000, seed=1), _write(tmp_path / "b", 2_000, seed=2)
    same = shutil.copytree(a, tmp_path / "a-copy")
    files = {}
    for name, path, columns in [("a", a, None), ("b", b, None), ("copy", same, None),
                                ("a-x", a, ["x"])]:  # fmt: skip
        loader = fl.open(path).loader(cache="node", cache_dir=cache_dir, format="numpy",
                                      shuffle=False, columns=columns)  # fmt: skip
        files[name] = loader.stats()["node_cache_file"]
        got = np.concatenate([batch["x"] for batch in loader])
        np.testing.assert_array_equal(got, _x(2_000, seed={"b": 2}.get(name, 1)))
    assert files["a"] == files["copy"]  # the same content: the same file
    assert len({files["a"], files["b"], files["a-x"]}) == 3


def _damage(file: Path, how: str) -> None:
    data = bytearray(file.read_bytes())
    magic, version, length, _ = node_cache._PREAMBLE.unpack_from(data)
    header = json.loads(bytes(data[node_cache._PREAMBLE.size :][:length]))
    if how == "truncated":
        data = data[: len(data) - 4096]
    elif how == "header byte":
        data[40] ^= 0x10
    elif how == "zeroed":
        data = bytearray(len(data))
    elif how == "checksum table byte":
        data[header["table_offset"] + 3] ^= 0x01
    elif how == "data byte":
        data[header["data_offset"] + 12345] ^= 0x01
    else:  # intact, written before a reboot: served (every block is checked before use)
        header["boot"] = "an earlier boot"
        text = json.dumps(header).encode()
        data[: node_cache._PREAMBLE.size + len(text)] = (
            node_cache._PREAMBLE.pack(magic, version, len(text), zlib.crc32(text)) + text
        )
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "how", ["truncated", "header byte", "zeroed", "checksum table byte", "data byte", "intact"]
)
def test_a_damaged_cache_file_is_rebuilt(tmp_path, how):
    """Damage the header or the size shows is found on open; damaged data when a gather
    first needs its block (tests/loader/test_node_cache_guard.py tries more)."""
    path = _write(tmp_path / "ds", 5_000)
    kw = {"cache": "node", "cache_dir": tmp_path / "c", "format": "numpy", "shuffle": False}
    file = Path(fl.open(path).loader(**kw).stats()["node_cache_file"])
    _damage(file, how)
    loader = fl.open(path).loader(**kw)
    assert loader.stats()["node_cache_built"] is (how not in ("data byte", "intact"))
    got = np.concatenate([b["x"] for b in loader])
    np.testing.assert_array_equal(got, _x(5_000))
    stats = loader.stats()
    assert stats["node_cache_built"] is (how != "intact")
    assert stats["node_cache_rebuilds"] == (how == "data byte")
    assert stats["node_cache_blocks_verified"] == stats["node_cache_blocks"]


def test_flipped_bits_in_shards_never_reach_a_node_cache(tmp_path):
    """Like tests/store/test_bitrot.py, for the fill: each damaged copy fills a fresh cache folder
    (the fingerprint is the pristine one's, so a shared folder would serve the pristine file,
    which is also never wrong)."""
    pristine = _write(tmp_path / "ds", 4_000)
    expected = _x(4_000)
    rng, outcomes = random.Random(5), []
    shards = sorted(pristine.glob("part-*.parquet"))
    for trial in range(12):
        work = shutil.copytree(pristine, tmp_path / f"t{trial}")
        victim = work / rng.choice(shards).name
        data = bytearray(victim.read_bytes())
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        victim.write_bytes(bytes(data))
        try:
            loader = fl.open(work).loader(cache="node", cache_dir=tmp_path / f"c{trial}",
                                          format="numpy", shuffle=False)  # fmt: skip
            same = np.array_equal(np.concatenate([b["x"] for b in loader]), expected)
            outcomes.append("same" if same else f"SILENT bit {bit} of {victim.name}")
        except fl.FeedlineError as exc:
            assert "Fix:" in str(exc)
            outcomes.append(type(exc).__name__)
    assert not [o for o in outcomes if o.startswith("SILENT")], outcomes
    assert sum(o != "same" for o in outcomes) >= 6, outcomes


def test_auto_picks_node_for_several_ranks_and_refusals_name_the_fix(tmp_path):
    big = _write(tmp_path / "big", 70_000)  # 72 MB of columns: over AUTO_NODE_BYTES
    path = _write(tmp_path / "ds", 2_000)
    kw = {"cache_dir": tmp_path / "c", "format": "numpy"}
    assert fl.open(big).loader(world_size=2, rank=1, **kw).stats()["cache"] == "node"
    assert fl.open(big).loader(**kw).stats()["cache"] == "memory"
    assert fl.open(path).loader(world_size=2, **kw).stats()["cache"] == "memory"  # small
    strings = tmp_path / "s"
    fl.from_arrow(pa.table({"s": ["a", "b"]})).write(strings)
    with pytest.raises(fl.ConfigurationError, match=r"Fix:.*columns"):
        fl.open(strings).loader(cache="node", strings="list", **kw).stats()
    assert fl.open(strings).loader(world_size=2, strings="list", **kw).stats()["cache"] == "memory"
    with pytest.raises(fl.ConfigurationError, match=r"computed.*Fix:"):
        fl.range(10).loader(cache="node", **kw).stats()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        folder, cache_dir, cache, rank, world, out = sys.argv[2:8]
        _worker(folder, cache_dir, cache, int(rank), int(world), out)
    elif sys.argv[1] == "hold":
        _hold_lock_and_die(Path(sys.argv[2]), sys.argv[3])


def _mapping_flags(file: Path) -> list[str]:
    """``VmFlags`` of this process's mappings of ``file`` (``rr``: ``MADV_RANDOM``)."""
    flags, inside = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split()[0] and not line.split()[0].endswith(":"):  # a mapping's header
            inside = line.rstrip().endswith(str(file))
        elif inside and line.startswith("VmFlags:"):
            flags.append(line.split(":", 1)[1])
    return flags


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux /proc smaps")
@pytest.mark.parametrize("room", [10**6, 10**12])
def test_a_file_larger_than_the_page_cache_is_mapped_for_random_reads(tmp_path, monkeypatch,
                                                                      room):  # fmt: skip
    """Over half the memory the page cache may use, the mapping gets ``MADV_RANDOM``: the
    kernel's readahead around each fault of a shuffled gather evicted the pages the next
    batches needed (~57x slower with the page cache capped at half the file)."""
    path = _write(tmp_path / "ds", 4_000)
    kw = {"batch_size": 500, "seed": 1, "format": "numpy", "cache": "node",
          "cache_dir": tmp_path / "c"}  # fmt: skip
    first = fl.open(path).loader(**kw)
    expected = _ids(first)
    monkeypatch.setattr(node_cache, "memory_room", lambda: room)
    loader = fl.open(path).loader(**kw)
    batch = next(iter(loader))
    file = Path(loader.stats()["node_cache_file"])
    flags = _mapping_flags(file)
    assert flags, f"no mapping of {file} in /proc/self/smaps"
    assert any("rr" in f.split() for f in flags) == (room < 10**9)
    assert np.array_equal(np.asarray(batch["id"]), expected[:500])
