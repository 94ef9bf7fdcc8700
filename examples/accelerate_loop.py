"""A Hugging Face Accelerate training loop fed by a feedline loader.

The loader takes its rank, world size and device from the ``Accelerator``
(``accelerator.process_index``, ``accelerator.num_processes``, ``accelerator.device``), so
each process reads its own disjoint share of every epoch, already batched, shuffled and on
the right device. Only the model and the optimizer go through ``accelerator.prepare``: the
loader is already sharded, and preparing a ``DataLoader`` over it would shard it again.

Training uses the loader's defaults (shuffled, a new order per ``set_epoch``, the
remainder dropped so every rank steps equally often); evaluation uses ``shuffle=False,
drop_last=False`` (every row once, the last batch short) and sums its error over the
processes with ``accelerator.reduce``, so uneven last batches weigh correctly.

Run it on one process, or on several (on CPU ``torchrun`` starts them; ``accelerate launch``
does the same on GPUs with ``--multi_gpu``, and on CPUs only through MPI)::

    python examples/accelerate_loop.py [OUT_DIR]
    torchrun --nproc_per_node 2 examples/accelerate_loop.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

import feedline as fl
from feedline.errors import FormatError

FEATURES = 16


def write_regression(path: Path, rows: int, seed: int, first_id: int = 0) -> fl.Dataset:
    """A feedline dataset of ``id``, features ``x`` and a noisy linear target ``y``.

    Written once: an existing dataset of the same size is opened as is (the processes of a
    launched job all call this; the main process writes, the others wait for it).
    """
    try:
        dataset = fl.open(path)
        if dataset.count() == rows:
            return dataset
    except FormatError:  # not written yet
        pass
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    w = np.random.default_rng(99).normal(size=FEATURES).astype(np.float32)
    y = (x @ w + 0.1 * rng.normal(size=rows)).astype(np.float32)
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    fl.from_numpy({"id": ids, "x": x, "y": y}).write(path, rows_per_shard=512, row_group_rows=128)
    return fl.open(path)


@dataclass
class Result:
    """Per epoch: the ids every process trained on, mean training loss, evaluation MSE."""

    train_ids: list[list[int]]
    eval_ids: list[list[int]]
    train_loss: list[float]
    eval_mse: list[float]
    world_size: int
    steps_per_epoch: int


def main(
    out: Path, *, train_rows: int = 4096, eval_rows: int = 500, batch_size: int = 64,
    epochs: int = 3, learning_rate: float = 0.05, seed: int = 0,
) -> Result:  # fmt: skip
    """Train a linear model with Accelerate for ``epochs`` epochs, evaluating after each.

    Parameters
    ----------
    out:
        Folder of the datasets (and of ``result.json``, written by the main process).
    train_rows, eval_rows, batch_size, epochs, learning_rate, seed:
        Sizes of the run, the SGD learning rate and the seed of the model and the order.
    """
    out = Path(out)
    accelerator = Accelerator(cpu=True)
    with accelerator.main_process_first():  # the main process writes, the others then open
        train = write_regression(out / "train", train_rows, seed=1)
        evaluation = write_regression(out / "eval", eval_rows, seed=2, first_id=train_rows)
    share = {"rank": accelerator.process_index, "world_size": accelerator.num_processes,
             "device": accelerator.device}  # fmt: skip
    train_loader = train.loader(batch_size=batch_size, seed=seed, **share)
    eval_loader = evaluation.loader(batch_size=batch_size, shuffle=False, drop_last=False,
                                    **share)  # fmt: skip

    torch.manual_seed(seed)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader: it is sharded

    result = Result([], [], [], [], accelerator.num_processes, len(train_loader))
    for epoch in range(epochs):
        train_loader.set_epoch(epoch)
        model.train()
        seen: list[int] = []
        total = torch.zeros(2, device=accelerator.device)  # loss sum, samples
        for batch in train_loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen += batch["id"].tolist()
            total += torch.stack([loss.detach() * len(batch["y"]), torch.tensor(len(batch["y"]))])
        total = accelerator.reduce(total, reduction="sum")
        result.train_ids.append(sorted(gather_object(seen)))
        result.train_loss.append(float(total[0] / total[1]))

        model.eval()
        evaluated: list[int] = []
        error = torch.zeros(2, device=accelerator.device)  # squared error sum, samples
        with torch.no_grad():
            for batch in eval_loader:  # a complete pass: a short last batch, nothing dropped
                diff = model(batch["x"]).squeeze(1) - batch["y"]
                error += torch.stack([(diff**2).sum(), torch.tensor(len(diff))])
                evaluated += batch["id"].tolist()
        error = accelerator.reduce(error, reduction="sum")
        result.eval_ids.append(sorted(gather_object(evaluated)))
        result.eval_mse.append(float(error[0] / error[1]))
        accelerator.print(
            f"epoch {epoch}: train loss {result.train_loss[-1]:.4f}, "
            f"eval MSE {result.eval_mse[-1]:.4f} over {int(error[1])} rows"
        )

    if accelerator.is_main_process:
        (out / "result.json").write_text(json.dumps(asdict(result)))
    train_loader.close()  # the loaders' threads stopped before the process group goes
    eval_loader.close()
    accelerator.end_training()
    return result


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "accelerate-loop-output"))
