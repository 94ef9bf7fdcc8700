"""A real ``torch.distributed`` run: 2 gloo processes train a tiny DDP model on a loader."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

N, BATCH, WORLD, STOP = 1000, 16, 2, 5
# fork reuses the imported torch (seconds faster); the parent never starts a process group
START_METHOD = "fork" if sys.platform == "linux" else "spawn"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gather(ids: list, world: int) -> list[list[int]]:
    import torch
    import torch.distributed as dist

    local = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
    parts = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(parts, local)  # equal lengths on every rank, by construction
    return [p.tolist() for p in parts]


def _worker(rank: int, path: str, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    import feedline as fl

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)  # fmt: skip
    try:
        torch.set_num_threads(1)  # two processes share the CPUs
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 7))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        ds = fl.open(path)
        loader = ds.loader(batch_size=BATCH, rank=rank, world_size=WORLD, seed=3)
        result: dict[str, object] = {"len": len(loader)}

        def step(batch: dict) -> None:
            optimizer.zero_grad()
            logits = model(batch["vec"].reshape(len(batch["vec"]), -1))
            torch.nn.functional.cross_entropy(logits, batch["label"]).backward()
            optimizer.step()

        for epoch in (0, 1):
            loader.set_epoch(epoch)
            seen = []
            for batch in loader:
                step(batch)
                seen.append(batch["id"])
            result[f"epoch{epoch}"] = _gather(seen, WORLD)
        # epoch 2: the run "dies" after STOP batches; a new loader resumes from the JSON state
        loader.set_epoch(2)
        iterator, before = iter(loader), []
        for _ in range(STOP):
            before.append(next(iterator)["id"])
        state = json.dumps(loader.state_dict())
        del iterator, loader
        restarted = fl.open(path).loader(batch_size=BATCH, rank=rank, world_size=WORLD)
        restarted.load_state_dict(json.loads(state))
        restarted.set_epoch(2)
        after = [batch["id"] for batch in restarted]
        result["epoch2"] = _gather(before + after, WORLD)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
        # release DDP's reducer (it holds the process group) while both ranks are still up:
        # a gloo group torn down after its peer exited can hang joining its I/O thread
        model = optimizer = None  # frees the reducer (the step closure shares these cells)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_two_gloo_ranks_read_disjoint_equal_shards_and_resume_exactly(write, tmp_path) -> None:
    import torch.multiprocessing as mp

    write(N)
    out = tmp_path / "result.json"
    args = (str(tmp_path / "ds0"), _free_port(), str(out))
    mp.start_processes(_worker, args=args, nprocs=WORLD, start_method=START_METHOD)
    result = json.loads(out.read_text())
    expected = N - N % (WORLD * BATCH)
    assert result["len"] == expected // (WORLD * BATCH)
    orders = []
    for epoch in (0, 1, 2):
        ranks = result[f"epoch{epoch}"]
        assert [len(r) for r in ranks] == [expected // WORLD] * WORLD  # equal shards
        assert not set(ranks[0]) & set(ranks[1])  # disjoint
        union = np.concatenate(ranks)
        assert len(np.unique(union)) == expected  # no repeats, nothing lost
        orders.append(union)
    assert not np.array_equal(orders[0], orders[1])  # reshuffled per epoch
