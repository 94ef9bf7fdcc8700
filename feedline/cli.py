"""The ``feedline`` command: inspect, convert, verify, bench-loader and demo.

Everything printed that came from data (column names, lineage, paths, statistics, error
messages) goes through :func:`safe_text` first, so a hostile manifest cannot drive the
terminal (escape sequences, bidi overrides) or inject Rich markup.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from feedline.errors import FeedlineError

__all__ = ["main"]

_READERS = {"parquet", "csv", "jsonl", "images", "text"}


def safe_text(value: object, style: str = "") -> Text:
    """``value`` as inert terminal text: shown as is, never driving the terminal.

    Every character Python does not call printable (C0/C1 controls such as ESC, BEL and
    NUL, bidi overrides, zero-width and other format characters, line separators) is shown
    as its Python escape (``\\x1b``, ``\\u202e``), and the result is a Rich ``Text``, so
    ``[bold]`` in data is never parsed as markup (nor ``:emoji:`` codes).

    Examples
    --------
    >>> print(safe_text("\\x1b]0;title\\x07[bold]x[/] \\u202egnp.exe").plain)
    \\x1b]0;title\\x07[bold]x[/] \\u202egnp.exe
    """
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return Text(text, style=style)


def _safe_table(table: Table) -> Table:
    """Make the plain strings of a table built elsewhere (statistics, drift) inert."""

    def inert(value: Any) -> Any:
        return safe_text(value) if isinstance(value, str) else value

    table.title, table.caption = inert(table.title), inert(table.caption)
    for column in table.columns:
        column.header, column.footer = inert(column.header), inert(column.footer)
        column._cells[:] = [inert(cell) for cell in column.cells]  # Rich's list of cells
    return table


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _guess_format(path: str) -> str:
    import os

    lower = path.lower().rstrip("/")
    for suffix, name in (
        (".csv", "csv"),
        (".csv.gz", "csv"),
        (".tsv", "csv"),
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
        from feedline.io.images import IMAGE_SUFFIXES

        if any(n.endswith(IMAGE_SUFFIXES) for n in names):
            return "images"
    return "parquet"


def _reader(fmt: str, src: str, storage_options: dict[str, Any] | None = None):
    import feedline as fl

    return {
        "parquet": fl.read_parquet,
        "csv": fl.read_csv,
        "jsonl": fl.read_jsonl,
        "images": fl.read_images,
        "text": fl.read_text,
    }[fmt](src, storage_options=storage_options)


def _storage(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``--storage-option KEY=VALUE`` pairs as ``storage_options`` (None when none)."""
    from feedline.io.storage import parse_storage_options

    return parse_storage_options(getattr(args, "storage_option", None)) or None


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option for remote URLs (repeatable; dotted keys nest, values "
        "may be JSON), e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000",
    )


def cmd_inspect(args: argparse.Namespace, console: Console) -> int:
    import feedline as fl

    ds = fl.open(args.path, storage_options=_storage(args))
    manifest = ds.manifest
    schema = ds.schema()
    summary = Table(title=safe_text(f"feedline dataset: {args.path}"), show_header=False)
    summary.add_column("key", style="bold")
    summary.add_column("value")
    if manifest is not None:
        summary.add_row("rows", f"{manifest.rows:,}")
        summary.add_row("shards", str(len(manifest.shards)))
        summary.add_row("row groups", str(len(manifest.row_group_sizes)))
        summary.add_row("bytes", _human(manifest.bytes))
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
        summary.add_row("records skipped at write", safe_text(skipped))
    else:
        summary.add_row("rows", f"{ds.count():,}")
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
        for name in ("path", "rows", "bytes", "row groups", "checksum"):
            shards.add_column(name)
        for shard in manifest.shards[: args.max_shards]:
            shards.add_row(
                safe_text(shard.path),
                f"{shard.rows:,}",
                _human(shard.bytes),
                str(len(shard.row_groups)),
                safe_text(shard.checksum[:23] + "…"),
            )
        if len(manifest.shards) > args.max_shards:
            shards.add_row(f"… {len(manifest.shards) - args.max_shards} more", "", "", "", "")
        console.print(shards)
    return 0


