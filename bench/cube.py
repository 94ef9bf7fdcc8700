"""The "speed cubing" workload: a (files, rows, columns) cube from many Parquet files.

Usage::

    .venv/bin/python bench/cube.py [--files 100] [--rows 2000] [--columns 400]
                                   [--take-rows 100] [--take-columns 100] [--repeat 5]

Writes ``--files`` Parquet files once under ``--root`` (``--rows`` x ``--columns`` float64,
snappy, pyarrow's default row groups: one per file here), draws ``--take-columns`` random
column names (seed 0), and builds the cube of every file's first ``--take-rows`` rows of
those columns, ``--repeat`` times per method, the methods interleaved in one process:

- ``pandas``: the article's approach: ``pd.read_parquet(f)`` per file,
  ``.iloc[:take_rows, cols].to_numpy()``, then ``np.stack``;
- ``pandas-columns``: the same, reading only the chosen columns
  (``pd.read_parquet(f, columns=names)``), a fairer baseline;
- ``feedline-C`` / ``feedline-F``: the recipe, ``fl.read_parquet(files).to_numpy(names,
  stack=True, per_file=True, rows=take_rows, order=...)``: the footers say which row groups
  hold the first rows, only those (and within them only the first pages) are decoded, files
  are read by the local engine's threads, each into its block of a preallocated cube
  (``order="F"``: each file's block column-major);
- ``all-rows-C`` / ``all-rows-F``: without ``per_file``: ``to_numpy(names, stack=True,
  order=...)`` of every row (files read in parallel, each into its slice), then each file's
  first rows cut out of the ``(files * rows, C)`` array.

Every cube is checked equal to the first pandas cube. Each method runs once untimed first
(imports, thread pools; the page cache is then warm), then reports the median cubes/s (one
cube = one pass over every file). Writes
``bench/out/cube.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import feedline as fl

OUT = Path(__file__).parent / "out" / "cube.json"


def make_input(folder: Path, files: int, rows: int, columns: int) -> list[str]:
    """``files`` Parquet files of ``rows`` x ``columns`` float64 (written once)."""
    marker = folder / f".shape-{files}-{rows}-{columns}"
    paths = [str(folder / f"part-{i:05d}.parquet") for i in range(files)]
    if marker.exists():
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*"):
        old.unlink()
    rng = np.random.default_rng(0)
    names = [f"c{j}" for j in range(columns)]
    for path in paths:
        data = rng.standard_normal((rows, columns))
        pq.write_table(pa.table(dict(zip(names, data.T, strict=True))), path)
    marker.touch()
    return paths


def pandas_cube(paths: list[str], names: list[str], take: int, *, prune: bool) -> np.ndarray:
    """The article's cube: read each file with pandas, slice, stack."""
    positions = None
    blocks = []
    for path in paths:
        frame = pd.read_parquet(path, columns=names if prune else None)
        if positions is None:
            positions = [frame.columns.get_loc(n) for n in names]
        blocks.append(frame.iloc[:take, positions].to_numpy())
    return np.stack(blocks)


def feedline_cube(paths: list[str], names: list[str], take: int, order: str) -> np.ndarray:
    """The recipe: one call, a preallocated cube filled file by file."""
    ds = fl.read_parquet(paths)
    cube = ds.to_numpy(names, stack=True, per_file=True, rows=take, order=order)  # type: ignore[arg-type]
    assert isinstance(cube, np.ndarray)
    return cube


def all_rows_cube(paths: list[str], names: list[str], take: int, order: str) -> np.ndarray:
    """Without ``per_file``: every row of the columns into one ``(files * rows, C)`` array,
    then each file's first rows cut out (files of equal length)."""
    flat = fl.read_parquet(paths).to_numpy(names, stack=True, order=order)  # type: ignore[arg-type]
    assert isinstance(flat, np.ndarray)
    return flat.reshape(len(paths), -1, len(names))[:, :take]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--columns", type=int, default=400)
    parser.add_argument("--take-rows", type=int, default=100)
    parser.add_argument("--take-columns", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--root", default="/tmp/feedline-cube")
    args = parser.parse_args()
    paths = make_input(Path(args.root), args.files, args.rows, args.columns)
    rng = np.random.default_rng(0)
    names = [f"c{j}" for j in rng.choice(args.columns, args.take_columns, replace=False)]
    take = args.take_rows
    methods: dict[str, Callable[[], np.ndarray]] = {
        "pandas": lambda: pandas_cube(paths, names, take, prune=False),
        "pandas-columns": lambda: pandas_cube(paths, names, take, prune=True),
        "feedline-C": lambda: feedline_cube(paths, names, take, "C"),
        "feedline-F": lambda: feedline_cube(paths, names, take, "F"),
        "all-rows-C": lambda: all_rows_cube(paths, names, take, "C"),
        "all-rows-F": lambda: all_rows_cube(paths, names, take, "F"),
    }
    reference = methods["pandas"]()  # also warms the page cache
    for build in methods.values():  # one untimed call each: imports, thread pools
        np.testing.assert_array_equal(build(), reference)
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeat):
        for name, build in methods.items():
            start = time.perf_counter()
            cube = build()
            seconds[name].append(time.perf_counter() - start)
            np.testing.assert_array_equal(cube, reference)
    size = sum(Path(p).stat().st_size for p in paths)
    print(
        f"{args.files} files of {args.rows} x {args.columns} float64 ({size / 1e6:.0f} MB); "
        f"cube {reference.shape}; median of {args.repeat}"
    )
    results = {}
    for name, times in seconds.items():
        median = statistics.median(times)
        results[name] = {"median_s": round(median, 4), "cubes_per_s": round(1 / median, 3)}
        print(f"{name:>15}: {median * 1000:8.1f} ms per cube, {1 / median:7.2f} cubes/s")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "files": args.files,
                "rows": args.rows,
                "columns": args.columns,
                "cube": list(reference.shape),
                "input_bytes": size,
                "repeat": args.repeat,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
