"""Synthetic data sets for demos and tests: a messy multimodal product catalog.

:func:`make_catalog` writes what a CLIP-style fine-tuning job on fashion data starts from: a
folder of small PNG product photos plus a CSV of ``id, description, category, price, image``.
Each image agrees with its description: the category is the silhouette (a shirt, a dress,
a shoe...), the colour word is the fill colour and the pattern word is near-black stripes,
dots or a plain fill; position, size, background and pixel noise are random, so matching images to
texts is learnable but not trivial. It is deterministic for a seed, and messy on purpose:

- about 1% of the images are corrupt (truncated PNG, garbage bytes or an empty file);
- about 3% of the prices are missing;
- categories come in mixed case with stray spaces (``"Shoes"``, ``" shoes"``, ``"SHOES "``).
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, MissingDependencyError

__all__ = ["CATEGORIES", "COLOURS", "PATTERNS", "Catalog", "make_catalog"]

#: fill colour (RGB) of each colour word
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 30, 35),
    "green": (30, 150, 55),
    "blue": (35, 75, 215),
    "yellow": (240, 205, 25),
    "orange": (245, 125, 20),
    "purple": (125, 40, 165),
    "pink": (245, 115, 185),
    "brown": (115, 70, 30),
}
#: the canonical (lower-case) categories, each drawn as its own silhouette
CATEGORIES = ("shirt", "trousers", "dress", "shoes", "hat", "bag", "scarf", "watch")
#: pattern words; the texts use one of several phrasings for each
PATTERNS = ("plain", "striped", "dotted")

_PATTERN_WORDS = {
    "plain": ("plain", "solid"),
    "striped": ("striped", "pinstriped"),
    "dotted": ("dotted", "polka-dot"),
}
_TEMPLATES = (
    "a {pattern} {colour} {category}",
    "{pattern} {category} in {colour}",
    "this {category} is {colour} and {pattern}",
    "our {style} {colour} {category} , {pattern}",
    "{colour} {pattern} {category} for {season}",
)
_STYLES = ("classic", "casual", "modern", "elegant", "everyday", "vintage")
_SEASONS = ("summer", "winter", "spring", "autumn", "every day")
_BASE_PRICE = {
    "shirt": 25,
    "trousers": 45,
    "dress": 60,
    "shoes": 80,
    "hat": 20,
    "bag": 70,
    "scarf": 18,
    "watch": 120,
}
_SIZE = 48  # pixels; a small image keeps 5,000 products in a few seconds
_CORRUPT_FRACTION = 0.01
_MISSING_PRICE_FRACTION = 0.03


@dataclass(frozen=True)
class Catalog:
    """What :func:`make_catalog` wrote.

    Attributes
    ----------
    path: the catalog folder. csv: ``path / "catalog.csv"``. images: ``path / "images"``.
    rows: number of products. corrupt: the image paths (relative to ``path``) written corrupt,
    each with how. missing_prices: ids whose price is empty. messy_categories: how many
    category strings are not already lower-case and trimmed.
    """

    path: Path
    csv: Path
    images: Path
    rows: int
    corrupt: dict[str, str] = field(default_factory=dict)
    missing_prices: tuple[int, ...] = ()
    messy_categories: int = 0


def make_catalog(n: int, seed: int = 0, path: str | os.PathLike[str] = "catalog") -> Catalog:
    """Write a synthetic product catalog of ``n`` products: PNG images plus ``catalog.csv``.

    Parameters
    ----------
    n:
        Number of products (rows of the CSV, image files).
    seed:
        The same seed writes the same bytes.
    path:
        Folder to write into (created; an existing catalog there is overwritten).

    Returns
    -------
    Catalog
        Paths, row count and the messiness that was put in (corrupt images, missing prices).

    Examples
    --------
    >>> import tempfile, feedline as fl
    >>> cat = make_catalog(200, seed=1, path=tempfile.mkdtemp())
    >>> cat.rows, len(cat.corrupt), len(cat.missing_prices)
    (200, 2, 6)
    >>> fl.read_csv(cat.csv).schema().names
    ['id', 'description', 'category', 'price', 'image']
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigurationError(
            f"make_catalog(n={n!r}): n must be a positive int. Fix: pass e.g. n=5000."
        )
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:
        raise MissingDependencyError("pillow", "images", "make_catalog()") from exc
    rng = np.random.default_rng(seed)
    root = Path(path)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    cat = rng.integers(len(CATEGORIES), size=n)
    col = rng.integers(len(COLOURS), size=n)
    pat = rng.integers(len(PATTERNS), size=n)
    corrupt_ids = set(rng.choice(n, size=_count(n, _CORRUPT_FRACTION), replace=False).tolist())
    missing = set(rng.choice(n, size=_count(n, _MISSING_PRICE_FRACTION), replace=False).tolist())
    colour_names = list(COLOURS)
    rows: list[dict[str, Any]] = []
    corrupt: dict[str, str] = {}
    messy = 0
    for i in range(n):
        category, colour, pattern = CATEGORIES[cat[i]], colour_names[col[i]], PATTERNS[pat[i]]
        png = _draw(Image, ImageDraw, rng, category, COLOURS[colour], pattern)
        relative = f"images/{i:06d}.png"
        if i in corrupt_ids:
            png, how = _corrupt(png, rng)
            corrupt[relative] = how
        (root / relative).write_bytes(png)
        label = _messy_category(category, rng)
        messy += label != category
        price = _price(category, pattern, rng)
        rows.append(
            {
                "id": i,
                "description": _describe(category, colour, pattern, rng),
                "category": label,
                "price": "" if i in missing else f"{price:.2f}",
                "image": relative,
            }
        )
    csv_path = root / "catalog.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(
            handle, fieldnames=["id", "description", "category", "price", "image"]
        )
        writer.writeheader()
        writer.writerows(rows)
    return Catalog(root, csv_path, images, n, corrupt, tuple(sorted(missing)), messy)


