"""A PyTorch Lightning ``LightningDataModule`` fed by feedline, with exact mid-epoch resume.

The data module writes a training and a validation dataset in ``prepare_data`` (once per
machine; the write is crash-safe and skipped when the dataset is already there), opens one
loader per split in ``setup`` (after Lightning has initialized ``torch.distributed``, so
each loader picks up its rank and world size by itself) and hands Lightning
``loader.as_torch_dataloader()``: the feedline loader batches, shuffles, shards by rank and
prefetches; the ``DataLoader`` only passes its batches on.

* Training: shuffled, a new order each epoch, ``drop_last=True`` (the loader's default when
  shuffling).
* Validation: ``shuffle=False, drop_last=False``: every row once, the last batch short.
  Every ``iter()`` of the ``DataLoader`` is a whole pass, so the two batches Lightning's
  sanity check reads and abandons do not shorten the first real validation.
* Resume: the ``DataLoader`` exposes the loader's ``state_dict()`` /
  ``load_state_dict()``; Lightning stores it in every checkpoint (``"loops" →
  "fit_loop" → "state_dict" → "combined_loader"``) and restores it on
  ``trainer.fit(..., ckpt_path=...)``, so a run resumed mid-epoch sees exactly the batches
  the interrupted run had not seen yet, in the same order.

Run it with::

    python examples/lightning_datamodule.py [OUT_DIR]

It trains two epochs, then repeats the run stopped mid-way through the second epoch, resumes
it from its checkpoint and checks that the two runs saw the same batches and ended with the
same weights.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch

import feedline as fl
from feedline.errors import FormatError
from feedline.loader import Loader
from feedline.loader.adapters.torch_dataset import LoaderDataLoader

FEATURES, CLASSES = 8, 3


def make_table(rows: int, seed: int, first_id: int = 0) -> dict[str, np.ndarray]:
    """Synthetic classification rows: ``id``, a feature vector ``x`` and its ``label``.

    The label is the arg-max of a fixed linear map of ``x`` (the same map for every split),
    so a linear model can learn it.
    """
    x = np.random.default_rng(seed).normal(size=(rows, FEATURES)).astype(np.float32)
    weights = np.random.default_rng(1234).normal(size=(FEATURES, CLASSES)).astype(np.float32)
    return {
        "id": np.arange(first_id, first_id + rows, dtype=np.int64),
        "x": x,
        "label": (x @ weights).argmax(axis=1).astype(np.int64),
    }


class FeedlineDataModule(pl.LightningDataModule):
    """Training and validation batches from two feedline datasets under ``root``.

    Parameters
    ----------
    root:
        Folder of the datasets (``root/train`` and ``root/val``).
    train_rows, val_rows:
        Rows of each split.
    batch_size:
        Samples per batch (per rank).
    seed:
        The training order's seed (the order depends only on seed and epoch).
    """

    def __init__(
        self, root: Path, train_rows: int = 2000, val_rows: int = 500, batch_size: int = 64,
        seed: int = 0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.root, self.batch_size, self.seed = Path(root), batch_size, seed
        self.rows = {"train": train_rows, "val": val_rows}
        self.train_loader: Loader | None = None
        self.val_loader: Loader | None = None

    def prepare_data(self) -> None:
        """Write each split once (Lightning calls this on one process per machine)."""
        for offset, (split, rows) in enumerate(self.rows.items()):
            path = self.root / split
            try:
                if fl.open(path).count() == rows:
                    continue
            except FormatError:  # not written yet
                pass
            first_id = 0 if split == "train" else self.rows["train"]
            table = make_table(rows, seed=offset, first_id=first_id)
            fl.from_numpy(table).write(path, rows_per_shard=512, row_group_rows=128)

    def setup(self, stage: str) -> None:
        """Open the loaders (rank and world size come from ``torch.distributed``)."""
        self.train_loader = fl.open(self.root / "train").loader(
            batch_size=self.batch_size, shuffle=True, seed=self.seed
        )
        self.val_loader = fl.open(self.root / "val").loader(
            batch_size=self.batch_size, shuffle=False, drop_last=False
        )

    def train_dataloader(self) -> LoaderDataLoader:
        """The training batches; their position goes into Lightning's checkpoints."""
        assert self.train_loader is not None, "setup() builds the loaders"
        return self.train_loader.as_torch_dataloader()

    def val_dataloader(self) -> LoaderDataLoader:
        """The validation batches: every row once per validation, from the first batch."""
        assert self.val_loader is not None, "setup() builds the loaders"
        return self.val_loader.as_torch_dataloader()


