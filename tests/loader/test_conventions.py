"""Conventions: Dataset.loader's typed signature, evaluation defaults and short last batches,
the seed of a checkpoint, the torch IterableDataset adapter and a Lightning training loop."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

import feedline as fl
from feedline.errors import ConfigurationError
from feedline.loader import Loader
from feedline.loader.order.sample_order import split_for_rank


def ids(loader: Loader) -> list[list[int]]:
    return [np.asarray(b["id"]).tolist() for b in loader]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


def test_dataset_loader_has_the_loaders_explicit_signature() -> None:
    dataset_params = list(inspect.signature(fl.Dataset.loader).parameters.values())[1:]
    loader_params = list(inspect.signature(Loader.__init__).parameters.values())[2:]
    assert [(p.name, p.kind, p.default) for p in dataset_params] == [
        (p.name, p.kind, p.default) for p in loader_params
    ]
    assert not any(p.kind is p.VAR_KEYWORD for p in dataset_params)
    assert inspect.signature(fl.Dataset.loader).return_annotation in ("Loader", Loader)


def test_evaluation_keeps_every_sample_once_with_a_short_last_batch(write) -> None:
    ds = write(103)
    evaluation = ds.loader(batch_size=10, shuffle=False, format="numpy")
    assert evaluation.drop_last is False and len(evaluation) == 11
    batches = ids(evaluation)
    assert [len(b) for b in batches] == [10] * 10 + [3]
    assert flat(batches) == list(range(103))
    training = ds.loader(batch_size=10, format="numpy")  # shuffled: the remainder is dropped
    assert training.drop_last is True and [len(b) for b in ids(training)] == [10] * 10
    padded = ds.loader(batch_size=10, shuffle=False, drop_last=False, pad_last=True,
                       format="numpy")  # fmt: skip
    assert ids(padded)[-1] == [100, 101, 102, 0, 1, 2, 3, 4, 5, 6]  # explicit padding
    metrics = evaluation.metrics()[0]
    assert metrics["samples"] == 103 and evaluation.timeline()[-1]["samples"] == 3


@pytest.mark.parametrize("world", range(2, 9))
@pytest.mark.parametrize("n", [50, 61])
def test_short_last_batches_keep_ranks_equal_and_are_never_empty(write, world: int, n: int) -> None:
    """Issue 24.3: with ``drop_last=False`` a rank past the last step's samples got an empty
    last batch (a NaN loss). Every rank yields ``len(loader)`` batches (DDP's all-reduce needs
    equal steps), none empty: such a rank's last batch is one repeated sample."""
    ds, bs = write(n, row_group_rows=10), 8
    loaders = [ds.loader(batch_size=bs, rank=r, world_size=world, seed=2, drop_last=False,
                         format="numpy") for r in range(world)]  # fmt: skip
    shares = [ids(loader) for loader in loaders]
    assert len({len(s) for s in shares}) == 1 == len({len(loader) for loader in loaders})
    assert all(1 <= len(b) <= bs for s in shares for b in s)  # never an empty batch
    assert all(len(b) == bs for s in shares for b in s[:-1])  # only the last is short
    left = n - (len(shares[0]) - 1) * world * bs  # samples for the last step
    real = [min(bs, max(0, left - r * bs)) for r in range(world)]  # in rank order
    assert [len(s[-1]) for s in shares] == [max(1, k) for k in real]
    everything = [i for s in shares for i in flat(s)]
    repeats = sum(k == 0 for k in real)  # one repeat per rank with nothing left
    assert len(everything) == n + repeats and sorted(set(everything)) == list(range(n))
    for rank, k in enumerate(real):
        if k == 0:  # the repeat is a sample of the epoch, yielded once more
            assert everything.count(shares[rank][-1][0]) == 2
    plan = split_for_rank(np.arange(10), rank=1, world_size=2, batch_size=4, drop_last=False,
                          pad_last=False)  # fmt: skip
    # position 12 of 10 samples: the padding's first repeat, sample 12 % 10
    assert plan.num_batches == 2 and [plan.batch(k).tolist() for k in (0, 1)] == [[4, 5, 6, 7],
                                                                                  [2]]  # fmt: skip
    assert plan.padded.tolist() == [False] * 4 + [True]


