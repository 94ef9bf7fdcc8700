"""A Hugging Face ``transformers.Trainer`` trained on batches from a feedline loader.

feedline tokenizes the text while writing the dataset (``fl.Tokenize`` with a tokenizer
trained here with the ``tokenizers`` library: nothing is downloaded), and the model is a
tiny, randomly initialised ``BertForSequenceClassification`` built from a ``BertConfig``
whose vocabulary size is the tokenizer's.

How the Trainer gets its batches: the feedline loader already batches, shuffles, shards by
rank (``torch.distributed``'s, which Accelerate initializes under ``accelerate launch`` /
``torchrun``) and prefetches, so :class:`FeedlineTrainer` overrides
``Trainer.get_train_dataloader`` / ``get_eval_dataloader`` (the documented way to "inject
custom behavior") to return ``DataLoader(loader.as_torch_dataset(), batch_size=None)``.
Passing the adapter as ``train_dataset`` instead would make the Trainer batch the loader's
batches again (``per_device_train_batch_size``) and let ``accelerator.prepare`` shard data
that is already sharded. ``len()`` of the adapter is a number of batches (what ``DataLoader``
expects) while the Trainer takes ``len(dataset)`` for samples, so ``num_examples`` is
overridden for training and evaluation runs on an unsized :class:`EvaluationPasses` (the
Trainer then counts the samples it sees): ``train_samples_per_second`` and
``eval_samples_per_second`` are per sample. Evaluation uses ``shuffle=False,
drop_last=False``: every row once, the last batch short.

Run it with::

    python examples/hf_trainer.py [OUT_DIR]
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from torch.utils.data import DataLoader, IterableDataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    EvalPrediction,
    Trainer,
    TrainingArguments,
)

import feedline as fl
from feedline.loader import Loader
from feedline.loader.adapters.torch_dataset import LoaderDataset

POSITIVE = ("good", "great", "excellent", "lovely", "superb", "wonderful")
NEGATIVE = ("bad", "awful", "poor", "terrible", "boring", "dull")
FILLER = ("the", "movie", "was", "plot", "acting", "and", "really", "quite", "a", "film",
          "story", "ending", "music", "cast", "it", "very")  # fmt: skip
MAX_LENGTH = 16


def make_reviews(rows: int, seed: int, first_id: int = 0) -> pa.Table:
    """Synthetic one-line reviews: filler words around one or two words of the label's sentiment.

    Columns ``id`` (int64), ``text`` (string) and ``labels`` (int64: 1 positive, 0 negative).
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=rows)
    texts = []
    for label in labels:
        words = list(rng.choice(FILLER, size=int(rng.integers(5, 10))))
        for _ in range(int(rng.integers(1, 3))):
            words.insert(int(rng.integers(0, len(words) + 1)),
                         str(rng.choice(POSITIVE if label else NEGATIVE)))  # fmt: skip
        texts.append(" ".join(words))
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    return pa.table({"id": ids, "text": texts, "labels": labels.astype(np.int64)})


def train_tokenizer(texts: Sequence[str], path: Path) -> Tokenizer:
    """A word-level tokenizer with BERT's special tokens (``[CLS] text [SEP]``), saved to ``path``.

    The ``tokenizers`` library trains it on ``texts`` in memory: no download.
    """
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")),
                        ("[SEP]", tokenizer.token_to_id("[SEP]"))],
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return tokenizer


def write_split(table: pa.Table, tokenizer: Path, path: Path) -> fl.Dataset:
    """Tokenize ``text`` into ``input_ids`` + ``attention_mask`` and write a feedline dataset."""
    tokenize = fl.Tokenize("text", str(tokenizer), max_length=MAX_LENGTH, output="input_ids",
                           mask_output="attention_mask")  # fmt: skip
    fl.from_arrow(table).transform(tokenize).write(path, rows_per_shard=512, row_group_rows=128)
    return fl.open(path)


class SeenIds:
    """A ``collate_fn`` that records each batch's ``id`` column and drops it.

    ``model(**batch)`` takes only the model's inputs; the ids say which samples a run saw
    (bookkeeping for this example and its test).
    """

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.batches.append(batch["id"].tolist())
        return {k: v for k, v in batch.items() if k != "id"}


