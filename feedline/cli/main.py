"""The ``feedline`` command: inspect, convert, verify, history, stats, bench-loader, doctor and
demo.

The parser lives here; each subcommand's work is in :mod:`feedline.cli.commands`, the
argument types (each refusing a bad value with a fix) in :mod:`feedline.cli.arguments`, and the
printing (inert text, human-readable numbers) in :mod:`feedline.cli.text`. Everything
printed that came from data goes through :func:`~feedline.ui.inert_text.safe_text` first, so
a hostile manifest cannot drive the terminal (escape sequences, bidi overrides) or inject
Rich markup.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from feedline._version import __version__
from feedline.cli import commands
from feedline.cli.arguments import (
    HelpFormatter,
    Parser,
    column_list,
    delimiter,
    image_size,
    non_negative_float,
    positive_int,
)
from feedline.cli.text import print_error
from feedline.errors import FeedlineError
from feedline.settings import config
from feedline.store.shards import PARQUET_CODECS

__all__ = ["build_parser", "main"]

_STORAGE_HELP = (
    "fsspec storage option for remote URLs (repeatable; dotted keys nest, values may be "
    "JSON), e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000"
)


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE", help=_STORAGE_HELP)


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bar")


_DESCRIPTION = """\
feedline: turn raw data into training-ready datasets and feed training loops.

  feedline convert images/ train/ --decode --resize 64x64   # a folder of images
  feedline convert data.csv train/ --delimiter ';'          # CSV, JSON lines, Parquet, text
  feedline inspect train/                                   # schema, rows, shards, lineage
  feedline verify train/                                    # every shard's checksum
  feedline history train/                                   # versions: time, operation, rows
  feedline stats train/ --html report.html                  # statistics, drift (--against)
  feedline bench-loader train/ --step-ms 20                 # loader throughput and data wait
  feedline doctor train/ --step-ms 20                       # which loader stage is slow, the fix

