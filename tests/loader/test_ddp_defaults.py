"""Two gloo processes build loaders without rank/world_size: both come from
``torch.distributed``; an evaluation loader gives each rank the same number of batches, the
last ones short, and every sample once."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

N, BATCH, WORLD = 45, 8, 2
START_METHOD = "fork" if sys.platform == "linux" else "spawn"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, path: str, port: int, out: str) -> None:
    import torch.distributed as dist

    import feedline as fl

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)  # fmt: skip
    try:
        loader = fl.open(path).loader(batch_size=BATCH, shuffle=False)  # evaluation
        mine = [b["id"].tolist() for b in loader]
        everyone: list = [None] * WORLD
        dist.all_gather_object(everyone, {"rank": loader.rank, "world": loader.world_size,
                                          "len": len(loader), "batches": mine})  # fmt: skip
        if rank == 0:
            Path(out).write_text(json.dumps(everyone))
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_ranks_come_from_torch_distributed_and_evaluation_covers_every_sample(write, tmp_path):
    import torch.multiprocessing as mp

    write(N)
    out = tmp_path / "result.json"
    mp.start_processes(_worker, args=(str(tmp_path / "ds0"), _free_port(), str(out)),
                       nprocs=WORLD, start_method=START_METHOD)  # fmt: skip
    ranks = json.loads(out.read_text())
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    assert [r["len"] for r in ranks] == [3, 3] == [len(r["batches"]) for r in ranks]
    assert [len(b) for b in ranks[0]["batches"]] == [8, 8, 8]
    assert [len(b) for b in ranks[1]["batches"]] == [8, 8, 5]  # the short last batch
    everything = sorted(i for r in ranks for b in r["batches"] for i in b)
    assert everything == list(range(N))
