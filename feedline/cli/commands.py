"""What each ``feedline`` subcommand does once its arguments are parsed.

Each ``cmd_*`` takes the parsed arguments and a Rich console and returns the exit status;
errors are :class:`~feedline.errors.FeedlineError` subclasses that :func:`feedline.cli.main.main`
prints. Everything printed that came from data goes through
:func:`~feedline.ui.inert_text.safe_text`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

import feedline as fl
from feedline.cli.bench_loader import bench_loader
from feedline.cli.doctor import doctor
from feedline.cli.text import count, percent, rate, safe_table, seconds, size
from feedline.demo import run_demo
from feedline.errors import ConfigurationError, FeedlineError
from feedline.io.image_folders import IMAGE_SUFFIXES
from feedline.io.storage.paths import parse_storage_options, resolve
from feedline.preprocess.vision.preprocessors import DecodeImages
from feedline.statistics.compute import stats, stored_stats
from feedline.statistics.drift import compare
from feedline.statistics.html_page import write_html
from feedline.store.dataset_files import read_manifest, verify_manifest
from feedline.store.versions import history
from feedline.ui.inert_text import safe_text

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.statistics.result import Stats

__all__ = [
    "READERS",
    "cmd_bench_loader",
    "cmd_convert",
    "cmd_demo",
    "cmd_doctor",
    "cmd_history",
    "cmd_inspect",
    "cmd_stats",
    "cmd_verify",
]

READERS = ("csv", "images", "jsonl", "parquet", "text")


def guess_format(path: str) -> str:
    """The reader for ``path``, from its suffix or the files in the folder."""
    lower = path.lower().rstrip("/")
    for suffix, name in (
        (".csv", "csv"),
        (".csv.gz", "csv"),
        (".tsv", "csv"),
        (".tsv.gz", "csv"),
        (".jsonl", "jsonl"),
        (".ndjson", "jsonl"),
        (".json", "jsonl"),
        (".txt", "text"),
        (".parquet", "parquet"),
    ):
        if lower.endswith(suffix):
            return name
    if os.path.isdir(path):
        names = [n.lower() for _, _, files in os.walk(path) for n in files]
        for name in ("csv", "jsonl", "parquet"):
            if any(n.endswith("." + name) for n in names):
                return name
        if any(n.endswith((".tsv", ".tsv.gz")) for n in names):
            return "csv"

        if any(n.endswith(IMAGE_SUFFIXES) for n in names):
            return "images"
    return "parquet"


def read(
    fmt: str, src: str, storage_options: dict[str, Any] | None = None, **options: Any
) -> Dataset:
    """``fl.read_<fmt>(src, ...)``."""

    readers: dict[str, Callable[..., Dataset]] = {
        "parquet": fl.read_parquet,
        "csv": fl.read_csv,
        "jsonl": fl.read_jsonl,
        "images": fl.read_images,
        "text": fl.read_text,
    }
    reader = readers[fmt]
    return reader(src, storage_options=storage_options, **options)


def storage(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``--storage-option KEY=VALUE`` pairs as ``storage_options`` (None when none)."""

    return parse_storage_options(getattr(args, "storage_option", None)) or None


def cmd_inspect(args: argparse.Namespace, console: Console) -> int:

    ds = fl.open(args.path, storage_options=storage(args))
    manifest = ds.manifest
    schema = ds.schema()
    summary = Table(title=safe_text(f"feedline dataset: {args.path}"), show_header=False)
    summary.add_column("key", style="bold")
    summary.add_column("value", overflow="fold")
    if manifest is not None:
        summary.add_row("rows", count(manifest.rows))
        summary.add_row("shards", count(len(manifest.shards)))
        summary.add_row("row groups", count(len(manifest.row_group_sizes)))
        summary.add_row("size", size(manifest.bytes))
        summary.add_row("format version", safe_text(manifest.format_version))
        summary.add_row("created", safe_text(manifest.created))
        for key in (
            "source",
            "source_fingerprint",
            "plan_fingerprint",
            "engine",
            "feedline_version",
        ):
            if key in manifest.lineage:
                summary.add_row(f"lineage.{key}", safe_text(manifest.lineage[key]))
        if manifest.lineage.get("plan"):
            plan = manifest.lineage["plan"]
            steps = plan if isinstance(plan, list) else [plan]
            summary.add_row("lineage.plan", safe_text(" -> ".join(map(str, steps))))
        skipped = manifest.write.get("report", {}).get("records_skipped", 0)
        summary.add_row(
            "records skipped at write",
            count(skipped) if isinstance(skipped, int) else safe_text(skipped),
        )
    else:
        summary.add_row("rows", count(ds.count()))
        summary.add_row("manifest", "none (plain Parquet folder)")
    console.print(summary)
    fields = Table(title="schema")
    fields.add_column("column", style="bold")
    fields.add_column("type")
    fields.add_column("nullable")
    for field in schema:
        fields.add_row(safe_text(field.name), safe_text(field.type), str(field.nullable))
    console.print(fields)
    if manifest is not None:
        shards = Table(title="shards")
        shards.add_column("path")
        for name in ("rows", "size", "row groups"):
            shards.add_column(name, justify="right")
        shards.add_column("checksum")
        for shard in manifest.shards[: args.max_shards]:
            shards.add_row(
                safe_text(shard.path),
                count(shard.rows),
                size(shard.bytes),
                count(len(shard.row_groups)),
                safe_text(shard.checksum[:23] + "…"),
            )
        if len(manifest.shards) > args.max_shards:
            more = len(manifest.shards) - args.max_shards
            shards.add_row(f"… {count(more)} more", "", "", "", "")
        console.print(shards)
    return 0


