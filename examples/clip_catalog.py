"""CLIP-style fine-tuning data, end to end, with feedline's public API only.

A messy product catalog (PNG images + CSV) → one feedline pipeline (clean the category, index
it, impute + scale the price, tokenize the description, decode + resize the images, skipping
the corrupt ones) → a feedline dataset → the loader → a few steps of a contrastive dual
encoder. Run it with::

    python examples/clip_catalog.py [OUT_DIR]

``feedline demo`` does the same at full size (plus a held-out evaluation, batch inference,
MLflow tracking and a second, tabular pipeline); see ``feedline/demo/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

import feedline as fl
from feedline.demo.synthetic import make_catalog


def clean_category(batch: pa.RecordBatch) -> pa.RecordBatch:
    clean = pc.utf8_lower(pc.utf8_trim_whitespace(batch["category"]))
    return batch.set_column(batch.schema.get_field_index("category"), "category", clean)


def read_image_files(batch: pa.RecordBatch, root: str) -> pa.RecordBatch:
    paths = [f"{root}/{name}" for name in batch["image"].to_pylist()]
    data = [Path(p).read_bytes() for p in paths]
    return batch.append_column("path", pa.array(paths)).append_column("bytes", pa.array(data))


def main(out: Path) -> None:
    catalog = make_catalog(1000, seed=0, path=out / "raw")
    descriptions = fl.read_csv(catalog.csv).select("description").to_arrow()["description"]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        descriptions.to_pylist(), trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"])
    )
    tokenizer.save(str(out / "tokenizer.json"))

    pipeline = (
        fl.read_csv(catalog.csv)
        .map_batches(clean_category)
        .transform(
            fl.Chain(
                [
                    fl.StringIndexer("category", output="label"),
                    fl.Imputer("price", strategy="median"),
                    fl.StandardScaler("price"),
                    fl.Tokenize("description", str(out / "tokenizer.json"), max_length=12),
                ]
            )
        )
        .map_batches(read_image_files, fn_kwargs={"root": str(catalog.path.resolve())})
        .transform(fl.DecodeImages("bytes", size=32, layout="CHW", on_error="skip"))
    )
    info = pipeline.write(out / "train")
    print(f"wrote {info.rows} rows; skipped {len(info.report.get('skipped', []))}:")
    for entry in info.report.get("skipped", [])[:5]:
        print(f"  {entry['where']}: {entry['reason']}")

    image = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 32),
    )
    text = torch.nn.EmbeddingBag(tokenizer.get_vocab_size(), 32, mode="mean", padding_idx=0)
    params = [*image.parameters(), *text.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    loader = fl.open(out / "train").loader(
        batch_size=64, shuffle=True, seed=0, columns=["bytes", "description"]
    )
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            img = torch.nn.functional.normalize(image(batch["bytes"].float() / 255), dim=-1)
            txt = torch.nn.functional.normalize(text(batch["description"].long()), dim=-1)
            logits = 10.0 * img @ txt.T
            target = torch.arange(len(logits))
            loss = (
                torch.nn.functional.cross_entropy(logits, target)
                + torch.nn.functional.cross_entropy(logits.T, target)
            ) / 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: last batch loss {loss.item():.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "clip-catalog-output"))