def test_seed_defaults_to_the_checkpoints_and_an_explicit_other_seed_is_refused(write) -> None:
    ds = write(200)
    first = ds.loader(batch_size=10, seed=7, format="numpy")
    iterator = iter(first)
    head = [next(iterator)["id"].tolist() for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    iterator.close()
    unset = ds.loader(batch_size=10, format="numpy")
    assert unset.seed == 0
    unset.load_state_dict(state)
    assert unset.seed == 7
    assert head + ids(unset) == ids(ds.loader(batch_size=10, seed=7, format="numpy"))
    ds.loader(batch_size=10, seed=7).load_state_dict(state)  # the same seed, explicit: fine
    with pytest.raises(ConfigurationError, match=r"seed=7 .*seed=8") as info:
        ds.loader(batch_size=10, seed=8).load_state_dict(state)
    assert "Fix:" in str(info.value)
    elastic = ds.loader(batch_size=5, world_size=2, drop_last=False)  # layout changes: allowed
    elastic.load_state_dict(state)


def test_rank_and_world_size_default_to_a_single_process_without_torch_distributed() -> None:
    import torch.distributed as dist

    assert not dist.is_initialized()
    loader = fl.range(10).loader(batch_size=2)
    assert (loader.rank, loader.world_size) == (0, 1)


def test_as_torch_dataset_works_with_a_dataloader(write) -> None:
    loader = write(100).loader(batch_size=16, seed=4)
    ds = loader.as_torch_dataset()
    assert isinstance(ds, torch.utils.data.IterableDataset) and len(ds) == 6
    got = [b["id"].tolist() for b in DataLoader(ds, batch_size=None)]
    loader.set_epoch(0)
    assert got == [b["id"].tolist() for b in loader]
    ds.set_epoch(1)
    second = [b["id"].tolist() for b in DataLoader(ds, batch_size=None)]
    assert second != got and len(set(flat(second))) == 96  # another epoch's order
    state = ds.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 6
    with pytest.raises(ConfigurationError, match="num_workers=0"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=1)))


def test_a_lightning_training_loop_runs_on_the_adapter(write) -> None:
    pl = pytest.importorskip("pytorch_lightning")
    ds = write(256)
    loader = ds.loader(batch_size=32, seed=0)
    seen: list[list[int]] = []

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(6, 7)

        def training_step(self, batch: dict, index: int) -> torch.Tensor:
            if index == 0:
                seen.append([])
            seen[-1] += batch["id"].tolist()
            logits = self.layer(batch["vec"].reshape(len(batch["vec"]), -1))
            return torch.nn.functional.cross_entropy(logits, batch["label"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(loader.as_torch_dataset(), batch_size=None)

    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)  # fmt: skip
    trainer.fit(Model())
    assert trainer.global_step == 2 * len(loader) == 16
    assert len(seen) == 2 and all(len(epoch) == 256 for epoch in seen)
    assert seen[0] != seen[1] and sorted(seen[0]) == sorted(seen[1]) == list(range(256))


def test_a_transform_pipeline_feeds_tf_with_short_batches(write) -> None:
    pytest.importorskip("tensorflow")
    table = pa.table({"id": np.arange(10), "x": np.arange(10, dtype=np.float32)})
    loader = write(table=table).loader(batch_size=4, shuffle=False,
                                       transform=lambda s, rng: {"y": s["x"] * 2})  # fmt: skip
    batches = [b["y"].numpy().tolist() for b in loader.to_tf_dataset()]
    assert batches == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]


def test_the_torch_dataloader_drops_an_abandoned_pass_and_resumes_a_restored_one(write) -> None:
    """Every ``iter()`` is a whole pass (Lightning's sanity check reads 2 batches and
    abandons them); only ``load_state_dict`` makes the next pass continue mid-epoch."""
    ds = write(100)
    dl = ds.loader(batch_size=10, shuffle=False, format="numpy").as_torch_dataloader()
    assert isinstance(dl, DataLoader) and len(dl) == 10
    abandoned = iter(dl)
    next(abandoned), next(abandoned)
    whole = [i for b in dl for i in b["id"].tolist()]
    assert whole == list(range(100))

    train = ds.loader(batch_size=10, seed=3, format="numpy").as_torch_dataloader()
    full = [b["id"].tolist() for b in train]  # epoch 0
    resumed_from = None
    for index, _ in enumerate(train):  # epoch 1, stopped after 4 batches
        if index == 3:
            resumed_from = train.state_dict()
            break
    assert resumed_from is not None and resumed_from["epoch"] == 1
    fresh = ds.loader(batch_size=10, seed=3, format="numpy").as_torch_dataloader()
    fresh.load_state_dict(resumed_from)
    rest = [b["id"].tolist() for b in fresh]
    fresh.set_epoch(1)  # the whole epoch 1, to compare
    epoch1 = [b["id"].tolist() for b in fresh]
    assert rest == epoch1[4:] and epoch1 != full
