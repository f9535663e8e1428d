"""The feedback page's A/B experiments: a list per line and a page per experiment (arms,
samples so far, rates, the effect and its confidence sequence over the recorded looks,
the always-valid p-value and the decision). A view's numbers are every request up to the
moment it is drawn, from the experiment's running tally (``registry.experiment_tally``:
a view folds in what arrived since the last one, so it costs that, not the experiment's
size). A view records no look: looks are recorded by ``flywheel experiment status`` and
the flows, from a recount of the raw tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from markupsafe import Markup
from sqlalchemy import Engine

from dashboard.errors import PageError
from registry.experiment_store import (
    ExperimentRecord,
    experiment_looks,
    get_experiment,
    list_experiments,
)
from registry.experiment_tally import arm_tallies
from registry.experiments import METRICS, ArmLabel, ExperimentLook


class PageContext(Protocol):
    """What the routes need of the page (``dashboard.app._Context``)."""

    def line_view(self, request: Request, business_line: str) -> tuple[Any, list[str]]: ...
    def render(self, name: str, status: int = 200, **context: Any) -> Response: ...


@dataclass(frozen=True, slots=True)
class ExperimentView:
    """One experiment as its page shows it."""

    record: ExperimentRecord
    look: ExperimentLook
    looks: list[dict[str, Any]]
    metric_description: str
    counted_at: datetime
    requests: dict[ArmLabel, int]

    @property
    def decision(self) -> str:
        """The decision in words."""
        record = self.record
        if record.winner is not None:
            adapter = record.arm(record.winner) or "base model"
            return (
                f"{record.winner.upper()} ({adapter}) is better, decided at look "
                f"{record.decided_look}"
            )
        return {
            "waiting": "waiting for data: too few samples to decide",
            "undecided": "no difference shown yet",
        }.get(self.look.verdict.value, self.look.verdict.value)

    def now(self) -> dict[str, Any]:
        """The numbers as of ``counted_at``, with every request of each arm so far."""
        return {
            **self.look.as_dict(),
            "counted_at": self.counted_at.isoformat(),
            "a_requests": self.requests["a"],
            "b_requests": self.requests["b"],
        }

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the page's API)."""
        return {
            **self.record.as_dict(),
            "decision": self.decision,
            "now": self.now(),
            "looks": [
                {
                    "look": look["look"],
                    "verdict": look["verdict"],
                    "at": look["created_at"].isoformat(),
                    **{k: look["numbers"].get(k) for k in _LOOK_FIELDS},
                }
                for look in self.looks
            ],
        }


_GRACE = timedelta(minutes=2)
_LOOK_FIELDS = ("a_samples", "b_samples", "a_rate", "b_rate", "effect", "lower", "upper", "p_value")


def _view(
    engine: Engine,
    record: ExperimentRecord,
    looks: list[dict[str, Any]],
    description: str,
    grace: timedelta,
) -> ExperimentView:
    tallies = arm_tallies(engine, record, grace=grace, now=datetime.now(UTC))
    return ExperimentView(
        record, tallies.look(), looks, description, tallies.counted_at, dict(tallies.requests)
    )


def experiment_view(
    engine: Engine, business_line: str, experiment_id: int, *, grace: timedelta = _GRACE
) -> ExperimentView:
    """The experiment's page data; 404 when it does not exist on this line (ids are scoped
    by line: another line's experiment is not shown)."""
    record = get_experiment(engine, experiment_id)
    if record is None or record.business_line != business_line:
        raise PageError(404, f"no experiment {experiment_id} on {business_line}")
    looks = experiment_looks(engine, record.id)
    return _view(engine, record, looks, METRICS[record.metric].description, grace)


def experiment_list(
    engine: Engine, business_line: str, *, grace: timedelta = _GRACE
) -> list[ExperimentView]:
    """The line's experiments, newest first, each with its numbers now."""
    return [
        _view(engine, record, [], "", grace)
        for record in list_experiments(engine, business_line, limit=50)
    ]


