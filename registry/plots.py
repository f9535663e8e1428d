"""The candidate-vs-champion comparison plot logged with every evaluation."""

from __future__ import annotations

import math
from pathlib import Path

from eval.reports import EvalReport

CANDIDATE_COLOR = "#1f77b4"
CHAMPION_COLOR = "#7f7f7f"


def comparison_plot(candidate: EvalReport, champion: EvalReport, path: Path) -> Path:
    """Write a PNG with one small bar chart per metric, candidate beside champion.

    Metrics have different scales (accuracy, loss, answer length), so each gets
    its own axes rather than sharing one. Uses matplotlib's object API on an Agg
    canvas: no display, and no pyplot global state touched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ours = candidate.metrics()
    theirs = champion.metrics()
    names = [name for name in ours | theirs if name != "pairs"]
    columns = min(4, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / columns))
    figure = Figure(figsize=(3.2 * columns, 2.6 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    labels = ("candidate", "champion")
    for ax, name in zip(axes, names, strict=False):
        values = (ours.get(name), theirs.get(name))
        heights = [0.0 if v is None else v for v in values]
        bars = ax.bar(labels, heights, color=(CANDIDATE_COLOR, CHAMPION_COLOR))
        ax.bar_label(bars, labels=["n/a" if v is None else f"{v:.3g}" for v in values], fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.margins(y=0.2)
        if min(heights) >= 0:
            ax.set_ylim(bottom=0, top=max(heights) * 1.2 or 1.0)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    figure.suptitle(f"{candidate.model} (candidate) vs {champion.model} (champion)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path
