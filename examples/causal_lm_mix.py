"""A small causal language model trained on a packed mix of two text sources, checkpointed
on 2 ranks and resumed on 3.

The two sources ship inside installed packages (nothing is downloaded): scikit-learn's dataset
descriptions (``sklearn/datasets/descr/*.rst``) and the Python reference topics that come
with the interpreter (``pydoc_data.topics``), one document per paragraph. A BPE tokenizer is
trained on them, ``fl.Tokenize(max_length=None)`` stores each paragraph's ids unpadded,
``fl.mix`` mixes the two with weights, and ``pack=fl.Packing(...)`` packs the mixed documents
into rows of exactly ``seq_len`` tokens with a block-diagonal attention mask, so the model
never attends across two documents and no compute goes to padding.

The ranks of a data-parallel job are simulated in one process (each rank's loader is what
that rank would read; their losses are summed as an all-reduce would). After
``steps_before`` steps on 2 ranks, the model, the optimizer and every rank's loader state go
into a checkpoint; a new job of 3 ranks loads it and finishes the epoch. Every token of the
epoch's mixed documents is trained on exactly once, before or after the resume.

    python examples/causal_lm_mix.py [OUT] [--docs 1000] [--steps-before 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import feedline as fl


# --8<-- [start:data]
def paragraphs(text: str, min_chars: int = 40) -> list[str]:
    """The text's paragraphs (blank-line separated), whitespace folded, short ones left out."""
    parts = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return [p for p in parts if len(p) >= min_chars]


def sklearn_descriptions() -> list[str]:
    """scikit-learn's dataset descriptions (reStructuredText shipped in its wheel; found
    without importing scikit-learn)."""
    spec = importlib.util.find_spec("sklearn")
    assert spec is not None and spec.submodule_search_locations, "pip install scikit-learn"
    folder = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "descr"
    return paragraphs("\n\n".join(p.read_text() for p in sorted(folder.glob("*.rst"))))


def python_topics() -> list[str]:
    """The Python reference topics shipped with the interpreter (what ``help()`` shows)."""
    from pydoc_data.topics import topics

    return paragraphs("\n\n".join(topics[k] for k in sorted(topics)))


def write_sources(out: Path, vocab_size: int = 1000) -> dict[str, fl.Dataset]:
    """Both sources tokenized at write time (unpadded ``list<int32>`` per paragraph)."""
    texts = {"sklearn": sklearn_descriptions(), "python": python_topics()}
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [t for ts in texts.values() for t in ts],
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]"], show_progress=False
        ),
    )
    tok.save(str(out / "tokenizer.json"))  # [PAD] is id 0: the packer's pad_id
    tokenize = fl.Tokenize(
        "text", tokenizer=str(out / "tokenizer.json"), max_length=None, output="input_ids"
    )
    for name, text in texts.items():
        fl.from_dict({"text": text}).transform(tokenize).write(out / name)
    return {name: fl.open(out / name) for name in texts}


# --8<-- [end:data]


# --8<-- [start:model]
class TinyCausalLM(torch.nn.Module):
    """Token and position embeddings, a few pre-norm transformer layers, a linear head."""

    def __init__(
        self, vocab: int, seq_len: int, dim: int = 64, layers: int = 2, heads: int = 4
    ) -> None:
        super().__init__()
        self.heads = heads
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(seq_len, dim)
        layer = torch.nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        n = input_ids.shape[1]
        # the packer's block-diagonal mask (True: same document) and causality; every token
        # sees itself (a row's padding too, so no softmax is over nothing)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        allowed = (attention_mask & causal) | torch.eye(n, dtype=torch.bool)
        blocked = (~allowed).repeat_interleave(self.heads, dim=0)  # (batch * heads, n, n)
        x = self.tokens(input_ids) + self.positions(position_ids)
        return self.head(self.layers(x, mask=blocked))