def cmd_history(args: argparse.Namespace, console: Console) -> int:
    """``feedline history PATH``: the retained versions, oldest first (as
    :func:`feedline.history`), as a table or, with ``--json``, one JSON list."""
    versions = history(args.path, storage_options=storage(args))
    if args.json:
        console.print_json(json.dumps([v.as_dict() for v in versions]))
        return 0
    table = Table(title=safe_text(f"versions of {args.path}"))
    table.add_column("version", justify="right", style="bold")
    table.add_column("time (UTC)")
    table.add_column("operation")
    for name in ("rows", "shards", "size"):
        table.add_column(name, justify="right")
    table.add_column("current")
    for v in versions:
        table.add_row(
            count(v.version),
            safe_text(v.time.strftime("%Y-%m-%d %H:%M:%S")),
            safe_text(v.operation),
            count(v.rows),
            count(v.shards),
            size(v.bytes),
            "yes" if v.current else "",
        )
    console.print(table)
    return 0


#: the ``convert`` options that only some inputs take
_CSV_ONLY = ("--delimiter",)
_DECODE_ONLY = ("--resize", "--image-mode", "--resize-mode", "--layout")


def _convert_options(fmt: str, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The reader's keyword arguments and the image decoder (or None) ``convert`` asks for."""
    given = {
        "--delimiter": args.delimiter, "--on-error": args.on_error,
        "--decode": args.decode or None, "--resize": args.resize,
        "--image-mode": args.image_mode, "--resize-mode": args.resize_mode,
        "--layout": args.layout,
    }  # fmt: skip
    applies = {
        "csv": {*_CSV_ONLY, "--on-error"},
        "images": {"--decode", *_DECODE_ONLY, "--on-error"},
    }.get(fmt, set())
    wrong = [name for name, value in given.items() if value is not None and name not in applies]
    if wrong:
        raise ConfigurationError(
            f"{', '.join(wrong)} do(es) not apply to {fmt} input: --delimiter is for CSV, "
            "--decode, --resize, --image-mode, --resize-mode and --layout for images, "
            "--on-error for both. Fix: drop them, or pass --format csv / --format images "
            "if the input's format was guessed wrong."
        )
    decode = args.decode or any(given[name] is not None for name in _DECODE_ONLY)
    if fmt == "images" and args.on_error is not None and not decode:
        raise ConfigurationError(
            "--on-error applies to images only when they are decoded (undecodable files are "
            "found then). Fix: add --decode (and --resize WIDTHxHEIGHT), or drop --on-error."
        )
    if fmt == "csv":
        options: dict[str, Any] = {"on_error": args.on_error or "raise"}
        if args.delimiter is not None or args.src.lower().rstrip("/").endswith((".tsv", ".tsv.gz")):
            options["delimiter"] = args.delimiter or "\t"
        return options, None
    if decode:
        return {}, DecodeImages(
            "bytes",
            size=args.resize or (224, 224),
            mode=args.image_mode or "RGB",
            resize=args.resize_mode or "shorter+center_crop",
            layout=args.layout or "HWC",
            on_error=args.on_error or "raise",
        )
    return {}, None


def cmd_convert(args: argparse.Namespace, console: Console) -> int:
    fmt = args.format or guess_format(args.src)
    options, decoder = _convert_options(fmt, args)
    ds = read(fmt, args.src, storage(args), **options)
    total = ds.count() if fmt in ("parquet", "images") else None
    if decoder is not None:
        ds = ds.transform(decoder)
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,} rows"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=args.quiet,
    ) as progress:
        task = progress.add_task(f"{fmt} → feedline", total=total)
        info = ds.write(
            args.dst,
            rows_per_shard=args.rows_per_shard,
            compression=args.compression,
            on_rows=lambda n: progress.advance(task, n),
            storage_options=storage(args),
            progress=False,  # this command draws its own bar
        )
    console.print(
        Text.assemble(
            f"Wrote {count(info.rows)} rows in {count(info.shards)} shard(s), {size(info.bytes)}, "
            f"in {seconds(info.seconds)} ({rate(info.rows_per_second, 'rows')}) → ",
            safe_text(info.path),
            style="green",
        )
    )
    skipped = info.report.get("records_skipped", 0)
    if skipped:
        console.print(
            safe_text(
                f"{count(skipped)} record(s) skipped; see `feedline inspect {args.dst}`",
                style="yellow",
            )
        )
    return 0


