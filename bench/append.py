"""Append cost vs rewriting the whole dataset (issue 27), one run.

Usage::

    PYTHONPATH=. .venv/bin/python bench/append.py [--rows 2000000] [--fractions 0.01,0.1]

A dataset of ``--rows`` rows (an int64 id, a float64, a 32-byte string) is written once;
then, for each fraction, new rows are added two ways on a fresh copy of it:

- ``ds.write(path, mode="append")``: writes only the new rows as a new version;
- a rewrite: ``fl.open(path)`` unioned with the new rows and written over it
  (``mode="overwrite"``), what one does without appends.

Prints the seconds of each and the ratio, and writes ``bench/out/append.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.table import Table

import feedline as fl


def make_table(rows: int, start: int = 0, seed: int = 0) -> pa.Table:
    """``rows`` rows: an id, a float and a 32-character string."""
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + rows, dtype=np.int64)
    text = rng.integers(0, 2**63, size=rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "value": rng.standard_normal(rows),
            "text": pa.array([f"{t:032x}" for t in text.tolist()]),
        }
    )


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the dataset")
    parser.add_argument(
        "--fractions", default="0.01,0.1", help="comma-separated fractions of new rows"
    )
    parser.add_argument("--rows-per-shard", type=int, default=250_000, help="rows per shard")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="feedline-append-"))
    results = []
    try:
        base = work / "base"
        table = make_table(args.rows)
        initial = timed(
            lambda: fl.from_arrow(table).write(base, rows_per_shard=args.rows_per_shard)
        )
        for fraction in [float(f) for f in args.fractions.split(",")]:
            new = make_table(int(args.rows * fraction), start=args.rows, seed=1)
            appended, rewritten = work / "appended", work / "rewritten"
            for copy in (appended, rewritten):
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(base, copy)

            def append(new: pa.Table = new, appended: Path = appended) -> None:
                fl.from_arrow(new).write(
                    appended, mode="append", rows_per_shard=args.rows_per_shard
                )

            append_s = timed(append)

            def rewrite(new: pa.Table = new, rewritten: Path = rewritten) -> None:
                whole = pa.concat_tables([fl.open(rewritten).to_arrow(), new])
                fl.from_arrow(whole).write(rewritten, rows_per_shard=args.rows_per_shard)

            rewrite_s = timed(rewrite)
            assert fl.open(appended).count() == fl.open(rewritten).count() == args.rows + len(new)
            results.append(
                {
                    "fraction": fraction,
                    "new_rows": len(new),
                    "append_s": append_s,
                    "rewrite_s": rewrite_s,
                    "rewrite_over_append": rewrite_s / append_s,
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    document = {"rows": args.rows, "initial_write_s": initial, "results": results}
    (out / "append.json").write_text(json.dumps(document, indent=1))
    view = Table(
        title=f"append vs rewrite, dataset of {args.rows:,} rows ({initial:.2f} s to write)"
    )
    for name in ("new rows", "append s", "rewrite s", "rewrite ÷ append"):
        view.add_column(name, justify="right")
    for r in results:
        view.add_row(
            f"{r['new_rows']:,} ({r['fraction']:.0%})",
            f"{r['append_s']:.3f}",
            f"{r['rewrite_s']:.3f}",
            f"{r['rewrite_over_append']:.1f}",
        )
    Console().print(view)


if __name__ == "__main__":
    main()
