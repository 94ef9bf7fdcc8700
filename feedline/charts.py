"""PNG charts (the ``plots`` extra): loader throughput and data wait over time.

Figures are drawn with matplotlib's Agg canvas directly (``matplotlib.figure.Figure``), so
neither pyplot nor the process-wide backend is touched.

Examples
--------
>>> import feedline as fl, tempfile
>>> loader = fl.range(4096).loader(batch_size=64, format="numpy")
>>> _ = list(loader)
>>> plot_loader_timeline(loader.timeline(), tempfile.mkdtemp() + "/t.png").suffix
'.png'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, MissingDependencyError
from feedline.ui.inert_text import inert

__all__ = [
    "bin_timeline",
    "draw_loader_timeline",
    "draw_stage_times",
    "plot_loader_timeline",
    "plot_stage_times",
]

#: figure size in inches and resolution: 1200 x 700 pixels
FIGSIZE, DPI = (12.0, 7.0), 100
_KEYS = ("epoch", "time", "samples", "wait_s", "step_s")


def _columns(timeline: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    if not len(timeline):
        raise ConfigurationError(
            "plot_loader_timeline: the timeline is empty (no batch was delivered). Fix: iterate "
            "the loader first and pass loader.timeline()."
        )
    try:
        return {k: np.array([row[k] for row in timeline], dtype=np.float64) for k in _KEYS}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"plot_loader_timeline: a timeline entry lacks a numeric {exc} key. Fix: pass "
            "Loader.timeline() (dicts with epoch, time, samples, wait_s, step_s)."
        ) from exc


def _cumulative(knots_x: np.ndarray, knots_y: np.ndarray, at: np.ndarray) -> np.ndarray:
    return np.interp(at, np.maximum.accumulate(knots_x), knots_y)


def bin_timeline(timeline: Sequence[Mapping[str, Any]], bins: int = 60) -> dict[str, np.ndarray]:
    """Throughput and data-wait fraction per time bin of a ``Loader.timeline()``.

    Samples count in the bin where their batch was delivered; waiting and stepping time is
    spread over the bins its interval overlaps (a batch waited ``[time - wait_s, time]`` after
    stepping ``step_s`` before that). A bin without waiting or stepping (a pause between
    iterations) has a NaN wait fraction.

    Returns
    -------
    dict
        ``edges`` (bins + 1 times in seconds), ``samples_per_s`` and ``wait_fraction`` (per bin).

    Examples
    --------
    >>> rows = [{"epoch": 0, "time": t, "samples": 10, "wait_s": 0.25, "step_s": 0.75}
    ...         for t in (1.0, 2.0, 3.0, 4.0)]
    >>> b = bin_timeline(rows, bins=2)
    >>> b["samples_per_s"].tolist(), b["wait_fraction"].round(2).tolist()
    ([10.0, 10.0], [0.25, 0.25])
    """
    c = _columns(timeline)
    end, bins = float(c["time"].max()), max(1, int(bins))
    edges = np.linspace(0.0, end if end > 0 else 1.0, bins + 1)
    delivered = np.clip(np.searchsorted(edges, c["time"], side="left") - 1, 0, bins - 1)
    samples = np.bincount(delivered, weights=c["samples"], minlength=bins)
    asked = c["time"] - c["wait_s"]
    start = asked - c["step_s"]
    # cumulative wait and step time as piecewise-linear functions of time
    x = np.stack([start, asked, c["time"]], axis=1).ravel()
    w0 = np.concatenate([[0.0], np.cumsum(c["wait_s"])[:-1]])
    s0 = np.concatenate([[0.0], np.cumsum(c["step_s"])[:-1]])
    wait = np.diff(_cumulative(x, np.stack([w0, w0, w0 + c["wait_s"]], 1).ravel(), edges))
    step_y = np.stack([s0, s0 + c["step_s"], s0 + c["step_s"]], 1).ravel()
    step = np.diff(_cumulative(x, step_y, edges))
    busy = wait + step
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = np.where(busy > 1e-12, wait / busy, np.nan)
    return {"edges": edges, "samples_per_s": samples / np.diff(edges), "wait_fraction": fraction}


def _figure() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError("matplotlib", "plots", "feedline.charts") from exc
    figure = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_loader_timeline(
    timeline: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    bins: int | None = None,
) -> Path:
    """Write a PNG of a loader's throughput and data-wait fraction over time.

    Top: samples/s per time bin and each epoch's mean; bottom:
    the share of the training loop's time spent waiting for data, per bin. Dashed lines mark
    where each epoch started. 1200 x 700 pixels.

    Parameters
    ----------
    timeline:
        ``Loader.timeline()`` (dicts with ``epoch``, ``time``, ``samples``, ``wait_s``,
        ``step_s``).
    path:
        The PNG to write (its folder is created).
    title:
        The chart's title.
    bins:
        Time bins over the run (default: about 20 batches per bin, 10 to 60 bins).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    figure = draw_loader_timeline(timeline, title=title, bins=bins)
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out, format="png")
    except OSError as exc:
        raise ConfigurationError(
            f"plot_loader_timeline: cannot write {str(out)!r}: {exc}. Fix: pass a writable path."
        ) from exc
    return out