def cmd_verify(args: argparse.Namespace, console: Console) -> int:

    target = resolve(args.path, storage(args))
    manifest = read_manifest(target)
    if manifest is None:
        raise FeedlineError(
            f"{args.path!r} has no feedline manifest, so there is nothing to "
            "verify. Fix: point at a dataset written by feedline."
        )
    with Progress(
        TextColumn("verifying"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} shards"),
        console=console,
        disable=args.quiet,
    ) as progress:
        task = progress.add_task("verify", total=len(manifest.shards))
        verify_manifest(target, manifest, on_shard=lambda _s: progress.advance(task))
    console.print(
        safe_text(
            f"OK: {count(len(manifest.shards))} shard(s), {count(manifest.rows)} rows, "
            f"{size(manifest.bytes)}, checksums match",
            style="green",
        )
    )
    return 0


#: how ``bench-loader`` shows each figure of :func:`~feedline.cli.bench_loader.bench_loader`
BENCH_ROWS: dict[str, tuple[str, Any]] = {
    "samples": ("samples", count),
    "batches": ("batches", count),
    "seconds": ("wall time", seconds),
    "first_batch_s": ("time to first batch", seconds),
    "samples_per_s": ("throughput after the first batch", lambda v: rate(v, "samples")),
    "samples_per_s_total": ("throughput over the run", lambda v: rate(v, "samples")),
    "wait_s": ("data wait after the first batch", seconds),
    "wait_fraction": ("data wait share of step time", percent),
    "wait_fraction_total": ("data wait share over the run", percent),
    "step_ms": ("simulated training step", lambda v: seconds(v / 1000)),
    "cache": ("cache", str),
    "cache_bytes": ("cache size", size),
    "peak_rss_bytes": ("peak memory (RSS)", size),
    "chart": ("chart", str),
}


def cmd_bench_loader(args: argparse.Namespace, console: Console) -> int:

    result = bench_loader(
        args.path,
        batch_size=args.batch_size,
        step_ms=args.step_ms,
        epochs=args.epochs,
        chart=args.chart,
        storage_options=storage(args),
        columns=args.columns,
        format=args.format,
    )
    table = Table(title=safe_text(f"loader benchmark: {args.path}"))
    table.add_column("measure", style="bold")
    table.add_column("value", justify="right")
    for key, value in result.items():
        label, show = BENCH_ROWS.get(key, (key, str))
        table.add_row(safe_text(label), safe_text("" if value is None else show(value)))
    console.print(table)
    return 0


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    found, chart = doctor(
        args.path, step_ms=args.step_ms, transform=args.transform, seconds=args.seconds or 5.0,
        chart=args.chart, verify=args.verify, storage_options=storage(args),
        batch_size=args.batch_size, num_workers=args.num_workers, worker_type=args.worker_type,
        prefetch=args.prefetch, cache=args.cache, columns=args.columns, format="numpy",
    )  # fmt: skip
    console.print(safe_text(found.verdict, "bold"))
    for note in found.notes:
        console.print(safe_text(note))
    if found.measured is not None:
        console.print(safe_text(f"Measured with {found.change}: {found.measured:.2f}x samples/s."))
    console.print(found.profile.table())
    if chart is not None:
        console.print(safe_text(f"chart: {chart}"))
    return 0


def cmd_stats(args: argparse.Namespace, console: Console) -> int:
    columns = args.columns

    def load(path: str) -> Stats:
        fmt = guess_format(path)
        options = storage(args)
        ds = (
            fl.open(path, storage_options=options) if fmt == "parquet" else read(fmt, path, options)
        )
        found = None if args.recompute else stored_stats(ds, columns)
        if found is not None:
            console.print(safe_text(f"{path}: statistics stored in the manifest", style="dim"))
        return found if found is not None else stats(ds, columns)

    result = load(args.path)
    for table in result.tables():
        console.print(safe_table(table))
    document, status = result.to_dict(), 0
    if args.against:
        report = compare(result, load(args.against), columns=columns)
        console.print(safe_table(report.table()))
        drifted = report.drifted
        console.print(
            safe_text(
                f"DRIFT in {len(drifted)} of {len(report.columns)} column(s): {', '.join(drifted)}",
                style="bold red",
            )
            if drifted
            else safe_text(f"No drift in {len(report.columns)} column(s)", style="green")
        )
        document["drift"] = report.to_dict()
        status = 1 if drifted and args.fail_on_drift else 0
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=1, allow_nan=False)
        except OSError as exc:
            raise ConfigurationError(
                f"--json {args.json!r} cannot be written: {exc.strerror or exc}. Fix: name a "
                "file in a folder that exists and that you can write to."
            ) from exc
    if args.html:
        page = write_html(result, args.html, title=f"feedline statistics: {args.path}")
        console.print(safe_text(f"Wrote {page}", style="green"))
    return status


def cmd_demo(args: argparse.Namespace, console: Console) -> int:

    run_demo(
        args.out,
        engine=args.engine,
        size=args.size,
        epochs=args.epochs,
        catalog_rows=args.rows,
        seed=args.seed,
        console=console,
    )
    return 0
