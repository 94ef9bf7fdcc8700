"""The result of :func:`feedline.stats`: per-column statistics with their tables and views."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feedline.errors import FormatError
from feedline.statistics.accumulators import QUANTILES
from feedline.statistics.html_page import summary_line, write_html
from feedline.statistics.numbers import fixed, number
from feedline.statistics.svg_charts import shown_value
from feedline.ui.inert_text import inert
from feedline.ui.notebook import MAX_NAMES, Markup, table, view

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["STATS_VERSION", "Stats", "rich_table"]

#: the version of the statistics stored in a manifest
STATS_VERSION = 1


def _fmt(value: Any) -> str:
    """Numbers for tables: thousands separators, about four significant digits, no ``-0``."""

    return number(value)


class Stats:
    """The result of :func:`stats`: ``rows``, per-column entries and correlation matrices.

    ``stats["col"]`` is the column's dict (``kind`` is ``numeric``, ``categorical``, ``image``
    or ``other``); ``to_dict()`` is JSON-safe and ``Stats.from_dict`` reads it back.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> result = fl.stats(fl.from_arrow(pa.table({"x": [1, 2, 3, 4], "y": [2.0, 4.0, 6.0, 9.0]})))
    >>> result["x"]["quantiles"]["p50"], result.correlation["spearman"][0][1]
    (2.5, 1.0)
    >>> Stats.from_dict(result.to_dict()).select(["y"]).columns["y"]["max"]
    9.0
    """

    def __init__(
        self, rows: int, columns: dict[str, dict[str, Any]], correlation: dict[str, Any]
    ) -> None:
        self.rows, self.columns, self.correlation = rows, columns, correlation

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self.columns[name]

    def __repr__(self) -> str:

        shown = [inert(f"{k} ({c.get('kind')})") for k, c in list(self.columns.items())[:MAX_NAMES]]
        more = len(self.columns) - len(shown)
        listed = ", ".join(shown) + (f", … +{more:,} more" if more > 0 else "")
        noun = "column" if len(self.columns) == 1 else "columns"
        return f"Stats(rows={self.rows:,}, {len(self.columns):,} {noun}: {listed})"

    def _repr_html_(self) -> str:
        """The notebook view: one row per column (at most 20), kind, counts and a summary."""

        rows = [
            [name, c.get("kind"), c.get("type", ""), _fmt(c.get("count")),
             _fmt(c.get("nulls")), Markup(summary_line(c))]
            for name, c in self.columns.items()
        ]  # fmt: skip
        head = ["column", "kind", "type", "count", "nulls", "summary"]
        lines = [
            f"{self.rows:,} rows · {len(self.columns):,} columns",
            "The page with charts: stats.write_html(path) or `feedline stats PATH --html FILE`.",
        ]
        return view("feedline Stats", lines, table(head, rows))

    def write_html(self, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
        """Write the statistics page (histograms, top values, correlations) to ``path``; see
        :func:`feedline.statistics.html_page.write_html`."""

        return write_html(self, path, title=title)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (the form stored in the manifest)."""

        return {
            "version": STATS_VERSION,
            "rows": self.rows,
            "columns": copy.deepcopy(self.columns),
            "correlation": copy.deepcopy(self.correlation),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Stats:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(doc, dict) or doc.get("version") != STATS_VERSION:
            raise FormatError(
                f"Not feedline statistics (version {STATS_VERSION}): "
                f"{str(doc)[:120]!r}. Fix: recompute them with fl.stats(ds)."
            )
        return cls(int(doc["rows"]), dict(doc["columns"]), dict(doc["correlation"]))

    def select(self, columns: Sequence[str]) -> Stats:
        """Only ``columns`` (and their rows and columns of the correlation matrices)."""
        keep = [i for i, c in enumerate(self.correlation["columns"]) if c in columns]
        sub: dict[str, list[Any] | None] = {
            "columns": [self.correlation["columns"][i] for i in keep]
        }
        for method in ("pearson", "spearman"):
            m = self.correlation.get(method)
            sub[method] = None if m is None else [[m[i][j] for j in keep] for i in keep]
        return Stats(self.rows, {c: self.columns[c] for c in columns}, sub)

    def table(self) -> Table:
        """A rich table: one row per column, with a one-line summary of its distribution."""
        table = rich_table(f"statistics: {self.rows:,} rows", "column", "kind", "count", "nulls")
        table.add_column("summary")
        for name, c in self.columns.items():
            table.add_row(name, c["kind"], _fmt(c["count"]), _fmt(c["nulls"]), _describe(c))
        return table

    def tables(self) -> list[Table]:
        """Every table: the summary, numeric moments and quantiles, and the correlations."""
        numeric = {k: v for k, v in self.columns.items() if v["kind"] == "numeric"}
        numeric |= {
            f"{k}.{d}": v[d]
            for k, v in self.columns.items()
            if v["kind"] == "image"
            for d in ("width", "height")
        }
        numeric |= {f"{k}[elements]": v["elements"] for k, v in self.columns.items()
                    if v["kind"] == "tensor"}  # fmt: skip
        heads = {
            "moments": ("mean", "std", "min", "max", "skewness", "kurtosis"),
            "quantiles": tuple(QUANTILES),
        }
        out = [self.table()]
        for title, keys in heads.items() if numeric else ():
            table = rich_table(title, "column", *keys)
            for name, c in numeric.items():
                table.add_row(name, *(_fmt(c.get(k, c["quantiles"].get(k))) for k in keys))
            out.append(table)

        names = self.correlation["columns"]
        for method in ("pearson", "spearman"):
            if self.correlation.get(method) and len(names) > 1:
                table = rich_table(f"{method} correlation", "", *names)
                for name, row in zip(names, self.correlation[method], strict=True):
                    table.add_row(name, *("" if v is None else fixed(v) for v in row))
                out.append(table)
        return out


def rich_table(title: str, *headers: str) -> Table:
    """A compact rich table: labels left-aligned, numbers right-aligned."""
    from rich.table import Table

    table = Table(title=title, pad_edge=False, show_edge=False)
    for i, name in enumerate(headers):
        table.add_column(
            name, justify="left" if i == 0 or name == "kind" else "right", no_wrap=True
        )
    return table


def _describe(c: dict[str, Any]) -> str:
    """One line about a column's distribution."""
    if c["kind"] == "tensor":
        shapes = ", ".join(k for k, _ in c["shapes"][:2])
        return f"shape {shapes or '-'}; elements: " + _describe(c["elements"])
    if c["kind"] == "categorical":
        labels = c.get("labels") or {}
        top = ", ".join(
            shown_value(k)[0] + (f" · {labels[str(k)]}" if str(k) in labels else "") + f" ({v:,})"
            for k, v in c["top"][:3]
        )
        return f"{c['distinct']:,}{'' if c['distinct_exact'] else ' (approx.)'} distinct; {top}"
    if c["kind"] == "image":
        w, h = c["width"]["quantiles"]["p50"], c["height"]["quantiles"]["p50"]
        return f"median {w or 0:g}x{h or 0:g}; {c['unreadable']} unreadable; " + ", ".join(
            f"{k} ({v:,})" for k, v in c["top_sizes"][:2]
        )
    if c["kind"] == "numeric" and c["count"]:
        return (
            f"mean {_fmt(c['mean'])} ± {_fmt(c['std'])}; min {_fmt(c['min'])}, "
            f"median {_fmt(c['quantiles']['p50'])}, max {_fmt(c['max'])}"
        )
    return c.get("type", "")