def draw_loader_timeline(
    timeline: Sequence[Mapping[str, Any]], *, title: str | None = None, bins: int | None = None
) -> Any:
    """The matplotlib ``Figure`` that :func:`plot_loader_timeline` saves (same arguments).

    Every label fits in the figure: the throughput axis has headroom above the tallest bin
    for the epoch labels, and its ticks are compact (``500k``, ``80M``).

    Examples
    --------
    >>> rows = [{"epoch": 0, "time": t, "samples": 10, "wait_s": 0.25, "step_s": 0.75}
    ...         for t in (1.0, 2.0, 3.0, 4.0)]
    >>> [a.get_ylabel() for a in draw_loader_timeline(rows).axes][0]
    'throughput (samples/s)'
    """
    bins = bins or int(np.clip(len(timeline) // 20, 10, 60))
    c, binned = _columns(timeline), bin_timeline(timeline, bins)
    figure = _figure()
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    edges, rate = binned["edges"], binned["samples_per_s"]
    top.stairs(rate, edges, fill=True, alpha=0.35, color="tab:blue")
    top.stairs(rate, edges, color="tab:blue", linewidth=1.5, label="samples/s (per time bin)")
    epochs = c["epoch"].astype(int)
    starts = c["time"] - c["wait_s"] - c["step_s"]
    for n, e in enumerate(np.unique(epochs)):
        mine = epochs == e
        t0, t1 = float(starts[mine].min()), float(c["time"][mine].max())
        spent = float((c["wait_s"][mine] + c["step_s"][mine]).sum())
        mean = float(c["samples"][mine].sum()) / spent if spent > 0 else 0.0
        top.hlines(mean, t0, t1, colors="tab:red", linewidth=2,
                   label="epoch mean samples/s" if n == 0 else None)  # fmt: skip
        for axis in (top, bottom):
            axis.axvline(t0, color="0.4", linestyle="--", linewidth=1)
        top.annotate(f"epoch {e}", (t0, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                     textcoords="offset points", fontsize=9, color="0.3")  # fmt: skip
    top.set_ylabel("throughput (samples/s)")
    highest = float(np.nanmax(rate)) if len(rate) and np.isfinite(rate).any() else 0.0
    top.set_ylim(0, highest * 1.18 if highest > 0 else 1.0)  # headroom for the epoch labels
    top.grid(alpha=0.3)
    top.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, fontsize=9, frameon=False)
    top.yaxis.set_major_formatter(_thousands(top))
    fraction = 100 * binned["wait_fraction"]
    bottom.stairs(np.nan_to_num(fraction), edges, fill=True, color="tab:orange", alpha=0.6)
    bottom.set_ylim(0, 100)
    bottom.set_ylabel("time waiting for data\n(% of the loop, per bin)")
    bottom.set_xlabel("time since the loader started (s)")
    bottom.grid(alpha=0.3)
    total_wait, total = float(c["wait_s"].sum()), float((c["wait_s"] + c["step_s"]).sum())
    figure.suptitle(
        (title or "loader throughput and data wait")
        + f"\n{int(c['samples'].sum()):,} samples in {len(c['time']):,} batches; "
        f"waited {100 * total_wait / total if total > 0 else 0:.1f}% of the loop's time",
        fontsize=12,
    )
    return figure


def draw_stage_times(
    stages: Sequence[tuple[str, float]], step_ms: float, *, title: str | None = None
) -> Any:
    """The ``Figure`` that :func:`plot_stage_times` saves: one bar per stage (ms per batch of
    its own work) and a line at the training step.

    Examples
    --------
    >>> f = draw_stage_times([("transform", 9.5), ("gather", 0.2)], 4.0)
    >>> f.axes[0].get_xlabel()
    'milliseconds per batch (own work)'
    """
    if not stages:
        raise ConfigurationError(
            "plot_stage_times: no stage was measured. Fix: run the loader (loader.diagnose() "
            "or an iteration) before charting its stages."
        )
    figure = _figure()
    axis = figure.subplots(1, 1)
    names = [inert(name) for name, _ in stages][::-1]
    values = [float(ms) for _, ms in stages][::-1]
    worst = max(range(len(values)), key=values.__getitem__)
    colors = ["tab:red" if i == worst else "tab:blue" for i in range(len(values))]
    axis.barh(names, values, color=colors, alpha=0.8)
    axis.axvline(step_ms, color="0.2", linestyle="--", linewidth=1.5,
                 label=f"training step ({step_ms:,.1f} ms)")  # fmt: skip
    for y, v in enumerate(values):
        axis.annotate(f"{v:,.2f} ms", (v, y), xytext=(4, 0), textcoords="offset points",
                      va="center", fontsize=9)  # fmt: skip
    axis.set_xlabel("milliseconds per batch (own work)")
    axis.set_xlim(0, max([*values, step_ms]) * 1.25 or 1.0)
    axis.grid(alpha=0.3, axis="x")
    axis.legend(loc="lower right", fontsize=9)
    figure.suptitle(_wrap(inert(title or "loader stage times")), fontsize=11)
    return figure


def plot_stage_times(
    stages: Sequence[tuple[str, float]],
    step_ms: float,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """Write a PNG of each loader stage's milliseconds per batch against the training step.

    ``stages``: ``(name, ms per batch)`` pairs, the first at the top (what
    ``Diagnosis.plot`` passes from ``loader.diagnose()``); the busiest bar is red.

    Examples
    --------
    >>> import tempfile
    >>> plot_stage_times([("transform", 9.5)], 4.0, tempfile.mkdtemp() + "/s.png").suffix
    '.png'
    """
    figure = draw_stage_times(stages, step_ms, title=title)
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out, format="png")
    except OSError as exc:
        raise ConfigurationError(
            f"plot_stage_times: cannot write {str(out)!r}: {exc}. Fix: pass a writable path."
        ) from exc
    return out


def _wrap(text: str, width: int = 110) -> str:
    """``text`` broken into lines of at most about ``width`` characters, at spaces."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def _compact(value: float, top: float) -> str:
    """A tick of an axis that reaches ``top``: one unit for the whole axis (``k`` from
    100,000, ``M`` from ten million, ``G`` from ten billion), thousands separators below.

    Examples
    --------
    >>> [_compact(v, 5e5) for v in (0, 250000, 500000)], [_compact(v, 8e7) for v in (0, 4e7, 8e7)]
    (['0', '250k', '500k'], ['0', '40M', '80M'])
    >>> [_compact(v, 12500) for v in (0, 12500)], _compact(1.5e10, 2e10)
    (['0', '12,500'], '15G')
    """
    for scale, suffix, start in ((1e9, "G", 1e10), (1e6, "M", 1e7), (1e3, "k", 1e5)):
        if top >= start:
            return f"{value / scale:,.4g}{suffix}" if value else "0"
    return f"{value:,.0f}"


def _thousands(axis: Any) -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: _compact(v, max(abs(x) for x in axis.get_ylim())))