Run `feedline COMMAND --help` for the options of each command.
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``feedline`` command (every argument has a help text).

    Examples
    --------
    >>> build_parser().parse_args(["inspect", "train/"]).max_shards
    20
    """
    parser = Parser(prog="feedline", description=_DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument(
        "-V",
        "--version",
        action="version",
        version=f"feedline {__version__}",
        help="print feedline's version and exit",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log what feedline does on standard error (-v: info, -vv: debug)",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (each takes --help)"
    )
    defaults = HelpFormatter

    p = sub.add_parser(
        "inspect",
        formatter_class=defaults,
        help="schema, rows, shards, sizes and lineage of a dataset",
        description="Show a dataset's schema, rows, shards, sizes and lineage.",
    )
    p.add_argument("path", help="a feedline dataset or Parquet folder (path or fsspec URL)")
    p.add_argument(
        "--max-shards", type=positive_int, default=20, metavar="N", help="list at most N shards"
    )
    _add_storage_option(p)
    p.set_defaults(run=commands.cmd_inspect)

    p = sub.add_parser(
        "convert",
        formatter_class=defaults,
        help="convert csv/jsonl/parquet/images/text to a feedline dataset",
        description="Read files and write them as a feedline dataset.",
    )
    p.add_argument("src", help="input file, folder, glob or fsspec URL")
    p.add_argument("dst", help="output dataset folder or fsspec URL")
    p.add_argument(
        "--format",
        choices=commands.READERS,
        default=None,
        help="input format (guessed from the path when omitted)",
    )
    p.add_argument(
        "--rows-per-shard",
        type=positive_int,
        default=None,
        metavar="N",
        help="rows in each output shard (default: about 1 GB per shard)",
    )
    p.add_argument(
        "--compression",
        default="zstd",
        choices=PARQUET_CODECS,
        help="Parquet compression codec of the shards",
    )
    p.add_argument(
        "--delimiter",
        type=delimiter,
        default=None,
        metavar="CHAR",
        help="CSV field separator: one character, or tab, comma, semicolon, pipe, "
        "space (default: ',', a tab for .tsv files)",
    )
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default=None,
        help="bad CSV rows or undecodable images: stop with an error naming them "
        "(raise, the default) or drop and count them (skip)",
    )
    images = p.add_argument_group("images (with --format images or a folder of images)")
    images.add_argument(
        "--decode",
        action="store_true",
        help="store decoded uint8 pixels (fl.DecodeImages) instead of the "
        "encoded files; implied by the options below",
    )
    images.add_argument(
        "--resize",
        type=image_size,
        default=None,
        metavar="WxH",
        help="decoded size, WIDTHxHEIGHT or one number for a square "
        "(default with --decode: 224x224)",
    )
    images.add_argument(
        "--resize-mode",
        choices=("shorter+center_crop", "stretch"),
        default=None,
        help="keep the aspect ratio and crop the centre "
        "(shorter+center_crop, the default) or stretch to the size",
    )
    images.add_argument(
        "--image-mode",
        choices=("RGB", "L", "RGBA"),
        default=None,
        help="channels of the decoded pixels (default: RGB)",
    )
    images.add_argument(
        "--layout",
        choices=("HWC", "CHW"),
        default=None,
        help="pixel order: HWC (NumPy, TF, JAX; the default) or CHW (PyTorch)",
    )
    _add_quiet(p)
    _add_storage_option(p)
    p.set_defaults(run=commands.cmd_convert)

    p = sub.add_parser(
        "verify",
        formatter_class=defaults,
        help="check every shard against the manifest's checksums",
        description="Read every shard and check it against the manifest.",
    )
    p.add_argument("path", help="a feedline dataset (path or fsspec URL)")
    _add_quiet(p)
    _add_storage_option(p)
    p.set_defaults(run=commands.cmd_verify)

    p = sub.add_parser(
        "history",
        formatter_class=defaults,
        help="the retained versions of a dataset: time, operation, rows",
        description="List the retained versions of a feedline dataset, oldest first: id, "
        "commit time (UTC), operation, rows, shards and size. Open one with "
        "fl.open(path, version=N) or as_of=datetime; fl.vacuum drops old ones.",
    )
    p.add_argument("path", help="a feedline dataset (path or fsspec URL)")
    p.add_argument(
        "--json", action="store_true", help="print the versions as a JSON list instead of a table"
    )
    _add_storage_option(p)
    p.set_defaults(run=commands.cmd_history)

    p = sub.add_parser(
        "bench-loader",
        formatter_class=defaults,
        help="samples/s and data wait of the training loader",
        description="Run the training loader over a dataset with a simulated "
        "training step; report throughput, time to first batch and data wait.",
    )
    p.add_argument("path", help="a feedline dataset or Parquet folder (path or fsspec URL)")
    p.add_argument(
        "--batch-size", type=positive_int, default=256, metavar="N", help="samples per batch"
    )
    p.add_argument(
        "--step-ms",
        type=non_negative_float,
        default=0.0,
        metavar="MS",
        help="simulated training step after each batch, in milliseconds",
    )
    p.add_argument("--epochs", type=positive_int, default=1, metavar="N", help="epochs to run")
    p.add_argument(
        "--columns",
        type=column_list,
        default=None,
        metavar="A,B",
        help="comma-separated columns to load (default: all)",
    )
    p.add_argument(
        "--format",
        choices=("torch", "numpy"),
        default="torch",
        help="what batches hold: torch tensors or NumPy arrays",
    )
    p.add_argument(
        "--chart",
        default=None,
        metavar="PNG",
        help="also write a PNG of throughput and data wait (feedline[plots])",
    )
    _add_storage_option(p)
    p.set_defaults(run=commands.cmd_bench_loader)

    p = sub.add_parser(
        "doctor",
        formatter_class=defaults,
        help="why the training loop would wait for data, and what to change",
        description="Run the training loader over a dataset against a simulated training "
        "step for a few seconds; say whether training would wait for data, which loader stage "
        "bounds throughput (per-stage times) and which option to change.",
    )
    p.add_argument("path", help="a feedline dataset or Parquet folder (path or fsspec URL)")
    p.add_argument(
        "--step-ms",
        type=non_negative_float,
        default=0.0,
        metavar="MS",
        help="the training step per batch to simulate, in milliseconds",
    )
    p.add_argument(
        "--transform",
        default=None,
        metavar="MODULE:FN",
        help="the loader's per-sample transform, fn(sample, rng) -> dict, imported from "
        "MODULE (the current folder is importable)",
    )
    p.add_argument(
        "--batch-size", type=positive_int, default=256, metavar="N", help="samples per batch"
    )
    p.add_argument(
        "--num-workers", type=int, default=0, metavar="N", help="the transform's workers"
    )
    p.add_argument(
        "--worker-type",
        choices=("thread", "process"),
        default="thread",
        help="what runs the transform: threads or processes",
    )
    p.add_argument("--prefetch", type=int, default=2, metavar="N", help="batches kept ready ahead")
    p.add_argument(
        "--cache",
        choices=("auto", "memory", "node", "none"),
        default="auto",
        help="how the loader holds the data (memory, one per-machine file, or streaming)",
    )
    p.add_argument(
        "--columns",
        type=column_list,
        default=None,
        metavar="A,B",
        help="comma-separated columns to load (default: all)",
    )
    p.add_argument(
        "--seconds",
        type=non_negative_float,
        default=5.0,
        metavar="S",
        help="how long to run the loader",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="also run the loader with the suggested change and report the measured speed-up",
    )
    p.add_argument(
        "--chart",
        default=None,
        metavar="PNG",
        help="also write a PNG of the stage times against the step (feedline[plots])",
    )
    _add_storage_option(p)
    p.set_defaults(run=commands.cmd_doctor)

    p = sub.add_parser(
        "stats",
        formatter_class=defaults,
        help="column statistics; with --against, drift from a reference",
        description="Column statistics of a dataset or files; with --against, "
        "drift from a reference (KS and PSI).",
    )
    p.add_argument("path", help="a dataset, or files any reader takes (path or fsspec URL)")
    p.add_argument(
        "--columns",
        type=column_list,
        default=None,
        metavar="A,B",
        help="comma-separated column names (default: all)",
    )
    p.add_argument(
        "--json", default=None, metavar="FILE", help="also write the statistics to this JSON file"
    )
    p.add_argument(
        "--html", default=None, metavar="FILE", help="also write an HTML page with histograms"
    )
    p.add_argument(
        "--against", default=None, metavar="REF", help="reference dataset to check drift against"
    )
    p.add_argument("--fail-on-drift", action="store_true", help="exit with 1 when a column drifted")
    p.add_argument("--recompute", action="store_true", help="ignore statistics in the manifest")
    _add_storage_option(p)
    p.set_defaults(run=commands.cmd_stats)

    p = sub.add_parser(
        "demo",
        formatter_class=defaults,
        help="the end-to-end demo: preprocess, train, infer, track",
        description="Generate data, preprocess it, train two models through "
        "the loader, run batch inference and track it all in MLflow.",
    )
    p.add_argument(
        "--out",
        "--output",
        dest="out",
        default="demo-output",
        metavar="DIR",
        help="folder for the datasets, models and MLflow store",
    )
    p.add_argument(
        "--engine",
        choices=["local", "spark", "ray"],
        default="local",
        help="engine of the preprocessing writes",
    )
    p.add_argument(
        "--size",
        choices=["small", "full"],
        default="full",
        help="small: a quick run; full: the whole demo",
    )
    p.add_argument(
        "--rows",
        type=positive_int,
        default=None,
        metavar="N",
        help="catalog products (overrides --size)",
    )
    p.add_argument(
        "--epochs", type=positive_int, default=None, metavar="N", help="epochs (overrides --size)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the data and training")
    p.set_defaults(run=commands.cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``feedline`` command; returns the exit status.

    A bad argument exits with status 2 (``SystemExit``), as does any
    :class:`~feedline.errors.FeedlineError`, whose message is printed as
    ``error: Kind: what. Fix: how.``.
    """
    args = build_parser().parse_args(argv)
    console = Console()
    verbosity = config.verbosity
    if args.verbose:
        config.verbosity = "debug" if args.verbose > 1 else "info"
    try:
        return int(args.run(args, console) or 0)
    except FeedlineError as exc:
        print_error(type(exc).__name__, str(exc))
        return 2
    finally:
        config.verbosity = verbosity


def _entry() -> Any:  # pragma: no cover - console script
    sys.exit(main())
