"""The catalog pipeline: messy CSV + PNG files → token ids + pixels → a CLIP-style model.

Preprocessing (one feedline pipeline, any engine): normalise the category's case, split
train/held-out by a hash of the id, ``StringIndexer`` the category, ``Imputer`` +
``StandardScaler`` the price, ``Tokenize`` the description with a WordLevel tokenizer trained
here on the training descriptions (nothing downloaded), read the image files and
``DecodeImages(on_error="skip")`` them (the corrupt ones are skipped and reported).

The model is a dual encoder: a small CNN over the pixels and a bag-of-embeddings text
encoder over the token ids, projected into one space and trained with the symmetric InfoNCE
loss and a learnable temperature, as CLIP.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import feedline as fl
from feedline.demo.synthetic import CATEGORIES, COLOURS

__all__ = [
    "CatalogEncoder",
    "ClipModel",
    "build_tokenizer",
    "is_heldout",
    "key_of",
    "normalise_category",
    "prepare",
    "read_images_column",
    "retrieval",
]

IMAGE_SIZE = 32
MAX_TOKENS = 12
EMBED = 64
_PATTERN_OF = {
    "plain": "plain",
    "solid": "plain",
    "striped": "striped",
    "pinstriped": "striped",
    "dotted": "dotted",
    "polka": "dotted",
}


def is_heldout(batch: pa.RecordBatch, percent: int = 20) -> pa.Array:
    """The deterministic split: a row is held out when a hash of its ``id`` falls in
    the first ``percent`` of 100 buckets.

    Examples
    --------
    >>> import pyarrow as pa
    >>> mask = is_heldout(pa.record_batch({"id": list(range(1000))}))
    >>> 150 < sum(mask.to_pylist()) < 250
    True
    """
    ids = batch["id"].to_numpy(zero_copy_only=False).astype(np.uint64)
    mixed = (ids * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return pa.array((mixed % np.uint64(100)) < np.uint64(percent))


def is_train(batch: pa.RecordBatch) -> pa.Array:
    """The complement of :func:`is_heldout`."""
    return pc.invert(is_heldout(batch))


def normalise_category(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``" SHOES "`` → ``"shoes"``: trim and lower-case the category column.

    Examples
    --------
    >>> import pyarrow as pa
    >>> normalise_category(pa.record_batch({"category": [" Shoes", "BAG "]}))["category"]
    <pyarrow.lib.StringArray object at ...>
    [
      "shoes",
      "bag"
    ]
    """
    clean = pc.utf8_lower(pc.utf8_trim_whitespace(batch["category"]))
    return batch.set_column(batch.schema.get_field_index("category"), "category", clean)


def read_images_column(batch: pa.RecordBatch, root: str) -> pa.RecordBatch:
    """Add ``path`` (the image file) and ``bytes`` (its content) from the ``image`` column.

    Examples
    --------
    >>> import pyarrow as pa, tempfile, pathlib
    >>> root = tempfile.mkdtemp(); _ = (pathlib.Path(root) / "a.png").write_bytes(b"x")
    >>> out = read_images_column(pa.record_batch({"image": ["a.png"]}), root)
    >>> out.schema.names, out["bytes"].to_pylist()
    (['image', 'path', 'bytes'], [b'x'])
    """
    paths = [os.path.join(root, p) for p in batch["image"].to_pylist()]
    data = []
    for path in paths:
        with open(path, "rb") as handle:
            data.append(handle.read())
    return batch.append_column("path", pa.array(paths)).append_column(
        "bytes", pa.array(data, pa.binary())
    )


