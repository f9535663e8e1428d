"""The candidate-vs-champion comparison plot logged with every evaluation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from eval.reports import PAIR_METRICS, EvalReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CANDIDATE_COLOR = "#1f77b4"
CHAMPION_COLOR = "#7f7f7f"


def comparison_title(candidate: EvalReport, champion: EvalReport, verdict: str | None) -> str:
    """The plot's title: who is compared with whom, on how many pairs, and the gate's verdict
    (``medical-dpo-1a2b3c4d vs medical-v2`` / ``n=60 held-out pairs · gate: promote``)."""
    pairs = f"n={candidate.pairs} held-out pairs"
    if champion.pairs != candidate.pairs:
        pairs = f"n={candidate.pairs} (candidate) and {champion.pairs} (champion) held-out pairs"
    facts = [pairs, "error bars: 95% intervals"]
    if verdict:
        facts.append(f"gate: {verdict}")
    return f"{candidate.model} vs {champion.model}\n{' · '.join(facts)}"


def comparison_plot(
    candidate: EvalReport, champion: EvalReport, path: Path, *, verdict: str | None = None
) -> Path:
    """Write :func:`comparison_figure` as a PNG at ``path``."""
    figure = comparison_figure(candidate, champion, verdict=verdict)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path


def comparison_figure(
    candidate: EvalReport, champion: EvalReport, *, verdict: str | None = None
) -> Figure:
    """One small bar chart per metric, candidate beside champion.

    Shares of a count (preference accuracy, refusal rate) get their 95% Wilson interval as
    error bars and their n in the panel's title; ``verdict`` (the gate's summary) goes in
    the figure's title. Metrics have different scales (accuracy, loss, answer length), so
    each gets its own axes rather than sharing one. Uses matplotlib's object API on an Agg
    canvas: no display, and no pyplot global state touched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ours = candidate.metrics()
    theirs = champion.metrics()
    bounds = (candidate.intervals(), champion.intervals())
    names = [name for name in ours | theirs if name != "pairs"]
    columns = min(4, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / columns))
    figure = Figure(figsize=(3.4 * columns, 2.8 * rows + 0.9), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        values = (ours.get(name), theirs.get(name))
        heights = [0.0 if v is None else v for v in values]
        spans = [side.get(name) for side in bounds]
        errors = [
            [0.0 if s is None else max(h - s[1], 0.0) for h, s in zip(heights, spans, strict=True)],
            [0.0 if s is None else max(s[2] - h, 0.0) for h, s in zip(heights, spans, strict=True)],
        ]
        has_errors = any(s is not None for s in spans)
        labels = [
            f"{side}\n{_value(v, s)}"
            for side, v, s in zip(("candidate", "champion"), values, spans, strict=True)
        ]
        ax.bar(
            labels,
            heights,
            color=(CANDIDATE_COLOR, CHAMPION_COLOR),
            yerr=errors if has_errors else None,
            capsize=6 if has_errors else 0,
            ecolor="black",
        )
        ax.set_title(_panel_title(name, candidate, spans, verdict), fontsize=9)
        ax.tick_params(labelsize=8)
        ax.margins(y=0.2)
        top = max([*heights, *(s[2] for s in spans if s is not None)])
        if min(heights) >= 0:
            ax.set_ylim(bottom=0, top=top * 1.15 or 1.0)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    figure.suptitle(comparison_title(candidate, champion, verdict), fontsize=10)
    return figure


def _panel_title(
    name: str,
    candidate: EvalReport,
    spans: list[tuple[int, float, float] | None],
    verdict: str | None,
) -> str:
    notes = []
    counted = next((s[0] for s in spans if s is not None), None)
    if counted is None and name in PAIR_METRICS and candidate.pairs:
        counted = candidate.pairs
    if counted is not None:
        notes.append(f"n={counted}")
    if name in PAIR_METRICS and verdict is not None and verdict.startswith("not judged"):
        notes.append("not judged")
    return f"{name} ({', '.join(notes)})" if notes else name


def _value(value: float | None, span: tuple[int, float, float] | None) -> str:
    if value is None:
        return "n/a"
    if span is None:
        return f"{value:.3g}"
    return f"{value:.2f} ({span[1]:.2f}–{span[2]:.2f})"