def cmd_convert(args: argparse.Namespace, console: Console) -> int:
    fmt = args.format or _guess_format(args.src)
    if fmt not in _READERS:
        raise FeedlineError(f"--format {fmt!r} is not known. Fix: use one of {sorted(_READERS)}.")
    ds = _reader(fmt, args.src, _storage(args))
    total = ds.count() if fmt in ("parquet", "images") else None
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
            storage_options=_storage(args),
        )
    console.print(Text.assemble(
        f"Wrote {info.rows:,} rows in {info.shards} shard(s), {_human(info.bytes)}, "
        f"in {info.seconds:.2f} s ({info.rows_per_second:,.0f} rows/s) → ", safe_text(info.path),
        style="green"))
    skipped = info.report.get("records_skipped", 0)
    if skipped:
        console.print(safe_text(f"{skipped} record(s) skipped; see `feedline inspect {args.dst}`",
                                style="yellow"))
    return 0


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from feedline.io.format import read_manifest, verify_manifest
    from feedline.io.storage import resolve

    target = resolve(args.path, _storage(args))
    manifest = read_manifest(target)
    if manifest is None:
        raise FeedlineError(
            f"{args.path!r} has no feedline manifest, so there is nothing to "
            "verify. Fix: point at a dataset written by feedline."
        )
    with Progress(
        TextColumn("verifying"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=console,
        disable=args.quiet,
    ) as progress:
        task = progress.add_task("verify", total=len(manifest.shards))
        verify_manifest(target, manifest, on_shard=lambda _s: progress.advance(task))
    console.print(safe_text(
        f"OK: {len(manifest.shards)} shard(s), {manifest.rows:,} rows, checksums match",
        style="green"))
    return 0


def cmd_bench_loader(args: argparse.Namespace, console: Console) -> int:
    from feedline.loader.bench import bench_loader

    result = bench_loader(
        args.path,
        batch_size=args.batch_size,
        step_ms=args.step_ms,
        epochs=args.epochs,
        chart=args.chart,
    )
    table = Table(title=safe_text(f"loader benchmark: {args.path}"))
    table.add_column("metric", style="bold")
    table.add_column("value")
    for key, value in result.items():
        table.add_row(safe_text(key),
                      safe_text(f"{value:,.3f}" if isinstance(value, float) else value))
    console.print(table)
    return 0


def cmd_stats(args: argparse.Namespace, console: Console) -> int:
    import json

    import feedline as fl
    from feedline.preprocess.drift import compare
    from feedline.preprocess.stats import stats, stored_stats

    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None

    def load(path: str):
        fmt = _guess_format(path)
        options = _storage(args)
        ds = (
            fl.open(path, storage_options=options)
            if fmt == "parquet"
            else _reader(fmt, path, options)
        )
        found = None if args.recompute else stored_stats(ds, columns)
        if found is not None:
            console.print(safe_text(f"{path}: statistics stored in the manifest", style="dim"))
        return found if found is not None else stats(ds, columns)

    result = load(args.path)
    for table in result.tables():
        console.print(_safe_table(table))
    document, status = result.to_dict(), 0
    if args.against:
        report = compare(result, load(args.against), columns=columns)
        console.print(_safe_table(report.table()))
        drifted = report.drifted
        console.print(
            safe_text(f"DRIFT in {len(drifted)} of {len(report.columns)} column(s): "
                      f"{', '.join(drifted)}", style="bold red")
            if drifted
            else safe_text(f"No drift in {len(report.columns)} column(s)", style="green")
        )
        document["drift"] = report.to_dict()
        status = 1 if drifted and args.fail_on_drift else 0
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, allow_nan=False)
    if args.html:
        from feedline.preprocess.stats_html import write_html

        page = write_html(result, args.html, title=f"feedline statistics: {args.path}")
        console.print(safe_text(f"Wrote {page}", style="green"))
    return status


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from feedline.demo import run_demo

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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``feedline`` command."""
    parser = argparse.ArgumentParser(prog="feedline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="schema, rows, shards, sizes and lineage of a dataset")
    p.add_argument("path")
    p.add_argument("--max-shards", type=int, default=20)
    _add_storage_option(p)
    p.set_defaults(run=cmd_inspect)

    p = sub.add_parser("convert", help="convert csv/jsonl/parquet/images/text to feedline")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument(
        "--format",
        choices=sorted(_READERS),
        default=None,
        help="input format (guessed from the path when omitted)",
    )
    p.add_argument("--rows-per-shard", type=int, default=None)
    p.add_argument("--compression", default="zstd")
    p.add_argument("--quiet", action="store_true")
    _add_storage_option(p)
    p.set_defaults(run=cmd_convert)

    p = sub.add_parser("verify", help="check every shard against the manifest's checksums")
    p.add_argument("path")
    p.add_argument("--quiet", action="store_true")
    _add_storage_option(p)
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("bench-loader", help="samples/s and data-wait of the training loader")
    p.add_argument("path")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--chart", default=None, help="also write a PNG of throughput and data wait")
    p.set_defaults(run=cmd_bench_loader)

    p = sub.add_parser("stats", help="column statistics; with --against, drift from a reference")
    p.add_argument("path")
    p.add_argument("--columns", default=None, help="comma-separated column names")
    p.add_argument("--json", default=None, help="also write the statistics to this JSON file")
    p.add_argument("--html", default=None, help="also write an HTML page with histograms")
    p.add_argument("--against", default=None, help="reference dataset to check drift against")
    p.add_argument("--fail-on-drift", action="store_true", help="exit with 1 when a column drifted")
    p.add_argument("--recompute", action="store_true", help="ignore statistics in the manifest")
    _add_storage_option(p)
    p.set_defaults(run=cmd_stats)

    p = sub.add_parser("demo", help="the end-to-end demo: preprocess, train, infer, track")
    p.add_argument("--out", "--output", dest="out", default="demo-output")
    p.add_argument(
        "--engine",
        choices=["local", "spark", "ray"],
        default="local",
        help="engine of the preprocessing writes",
    )
    p.add_argument("--size", choices=["small", "full"], default="full")
    p.add_argument("--rows", type=int, default=None, help="catalog products (overrides --size)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (overrides --size)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``feedline`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        return int(args.run(args, console) or 0)
    except FeedlineError as exc:
        message = safe_text(f" {type(exc).__name__}: {exc}")
        Console(stderr=True).print(Text.assemble(("error:", "bold red"), message), soft_wrap=True)
        return 2


def _entry() -> Any:  # pragma: no cover - console script
    sys.exit(main())