def confidence_plot(
    looks: Sequence[dict[str, Any]], *, width: int = 520, height: int = 200
) -> Markup:
    """The effect (B - A) at each recorded look with its confidence sequence as a band, and
    the zero line: the band leaving zero is the decision."""
    points = [
        (
            int(look["look"]),
            look["numbers"].get("effect"),
            look["numbers"]["lower"],
            look["numbers"]["upper"],
        )
        for look in looks
    ]
    if not points:
        return Markup('<p class="muted">No look recorded yet (flywheel experiment status).</p>')
    left, right, top, bottom = 48, 10, 20, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    low = min(0.0, *(p[2] for p in points))
    high = max(0.0, *(p[3] for p in points))
    span = (high - low) or 1.0
    count = len(points)

    def x(index: int) -> float:
        return left + plot_w * (index + 0.5) / count

    def y(value: float) -> float:
        return top + plot_h * (high - value) / span

    upper = " ".join(f"{x(i):.1f},{y(p[3]):.1f}" for i, p in enumerate(points))
    lower = " ".join(f"{x(i):.1f},{y(p[2]):.1f}" for i, p in reversed(list(enumerate(points))))
    effect = " ".join(f"{x(i):.1f},{y(p[1]):.1f}" for i, p in enumerate(points) if p[1] is not None)
    labels = "".join(
        f'<text x="{x(i):.1f}" y="{height - 12}" text-anchor="middle">{p[0]}</text>'
        for i, p in enumerate(points)
        if count <= 12 or i % max(1, count // 12) == 0
    )
    svg = (
        f'<svg class="chart" id="confidence-sequence" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" '
        'aria-label="effect B minus A and its confidence sequence per look">'
        f'<text x="{left}" y="14">effect B − A and its confidence sequence, per look</text>'
        f'<polygon points="{upper} {lower}" fill="#4c78a8" fill-opacity="0.25"/>'
        f'<polyline points="{effect}" fill="none" stroke="#4c78a8" stroke-width="2"/>'
        f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" '
        'stroke="#888" stroke-dasharray="4 3"/>'
        f'<text x="{left - 4}" y="{y(high) + 4:.1f}" text-anchor="end">{high:+.2f}</text>'
        f'<text x="{left - 4}" y="{y(low) + 4:.1f}" text-anchor="end">{low:+.2f}</text>'
        f'<text x="{left - 4}" y="{y(0) + 4:.1f}" text-anchor="end">0</text>'
        f"{labels}</svg>"
    )
    return Markup(svg)  # noqa: S704 (numbers only, no user text)


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def _experiment_id(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 18:
        raise PageError(404, f"no experiment {raw[:40]!r}")
    return int(raw)


def add_experiment_routes(
    app: FastAPI, context: PageContext, engine: Engine, *, grace: timedelta = _GRACE
) -> None:
    """The experiments list and pages, and their JSON, under each line's access check;
    rows younger than ``grace`` are counted live, then folded into the tallies."""

    @app.get("/lines/{business_line}/experiments")
    def experiments_page(request: Request, business_line: str) -> Response:
        viewer, lines = context.line_view(request, business_line)
        return context.render(
            "experiments.html",
            viewer=viewer,
            lines=lines,
            business_line=business_line,
            tab="experiments",
            experiments=experiment_list(engine, business_line, grace=grace),
            metrics=METRICS,
        )

    @app.get("/lines/{business_line}/experiments/{experiment_id}")
    def experiment_page(request: Request, business_line: str, experiment_id: str) -> Response:
        viewer, lines = context.line_view(request, business_line)
        view = experiment_view(engine, business_line, _experiment_id(experiment_id), grace=grace)
        return context.render(
            "experiment.html",
            viewer=viewer,
            lines=lines,
            business_line=business_line,
            tab="experiments",
            view=view,
            plot=confidence_plot(view.looks),
        )

    @app.get("/api/lines/{business_line}/experiments")
    def api_experiments(request: Request, business_line: str) -> Response:
        context.line_view(request, business_line)
        rows = [
            {**v.record.as_dict(), "decision": v.decision, "now": v.now()}
            for v in experiment_list(engine, business_line, grace=grace)
        ]
        return _json(rows)

    @app.get("/api/lines/{business_line}/experiments/{experiment_id}")
    def api_experiment(request: Request, business_line: str, experiment_id: str) -> Response:
        context.line_view(request, business_line)
        view = experiment_view(engine, business_line, _experiment_id(experiment_id), grace=grace)
        return _json(view.as_dict())