class Classifier(pl.LightningModule):
    """A small MLP that records what it was fed (ids per step, losses, validation ids)."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES)
        )
        self.lr = lr
        self.step_ids: list[list[int]] = []
        self.step_losses: list[float] = []
        self.val_ids: list[list[int]] = []
        self.val_correct: list[int] = []

    def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(self.net(batch["x"]), batch["label"])
        self.step_ids.append(batch["id"].tolist())
        self.step_losses.append(loss.item())
        return loss

    def on_validation_epoch_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_ids.append([])
            self.val_correct.append(0)

    def validation_step(self, batch: dict[str, torch.Tensor], index: int) -> None:
        logits = self.net(batch["x"])
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, batch["label"]),
                 batch_size=len(logits))  # fmt: skip
        if not self.trainer.sanity_checking:
            self.val_ids[-1] += batch["id"].tolist()
            self.val_correct[-1] += int((logits.argmax(1) == batch["label"]).sum())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


@dataclass
class FitResult:
    """What one ``trainer.fit`` saw: per-step ids and losses, per-validation ids and accuracy."""

    step_ids: list[list[int]]
    step_losses: list[float]
    val_ids: list[list[int]]
    val_accuracy: list[float]
    steps_per_epoch: int
    weights: dict[str, torch.Tensor] = field(repr=False)
    checkpoints: list[Path] = field(default_factory=list)


def fit(
    data: FeedlineDataModule, *, epochs: int, max_steps: int = -1, checkpoint_every: int = 0,
    ckpt_path: Path | None = None, checkpoint_dir: Path | None = None,
) -> FitResult:  # fmt: skip
    """Train :class:`Classifier` on ``data`` with a CPU ``pl.Trainer``.

    Parameters
    ----------
    data:
        The data module.
    epochs, max_steps:
        Stop after ``epochs`` epochs or ``max_steps`` steps (``-1``: no step limit).
    checkpoint_every:
        Save a checkpoint every this many steps into ``checkpoint_dir`` (0: none).
    ckpt_path:
        Resume from this checkpoint.
    """
    pl.seed_everything(0, verbose=False)
    model = Classifier()
    callbacks: list[pl.Callback] = []
    if checkpoint_every:
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=checkpoint_dir, every_n_train_steps=checkpoint_every, save_top_k=-1,
        ))  # fmt: skip
    trainer = pl.Trainer(
        max_epochs=epochs, max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
        callbacks=callbacks, enable_checkpointing=bool(checkpoint_every),
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        # the feedline loader has its own threads (num_workers=, prefetch=) and refuses
        # DataLoader workers (each would read the whole epoch again): Lightning's hints about
        # worker processes do not apply
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*has `__len__` defined.*multi-process")
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    assert data.val_loader is not None and data.train_loader is not None
    return FitResult(
        step_ids=model.step_ids, step_losses=model.step_losses, val_ids=model.val_ids,
        val_accuracy=[c / data.rows["val"] for c in model.val_correct],
        steps_per_epoch=len(data.train_loader),
        weights={k: v.detach().clone() for k, v in model.state_dict().items()},
        checkpoints=sorted(Path(checkpoint_dir).glob("*.ckpt")) if checkpoint_dir else [],
    )  # fmt: skip


@dataclass
class Demo:
    """The full run and the interrupted + resumed run of :func:`main`."""

    full: FitResult
    interrupted: FitResult
    resumed: FitResult


def main(
    out: Path, *, train_rows: int = 2000, val_rows: int = 500, batch_size: int = 64,
    epochs: int = 2,
) -> Demo:  # fmt: skip
    """Train ``epochs`` epochs; then stop a second run mid-epoch and resume it from its checkpoint.

    Parameters
    ----------
    out:
        Folder for the datasets and checkpoints.
    train_rows, val_rows, batch_size, epochs:
        Sizes of the run.
    """
    out = Path(out)
    full = fit(FeedlineDataModule(out / "data", train_rows, val_rows, batch_size), epochs=epochs)
    print(f"full run: {len(full.step_ids)} steps, loss {full.step_losses[0]:.3f} -> "
          f"{full.step_losses[-1]:.3f}, val accuracy {full.val_accuracy}")  # fmt: skip

    stop = full.steps_per_epoch * (epochs - 1) + full.steps_per_epoch // 2  # mid last epoch
    interrupted = fit(
        FeedlineDataModule(out / "data", train_rows, val_rows, batch_size), epochs=epochs,
        max_steps=stop, checkpoint_every=stop, checkpoint_dir=out / "checkpoints",
    )  # fmt: skip
    checkpoint = interrupted.checkpoints[-1]
    resumed = fit(
        FeedlineDataModule(out / "data", train_rows, val_rows, batch_size), epochs=epochs,
        ckpt_path=checkpoint, checkpoint_every=stop, checkpoint_dir=out / "checkpoints",
    )  # fmt: skip
    same = interrupted.step_ids + resumed.step_ids == full.step_ids
    same_weights = all(torch.equal(full.weights[k], resumed.weights[k]) for k in full.weights)
    print(f"stopped after {stop} steps, resumed from {checkpoint.name}: "
          f"{len(resumed.step_ids)} more steps; same batches as the full run: {same}; "
          f"same final weights: {same_weights}")  # fmt: skip
    return Demo(full=full, interrupted=interrupted, resumed=resumed)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "lightning-datamodule-output"))
