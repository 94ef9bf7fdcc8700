"""Notebook views and reprs of Stats, DriftReport, WriteInfo and Dataset: they say what the
object is, escape every data-derived string, hold no scripts or external resources, and stay
small for wide data."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl

HOSTILE = "<script>alert(1)</script>"
WIDE = 300  # columns


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs
        self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-3:])
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _check(page: str) -> str:
    """Parse ``page``; it is one balanced, inert, self-contained element. Returns its text."""
    parser = Tags()
    parser.feed(page)
    parser.close()
    assert parser.stack == [] and parser.tags[0] == "div"
    assert "script" not in parser.tags and "img" not in parser.tags and "link" not in parser.tags
    assert not [k for k, _ in parser.attrs if k.startswith("on") or k in ("src", "href")]
    assert "http://" not in page and "https://" not in page
    return "".join(parser.text)


@pytest.fixture(scope="module")
def hostile() -> fl.Dataset:
    rng = np.random.default_rng(0)
    return fl.from_arrow(pa.table({
        HOSTILE: rng.normal(size=500),
        "c": rng.choice(["<b>bold</b>", "&amp;", "ok"], 500),
    }))  # fmt: skip


@pytest.fixture(scope="module")
def wide() -> fl.Dataset:
    return fl.from_arrow(pa.table({f"col{i:03d}": np.arange(20.0) + i for i in range(WIDE)}))


def test_stats_repr_and_view(hostile, wide) -> None:
    s = fl.stats(hostile)
    assert repr(s) == f"Stats(rows=500, 2 columns: {HOSTILE} (numeric), c (categorical))"
    page = s._repr_html_()
    text = _check(page)
    assert HOSTILE in text and "<b>bold</b>" in text  # shown as text, never markup
    assert "&lt;script&gt;" in page and "&lt;b&gt;bold" in page
    s_wide = fl.stats(wide, spearman=False)
    assert repr(s_wide).endswith(f"col007 (numeric), … +{WIDE - 8} more)")
    page = s_wide._repr_html_()
    text = _check(page)
    assert "col019" in text and "col020" not in text and f"… and {WIDE - 20} more" in text
    assert len(page) < 8_000


def test_stats_write_html(hostile, tmp_path: Path) -> None:
    out = fl.stats(hostile).write_html(tmp_path / "s.html")
    assert "&lt;script&gt;" in out.read_text(encoding="utf-8")


def test_drift_report_repr_and_view(hostile, wide) -> None:
    shifted = hostile.map_batches(
        lambda b: b.set_column(0, HOSTILE, pa.array(b.column(0).to_numpy() + 3.0))
    )
    report = fl.compare(shifted, hostile)
    assert report.drifted == [HOSTILE]
    assert repr(report) == (
        f"DriftReport(1 of 2 columns drifted: '{HOSTILE}'; 500 new rows vs 500 reference)"
    )
    text = _check(report._repr_html_())
    assert HOSTILE in text and "DRIFT" in text and "1 of 2 columns drifted" in text
    moved = wide.map_batches(
        lambda b: b.set_column(WIDE - 1, f"col{WIDE - 1:03d}", pa.array(np.full(b.num_rows, 1e6)))
    )
    wide_report = fl.compare(moved, wide)
    page = wide_report._repr_html_()
    text = _check(page)
    # the drifted column is listed first, so truncation never hides it
    assert text.index(f"col{WIDE - 1:03d}") < text.index("col000")
    assert f"… and {WIDE - 20} more" in text and len(page) < 8_000


def test_write_info_repr_and_view(tmp_path: Path) -> None:
    folder = tmp_path / "<b>x</b>"
    info = fl.range(1234).write(folder / "ds")
    text = repr(info)
    assert text.startswith(f"WriteInfo(path={str(folder / 'ds')!r}, rows=1,234, shards=1, ")
    assert "report" not in text  # the counters live in the view, not in one long line
    page = info._repr_html_()
    words = _check(page)
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" in words
    assert "1,234" in words and "rows/s" in words and "bytes" in words and "rows_read" in words


def test_dataset_view_is_truncated_and_escaped(wide) -> None:
    page = wide._repr_html_()
    text = _check(page)
    assert f"{WIDE} columns" in text and f"… and {WIDE - 20} more" in text
    assert "col019" in text and "col020" not in text and len(page) < 5_000
    hostile_page = fl.from_arrow(pa.table({HOSTILE: [1]}))._repr_html_()
    assert HOSTILE in _check(hostile_page) and HOSTILE not in hostile_page
