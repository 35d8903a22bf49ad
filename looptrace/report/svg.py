"""The page's charts, drawn as inline SVG when the report is written: no script, nothing fetched, a few kilobytes each.

Three shapes: columns stacked by series (runs per period by status), plain columns (a share or a sum per period),
and a run's timeline (``timeline_svg``: bars on one time axis, its loops as bands over the turns they took). Every
mark carries a ``<title>`` (the browser shows it on hover) and ``data-*`` attributes saying what it stands for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH = 960
PLOT_LEFT = 56  # room for the value axis
PLOT_RIGHT = 12
PLOT_TOP = 10
AXIS_ROOM = 26  # below the plot: the period labels
MAX_LABELS = 12  # period labels shown at most; the others are on the columns' titles


@dataclass(frozen=True, slots=True)
class Column:
    """One period's column: its label, its parts (series name, value) bottom up, and what its title says."""

    label: str
    parts: Sequence[tuple[str, float]]
    title: str
    key: str  # the period, as data: 2026-11-24 or 2026-11-24T09


def columns_svg(columns: Sequence[Column], colors: dict[str, str], *, height: int = 200, width: int = WIDTH,
                value_format: Callable[[float], str] = lambda v: f"{v:,.0f}", name: str = "chart") -> Markup:
    """Columns side by side, each stacked from its parts; a value axis with a few round ticks."""
    top = max((sum(v for _, v in c.parts) for c in columns), default=0.0)
    ticks = nice_ticks(top)
    scale_top = ticks[-1] if ticks[-1] > 0 else 1.0
    plot_h = height - PLOT_TOP - AXIS_ROOM
    plot_w = width - PLOT_LEFT - PLOT_RIGHT
    slot = plot_w / max(len(columns), 1)
    bar_w = max(min(slot * 0.72, 48), 1.0)
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(name)}" '
           f'preserveAspectRatio="xMinYMin meet">']
    for tick in ticks:
        y = PLOT_TOP + plot_h * (1 - tick / scale_top)
        out.append(f'<line class="grid" x1="{PLOT_LEFT}" x2="{width - PLOT_RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{PLOT_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{escape(value_format(tick))}</text>')
    every = math.ceil(len(columns) / max(MAX_LABELS * width // WIDTH, 4)) if columns else 1
    for index, column in enumerate(columns):
        x = PLOT_LEFT + slot * index + (slot - bar_w) / 2
        base = float(PLOT_TOP + plot_h)
        for series, value in column.parts:
            if value <= 0:
                continue
            h = plot_h * value / scale_top
            base -= h
            out.append(f'<rect class="mark" x="{x:.1f}" y="{base:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                       f'fill="{colors.get(series, "#888")}" data-period="{escape(column.key)}" '
                       f'data-series="{escape(series)}" data-value="{value:g}">'
                       f'<title>{escape(column.title)}</title></rect>')
        if index % every == 0:
            out.append(f'<text class="label" x="{x + bar_w / 2:.1f}" y="{height - 8}" text-anchor="middle">'
                       f'{escape(column.label)}</text>')
    out.append(f'<line class="axis" x1="{PLOT_LEFT}" x2="{width - PLOT_RIGHT}" y1="{PLOT_TOP + plot_h}" '
               f'y2="{PLOT_TOP + plot_h}"/></svg>')
    return Markup("".join(out))


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round values from 0 to at least ``top``: 0, 5, 10, 15 or 0, 0.25, 0.5 ..."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [step * i for i in range(math.ceil(top / step - 1e-9) + 1)]


def time_ticks(span_ns: int, count: int = 6) -> list[int]:
    """Round offsets (ns) from the start of a run to its end: 0, 2 ms, 4 ms ... or 0, 30 s, 1 min ..."""
    if span_ns <= 0:
        return [0]
    raw = span_ns / count
    steps = [m * 10**e for e in range(0, 13) for m in (1, 2, 5)] + [60e9 * m for m in (1, 2, 5, 10, 15, 30, 60)]
    step = next((s for s in sorted(steps) if s >= raw), raw)
    return [int(step * i) for i in range(int(span_ns // step) + 1)]


def duration_text(ns: float) -> str:
    """A span of time as people say it: 850 µs, 12 ms, 3.4 s, 2 min 5 s."""
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.0f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.0f} ms" if ns >= 10_000_000 else f"{ns / 1e6:.1f} ms"
    seconds = ns / 1e9
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"
