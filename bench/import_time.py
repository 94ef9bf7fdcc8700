"""What ``import feedline`` costs: wall time (``python -X importtime``) and what it loads.

Each run is a fresh interpreter; the figure is the median of ``--runs`` cumulative times of
the ``feedline`` entry of ``-X importtime``, plus the modules the import added to
``sys.modules`` (feedline's own, and the third-party top-level packages).

    python bench/import_time.py                      # this checkout
    git worktree add /tmp/before 810603e             # the layout before the "One house" move
    python bench/import_time.py --tree /tmp/before   # that checkout, same interpreter
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--runs", type=int, default=9)
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
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
