"""Data-derived text is shown inert everywhere feedline prints it (issue 23, item 19):
``ds.show()``, ``repr(ds)``, ``ds.explain()``, the notebook views, and the reprs of Stats,
DriftReport and WriteInfo hold no raw escape sequence, bidi override or Rich markup from a
column name or a value; each such character is shown as its Python escape."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from rich.console import Console

import feedline as fl

#: retitles the terminal, clears it, reverses what follows, and would be Rich markup
NAME = "\x1b]0;pwned\x07\x1b[2Jprice\u202e[bold]x[/]"
VALUE = "v\x1b[31mred\u202e\x00"
RAW = ("\x1b", "\x07", "\u202e", "\x00")


def _clean(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)


@pytest.fixture
def ds() -> fl.Dataset:
    return fl.from_arrow(pa.table({NAME: [VALUE, "[red]markup[/]"], "n": [1.0, 2.0]}))


def test_show_prints_names_and_values_inert_and_never_as_markup(ds: fl.Dataset) -> None:
    out = io.StringIO()
    ds.show(console=Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    _clean(text)
    assert "\\x1b]0;pwned\\x07\\x1b[2Jprice\\u202e[bold" in text  # escaped; markup as text
    assert "v\\x1b[31mred\\u202e\\x00" in text
    assert "[red]markup[/]" in text


def test_repr_and_explain_are_inert(ds: fl.Dataset) -> None:
    for text in (repr(ds), ds.rename({NAME: "z"}).explain()):
        _clean(text)
        assert "\\x1b[2Jprice\\u202e" in text
    assert len(repr(ds).splitlines()) == 2  # a name cannot add lines


def test_notebook_views_hold_no_control_characters(ds: fl.Dataset, tmp_path: Path) -> None:
    page = ds._repr_html_()
    _clean(page)
    assert "\\x1b[2Jprice\\u202e[bold]x[/]" in page
    info = ds.write(tmp_path / "out\x1b[2J")
    for text in (repr(info), info._repr_html_()):
        _clean(text)


def test_stats_and_drift_reprs_are_inert(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ref = fl.from_arrow(pa.table({NAME: rng.normal(size=500), "s": [VALUE] * 500}))
    new = fl.from_arrow(pa.table({NAME: rng.normal(3, size=500), "s": [VALUE] * 500}))
    stats = fl.stats(ref)
    report = fl.compare(new, ref)
    for text in (repr(stats), stats._repr_html_(), repr(report), report._repr_html_()):
        _clean(text)
    assert "\\x1b[2Jprice" in repr(stats)
