"""A training process reading ``s3://`` is killed with SIGKILL mid-epoch and resumes exactly.

The child is a plain Python script: it reads the dataset from the loopback S3 server through
the loader (shuffle, two epochs, a shard cache folder), and after every batch appends the
batch's ids and the loader's ``state_dict()`` to a log file (fsync). It is killed twice (in
epoch 0 and in epoch 1) and restarted from the last state in the log, with the same cache
folder (locks and partial downloads of the killed processes left behind; partial downloads
of an earlier killed run are planted too). The batches in the
log must be exactly those of an uninterrupted run: nothing lost, nothing repeated.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import feedline as fl

N, BATCH, EPOCHS = 2000, 50, 2
OPTIONS = {"batch_size": BATCH, "format": "numpy", "cache": "none", "shuffle": True,
           "shuffle_window": 2, "seed": 7}  # fmt: skip

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import feedline as fl

    endpoint, url, folder, log = sys.argv[1:5]
    storage = {"key": "testing", "secret": "testing", "use_listings_cache": False,
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    options = json.loads(sys.argv[5])
    loader = fl.open(url, storage_options=storage).loader(cache_dir=folder, **options)
    last = None
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                try:
                    last = json.loads(line)["state"]
                except ValueError:  # a line torn by the kill: that batch is yielded again
                    break
    start = 0
    if last is not None:
        if last["batches"] >= len(loader):
            start = last["epoch"] + 1
        else:
            loader.load_state_dict(last)
            start = last["epoch"]
    with open(log, "a") as f:
        for epoch in range(start, int(sys.argv[6])):
            loader.set_epoch(epoch)
            for batch in loader:
                time.sleep(0.03)  # a training step
                record = {"epoch": epoch, "ids": batch["id"].tolist(),
                          "state": loader.state_dict()}
                f.write(json.dumps(record) + "\\n")
                f.flush()
                os.fsync(f.fileno())
    """
)


def logged(log: Path) -> list[dict]:
    records = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            break
    return records


def start(tmp_path: Path, s3_bucket, folder: Path, log: Path) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(CHILD)
    args = [sys.executable, str(script), s3_bucket.endpoint, f"{s3_bucket.url}/ds",
            str(folder), str(log), json.dumps(OPTIONS), str(EPOCHS)]  # fmt: skip
    return subprocess.Popen(args)


def kill_when(proc: subprocess.Popen, log: Path, epoch: int, batches: int) -> None:
    """SIGKILL ``proc`` once the log holds ``batches`` batches of ``epoch``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(r["epoch"] == epoch for r in logged(log)) >= batches:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the training process ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_from_state_dict_sees_every_id_once(
    s3_bucket, tmp_path
) -> None:
    storage = s3_bucket.storage_options
    fl.range(N).write(f"{s3_bucket.url}/ds", rows_per_shard=250, row_group_rows=50,
                      storage_options=storage)  # fmt: skip
    ds = fl.open(f"{s3_bucket.url}/ds", storage_options=storage)
    reference = ds.loader(cache_dir=False, **OPTIONS)
    expected = []
    for epoch in range(EPOCHS):
        reference.set_epoch(epoch)
        expected += [(epoch, b["id"].tolist()) for b in reference]
    per_epoch = N // BATCH
    shards = {f"sha256-{s.checksum.split(':', 1)[1]}.parquet" for s in ds.manifest.shards}

    folder, log = tmp_path / "cache", tmp_path / "log.jsonl"
    (folder / ".tmp").mkdir(parents=True)  # and an earlier run was killed mid-download
    for name in shards:
        (folder / ".tmp" / f"{name}.4242.0badf00d.part").write_bytes(b"PAR1 torn")
    kill_when(start(tmp_path, s3_bucket, folder, log), log, epoch=0, batches=per_epoch // 3)
    kill_when(start(tmp_path, s3_bucket, folder, log), log, epoch=1, batches=per_epoch // 2)
    last = start(tmp_path, s3_bucket, folder, log)
    assert last.wait(timeout=180) == 0

    records = logged(log)
    assert [(r["epoch"], r["ids"]) for r in records] == expected  # nothing lost or repeated
    for epoch in range(EPOCHS):
        seen = np.concatenate([r["ids"] for r in records if r["epoch"] == epoch])
        assert np.array_equal(np.sort(seen), np.arange(N))
    assert {p.name for p in folder.iterdir() if not p.name.startswith(".")} == shards
    assert not list((folder / ".tmp").iterdir())  # partial downloads of the killed runs: gone
