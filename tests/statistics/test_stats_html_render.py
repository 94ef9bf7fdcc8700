"""The statistics page's charts, rendered and measured: nothing clipped, no labels overlap.

Every inline SVG of a page with awkward columns (long names, counts in the tens of
thousands, values over nine orders of magnitude, years, tiny floats, long category values)
is parsed as XML, each text's box is measured with the real DejaVu Sans metrics (the font
the render uses) and must lie inside the viewBox without touching another text; the SVG is
then rendered offline by resvg (no browser) and its border must be blank (nothing drawn
runs off the edge) while text was drawn.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.statistics.html_page import render_html

matplotlib = pytest.importorskip("matplotlib")
ImageFont = pytest.importorskip("PIL.ImageFont")
Image = pytest.importorskip("PIL.Image")

NS = "{http://www.w3.org/2000/svg}"
FONT_FILE = str(Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf")
LONG = "purchase_amount_in_euros_including_value_added_tax_and_shipping_costs"


@pytest.fixture(scope="module")
def page() -> str:
    rng = np.random.default_rng(3)
    n = 20_000
    table = pa.table({
        LONG: rng.lognormal(10, 3, n),
        "big_counts": rng.integers(1_000_000, 90_000_000, n),
        "year": rng.integers(1995, 2024, n),
        "tiny": rng.normal(0, 1e-4, n),
        "negative": -rng.lognormal(12, 1, n),
        "constant": np.zeros(n),
        "category": rng.choice(["", "x" * 80, "shoes", "  padded", "日本語のカテゴリ名"], n),
    })  # fmt: skip
    return render_html(fl.stats(fl.from_arrow(table)))


def _svgs(page: str) -> list[str]:
    found = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(found) == 7
    return found


def _boxes(svg: str) -> tuple[float, float, list[tuple[str, float, float, float, float]]]:
    root = ET.fromstring(svg)  # well-formed, standalone XML
    assert root.tag == f"{NS}svg"
    _, _, width, height = (float(v) for v in root.get("viewBox").split())
    size = float(root.get("font-size"))
    font = ImageFont.truetype(FONT_FILE, round(size))
    boxes = []
    for text in root.iter(f"{NS}text"):
        label = "".join(text.itertext())
        w = font.getlength(label)
        x, y = float(text.get("x")), float(text.get("y"))
        x0 = {"start": x, "middle": x - w / 2, "end": x - w}[text.get("text-anchor", "start")]
        boxes.append((label, x0, x0 + w, y - 0.76 * size, y + 0.24 * size))
    return width, height, boxes


def test_every_text_is_inside_the_chart_and_none_overlap(page: str) -> None:
    for svg in _svgs(page):
        width, height, boxes = _boxes(svg)
        assert boxes
        for label, x0, x1, y0, y1 in boxes:
            assert x0 >= 0 and x1 <= width and y0 >= 0 and y1 <= height, (label, x0, x1, width)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                apart = a[2] <= b[1] or b[2] <= a[1] or a[4] <= b[3] or b[4] <= a[3]
                assert apart, (a, b)


def test_tick_labels_are_round_and_in_one_style(page: str) -> None:
    ticks = {}
    for svg in _svgs(page):
        root = ET.fromstring(svg)
        caption = root.get("aria-label")
        base = [t for t in root.iter(f"{NS}text") if t.get("text-anchor") == "middle"]
        ticks[caption] = [t.text for t in base][:-1]  # the last one is the caption
    assert ticks["big_counts"] == ["20M", "40M", "60M", "80M"]
    assert ticks["year"] == ["1995", "2000", "2005", "2010", "2015", "2020"]
    assert "0" in ticks["tiny"] and all(re.fullmatch(r"0|-?[1-9]e-0[45]", t) for t in ticks["tiny"])
    negative = ticks["negative"]  # one unit for the whole axis
    assert all(re.fullmatch(r"-[1-9]\d*M", t) for t in negative) and len(negative) >= 3, negative


def test_rendered_offline_nothing_runs_off_the_edge(page: str) -> None:
    resvg = pytest.importorskip("resvg_py")
    for svg in _svgs(page):
        png = resvg.svg_to_bytes(
            svg_string=svg,
            background="#ffffff",
            skip_system_fonts=True,  # the same font on every machine
            font_files=[FONT_FILE],
            sans_serif_family="DejaVu Sans",
        )
        pixels = np.asarray(Image.open(io.BytesIO(bytes(png))).convert("L"))
        width, height, _ = _boxes(svg)
        assert pixels.shape == (height, width)
        border = np.concatenate([pixels[:2].ravel(), pixels[-2:].ravel(),
                                 pixels[:, :2].ravel(), pixels[:, -2:].ravel()])  # fmt: skip
        assert border.min() == 255, "something is drawn over the chart's edge"
        grey = (pixels > 20) & (pixels < 120)  # anti-aliased glyph edges: text was drawn
        assert grey.sum() > 200


def test_width_estimate_is_never_narrower_than_the_font() -> None:
    from feedline.statistics.svg_charts import FONT_SIZE, text_width

    font = ImageFont.truetype(FONT_FILE, FONT_SIZE)
    samples = [
        "0123456789", "1,234,567.89", "-2e-04", "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "WWWMMMmmmwww", "(empty string)", '" padded "',
        "<script>alert(1)</script>", "top 20 values by count", "x" * 80, "Ünïcödé ñ · é",
    ]  # fmt: skip
    for text in samples:
        assert text_width(text) >= font.getlength(text), text