def _count(n: int, fraction: float) -> int:
    """How many rows get a defect: ``round(n * fraction)``, at least one from 50 rows on."""
    return max(round(n * fraction), 1 if n >= 50 else 0)


def _describe(category: str, colour: str, pattern: str, rng: np.random.Generator) -> str:
    template = _TEMPLATES[rng.integers(len(_TEMPLATES))]
    words = _PATTERN_WORDS[pattern]
    return template.format(
        pattern=words[rng.integers(len(words))],
        colour=colour,
        category=category,
        style=_STYLES[rng.integers(len(_STYLES))],
        season=_SEASONS[rng.integers(len(_SEASONS))],
    ).capitalize()


def _messy_category(category: str, rng: np.random.Generator) -> str:
    variant = rng.integers(10)
    if variant < 6:
        return category
    if variant < 8:
        return category.capitalize()
    if variant == 8:
        return f" {category}"
    return f"{category.upper()} "


def _price(category: str, pattern: str, rng: np.random.Generator) -> float:
    factor = {"plain": 1.0, "striped": 1.1, "dotted": 1.2}[pattern]
    return float(_BASE_PRICE[category] * factor * rng.lognormal(0.0, 0.25))


def _corrupt(png: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    kind = rng.integers(3)
    if kind == 0:
        return png[: len(png) // 2], "truncated"
    if kind == 1:
        return rng.integers(0, 256, size=len(png), dtype=np.uint8).tobytes(), "garbage bytes"
    return b"", "empty file"


def _shape(draw: Any, category: str, box: tuple[float, float, float, float]) -> None:
    """Draw the silhouette of ``category`` (fill 255) inside ``box`` on a mask."""
    x0, y0, w, h = box

    def poly(points: list[tuple[float, float]]) -> None:
        draw.polygon([(x0 + u * w, y0 + v * h) for u, v in points], fill=255)

    def rect(u0: float, v0: float, u1: float, v1: float, ellipse: bool = False) -> None:
        xy = [x0 + u0 * w, y0 + v0 * h, x0 + u1 * w, y0 + v1 * h]
        (draw.ellipse if ellipse else draw.rectangle)(xy, fill=255)

    if category == "shirt":
        poly(
            [
                (0.3, 0),
                (0.7, 0),
                (1, 0.25),
                (0.85, 0.42),
                (0.75, 0.32),
                (0.75, 1),
                (0.25, 1),
                (0.25, 0.32),
                (0.15, 0.42),
                (0, 0.25),
            ]
        )
    elif category == "trousers":
        poly([(0.2, 0), (0.8, 0), (0.92, 1), (0.6, 1), (0.5, 0.35), (0.4, 1), (0.08, 1)])
    elif category == "dress":
        poly([(0.38, 0), (0.62, 0), (0.66, 0.35), (0.95, 1), (0.05, 1), (0.34, 0.35)])
    elif category == "shoes":
        poly([(0.05, 0.3), (0.4, 0.3), (0.5, 0.6), (0.95, 0.72), (0.95, 1), (0.05, 1)])
    elif category == "hat":
        rect(0.2, 0.15, 0.8, 1.2, ellipse=True)
        rect(0.0, 0.75, 1.0, 0.95)
    elif category == "bag":
        rect(0.1, 0.4, 0.9, 1.0)
        draw.arc(
            [x0 + 0.28 * w, y0, x0 + 0.72 * w, y0 + 0.7 * h],
            180,
            360,
            fill=255,
            width=max(2, round(0.08 * w)),
        )
    elif category == "scarf":
        rect(0.0, 0.3, 1.0, 0.55)
        rect(0.68, 0.55, 0.86, 1.0)
    else:  # watch
        rect(0.4, 0.0, 0.6, 1.0)
        rect(0.22, 0.26, 0.78, 0.74, ellipse=True)


def _draw(
    Image: Any,
    ImageDraw: Any,
    rng: np.random.Generator,
    category: str,
    rgb: tuple[int, int, int],
    pattern: str,
) -> bytes:
    """One product photo as PNG bytes."""
    grey = int(rng.integers(185, 240))
    w, h = (float(v) for v in rng.uniform(0.55, 0.9, size=2) * _SIZE)
    x0, y0 = (float(v) for v in rng.uniform(0, 1, size=2) * (_SIZE - np.array([w, h])))
    mask = Image.new("L", (_SIZE, _SIZE), 0)
    _shape(ImageDraw.Draw(mask), category, (x0, y0, w, h))
    fill = np.clip(np.array(rgb) + rng.normal(0, 10, size=3), 0, 255).astype(np.uint8)
    layer = Image.new("RGB", (_SIZE, _SIZE), tuple(int(v) for v in fill))
    dark = (28, 28, 28)  # the pattern: near black, far from every colour word's fill
    paint = ImageDraw.Draw(layer)
    if pattern == "striped":
        step = int(rng.integers(5, 8))
        for k in range(-_SIZE, 2 * _SIZE, step):
            paint.line([(k, 0), (k + _SIZE, _SIZE)], fill=dark, width=2)
    elif pattern == "dotted":
        step = int(rng.integers(6, 9))
        for yy in range(int(rng.integers(step)), _SIZE, step):
            for xx in range(int(rng.integers(step)), _SIZE, step):
                paint.ellipse([xx - 1.5, yy - 1.5, xx + 1.5, yy + 1.5], fill=dark)
    canvas = Image.new("RGB", (_SIZE, _SIZE), (grey, grey, grey))
    canvas.paste(layer, mask=mask)
    pixels = np.asarray(canvas, dtype=np.int16) + rng.normal(0, 6, (_SIZE, _SIZE, 3)).astype(
        np.int16
    )
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()
