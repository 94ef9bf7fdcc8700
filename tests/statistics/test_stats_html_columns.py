"""Statistics of awkward columns: empty strings, orders of magnitude, negative zeros, indexed
labels and tensors, in the stats, the HTML page and the terminal tables."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pyarrow as pa
import pytest

import feedline as fl
from feedline.statistics.html_page import histogram, log_scale, render_html
from feedline.statistics.result import Stats

NS = "{http://www.w3.org/2000/svg}"


def _charts(page: str) -> dict[str, ET.Element]:
    roots = [ET.fromstring(svg) for svg in re.findall(r"<svg.*?</svg>", page, re.S)]
    return {root.get("aria-label"): root for root in roots}


def _texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text")]


def test_empty_strings_are_labelled_and_told_apart_from_nulls() -> None:
    values = ["", "", "", "a", None, " a "]
    s = fl.stats(fl.from_arrow(pa.table({"c": pa.array(values, pa.string())})))
    assert s["c"]["top"][0] == ["", 3] and s["c"]["nulls"] == 1
    page = render_html(s)
    (chart,) = _charts(page).values()
    labels = _texts(chart)
    assert "(empty string)" in labels and '" a "' in labels  # never a blank bar label
    assert "<i>(empty string)</i> (3)" in page  # the summary line too
    assert "1 null" in page
    assert "(empty string) (3)" in s.table().columns[-1]._cells[0]  # the terminal table


def test_values_over_orders_of_magnitude_get_a_log_axis() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.lognormal(8, 3, 20_000)  # bytes: 1 to 1e8
    s = fl.stats(fl.from_arrow(pa.table({"size": sizes, "shifted": sizes - sizes.min()})))
    assert log_scale(s["size"]) and not log_scale(s["shifted"])  # zero: no log axis
    edges, counts = histogram(s["size"], log=True)
    ratios = edges[1:] / edges[:-1]
    assert np.allclose(ratios, ratios[0])  # evenly spaced in log10
    exact, _ = np.histogram(sizes, bins=edges)
    assert np.abs(counts - exact).max() <= 0.01 * len(sizes)
    assert counts.max() < 0.2 * len(sizes)  # spread out, not one tall bar at the left
    charts = _charts(render_html(s))
    ticks = _texts(charts["size (log scale)"])
    assert {"1", "100", "10k", "1M"} <= set(ticks)  # powers of ten
    assert "shifted" in charts  # linear


def test_narrow_positive_ranges_stay_linear() -> None:
    s = fl.stats(fl.from_arrow(pa.table({"x": np.linspace(1.0, 999.0, 500)})))
    assert not log_scale(s["x"]) and "x" in _charts(render_html(s))


def test_no_negative_zero_anywhere() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    y = np.array([2.0, -1.0, 0.5, 0.4, -1.2, 3.1])
    y = y - (np.corrcoef(x, y)[0, 1] + 2e-5) * (x - x.mean()) * y.std() / x.std()
    s = fl.stats(fl.from_arrow(pa.table({"x": x, "y": y, "z": -np.zeros(6)})))
    r = s.correlation["pearson"][0][1]
    assert -5e-4 < r < 0  # prints as zero at three decimals
    page = render_html(s)
    assert "-0.000" not in page and ">0.000<" in page
    assert not re.search(r">-0<|>-0\.0*<", page)  # the all-minus-zero column's moments too
    for table in s.tables():
        for column in table.columns:
            assert not any(str(c) in ("-0", "-0.000") for c in column._cells), column.header


def test_indexed_label_columns_are_categorical_with_their_labels(tmp_path) -> None:
    table = pa.table({"label": ["cat", "dog", "dog", "bird", "dog", "cat"], "x": np.arange(6.0)})
    ds = fl.from_arrow(table).transform(fl.StringIndexer("label"))
    s = fl.stats(ds)
    assert s["label"]["kind"] == "categorical" and s["label"]["type"] == "int64"
    assert s["label"]["top"][0] == [0, 3] and s["label"]["labels"]["0"] == "dog"
    assert s.correlation["columns"] == ["x"]  # ids are not numbers to correlate
    page = render_html(s)
    assert "0 · dog" in _texts(_charts(page)["top 3 values by count"])
    # written out: the indexer is in the manifest, the column is still a label column
    ds.write(tmp_path / "ds")
    stored = fl.stats(fl.open(tmp_path / "ds"))
    assert stored["label"]["kind"] == "categorical" and stored["label"]["labels"]["2"] == "bird"
    # the caller decides: no categorical columns, or an integer column of their own
    assert fl.stats(ds, categorical=[])["label"]["kind"] == "numeric"
    plain = fl.from_arrow(pa.table({"code": [3, 3, 7]}))
    assert fl.stats(plain, categorical=["code"])["code"]["top"] == [[3, 2], [7, 1]]


def test_tensor_columns_get_element_statistics_and_shapes() -> None:
    rng = np.random.default_rng(1)
    images = rng.normal(2.0, 3.0, (50, 4, 3)).astype(np.float32)
    ragged = [[1, 2, 3], [4], None, [5, 6]]
    ds = fl.from_arrow(pa.table({
        "emb": pa.FixedShapeTensorArray.from_numpy_ndarray(images),
        "ids": pa.array(ragged + [[7]] * 46, pa.list_(pa.int32())),
    }))  # fmt: skip
    s = fl.stats(ds)
    emb = s["emb"]
    assert emb["kind"] == "tensor" and emb["shapes"] == [["4×3", 50]] and emb["count"] == 50
    e = emb["elements"]
    assert e["count"] == images.size
    assert e["mean"] == pytest.approx(images.mean(dtype=np.float64), rel=1e-6)
    assert e["std"] == pytest.approx(images.std(ddof=1, dtype=np.float64), rel=1e-6)
    assert (e["min"], e["max"]) == (float(images.min()), float(images.max()))
    ids = s["ids"]
    assert ids["nulls"] == 1 and ids["shapes"][0] == ["1", 47] and ids["elements"]["max"] == 7
    page = render_html(s)
    assert "emb (elements)" in _charts(page) and "tensor&lt;float, 4×3&gt;" in page
    assert "48,000" not in page and "600 elements" in page
    # drift compares the elements
    shifted = fl.from_arrow(pa.table({
        "emb": pa.FixedShapeTensorArray.from_numpy_ndarray(images + 5),
    }))  # fmt: skip
    assert fl.compare(shifted, ds.select(["emb"])).drifted == ["emb"]
    assert fl.compare(ds.select(["emb"]), ds.select(["emb"])).drifted == []


def test_stats_of_tensor_and_indexed_columns_round_trip() -> None:
    ds = fl.from_arrow(pa.table({
        "t": pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((3, 2, 2))),
        "c": ["a", "b", "a"],
    })).transform(fl.StringIndexer("c"))  # fmt: skip
    s = fl.stats(ds)
    again = Stats.from_dict(s.to_dict())
    assert again["t"]["elements"]["mean"] == 1.0 and again["c"]["labels"] == {"0": "a", "1": "b"}
