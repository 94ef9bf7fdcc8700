"""``num_workers="auto"`` / ``prefetch="auto"`` against hand-picked settings (issue 28).

Two cases, each a grid of fixed ``num_workers`` x ``prefetch`` settings
and ``"auto"`` for both, run side by side in this one process, ``--rounds`` times round-robin
(a busy machine slows whichever runs at the time; the table shows each setting's median):

* ``J``: bench/loader.py's case J (real-size JPEGs, decode + RandomResizedCrop(224) + flip,
  ``feedline.preprocess.vision.augment``), thread workers, batches of ``--batch`` images;
* ``P``: a Python-heavy per-sample transform (a pure-Python loop, ~0.1 ms a sample: it holds
  the GIL), process workers, over ``fl.range``.

Each run is a fresh loader iterated epoch after epoch for ``--seconds`` from its first batch
(the cache fill and the workers' start are left out for every setting alike), with a loop
that does nothing (data-bound: the best setting is the fastest). Two rates: over the whole
run (auto's convergence included) and over its second half (steady state). The figure of
merit is auto / the best fixed setting (goal: at least 0.9): the ratio of the medians, and,
less sensitive to slow swings of the machine's load, the median over the rounds of auto's
rate over each setting's in the same round (the lowest of the settings shown). What the
meters that feed the tuner cost is ``bench/profile_overhead.py``'s.

Run: ``python bench/autotune.py [--seconds 12] [--rounds 2] [--images 2000] [--cases JP]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import feedline as fl
from feedline.host import cpus_available

HERE = Path(__file__).resolve().parent
WORKERS = (1, 2, 3)
PREFETCH = (2, 8)


def bench_loader() -> Any:
    """bench/loader.py as a module (its case J: data, pipeline)."""
    spec = importlib.util.spec_from_file_location("bench_loader", HERE / "loader.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_loader"] = module
    spec.loader.exec_module(module)
    return module


def python_heavy(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A pure-Python loop (holds the GIL), about 0.1 ms a sample."""
    total, x = 0, int(sample["id"])
    for i in range(1500):
        total += (x * i) % 7
    return {"id": sample["id"], "v": total + rng.random()}


def timed(make: Callable[[], fl.Loader], seconds: float) -> dict[str, Any]:
    """Iterate a fresh loader for ``seconds`` from its first batch: samples/s overall and
    over the second half; the autotuner's report."""
    loader = make()
    stamps: list[tuple[float, int]] = []
    try:
        first = None
        while first is None or stamps[-1][0] - first < seconds:
            for batch in loader:
                now = time.perf_counter()
                n = len(next(iter(batch.values())))
                if first is None:
                    first = now
                    continue
                stamps.append((now, n))
                if now - first >= seconds:
                    break
        report = loader.stats().get("autotune")
    finally:
        loader.close()
    assert first is not None
    end = stamps[-1][0]
    half = first + (end - first) / 2
    late = [n for t, n in stamps if t > half]
    return {"all": sum(n for _, n in stamps) / (end - first),
            "steady": sum(late) / (end - half), "autotune": report}  # fmt: skip


def tune_part(args: argparse.Namespace) -> None:
    cases: dict[str, tuple[Callable[..., fl.Loader], str]] = {}
    if "J" in args.cases:
        bl = bench_loader()
        spec = bl.j_spec(Path(args.work), args.images)
        bl.j_make_data(spec)
        ds = fl.open(spec["dir"])

        def j_loader(**knobs: Any) -> fl.Loader:
            return ds.loader(batch_size=args.batch, seed=0, format="torch",
                             transform=bl.j_pipeline(), worker_type="thread", **knobs)  # fmt: skip

        cases["J"] = (j_loader, f"{args.images} JPEGs, thread workers")
    if "P" in args.cases:
        rows = fl.range(200_000)

        def p_loader(**knobs: Any) -> fl.Loader:
            return rows.loader(batch_size=args.batch, seed=0, format="numpy",
                               transform=python_heavy, worker_type="process", **knobs)  # fmt: skip

        cases["P"] = (p_loader, "Python-heavy transform, process workers")
    settings: list[dict[str, Any]] = [
        {"num_workers": w, "prefetch": p} for w in WORKERS for p in PREFETCH
    ] + [{"num_workers": "auto", "prefetch": "auto"}]
    print(f"CPUs available: {cpus_available()}; batch {args.batch}; {args.seconds:.0f} s a run; "
          f"{args.rounds} rounds round-robin", flush=True)  # fmt: skip
    for name, (make, what) in cases.items():
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for knobs in settings:
                key = f"{knobs['num_workers']}/{knobs['prefetch']}"
                result = timed(lambda k=knobs, m=make: m(**k), args.seconds)
                runs.setdefault(key, []).append(result)
                print(f"  {name} {key:10} {result['all']:10,.0f} {result['steady']:10,.0f}",
                      flush=True)  # fmt: skip
        print(f"\ncase {name}: {what}\n")
        print("| num_workers / prefetch | samples/s (whole run) | samples/s (second half) |")
        print("|---|---:|---:|")
        medians = {k: {m: statistics.median(r[m] for r in v) for m in ("all", "steady")}
                   for k, v in runs.items()}  # fmt: skip
        for key, m in medians.items():
            print(f"| {key} | {m['all']:,.0f} | {m['steady']:,.0f} |")
        fixed = {k: m for k, m in medians.items() if not k.startswith("auto")}
        cpus = cpus_available()
        within = {k: m for k, m in fixed.items() if int(k.split("/")[0]) <= cpus}
        print()
        for metric in ("all", "steady"):
            for label, pool in (("any setting", fixed), (f"num_workers <= {cpus} CPUs", within)):
                best = max(pool, key=lambda k, p=pool, m=metric: p[k][m])
                ratio = medians["auto/auto"][metric] / pool[best][metric]
                print(f"auto / best of {label} ({best}), {metric}: **{ratio:.2f}**")
        for metric in ("all", "steady"):  # paired: auto against each setting in its round
            paired = {k: statistics.median(a[metric] / f[metric] for a, f in
                                           zip(runs["auto/auto"], v, strict=True))
                      for k, v in runs.items() if not k.startswith("auto")}  # fmt: skip
            worst = min(paired, key=lambda k, p=paired: p[k])
            print(
                f"auto / {worst}, the median of the rounds' ratios (the lowest of the "
                f"settings), {metric}: **{paired[worst]:.2f}**; each setting: "
                + ", ".join(f"{k} {v:.2f}" for k, v in paired.items())
            )
        for r in runs["auto/auto"]:
            t = r["autotune"]
            changes = [(d["batch"], d["knob"], d["old"], d["new"]) for d in t["history"]
                       if d["old"] != d["new"]]  # fmt: skip
            print(
                f"auto picked num_workers={t['num_workers']}, prefetch={t['prefetch']} after "
                f"{t['batches_seen']} batches; changes (batch, knob, old, new): {changes}"
            )
        print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="JP", help="tuning cases: J, P or JP")
    parser.add_argument("--seconds", type=float, default=12.0, help="seconds a tuning run")
    parser.add_argument("--rounds", type=int, default=2, help="tuning rounds round-robin")
    parser.add_argument("--batch", type=int, default=64, help="tuning cases' batch size")
    parser.add_argument("--images", type=int, default=2000, help="case J: JPEGs")
    parser.add_argument("--work", default="/tmp/feedline-bench-loader", help="data folder")
    args = parser.parse_args()
    tune_part(args)


if __name__ == "__main__":
    main()
