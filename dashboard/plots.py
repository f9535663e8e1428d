"""Plots as inline SVG strings, rendered on the server (no JavaScript, nothing fetched).

Each function is pure: numbers in, an ``<svg>`` element out, every label escaped.
A line chart draws one polyline per series with a gap where a bucket has no data
(a rate over zero requests is unknown, not zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from html import escape

from markupsafe import Markup

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
CANDIDATE_COLOR = "#1f77b4"
CHAMPION_COLOR = "#7f7f7f"
MARKED_POINTS = 48  # up to this many buckets, every point of a line gets a marker


def color_of(index: int) -> str:
    """The series color at ``index`` (cycles through the palette)."""
    return PALETTE[index % len(PALETTE)]


def _number(value: float, percent: bool) -> str:
    if percent:
        return f"{value:.0%}" if value >= 0.1 or value == 0 else f"{value:.1%}"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _time_label(value: datetime, size: timedelta) -> str:
    if size >= timedelta(days=1):
        return f"{value.day} {value:%b}"
    return f"{value.day} {value:%b %H:%M}"


def line_chart(
    title: str,
    starts: Sequence[datetime],
    size: timedelta,
    series: dict[str, Sequence[float | None]],
    *,
    percent: bool = False,
    width: int = 380,
    height: int = 170,
) -> Markup:
    """A small line chart: x is time (bucket starts), one colored line per series."""
    left, right, top, bottom = 44, 8, 22, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for points in series.values() for v in points if v is not None]
    peak = max(values, default=0.0) or (0.01 if percent else 1.0)
    n = max(len(starts), 1)

    def x(i: int) -> float:
        return left + (plot_w * (i + 0.5) / n)

    def y(v: float) -> float:
        return top + plot_h * (1 - v / peak)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="14" class="chart-title">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'class="axis"/>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        tick = peak * fraction
        parts.append(
            f'<text x="{left - 4}" y="{y(tick) + 4:.1f}" class="tick" text-anchor="end">'
            f"{escape(_number(tick, percent))}</text>"
        )
        if fraction:
            parts.append(
                f'<line x1="{left}" y1="{y(tick):.1f}" x2="{left + plot_w}" y2="{y(tick):.1f}" '
                'class="grid"/>'
            )
    if starts:
        for i in sorted({0, len(starts) // 2, len(starts) - 1}):
            anchor = "start" if i == 0 else "end" if i == len(starts) - 1 else "middle"
            parts.append(
                f'<text x="{x(i):.1f}" y="{height - 12}" class="tick" text-anchor="{anchor}">'
                f"{escape(_time_label(starts[i], size))}</text>"
            )
    for index, (name, points) in enumerate(series.items()):
        color = color_of(index)
        runs: list[list[str]] = [[]]
        for i, value in enumerate(points):
            if value is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(i):.1f},{y(value):.1f}")
        for run in runs:
            if len(run) > 1:
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.6" '
                    f'points="{" ".join(run)}"><title>{escape(name)}</title></polyline>'
                )
            # Few points get a marker each, sized to the room they have; a lone point always.
            if len(run) == 1 or n <= MARKED_POINTS:
                radius = 3 if n <= MARKED_POINTS else 2
                for point in run:
                    cx, cy = point.split(",")
                    parts.append(f'<circle cx="{cx}" cy="{cy}" r="{radius}" fill="{color}"/>')
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every label above went through escape())


def funnel_chart(steps: Sequence[tuple[str, int]], *, width: int = 520) -> Markup:
    """Horizontal bars, one per cleaning step, each with its count and share of the first."""
    bar_h, gap, label_w = 22, 8, 120
    height = len(steps) * (bar_h + gap) + gap
    first = steps[0][1] if steps and steps[0][1] else 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart funnel" viewBox="0 0 {width} '
        f'{height}" width="{width}" height="{height}" role="img" aria-label="cleaning funnel">'
    ]
    for i, (name, count) in enumerate(steps):
        top = gap + i * (bar_h + gap)
        span = (width - label_w - 110) * count / first
        parts.append(
            f'<text x="0" y="{top + 15}" class="tick">{escape(name)}</text>'
            f'<rect x="{label_w}" y="{top}" width="{span:.1f}" height="{bar_h}" '
            f'fill="{color_of(0)}" opacity="{1 - 0.15 * i:.2f}"/>'
            f'<text x="{label_w + span + 6:.1f}" y="{top + 15}" class="tick">'
            f"{count:,} ({count / first:.0%})</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every label above went through escape())


def metric_bars(
    rows: Sequence[tuple[str, float | None, float | None]], *, columns: int = 4
) -> Markup:
    """Candidate beside champion, one small bar pair per metric, each on its own scale
    (accuracy, loss and answer length do not share an axis)."""
    cell_w, cell_h = 150, 110
    count = max(len(rows), 1)
    cols = min(columns, count)
    lines = (count + cols - 1) // cols
    width, height = cols * cell_w, lines * cell_h + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="candidate vs champion">',
        f'<rect x="4" y="4" width="10" height="10" fill="{CANDIDATE_COLOR}"/>'
        '<text x="18" y="13" class="tick">candidate</text>'
        f'<rect x="90" y="4" width="10" height="10" fill="{CHAMPION_COLOR}"/>'
        '<text x="104" y="13" class="tick">champion</text>',
    ]
    for i, (name, candidate, champion) in enumerate(rows):
        ox, oy = (i % cols) * cell_w, 20 + (i // cols) * cell_h
        parts.append(f'<text x="{ox + 6}" y="{oy + 14}" class="tick">{escape(name)}</text>')
        present = [abs(v) for v in (candidate, champion) if v is not None]
        peak = max(present, default=0.0) or 1.0
        for j, (value, color) in enumerate(
            ((candidate, CANDIDATE_COLOR), (champion, CHAMPION_COLOR))
        ):
            bar_x = ox + 20 + j * 55
            if value is None:
                parts.append(f'<text x="{bar_x}" y="{oy + 80}" class="tick">n/a</text>')
                continue
            bar = 62 * abs(value) / peak
            parts.append(
                f'<rect x="{bar_x}" y="{oy + 88 - bar:.1f}" width="40" height="{bar:.1f}" '
                f'fill="{color}"/><text x="{bar_x}" y="{oy + 100}" class="tick">'
                f"{escape(f'{value:.3g}')}</text>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every label above went through escape())
