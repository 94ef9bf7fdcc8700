"""The HTML statistics page: parses, self-contained, every column, hostile names escaped."""

from __future__ import annotations

import io
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.cli.main import main
from feedline.statistics.html_page import histogram, render_html, write_html

HOSTILE = "<script>alert(1)</script>"
VOID = {"meta", "br", "img", "hr", "input", "link"}


class Page(HTMLParser):
    """Collects tags, text and attribute values, and checks that elements nest properly."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.attributes: list[str] = []  # names
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [k for k, _ in attrs]
        self.ids += [v for k, v in attrs if k == "id"]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    assert page.stack == [], page.stack
    return page


@pytest.fixture(scope="module")
def table() -> pa.Table:
    rng = np.random.default_rng(1)
    n = 5000
    return pa.table({
        "price": np.where(rng.random(n) < 0.1, np.nan, rng.lognormal(3, 0.5, n)),
        HOSTILE: rng.integers(0, 5, n),
        "category": rng.choice(["shoes", "hats", '<img src=x onerror="alert(2)">'], n),
        "empty": pa.nulls(n, pa.float64()),
        "flag": rng.random(n) < 0.3,
    })  # fmt: skip


def test_page_parses_and_has_every_column(table: pa.Table, tmp_path: Path) -> None:
    stats = fl.stats(fl.from_arrow(table))
    out = write_html(stats, tmp_path / "deep" / "stats.html", title="catalog <v1>")
    text = out.read_text(encoding="utf-8")
    page = parse(text)
    words = "".join(page.text)
    for name in table.column_names:
        assert words.count(name) >= 2, name  # in the summary table and its own section
    assert len(page.ids) == len(set(page.ids)) == table.num_columns
    assert "catalog <v1>" in words
    # hostile names and values are text, never markup
    assert "script" not in page.tags and "img" not in page.tags
    assert not [a for a in page.attributes if a.startswith("on")]  # no event handlers
    assert HOSTILE not in text and "&lt;script&gt;" in text
    assert '<img src=x onerror="alert(2)">' in words  # shown as text
    # self-contained: no external resources at all
    linked = text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a name, never fetched
    assert "http://" not in linked and "https://" not in linked and "<link" not in text
    assert "src=" not in text.replace("&lt;img src=x", "")
    # a chart for each numeric column with values and for the categorical ones
    assert page.tags.count("svg") == 4  # price, HOSTILE, category, flag (bool: top values)


def test_histogram_matches_numpy_on_the_same_bins(table: pa.Table) -> None:
    stats = fl.stats(fl.from_arrow(table))
    edges, counts = histogram(stats["price"])
    values = table["price"].to_numpy()
    values = values[np.isfinite(values)]
    exact, _ = np.histogram(values, bins=edges)
    assert counts.sum() == pytest.approx(len(values))
    assert np.abs(counts - exact).max() <= 0.01 * len(values)  # one grid step: 0.5% per edge
    edges, counts = histogram(stats[HOSTILE])  # integers: one bin per value
    assert edges.tolist() == [-0.5, 0.5, 1.5, 2.5, 3.5, 4.5]
    exact = np.bincount(table[HOSTILE].to_numpy(), minlength=5)
    assert np.abs(counts - exact).max() <= 0.01 * len(table)
    assert histogram(stats["empty"]) is None


def test_images_get_size_charts() -> None:
    from PIL import Image

    blobs = []
    for i in range(30):
        buffer = io.BytesIO()
        Image.new("RGB", (16 + i % 3, 8), (i, 0, 0)).save(buffer, "PNG")
        blobs.append(buffer.getvalue())
    blobs.append(b"not an image")
    stats = fl.stats(fl.from_arrow(pa.table({"image": pa.array(blobs, pa.binary())})))
    page = parse(render_html(stats))
    words = "".join(page.text)
    assert "1 unreadable image(s)" in words and "16x8" in words and "RGB" in words
    assert page.tags.count("svg") == 4  # width, height, top sizes, modes


def test_empty_dataset_renders(tmp_path: Path) -> None:
    stats = fl.stats(fl.from_arrow(pa.table({"x": pa.array([], pa.float64())})))
    page = parse(render_html(stats))
    assert "x" in "".join(page.text) and "svg" not in page.tags


def test_cli_stats_html(table: pa.Table, tmp_path: Path) -> None:
    fl.from_arrow(table).write(tmp_path / "ds")
    assert main(["stats", str(tmp_path / "ds"), "--html", str(tmp_path / "s.html")]) == 0
    words = "".join(parse((tmp_path / "s.html").read_text(encoding="utf-8")).text)
    assert all(name in words for name in table.column_names)


def test_unwritable_path_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    stats = fl.stats(fl.from_arrow(pa.table({"x": [1.0]})))
    with pytest.raises(fl.ConfigurationError, match=r"cannot write.*Fix:"):
        write_html(stats, tmp_path / "file" / "s.html")


def test_far_outliers_do_not_squash_the_histogram() -> None:
    values = np.append(np.random.default_rng(2).normal(size=4000), 1e6)
    stats = fl.stats(fl.from_arrow(pa.table({"v": values})))
    whole = histogram(stats["v"])
    assert whole[0][0] == values.min() and whole[0][-1] == 1e6
    assert whole[1][0] > 0.98 * len(values)  # everything in the first bar
    edges, counts = histogram(stats["v"], clip_tails=True)
    assert edges[0] == pytest.approx(np.quantile(values, 0.005))
    assert edges[-1] == pytest.approx(np.quantile(values, 0.995))
    assert counts.sum() == pytest.approx(0.99 * len(values), rel=1e-6)
    assert counts.max() < 0.2 * len(values)  # spread over the bins
    assert "central 99% (min" in "".join(parse(render_html(stats)).text)
