"""feedline.demo.synthetic.make_catalog: deterministic, images agree with texts, messy as stated."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import feedline as fl
from feedline.demo.synthetic import CATEGORIES, COLOURS, make_catalog

N = 1000
_PATTERN_INK = (28, 28, 28)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory):
    return make_catalog(N, seed=7, path=tmp_path_factory.mktemp("catalog"))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _words(description: str) -> list[str]:
    return description.lower().replace("-", " ").replace(",", " ").split()


def _foreground(pixels: np.ndarray) -> np.ndarray:
    """Pixels that differ from the background (estimated from the image border)."""
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    background = np.median(border, axis=0)
    return pixels[np.linalg.norm(pixels - background, axis=2) > 60]


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    a = make_catalog(120, seed=3, path=tmp_path / "a")
    b = make_catalog(120, seed=3, path=tmp_path / "b")
    c = make_catalog(120, seed=4, path=tmp_path / "c")
    assert a.csv.read_bytes() == b.csv.read_bytes()
    assert a.csv.read_bytes() != c.csv.read_bytes()
    for name in sorted(p.name for p in a.images.iterdir()):
        assert (a.images / name).read_bytes() == (b.images / name).read_bytes(), name
    assert a.corrupt == b.corrupt and a.missing_prices == b.missing_prices
    differing = sum(
        (a.images / p.name).read_bytes() != (c.images / p.name).read_bytes()
        for p in a.images.iterdir()
    )
    assert differing > 100


def test_csv_layout_and_feedline_reads_it(catalog) -> None:
    rows = _rows(catalog.csv)
    assert len(rows) == N == catalog.rows
    assert list(rows[0]) == ["id", "description", "category", "price", "image"]
    assert [int(r["id"]) for r in rows] == list(range(N))
    assert all((catalog.path / r["image"]).is_file() for r in rows)
    table = fl.read_csv(catalog.csv).to_arrow()
    assert table.num_rows == N
    assert table["price"].null_count == len(catalog.missing_prices)


def test_images_agree_with_descriptions(catalog) -> None:
    """The dominant fill colour is the colour word; patterned texts have patterned images."""
    palette = np.array([*COLOURS.values(), _PATTERN_INK], dtype=float)
    names = list(COLOURS)
    checked = 0
    for row in _rows(catalog.csv):
        if row["image"] in catalog.corrupt:
            continue
        pixels = np.asarray(Image.open(catalog.path / row["image"]).convert("RGB"), float)
        fg = _foreground(pixels)
        nearest = np.linalg.norm(fg[:, None, :] - palette[None], axis=2).argmin(axis=1)
        dominant = names[np.bincount(nearest[nearest < len(names)], minlength=8).argmax()]
        words = _words(row["description"])
        colour = next(w for w in words if w in COLOURS)
        assert dominant == colour, (row["id"], row["description"])
        assert sum(w in CATEGORIES for w in words) == 1, row["description"]
        ink = float((nearest == len(names)).mean())
        if {"plain", "solid"} & set(words):
            assert ink < 0.02, (row["id"], row["description"], ink)
        else:
            assert ink > 0.08, (row["id"], row["description"], ink)
        checked += 1
    assert checked == N - len(catalog.corrupt)


def test_category_is_the_silhouette(catalog) -> None:
    """Same category, same silhouette: the foreground masks' shapes differ between categories
    (nearest-centroid classification of the mask's aspect and fill ratio beats chance)."""
    features, labels = [], []
    for row in _rows(catalog.csv):
        if row["image"] in catalog.corrupt:
            continue
        pixels = np.asarray(Image.open(catalog.path / row["image"]).convert("RGB"), float)
        border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
        mask = np.linalg.norm(pixels - np.median(border, axis=0), axis=2) > 60
        ys, xs = np.nonzero(mask)
        box = mask[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
        thirds = np.array_split(box, 3, axis=0)
        columns = np.array_split(box, 3, axis=1)
        features.append([box.mean(), *(t.mean() for t in thirds), *(c.mean() for c in columns)])
        labels.append(CATEGORIES.index(row["category"].strip().lower()))
    x, y = np.array(features), np.array(labels)
    centroids = np.stack([x[y == k].mean(axis=0) for k in range(len(CATEGORIES))])
    predicted = np.linalg.norm(x[:, None] - centroids[None], axis=2).argmin(axis=1)
    assert (predicted == y).mean() > 3 / len(CATEGORIES)


def test_messiness_in_the_stated_proportions(catalog) -> None:
    rows = _rows(catalog.csv)
    assert len(catalog.corrupt) == round(0.01 * N)
    assert len(catalog.missing_prices) == round(0.03 * N)
    assert sorted(int(r["id"]) for r in rows if r["price"] == "") == list(catalog.missing_prices)
    assert all(float(r["price"]) > 0 for r in rows if r["price"])
    raw = [r["category"] for r in rows]
    messy = [c for c in raw if c != c.strip().lower()]
    assert len(messy) == catalog.messy_categories
    assert 0.2 < len(messy) / N < 0.6
    assert any(c != c.strip() for c in messy) and any(c.isupper() for c in messy)
    assert any(c.strip() != c.strip().lower() and not c.strip().isupper() for c in messy)
    assert {c.strip().lower() for c in raw} == set(CATEGORIES)


def test_corrupt_images_are_undecodable(catalog) -> None:
    assert set(catalog.corrupt.values()) == {"truncated", "garbage bytes", "empty file"}
    for relative in catalog.corrupt:
        data = (catalog.path / relative).read_bytes()
        with pytest.raises(Exception), Image.open(io.BytesIO(data)) as image:  # noqa: B017
            image.load()  # Pillow raises several kinds of exception for bad files
    good = next(r["image"] for r in _rows(catalog.csv) if r["image"] not in catalog.corrupt)
    with Image.open(catalog.path / good) as image:
        image.load()
        assert image.size == (48, 48)


@pytest.mark.parametrize("n", [0, -5, 2.5, True])
def test_bad_n_is_a_configuration_error(n, tmp_path: Path) -> None:
    with pytest.raises(fl.ConfigurationError, match="Fix:"):
        make_catalog(n, path=tmp_path / "x")
    assert not (tmp_path / "x").exists()
