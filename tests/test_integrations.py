"""The integration examples run: Lightning (with exact resume), the HF Trainer, Accelerate.

Each test runs an example's ``main`` at a small size on CPU (nothing is downloaded) and checks
what the training loop was fed: every sample once per epoch, every validation row once with
a short last batch, a falling loss, and for Lightning a mid-epoch resume from a checkpoint
that sees exactly the batches the interrupted run had not seen.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytestmark = [
    pytest.mark.filterwarnings("error"),
    # pytorch-lightning 2.6.6 on torch 2.13 (its own code, not the example's)
    pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.`:FutureWarning"),
    # the resumed run checkpoints into the folder of the run it resumes (Lightning's advice)
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* is not empty:UserWarning"),
]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (the folder is not a package)."""
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"feedline_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def no_thread_left_behind() -> Iterator[None]:
    """Every thread a test started (the loaders' prefetch threads included) has ended."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while left := [t for t in threading.enumerate() if t not in before and t.is_alive()]:
        if time.monotonic() > deadline:
            raise AssertionError(f"threads still running after the test: {[t.name for t in left]}")
        gc.collect()  # an abandoned loader iteration closes when collected
        time.sleep(0.05)


def epochs_of(step_ids: list[list[int]], steps_per_epoch: int) -> list[list[int]]:
    flat = [[i for step in step_ids[e : e + steps_per_epoch] for i in step]
            for e in range(0, len(step_ids), steps_per_epoch)]  # fmt: skip
    return flat


def test_lightning_datamodule_feeds_every_sample_and_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    example = load_example("lightning_datamodule")
    train_rows, val_rows, batch_size = 640, 150, 32
    demo = example.main(tmp_path, train_rows=train_rows, val_rows=val_rows,
                        batch_size=batch_size, epochs=2)  # fmt: skip
    full, interrupted, resumed = demo.full, demo.interrupted, demo.resumed
    steps = train_rows // batch_size
    assert full.steps_per_epoch == steps and len(full.step_ids) == 2 * steps
    assert all(len(b) == batch_size for b in full.step_ids)
    epochs = epochs_of(full.step_ids, steps)
    assert [sorted(e) for e in epochs] == [list(range(train_rows))] * 2  # each id once per epoch
    assert epochs[0] != epochs[1]  # shuffled anew each epoch
    # validation after each epoch: every row once, in order (its last batch has 150 % 32 rows)
    assert full.val_ids == [list(range(train_rows, train_rows + val_rows))] * 2
    losses = full.step_losses
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-steps:]) / steps < 0.6 * sum(losses[:steps]) / steps
    assert full.val_accuracy[-1] > 0.8

    # stopped in the middle of epoch 1, then resumed from the checkpoint of that step
    stop = steps + steps // 2
    assert len(interrupted.step_ids) == stop and len(interrupted.checkpoints) == 1
    checkpoint = torch.load(interrupted.checkpoints[0], weights_only=False)
    loader_state = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (loader_state["epoch"], loader_state["batches"]) == (1, stop - steps)
    assert len(resumed.step_ids) == 2 * steps - stop
    assert interrupted.step_ids + resumed.step_ids == full.step_ids  # exactly the remaining
    assert resumed.val_ids == [list(range(train_rows, train_rows + val_rows))]
    assert all(torch.equal(full.weights[k], resumed.weights[k]) for k in full.weights)


def test_hf_trainer_trains_a_tiny_bert_on_feedline_batches(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    example = load_example("hf_trainer")
    train_rows, eval_rows, batch_size = 1024, 200, 16
    result = example.main(tmp_path, train_rows=train_rows, eval_rows=eval_rows,
                          batch_size=batch_size)  # fmt: skip
    assert result.steps == train_rows // batch_size == len(result.train_ids)
    seen = [i for batch in result.train_ids for i in batch]
    assert sorted(seen) == list(range(train_rows)) and seen != sorted(seen)  # shuffled, once
    assert [len(b) for b in result.eval_ids] == [16] * 12 + [8]  # short last batch kept
    evaluated = [i for b in result.eval_ids for i in b]
    assert evaluated == list(range(train_rows, train_rows + eval_rows))  # every row, once
    assert all(math.isfinite(x) for x in result.losses) and len(result.losses) == 16
    assert result.losses[-1] < 0.8 * result.losses[0]
    assert result.metrics["eval_accuracy"] > 0.9
    # the Trainer counted samples, not batches
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        counted = result.metrics[f"{split}_samples_per_second"] * result.metrics[f"{split}_runtime"]
        assert counted == pytest.approx(rows, rel=0.05), split


def test_accelerate_loop_covers_each_epoch_once(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    example = load_example("accelerate_loop")
    train_rows, eval_rows = 1024, 150
    result = example.main(tmp_path, train_rows=train_rows, eval_rows=eval_rows, batch_size=64,
                          epochs=2)  # fmt: skip
    assert result.world_size == 1 and result.steps_per_epoch == 16
    assert result.train_ids == [list(range(train_rows))] * 2
    assert result.eval_ids == [list(range(train_rows, train_rows + eval_rows))] * 2
    assert all(math.isfinite(x) for x in result.train_loss + result.eval_mse)
    assert result.train_loss[1] < 0.1 * result.train_loss[0] and result.eval_mse[-1] < 0.05
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["train_ids"] == result.train_ids


def _aborted_in_teardown(output: str, epochs: int) -> bool:
    """Whether a torchrun job finished every epoch and then a rank aborted on its way out."""
    return (
        "terminate called without an active exception" in output
        and f"epoch {epochs - 1}: train loss" in output
        and "exitcode  : -6" in output
    )


@pytest.mark.ddp
def test_accelerate_loop_on_two_processes_shares_each_epoch(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    script = str(EXAMPLES / "accelerate_loop.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", script, str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    for _ in range(2):
        if not (done.returncode and _aborted_in_teardown(done.stdout + done.stderr, epochs=3)):
            break
        # In some full-suite runs (never alone: 0 of 8) a rank aborts in torch's native
        # teardown after the last epoch ("terminate called without an active exception",
        # SIGABRT), the loaders closed, the process group destroyed and only MainThread left
        # at the end of main. Not feedline's; run again: a run must pass whole.
        (tmp_path / "result.json").unlink(missing_ok=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps_per_epoch"] == 4096 // (2 * 64)
    assert result["train_ids"] == [list(range(4096))] * 3  # the two ranks together: each once
    assert result["eval_ids"] == [list(range(4096, 4596))] * 3
    assert result["train_loss"][-1] < 0.1 * result["train_loss"][0]


def test_causal_lm_mix_trains_on_every_token_once_across_an_elastic_resume(
    tmp_path: Path,
) -> None:
    """examples/causal_lm_mix.py at a tiny size: 2 ranks, a checkpoint, 3 ranks finish the
    epoch; the tokens trained on are the epoch's mixed documents' tokens, each once."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("sklearn")
    example = load_example("causal_lm_mix")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend (5x slower here)
    try:
        result = example.main(tmp_path, docs=60, steps_before=2, seq_len=32, batch_size=2)
    finally:
        torch.set_num_threads(threads)
    documents = result["mix"].loader(
        64, format="numpy", drop_last=False, ragged="list", columns=["input_ids"]
    )
    want = Counter(int(t) for b in documents for d in b["input_ids"] for t in d)
    assert Counter(result["tokens_seen"]) == want
    losses = result["losses"]
    assert len(losses) > result["steps_before"] and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < losses[0]
