"""The candidate-vs-champion comparison plot."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eval.reports import EvalReport, GenerationSample
from flywheel.intervals import wilson_interval
from registry.plots import comparison_figure, comparison_plot, comparison_title

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _report(model: str, accuracy: float | None, loss: float) -> EvalReport:
    return EvalReport(
        model=model,
        pairs=20,
        preference_accuracy=accuracy,
        mean_margin=None if accuracy is None else accuracy - 0.5,
        preferred_loss=None if accuracy is None else loss * 0.8,
        general_loss=loss,
        refusal_rate=0.05,
        mean_answer_length=52.0,
        pii_in_generations=0,
        canaries_in_generations=1,
    )


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = comparison_plot(
        _report("medical-v2", 0.8, 1.9), _report("medical-v1", 0.6, 2.0), tmp_path / "a" / "c.png"
    )

    assert path == tmp_path / "a" / "c.png"
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert path.stat().st_size > 5_000


def test_plot_copes_with_missing_metrics(tmp_path: Path) -> None:
    path = comparison_plot(
        _report("medical-v1", 0.7, 1.9), _report("base", None, 2.1), tmp_path / "c.png"
    )

    assert path.read_bytes().startswith(PNG_SIGNATURE)


def _paired(model: str, right: int, pairs: int, refused: int) -> EvalReport:
    wins = (True,) * right + (False,) * (pairs - right)
    samples = tuple(
        GenerationSample(prompt=f"q{i}", answer="a", refused=i < refused) for i in range(8)
    )
    return dataclasses.replace(
        _report(model, right / pairs, 2.0),
        pairs=pairs,
        pair_wins=wins,
        samples=samples,
        refusal_rate=refused / 8,
    )


def test_the_title_names_both_models_the_pairs_and_the_gates_verdict() -> None:
    candidate = _paired("medical-dpo-1a2b3c4d", 45, 60, 0)

    title = comparison_title(candidate, _paired("medical-v2", 33, 60, 1), "promote")
    assert title == (
        "medical-dpo-1a2b3c4d vs medical-v2\n"
        "n=60 held-out pairs · error bars: 95% intervals · gate: promote"
    )
    base = comparison_title(candidate, _paired("base model Qwen2.5-0.5B", 3, 60, 0), None)
    assert base.startswith("medical-dpo-1a2b3c4d vs base model Qwen2.5-0.5B\n")
    assert "(candidate)" not in base


def test_shares_get_error_bars_and_n_and_a_gate_on_four_pairs_is_not_judged(
    tmp_path: Path,
) -> None:
    from matplotlib.container import ErrorbarContainer

    candidate = _paired("customer_service-sft-1a2b3c4d", 4, 4, 0)
    champion = _paired("base model Qwen2.5-0.5B-Instruct", 0, 4, 1)

    figure = comparison_figure(candidate, champion, verdict="not judged: n=4 < 100")

    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_visible()}
    accuracy = panels["preference_accuracy (n=4, not judged)"]
    assert panels["refusal_rate (n=8)"]
    assert "general_loss" in panels
    (bars,) = [c for c in accuracy.containers if isinstance(c, ErrorbarContainer)]
    _, _, (lines,) = bars.lines
    low, high = wilson_interval(4, 4)
    spans = [(seg[0][1], seg[1][1]) for seg in lines.get_segments()]
    assert spans[0] == pytest.approx((low, high))
    assert spans[1] == pytest.approx(wilson_interval(0, 4))
    assert not any(isinstance(c, ErrorbarContainer) for c in panels["general_loss"].containers)
    assert figure.get_suptitle().endswith("gate: not judged: n=4 < 100")
    ticks = [t.get_text() for t in accuracy.get_xticklabels()]
    assert ticks == ["candidate\n1.00 (0.51–1.00)", "champion\n0.00 (0.00–0.49)"]

    path = comparison_plot(candidate, champion, tmp_path / "comparison.png", verdict="not judged")
    assert path.read_bytes().startswith(PNG_SIGNATURE)