def token_losses(model: TinyCausalLM, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """The summed next-token loss of a packed batch and its number of predicted tokens
    (``labels`` are already shifted, -100 across documents' ends and the padding)."""
    logits = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"])
    labels = batch["labels"]
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
    )
    return loss, int((labels != -100).sum())


# --8<-- [end:model]


# --8<-- [start:train]
def loaders(mix: Any, world_size: int, batch_size: int, pack: fl.Packing) -> list[Any]:
    """Every rank's packed loader (in a real job, each process makes its own rank's)."""
    return [mix.loader(batch_size, rank=rank, world_size=world_size, pack=pack,
                       drop_last=False) for rank in range(world_size)]  # fmt: skip


def train(
    model: TinyCausalLM,
    optimizer: torch.optim.Optimizer,
    ranks: list[Any],
    steps: int | None,
    seen: list[int],
) -> list[float]:
    """``steps`` data-parallel steps (``None``: to the epoch's end): each rank's batch, the
    losses summed over the ranks and divided by their tokens, as DDP's all-reduce would."""
    iters = [iter(loader) for loader in ranks]
    losses: list[float] = []
    while steps is None or len(losses) < steps:
        batches = [next(it, None) for it in iters]
        if all(b is None for b in batches):
            break  # equal_batches: the ranks end together
        total, count = torch.zeros(()), 0
        for batch in batches:
            loss, n = token_losses(model, batch)
            total, count = total + loss, count + n
            seen.extend(batch["input_ids"][batch["input_ids"] != 0].tolist())
        optimizer.zero_grad()
        (total / max(count, 1)).backward()
        optimizer.step()
        losses.append(float(total.detach()) / max(count, 1))
    return losses


def main(
    out: Path | str = "causal_lm_mix",
    *,
    docs: int = 1000,
    steps_before: int = 20,
    seq_len: int = 128,
    batch_size: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    sources = write_sources(out)
    vocab = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
    mix = fl.mix(sources, weights={"sklearn": 0.3, "python": 0.7}, seed=seed, stop=docs)
    pack = fl.Packing(
        seq_len=seq_len,
        column="input_ids",
        algorithm="best_fit",
        buffer_size=64,
        boundaries="mask",
        equal_batches=True,
    )

    # job 1: 2 ranks, a few steps, then a checkpoint (the loaders' states are a few ints)
    model = TinyCausalLM(vocab, seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    seen: list[int] = []
    before = loaders(mix, 2, batch_size, pack)
    losses = train(model, optimizer, before, steps_before, seen)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "loaders": json.dumps([loader.state_dict() for loader in before])},
               out / "checkpoint.pt")  # fmt: skip

    # job 2: 3 ranks resume from every old rank's state and finish the epoch
    checkpoint = torch.load(out / "checkpoint.pt")
    model = TinyCausalLM(vocab, seq_len)
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    optimizer.load_state_dict(checkpoint["optimizer"])
    after = loaders(mix, 3, batch_size, pack)
    for loader in after:
        loader.load_state_dict(json.loads(checkpoint["loaders"]))
    losses += train(model, optimizer, after, None, seen)
    padding = [m["padding_fraction"] for loader in after for m in loader.metrics()]
    return {
        "losses": losses,
        "steps_before": steps_before,
        "tokens_seen": seen,
        "padding_fraction": float(np.mean(padding)) if padding else 0.0,
        "mix": mix,
    }


# --8<-- [end:train]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="causal_lm_mix")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--steps-before", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a model this small only contends with more threads
    result = main(args.out, docs=args.docs, steps_before=args.steps_before)
    losses = result["losses"]
    print(
        f"{len(losses)} steps ({result['steps_before']} on 2 ranks, the rest on 3 after the "
        f"resume); loss {losses[0]:.2f} -> {np.mean(losses[-5:]):.2f}; "
        f"{len(result['tokens_seen'])} tokens, padding {result['padding_fraction']:.1%}"
    )
