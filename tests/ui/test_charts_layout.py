"""The loader chart's layout, measured on the drawn figure: every text inside it, epoch labels
above the data, compact throughput ticks, no tick labels overlapping."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import feedline as fl

pytest.importorskip("matplotlib")
from matplotlib.text import Text

from feedline.charts import draw_loader_timeline


@pytest.fixture(scope="module")
def figure():
    loader = fl.range(60_000).loader(batch_size=500, format="numpy")
    for epoch in range(3):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    timeline = loader.timeline()
    figure = draw_loader_timeline(timeline, title="a long title " * 4)
    figure.canvas.draw()
    return figure


def _drawn_ticks(axis) -> list[Text]:
    """The tick labels matplotlib draws: those of ticks inside the view interval."""
    low, high = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks()
    return [
        t.label1 for t in ticks if low - 1e-9 <= t.get_loc() <= high + 1e-9 and t.label1.get_text()
    ]


def _texts(figure) -> list[Text]:
    ticks = {id(t) for a in figure.axes for ax in (a.xaxis, a.yaxis) for t in ax.get_ticklabels()}
    drawn = [t for a in figure.axes for ax in (a.xaxis, a.yaxis) for t in _drawn_ticks(ax)]
    other = [t for t in figure.findobj(Text) if id(t) not in ticks and t.get_text().strip()]
    return [t for t in drawn + other if t.get_visible()]


def test_every_text_is_inside_the_figure(figure) -> None:
    renderer = figure.canvas.get_renderer()
    width, height = figure.bbox.width, figure.bbox.height
    for text in _texts(figure):
        box = text.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0, text.get_text()
        assert box.x1 <= width and box.y1 <= height, text.get_text()


def test_epoch_labels_sit_above_the_data(figure) -> None:
    renderer = figure.canvas.get_renderer()
    top = figure.axes[0]
    paths = [p.get_path() for p in top.patches]
    paths += [q for c in top.collections for q in c.get_paths()]
    highest = max(np.nanmax(path.vertices[:, 1]) for path in paths if len(path.vertices))
    data_top = top.transData.transform((0, highest))[1]
    labels = [t for t in top.texts if t.get_text().startswith("epoch ")]
    assert len(labels) == 3
    for label in labels:
        assert label.get_window_extent(renderer).y0 >= data_top, label.get_text()


def test_throughput_ticks_are_compact_and_no_tick_labels_overlap(figure) -> None:
    renderer = figure.canvas.get_renderer()
    top, bottom = figure.axes[:2]
    labels = [t.get_text() for t in _drawn_ticks(top.yaxis)]
    assert labels and all(re.fullmatch(r"0|\d{1,3}(,\d{3})?|\d+(\.\d+)?[kMG]", s) for s in labels)
    assert max(len(s) for s in labels) <= 6, labels
    for axis in (top.yaxis, bottom.yaxis, bottom.xaxis):
        boxes = [t.get_window_extent(renderer) for t in _drawn_ticks(axis)]
        boxes.sort(key=lambda b: (b.x0, b.y0))
        for a, b in itertools.pairwise(boxes):
            assert not a.overlaps(b)
