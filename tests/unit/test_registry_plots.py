"""The candidate-vs-champion comparison plot."""

from __future__ import annotations

from pathlib import Path

from eval.reports import EvalReport
from registry.plots import comparison_plot

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
