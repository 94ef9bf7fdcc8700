"""What ``import feedline`` costs: wall time (``python -X importtime``) and what it loads.

Each run is a fresh interpreter; the figure is the median of ``--runs`` cumulative times of
the ``feedline`` entry of ``-X importtime``, plus the modules the import added to
``sys.modules`` (feedline's own, and the third-party top-level packages).

    python bench/import_time.py                      # this checkout
    git worktree add /tmp/before 810603e             # the layout before the "One house" move
    python bench/import_time.py --tree /tmp/before   # that checkout, same interpreter

``--first-batch`` also times a training job's start in a fresh interpreter:
``from feedline.loader import Loader`` and the first batch of a loader over a written dataset
(100,000 rows x 8 float32 columns), with the feedline modules that start loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_LOADED = """
import json, sys
before = set(sys.modules)
import feedline
new = set(sys.modules) - before
own = sorted(m for m in new if m.split(".")[0] == "feedline")
third = sorted({m.split(".")[0] for m in new} - set(sys.stdlib_module_names) - {"feedline"}
               - {m for m in new if m.startswith("_")})
print(json.dumps({"feedline_modules": len(own), "third_party": third}))
"""


def _cumulative_us(tree: Path) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import feedline"],
        capture_output=True, text=True, env=env, cwd="/", check=True,
    )  # fmt: skip
    for line in out.stderr.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == "feedline":
            return int(parts[1])
    raise RuntimeError(f"no 'feedline' line in -X importtime output:\n{out.stderr[-2000:]}")


_FIRST_BATCH = """
import json, sys, time
start = time.perf_counter()
from feedline.loader import Loader
batch = next(iter(Loader(sys.argv[1], batch_size=256, seed=0, format="numpy")))
seconds = time.perf_counter() - start
own = sorted(m for m in sys.modules if m.split(".")[0] == "feedline")
layers = ("feedline.dataset", "feedline.readers", "feedline.engines", "feedline.relational",
          "feedline.plan", "feedline.in_memory")
above = [m for m in own if m.startswith(layers)]
print(json.dumps({"seconds": round(seconds, 3), "feedline_modules": len(own),
                  "dataset_reader_engine_or_plan_modules": above}))
"""


def _first_batch(tree: Path, runs: int) -> dict[str, object]:
    import tempfile

    import numpy as np
    import pyarrow as pa

    import feedline as fl

    folder = Path(tempfile.mkdtemp()) / "ds"
    columns = {
        f"x{i}": np.random.default_rng(i).random(100_000, dtype=np.float32) for i in range(8)
    }
    fl.from_arrow(pa.table(columns)).write(str(folder))
    env = dict(os.environ, PYTHONPATH=str(tree))
    results = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_BATCH, str(folder)],
            capture_output=True, text=True, env=env, cwd="/", check=True,
        )  # fmt: skip
        results.append(json.loads(out.stdout))
    seconds = sorted(float(r["seconds"]) for r in results)
    last = results[-1]
    return {
        "median_s": statistics.median(seconds),
        "feedline_modules": last["feedline_modules"],
        "dataset_reader_engine_or_plan_modules": len(last["dataset_reader_engine_or_plan_modules"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--first-batch", action="store_true")
    args = parser.parse_args()
    times = sorted(_cumulative_us(args.tree) for _ in range(args.runs))
    env = dict(os.environ, PYTHONPATH=str(args.tree))
    loaded = subprocess.run(
        [sys.executable, "-c", _LOADED], capture_output=True, text=True, env=env, cwd="/",
        check=True,
    )  # fmt: skip
    result = {
        "tree": str(args.tree),
        "median_ms": round(statistics.median(times) / 1000, 1),
        "min_ms": round(times[0] / 1000, 1),
        "max_ms": round(times[-1] / 1000, 1),
        **json.loads(loaded.stdout),
    }
    if args.first_batch:
        result["first_batch"] = _first_batch(args.tree, args.runs)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
