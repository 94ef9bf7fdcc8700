"""What progress bars cost: write, fit and the loader's cache fill with bars on vs off.

Bars are drawn to an in-memory terminal (``Console(force_terminal=True)``), so rich renders
them exactly as on a real terminal. Runs alternate on/off; the medians and their ratio are
printed (1.00 = no cost).

Run: ``.venv/bin/python bench/progress.py [--rows 4000000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable

from rich.console import Console

import feedline as fl


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000, help="rows of the int64 dataset")
    parser.add_argument("--repeat", type=int, default=5, help="runs per setting")
    args = parser.parse_args()
    fl.config.console = Console(file=io.StringIO(), force_terminal=True)
    folder = tempfile.mkdtemp()
    src = f"{folder}/src"
    fl.range(args.rows).write(src, rows_per_shard=args.rows // 8, row_group_rows=20_000)
    cases: dict[str, Callable[[bool], object]] = {
        "write": lambda on: fl.open(src).write(tempfile.mkdtemp(dir=folder), progress=on),
        "fit": lambda on: fl.StandardScaler("id").fit(fl.open(src), progress=on),
        "cache fill": lambda on: next(
            iter(fl.open(src).loader(batch_size=1024, cache="memory", format="numpy"))
        ),
    }
    print(f"{'call':<12}{'off s':>9}{'on s':>9}{'on/off':>9}")
    for name, case in cases.items():
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeat):
            for on in (False, True):
                fl.config.progress = on  # the cache fill has no per-call switch
                seconds[on].append(timed(lambda on=on, case=case: case(on)))
        fl.config.progress = None
        off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
        print(f"{name:<12}{off:>9.3f}{on:>9.3f}{on / off:>9.2f}")


if __name__ == "__main__":
    main()
