"""Traffic for an A/B experiment's tally: requests the gateway labelled with an arm (and
some it did not, or on another line, or before the start), feedback of every kind, and
late feedback on requests of earlier rounds that flips their flags (a thumbs-down after a
thumbs-up, a failed task after a successful one). Used by the tally's tests on SQLite and
PostgreSQL, which compare it with a recount of the raw tables."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from feedback.store import FeedbackStore
from registry.experiment_store import (
    ExperimentRecord,
    arm_counts,
    create_experiment,
    get_experiment,
)
from registry.experiment_tally import arm_tallies
from registry.experiments import ArmCount, ExperimentPolicy, metric_counts

LINE = "legal"
START = datetime(2026, 11, 2, 9, tzinfo=UTC)
FAR = datetime(2100, 1, 1, tzinfo=UTC)
KINDS = ("thumbs_up", "thumbs_down", "regenerate", "edit", "abandon", "task_outcome", "review")


def start(store: FeedbackStore, metric: str = "satisfied") -> ExperimentRecord:
    """A running experiment on ``LINE`` since ``START``."""
    experiment_id = create_experiment(
        store.engine,
        business_line=LINE,
        arm_a=f"{LINE}-v1",
        arm_b=f"{LINE}-v2",
        share=0.5,
        metric=metric,
        policy=ExperimentPolicy(min_samples=5),
        actor="test",
        reason=None,
        when=START,
    )
    record = get_experiment(store.engine, experiment_id)
    assert record is not None
    return record


def feedback(
    rng: random.Random, request_id: str, at: datetime, n: int, kind: str | None = None
) -> dict[str, Any]:
    """One feedback event on ``request_id`` (of ``kind``, or a random one)."""
    kind = kind or rng.choice(KINDS)
    event: dict[str, Any] = {
        "type": kind,
        "request_id": request_id,
        "idempotency_key": f"{request_id}-{kind}-{n}",
        "created_at": at.isoformat(),
    }
    if kind == "edit":
        event["edited_text"] = "a better answer"
    if kind == "task_outcome":
        event["outcome"] = rng.choice(("success", "failure"))
    if kind == "review":
        event["outcome"] = rng.choice(("pass", "fail"))
        event["metadata"] = {"reason": "checked", "reviewer": "rita"}
    return event


def interaction(
    request_id: str,
    arm: str | None,
    at: datetime,
    *,
    line: str = LINE,
    status: str = "ok",
    user: str = "user-0",
) -> dict[str, Any]:
    """One request served at ``at`` on ``arm`` (None: not in the experiment)."""
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": user,
        "business_line": line,
        "adapter_name": f"{line}-v1",
        "base_model": "base",
        "arm": arm,
        "messages": [{"role": "user", "content": f"question {request_id}"}],
        "response": "an answer",
        "status": status,
        "created_at": at.isoformat(),
    }


@dataclass
class Traffic:
    """Rounds of traffic around one experiment, each ingested into the store."""

    store: FeedbackStore
    rng: random.Random = field(default_factory=lambda: random.Random(11))
    served: list[tuple[str, datetime]] = field(default_factory=list)
    sent: int = 0

    def round(self, requests: int, late: int, *, until: timedelta = timedelta(days=3)) -> None:
        """``requests`` new requests (most on the experiment's arms, served between an hour
        before ``START`` and ``until`` after it) with their first feedback, and ``late``
        feedback events on requests of earlier rounds."""
        rng, events = self.rng, []
        fresh = []
        for _ in range(requests):
            self.sent += 1
            request_id = f"req-{self.sent}"
            at = START + timedelta(seconds=rng.uniform(-3600, until.total_seconds()))
            line = LINE if rng.random() < 0.9 else "medical"
            arm = rng.choice(("experiment_a", "experiment_b", "experiment_a", "experiment_b",
                              "champion", None))  # fmt: skip
            status = "cancelled" if rng.random() < 0.08 else "ok"
            user = f"user-{rng.randrange(40)}"
            events.append(interaction(request_id, arm, at, line=line, status=status, user=user))
            for n in range(rng.choice((0, 0, 1, 1, 2))):
                events.append(feedback(rng, request_id, at + timedelta(seconds=5 + n), n))
            fresh.append((request_id, at))
        for n in range(late if self.served else 0):
            request_id, at = rng.choice(self.served)
            kind = rng.choice(("thumbs_down", "task_outcome", "task_outcome", None))
            events.append(feedback(rng, request_id, at + timedelta(days=1), 100 + self.sent + n,
                                   kind))  # fmt: skip
        report = self.store.ingest(events, source="test")
        assert report.quarantined == 0, report.rejections
        self.served += fresh


def recounted(engine: Engine, record: ExperimentRecord) -> dict[str, dict[str, ArmCount]]:
    """Every metric of each arm, recounted from the raw tables (what looks decide on)."""
    end = record.ended_at or FAR
    return {arm: arm_counts(engine, LINE, arm, record.started_at, end) for arm in ("a", "b")}


def tallied(
    engine: Engine, record: ExperimentRecord, grace: timedelta = timedelta(0)
) -> dict[str, dict[str, ArmCount]]:
    """Every metric of each arm from the tally (folded cells plus the live tail)."""
    tallies = arm_tallies(engine, record, grace=grace)
    return {arm: metric_counts(tallies.arms[arm]) for arm in ("a", "b")}