class EvaluationPasses(IterableDataset):
    """A complete pass of an evaluation loader at every iteration, with no ``len()``.

    Without a length the Trainer counts the samples it evaluated (``len()`` of the loader's
    adapter is its number of batches, which the Trainer would report as samples), and
    ``set_epoch(0)`` restarts a pass that an earlier evaluation left unfinished.
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.loader.set_epoch(0)
        return iter(self.loader.as_torch_dataset())


class FeedlineTrainer(Trainer):
    """A ``Trainer`` whose training and evaluation batches come from feedline loaders.

    Parameters
    ----------
    train_loader, eval_loader:
        The loaders (training: shuffled; evaluation: ``shuffle=False, drop_last=False``).
    *args, **kwargs:
        ``Trainer``'s own arguments (without ``train_dataset`` / ``eval_dataset``).
    """

    def __init__(self, *args: Any, train_loader: Loader, eval_loader: Loader | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        self.train_loader, self.eval_loader = train_loader, eval_loader
        self.train_seen, self.eval_seen = SeenIds(), SeenIds()
        super().__init__(*args, train_dataset=train_loader.as_torch_dataset(),
                         eval_dataset=EvaluationPasses(eval_loader) if eval_loader else None,
                         **kwargs)  # fmt: skip

    def get_train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_loader.as_torch_dataset(), batch_size=None,
                          collate_fn=self.train_seen)  # fmt: skip

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        if self.eval_loader is None:
            raise ValueError("FeedlineTrainer: evaluation needs eval_loader=")
        return DataLoader(EvaluationPasses(self.eval_loader), batch_size=None,
                          collate_fn=self.eval_seen)  # fmt: skip

    def num_examples(self, dataloader: DataLoader) -> int:
        """Samples per epoch over all ranks (``len(dataset)`` would count batches)."""
        dataset = dataloader.dataset
        if not isinstance(dataset, LoaderDataset):
            return super().num_examples(dataloader)
        loader = dataset.loader
        if loader.drop_last:
            return len(loader) * loader.batch_size * loader.world_size
        return loader.num_samples


def accuracy(prediction: EvalPrediction) -> dict[str, float]:
    """Share of correct arg-max predictions."""
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


@dataclass
class Result:
    """What :func:`main` trained and saw."""

    train_ids: list[list[int]]
    eval_ids: list[list[int]]
    losses: list[float]
    metrics: dict[str, float]  # the Trainer's: train_* from train(), eval_* from evaluate()
    steps: int
    train_rows: int


def main(
    out: Path, *, train_rows: int = 2048, eval_rows: int = 300, batch_size: int = 32,
    learning_rate: float = 3e-3, seed: int = 0,
) -> Result:  # fmt: skip
    """Write tokenized train/eval datasets, train a tiny BERT one epoch, evaluate it.

    Parameters
    ----------
    out:
        Folder for the tokenizer, the datasets and the Trainer's output.
    train_rows, eval_rows, batch_size, learning_rate, seed:
        Sizes of the run, AdamW's (constant) learning rate and the seed of the model and of
        the training order.
    """
    out = Path(out)
    train_table = make_reviews(train_rows, seed=1)
    eval_table = make_reviews(eval_rows, seed=2, first_id=train_rows)
    tokenizer = train_tokenizer(train_table["text"].to_pylist(), out / "tokenizer.json")
    train = write_split(train_table, out / "tokenizer.json", out / "train")
    evaluation = write_split(eval_table, out / "tokenizer.json", out / "eval")

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=MAX_LENGTH,
        num_labels=2, pad_token_id=tokenizer.token_to_id("[PAD]"),
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=str(out / "trainer"), num_train_epochs=1, per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size, learning_rate=learning_rate,
        lr_scheduler_type="constant",  # a tiny BERT from scratch leaves its plateau sooner
        logging_steps=4, save_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_pin_memory=False, seed=seed,
    )  # fmt: skip
    columns = ["id", "input_ids", "attention_mask", "labels"]
    trainer = FeedlineTrainer(
        model=model, args=args, compute_metrics=accuracy,
        train_loader=train.loader(batch_size=batch_size, seed=seed, columns=columns),
        eval_loader=evaluation.loader(batch_size=batch_size, shuffle=False, drop_last=False,
                                      columns=columns),
    )  # fmt: skip
    output = trainer.train()
    metrics = trainer.evaluate()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(
        f"{output.global_step} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
        f"eval loss {metrics['eval_loss']:.3f}, accuracy {metrics['eval_accuracy']:.3f}"
    )
    return Result(
        train_ids=trainer.train_seen.batches, eval_ids=trainer.eval_seen.batches, losses=losses,
        metrics={**output.metrics, **metrics}, steps=output.global_step, train_rows=train_rows,
    )  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "hf-trainer-output"))