def build_tokenizer(descriptions: list[str], path: Path) -> Path:
    """Train a lower-casing WordLevel tokenizer on ``descriptions``; save its tokenizer.json.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from tokenizers import Tokenizer
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> path = build_tokenizer(["A red hat", "a blue hat"], folder / "tokenizer.json")
    >>> Tokenizer.from_file(str(path)).encode("Red hat").tokens
    ['red', 'hat']
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        descriptions, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"])
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def prepare(csv: Path, split: str) -> fl.Dataset:
    """The unfitted pipeline of one split (``"train"`` or ``"heldout"``) up to the tokens."""
    rows = fl.read_csv(csv).map_batches(normalise_category)
    return rows.filter(is_train if split == "train" else is_heldout)


def preprocessors(tokenizer: Path) -> fl.Chain:
    """Index the category, impute and scale the price, tokenize the description."""
    return fl.Chain(
        [
            fl.StringIndexer("category", output="label", order="alphabetical"),
            fl.Imputer("price", strategy="median"),
            fl.StandardScaler("price"),
            fl.Tokenize("description", str(tokenizer), max_length=MAX_TOKENS, output="tokens"),
        ]
    )


def finish(ds: fl.Dataset, chain: Any, root: Path) -> fl.Dataset:
    """Apply the fitted chain, read and decode the images (corrupt ones skipped)."""
    return (
        ds.transform(chain)
        .map_batches(read_images_column, batch_size=256, fn_kwargs={"root": str(root.resolve())})
        .transform(
            fl.DecodeImages(
                "bytes",
                size=IMAGE_SIZE,
                layout="CHW",
                on_error="skip",
                path_column="path",
                output="pixels",
            )
        )
        .select(
            [
                "id",
                "description",
                "category",
                "label",
                "price",
                "tokens",
                "tokens_mask",
                "pixels",
                "path",
            ]
        )
    )


def key_of(description: str) -> tuple[str, str, str]:
    """What a description says is visible: ``(colour, category, pattern)``.

    Examples
    --------
    >>> key_of("Our vintage brown scarf , polka-dot")
    ('brown', 'scarf', 'dotted')
    """
    words = description.lower().replace("-", " ").replace(",", " ").split()
    colour = next(w for w in words if w in COLOURS)
    category = next(w for w in words if w in CATEGORIES)
    pattern = next(_PATTERN_OF[w] for w in words if w in _PATTERN_OF)
    return colour, category, pattern


def retrieval(
    image_emb: np.ndarray, text_emb: np.ndarray, keys: list[Any], candidates: int
) -> tuple[float, float]:
    """Image→text recall@1 among groups of ``candidates`` held-out texts, and its chance level.

    A query is a hit when the best-scoring text describes what its image shows (same colour,
    category and pattern). Chance is the mean fraction of the group's texts that do.

    Examples
    --------
    >>> import numpy as np
    >>> e = np.eye(4, dtype=np.float32)
    >>> retrieval(e, e, ["a", "b", "c", "d"], candidates=4)
    (1.0, 0.25)
    """
    hits, chance, n = 0.0, 0.0, 0
    keys_arr = np.array([hash(k) for k in keys])
    for start in range(0, len(keys) - candidates + 1, candidates):
        sl = slice(start, start + candidates)
        scores = image_emb[sl] @ text_emb[sl].T
        best = scores.argmax(axis=1)
        group = keys_arr[sl]
        hits += float((group[best] == group).sum())
        chance += float((group[:, None] == group[None, :]).mean(axis=1).sum())
        n += candidates
    return (hits / n, chance / n) if n else (0.0, 0.0)


def _torch() -> Any:
    import torch

    return torch


def ClipModel(vocab: int) -> Any:
    """The dual encoder (built lazily so that importing this module does not need torch).

    Examples
    --------
    >>> import torch
    >>> model = ClipModel(vocab=10)
    >>> batch = {"pixels": torch.zeros(4, 3, 32, 32, dtype=torch.uint8),
    ...          "tokens": torch.ones(4, 5, dtype=torch.int32),
    ...          "tokens_mask": torch.ones(4, 5, dtype=torch.int8)}
    >>> model.encode_image(batch["pixels"]).shape, model.loss(batch).ndim
    (torch.Size([4, 64]), 0)
    """
    torch = _torch()
    nn = torch.nn
    module: Any = nn.Module  # torch is imported here, so its classes are untyped here

    class _Clip(module):
        def __init__(self) -> None:
            super().__init__()
            self.image = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(2),
                nn.Flatten(),
                nn.Linear(64 * 4, EMBED),
            )
            self.embed = nn.Embedding(vocab, EMBED, padding_idx=0)
            self.text = nn.Sequential(nn.Linear(EMBED, EMBED), nn.ReLU(), nn.Linear(EMBED, EMBED))
            self.logit_scale = nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))

        def encode_image(self, pixels: Any) -> Any:
            x = pixels.float() / 127.5 - 1.0
            return nn.functional.normalize(self.image(x), dim=-1)

        def encode_text(self, tokens: Any, mask: Any) -> Any:
            m = mask.float().unsqueeze(-1)
            pooled = (self.embed(tokens.long()) * m).sum(1) / m.sum(1).clamp(min=1.0)
            return nn.functional.normalize(self.text(pooled), dim=-1)

        def loss(self, batch: dict[str, Any]) -> Any:
            img = self.encode_image(batch["pixels"])
            txt = self.encode_text(batch["tokens"], batch["tokens_mask"])
            logits = self.logit_scale.clamp(max=4.6).exp() * img @ txt.T
            target = torch.arange(len(logits))
            ce = nn.functional.cross_entropy
            return (ce(logits, target) + ce(logits.T, target)) / 2

    return _Clip()


class CatalogEncoder:
    """Batch inference: embeds the held-out images and texts with the trained dual encoder.

    Constructed once per worker by ``map_batches`` with ``weights`` (a saved ``state_dict``)
    and ``vocab`` (the tokenizer's vocabulary size); called per batch.
    """

    def __init__(self, weights: str, vocab: int) -> None:
        torch = _torch()
        self.torch = torch
        self.model = ClipModel(vocab)
        self.model.load_state_dict(torch.load(weights, weights_only=True))
        self.model.eval()

    def __call__(self, batch: pa.RecordBatch) -> dict[str, Any]:
        torch = self.torch

        def tensor(name: str) -> Any:
            return torch.from_numpy(np.array(batch[name].to_numpy_ndarray()))

        with torch.no_grad():
            img = self.model.encode_image(tensor("pixels")).numpy()
            txt = self.model.encode_text(tensor("tokens"), tensor("tokens_mask")).numpy()
        return {
            "id": batch["id"],
            "description": batch["description"],
            "image_emb": img.astype(np.float32),
            "text_emb": txt.astype(np.float32),
        }
