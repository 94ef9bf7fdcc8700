"""Packing side by side with Grain's and Hugging Face's, one run on the same documents.

    python3 -m venv /tmp/bench-venv
    /tmp/bench-venv/bin/pip install grain datasets transformers torch==2.13.0 pyarrow numpy \
        isal duckdb rich
    PYTHONPATH=. /tmp/bench-venv/bin/python bench/packing_peers.py [--docs 20000] [--seq-len 2048]

The documents: lognormal lengths (median ~300 tokens), clipped to ``seq_len`` so that no
packer has to split or truncate (each sees the same tokens). Each line times one full pass
that yields batches of ``--rows`` rows as numpy / torch arrays (feedline: epoch 1 of one
loader, after epoch 0 filled its cache; the peers: a second pass):

- feedline: ``ds.loader(pack=fl.Packing(...))`` (greedy / first_fit / best_fit, buffer of
  1024 documents), and the ``nodes.Pack`` node over ``loader.source_node()``;
- Grain: ``grain.experimental.FirstFitPackIterDataset`` / ``BestFitPackIterDataset`` (bins of
  ``--bins`` rows) then ``.batch(rows)``, over an in-memory ``MapDataset.source``;
- HF: a ``datasets.Dataset`` through a torch ``DataLoader`` with
  ``transformers.DataCollatorWithFlattening`` (each batch of documents flattened into one
  row: no padding, but rows of varying length, not ``seq_len``), and the run_clm
  concatenate-and-chunk recipe (``Dataset.map(group_texts)`` adding ``labels``, then
  ``default_data_collator``: no padding, documents cut across rows with no boundary), timed
  including the ``map``.

Real tokens/s counts document tokens only; the padding fraction is padding over all slots.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import pyarrow as pa

import feedline as fl
from feedline.loader import nodes


def _timed(run: Any) -> tuple[float, Any]:
    run(0)  # warm-up: epoch 0 (fills caches, imports)
    t = time.perf_counter()
    out = run(1)
    return time.perf_counter() - t, out


def _line(name: str, seconds: float, real: int, slots: int, note: str = "") -> None:
    pad = 1 - real / slots if slots else 0.0
    print(f"{name:40s} {real / seconds:>12,.0f} real tokens/s  padding {pad:.3f}  {note}")


def _count(batch: dict[str, Any]) -> tuple[int, int]:
    ids = batch["input_ids"]
    return int(np.count_nonzero(ids)), ids.size  # tokens are 1.., the padding 0


def bench_feedline(ds: Any, real: int, seq_len: int, rows: int) -> None:
    for algorithm in ("greedy", "first_fit", "best_fit"):
        pack = fl.Packing(seq_len=seq_len, algorithm=algorithm, buffer_size=1024)
        loader = ds.loader(batch_size=rows, seed=0, format="numpy", drop_last=False, pack=pack)

        def run(epoch: int, loader: Any = loader) -> tuple[int, int]:
            loader.set_epoch(epoch)
            counts = [_count(b) for b in loader]
            return sum(c[0] for c in counts), sum(c[1] for c in counts)

        seconds, (got, slots) = _timed(run)
        _line(f"feedline loader {algorithm}", seconds, got, slots, _delivered(got, real))
    pack = fl.Packing(seq_len=seq_len, algorithm="best_fit", buffer_size=1024)
    docs = ds.loader(batch_size=pack.buffer_size, drop_last=False, seed=0, format="numpy",
                     columns=["input_ids"], ragged={"input_ids": "list"})  # fmt: skip
    node = nodes.Pack(docs.source_node(), pack, batch_size=rows)

    def run_node(epoch: int) -> tuple[int, int]:
        node.reset({"epoch": epoch, "batches": 0})
        counts = [_count(b.data) for b in node]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    seconds, (got, slots) = _timed(run_node)
    _line("feedline nodes.Pack best_fit", seconds, got, slots, _delivered(got, real))


def _delivered(got: int, real: int) -> str:
    return "" if got == real else f"(delivered {got} of {real} tokens)"


def bench_grain(docs: list[np.ndarray], real: int, seq_len: int, rows: int, bins: int) -> None:
    try:
        import grain
        import grain.experimental as ge
    except ImportError as e:
        print(f"grain: not installed ({e})")
        return
    for name in ("FirstFitPackIterDataset", "BestFitPackIterDataset"):
        packer = getattr(ge, name, None)
        if packer is None:
            print(f"grain {name}: not in this version")
            continue

        def run(epoch: int, packer: Any = packer) -> tuple[int, int]:
            source = grain.MapDataset.source([{"input_ids": d} for d in docs])
            packed = packer(source.to_iter_dataset(), length_struct={"input_ids": seq_len},
                            num_packing_bins=bins, shuffle_bins=False)  # fmt: skip
            got = slots = 0
            for batch in packed.batch(rows):
                slots += batch["input_ids"].size
                got += int((batch["input_ids_segment_ids"] != 0).sum())
            return got, slots

        seconds, (got, slots) = _timed(run)
        _line(f"grain {name} ({bins} bins)", seconds, got, slots,
              _delivered(got, real))  # fmt: skip


def bench_hf(docs: list[np.ndarray], real: int, seq_len: int, rows: int) -> None:
    try:
        import datasets
        import torch
        from transformers import DataCollatorWithFlattening, default_data_collator
    except ImportError as e:
        print(f"Hugging Face: not installed ({e})")
        return
    datasets.disable_progress_bars()
    hf = datasets.Dataset.from_dict({"input_ids": [d.tolist() for d in docs]})
    per_batch = max(1, round(rows * seq_len / (real / len(docs))))  # ~rows * seq_len tokens

    def run_flat(epoch: int) -> tuple[int, int]:
        loader = torch.utils.data.DataLoader(hf, batch_size=per_batch,
                                             collate_fn=DataCollatorWithFlattening())  # fmt: skip
        got = 0
        for batch in loader:
            got += batch["input_ids"].numel()
        return got, got

    seconds, (got, slots) = _timed(run_flat)
    _line("HF DataCollatorWithFlattening", seconds, got, slots,
          f"({per_batch} docs per batch, one row of varying length)")  # fmt: skip

    def group_texts(batch: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
        flat = [t for ids in batch["input_ids"] for t in ids]
        end = len(flat) // seq_len * seq_len
        chunks = [flat[i : i + seq_len] for i in range(0, end, seq_len)]
        return {"input_ids": chunks, "labels": [list(c) for c in chunks]}

    def run_group(epoch: int) -> tuple[int, int]:
        grouped = hf.map(group_texts, batched=True, batch_size=1000,
                         load_from_cache_file=False)  # fmt: skip
        loader = torch.utils.data.DataLoader(grouped, batch_size=rows,
                                             collate_fn=default_data_collator)  # fmt: skip
        got = 0
        for batch in loader:
            got += batch["input_ids"].numel()
        return got, got

    try:
        seconds, (got, slots) = _timed(run_group)
        note = f"(map included; {real - got} tokens dropped: each 1000-doc map batch's tail)"
        _line("HF map(group_texts)+default collator", seconds, got, slots, note)
    except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
        print(f"HF map(group_texts) + default_data_collator: failed ({e!r})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--bins", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.7, 1.0, args.docs).astype(int), 1, args.seq_len)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(1, 50000, int(offsets[-1]), dtype=np.int32)
    ds = fl.from_arrow(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, pa.array(values))}))
    docs = [values[offsets[i] : offsets[i + 1]] for i in range(args.docs)]
    real = int(lengths.sum())
    print(f"{args.docs} documents, {real} tokens, seq_len {args.seq_len}, {args.rows} rows/batch")
    bench_feedline(ds, real, args.seq_len, args.rows)
    bench_grain(docs, real, args.seq_len, args.rows, args.bins)
    bench_hf(docs, real, args.seq_len, args.rows)


if __name__ == "__main__":
    main()
