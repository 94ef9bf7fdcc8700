"""Bad entries in the shard cache folder are removed and downloaded again (issue 23: 12, 16).

A cached shard truncated, swapped for another, replaced by a symbolic link, a directory,
``/dev/zero`` or a FIFO must never hang a loader nor stop every later loader with the
"evicted right after download. Fix: raise cache_limit" message meant for a cache too small.
The remote dataset lives on fsspec's ``memory://`` file system (remote to the loader, cheap).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from hostile import run_limited

import feedline as fl
from feedline.loader.data import shard_cache

N, PER_SHARD = 1_000, 250


def _remote() -> fl.Dataset:
    url = f"memory://feedline-tests/{uuid.uuid4().hex}/ds"
    fl.range(N).write(url, rows_per_shard=PER_SHARD, row_group_rows=PER_SHARD)
    return fl.open(url)


def _ids(loader: fl.Loader) -> list[int]:
    return sorted(np.concatenate([np.asarray(b["id"]) for b in loader]).tolist())


def _cached(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _warm(ds: fl.Dataset, folder: Path) -> list[Path]:
    assert _ids(ds.loader(batch_size=100, format="numpy", cache_dir=folder)) == list(range(N))
    return _cached(folder)


def _plant(victim: Path, other: Path, how: str) -> None:
    victim.unlink()
    if how == "truncated":
        shutil.copy(other, victim)  # then cut
        os.truncate(victim, 100)
    elif how == "swapped for another shard":
        shutil.copy(other, victim)
    elif how == "a symlink to another shard":
        victim.symlink_to(other)
    elif how == "an empty directory":
        victim.mkdir()
    elif how == "a symlink to /dev/zero":
        victim.symlink_to("/dev/zero")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["truncated", "swapped for another shard",
                                 "a symlink to another shard", "an empty directory",
                                 "a symlink to /dev/zero"])  # fmt: skip
@pytest.mark.parametrize("cache", ["memory", "none"])
def test_a_bad_cached_shard_is_removed_and_downloaded_again(tmp_path, caplog, how, cache):
    ds, folder = _remote(), tmp_path / "c"
    names = _warm(ds, folder)
    victim = names[0]
    good = victim.read_bytes()
    _plant(victim, names[1], how)
    loader = ds.loader(batch_size=100, format="numpy", cache_dir=folder, cache=cache)
    with caplog.at_level(logging.WARNING, logger="feedline.loader.data.shard_cache"):
        assert _ids(loader) == list(range(N))
    stats = loader.stats()
    assert (stats["shard_corrupt"], stats["shard_downloads"]) == (1, 1)
    assert victim.is_file() and not victim.is_symlink() and victim.read_bytes() == good
    assert _cached(folder) == names and "was bad" in caplog.text and victim.name in caplog.text
    again = ds.loader(batch_size=100, format="numpy", cache_dir=folder, cache=cache)
    assert _ids(again) == list(range(N)) and again.stats()["shard_downloads"] == 0


@pytest.mark.timeout(120)
def test_a_fifo_in_place_of_a_cached_shard_is_replaced_not_waited_on(tmp_path):
    body = f"""
    import os, uuid, numpy as np
    from pathlib import Path
    url = f"memory://feedline-tests/{{uuid.uuid4().hex}}/ds"
    fl.range({N}).write(url, rows_per_shard={PER_SHARD}, row_group_rows={PER_SHARD})
    ds, folder = fl.open(url), Path({str(tmp_path / "c")!r})
    list(ds.loader(batch_size=100, format="numpy", cache_dir=folder))
    victim = sorted(p for p in folder.iterdir() if not p.name.startswith("."))[0]
    victim.unlink()
    os.mkfifo(victim)
    loader = ds.loader(batch_size=100, format="numpy", cache_dir=folder, cache="none")
    ids = sorted(np.concatenate([b["id"] for b in loader]).tolist())
    return {{"same": ids == list(range({N})), "corrupt": loader.stats()["shard_corrupt"],
            "regular": victim.is_file()}}
    """
    outcome = run_limited(body, timeout=90)
    assert outcome.kind == "ok", (outcome.kind, outcome.message, outcome.stderr[-2000:])
    assert outcome.value == {"same": True, "corrupt": 1, "regular": True}


def test_a_directory_with_files_in_place_of_a_shard_is_refused_and_kept(tmp_path):
    ds, folder = _remote(), tmp_path / "c"
    victim = _warm(ds, folder)[0]
    victim.unlink()
    (victim / "mine").mkdir(parents=True)
    with pytest.raises(fl.ConfigurationError, match=r"directory with files in it.*Fix:"):
        list(ds.loader(batch_size=100, format="numpy", cache_dir=folder, cache="none"))
    assert (victim / "mine").is_dir()


def test_a_cache_too_small_and_a_bad_disk_get_their_own_messages(tmp_path, monkeypatch):
    """The "raise cache_limit" advice only when the shard really vanished after download."""
    ds, folder = _remote(), tmp_path / "c"
    real = shard_cache.ShardCache._download

    def evicted_at_once(self, i):  # another process evicts every shard right after download
        done = real(self, i)
        (self.folder / self.keys[i].name).unlink(missing_ok=True)
        return done

    monkeypatch.setattr(shard_cache.ShardCache, "_download", evicted_at_once)
    with pytest.raises(fl.IntegrityError, match=r"evicted right after download.*cache_limit"):
        list(ds.loader(batch_size=100, format="numpy", cache_dir=folder, cache="none"))

    def truncated_each_time(self, i):  # a disk that damages what is written
        done = real(self, i)
        os.truncate(self.folder / self.keys[i].name, 10)
        return done

    monkeypatch.setattr(shard_cache.ShardCache, "_download", truncated_each_time)
    with pytest.raises(fl.IntegrityError) as info:
        list(ds.loader(batch_size=100, format="numpy", cache_dir=folder / "2", cache="none"))
    message = str(info.value)
    assert "was bad" in message and "holds 10 bytes" in message and "Fix:" in message
    assert "cache_limit" not in message
