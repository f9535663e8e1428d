"""The loop over several nights, measured on simulated users who react to real answers.

How the canary meets users is the plan's ``canary_traffic``:

- ``share`` (the default): the canary sees only its true share of the day's
  traffic. A first day of users asks the base model; then each night the
  nightly flow runs (datasets → train → gate → register → hot-load → canary)
  and the next day's users ask through the gateway, whose sticky split sends
  the canary its share (5% of users). The day comes in ``canary_rounds``
  parts; after each, the simulated reviewers work the review queue and the
  canary flow looks (step up, promote, roll back, wait). A canary still
  undecided at the day's end stays live into the next day, as in production.
- ``picked``: after each night's traffic, users are picked per arm with the
  gateway's own sticky split so a 5% canary gets ``canary_users`` of them a
  round, in minutes (the old demo's shortcut; it shows a canary far more users
  than its share would).

Users react to what they got; with ``reviews_per_round`` and a feedback page to
review on, simulated reviewers judge a blind sample too
(:mod:`lab.simulation.reviewers`: the users' hidden ``satisfied()`` with noise). After the
last night, fresh prompts (another seed) are answered by the base model and by the final
champion with the traffic's sampling settings and scored with the users' hidden
``satisfied()``.

:func:`run_loop` takes its services as a :class:`LoopServices` value, so the
same code runs on vLLM and the real flows (``flywheel loop``) and on a stub
upstream in the fast tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from typing import Any, Literal

import httpx

from eval.paired import compare_paired
from lab.simulation.protocol import LoadedUsers
from lab.simulation.reviewers import SimulatedReviewers
from lab.simulation.traffic import (
    Sampling,
    TrafficReport,
    UserRequest,
    UserTraffic,
    user_requests,
)
from registry.routing import RoutingTable, choose_arm

CanaryTraffic = Literal["share", "picked"]


@dataclass(frozen=True, slots=True)
class LoopPlan:
    """How many nights, requests and prompts; the seed that makes a run repeatable."""

    business_line: str
    nights: int = 3
    requests: int = 300
    eval_prompts: int = 100
    seed: int = 0
    canary_users: int = 40
    champion_users: int = 40
    canary_rounds: int = 6
    user_pool: int = 0
    sampling: Sampling = field(default_factory=Sampling)
    # Requests in flight at once: vLLM batches them; on a 2-core CPU 64 answered 1.9x the
    # answers/s of 16 (docs/results/2026-12-06-vllm-batch.md).
    concurrency: int = 64
    reviews_per_round: int = 0
    review_noise: float = 0.1
    # The share of the answers a reviewer fails that it also corrects (0: verdicts only).
    review_corrections: float = 0.0
    canary_traffic: CanaryTraffic = "share"
    # With share: a first day of users before the first night (False: the store already holds
    # the line's traffic, e.g. when a run is resumed on its own store).
    first_day: bool = True

    def pool(self) -> int:
        """Distinct users per night (returning users, so sticky routing matters)."""
        return self.user_pool or max(1, self.requests // 2)


@dataclass(frozen=True, slots=True)
class NightlyResult:
    """What the line's nightly run did."""

    status: str
    reason: str
    version: int | None = None
    adapter: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CanaryResult:
    """What the canary flow decided."""

    action: str
    reason: str


@dataclass(frozen=True, slots=True)
class LoopServices:
    """What the loop talks to: the gateway, vLLM for the final scoring, the two flows."""

    gateway_url: str
    api_key: str
    vllm_url: str
    base_model: str
    nightly: Callable[[str], NightlyResult]
    canary: Callable[[str], CanaryResult]
    routes: Callable[[str], RoutingTable]
    transport: httpx.AsyncBaseTransport | None = None
    vllm_transport: httpx.AsyncBaseTransport | None = None
    # The feedback page and keys with the reviewer role on the line, for simulated reviewers.
    review_url: str | None = None
    reviewer_keys: tuple[str, ...] = ()
    # Waits until the gateway's records of the traffic so far are in the store, so reviewers
    # see every answer (an in-process gateway's recorder flush); None: answers still in the
    # gateway's batch are reviewed in the next round.
    stored: Callable[[], object] | None = None


@dataclass(slots=True)
class NightRecord:
    """One night of the loop, as the JSON output and the table show it."""

    night: int
    champion: str | None
    canary: str | None
    decision: str
    satisfied: dict[str, float]
    served: dict[str, int]
    nightly: dict[str, Any]
    canary_decisions: list[dict[str, str]]
    reactions: dict[str, int]
    minutes: float
    reviews: dict[str, int] = field(default_factory=dict)
    # Requests and feedback the gateway did not take (by error), so a lost one shows.
    failures: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class LoopResult:
    """Every night and the final comparison on fresh prompts."""

    line: str
    base_model: str
    users: str
    nights: list[NightRecord]
    final: dict[str, Any]
    sampling: dict[str, Any]
    minutes: float
    canary_traffic: CanaryTraffic = "share"
    # The users' feedback profile (None: the user model decides its own rates).
    feedback: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "line": self.line,
            "base_model": self.base_model,
            "users": self.users,
            "feedback": self.feedback,
            "nights": [asdict(n) for n in self.nights],
            "final": self.final,
            "sampling": self.sampling,
            "minutes": round(self.minutes, 2),
            "canary_traffic": CANARY_TRAFFIC[self.canary_traffic],
        }


CANARY_TRAFFIC: dict[str, str] = {
    "share": "the canary's true share of each day's users (the gateway's sticky split)",
    "picked": "users picked per arm with the gateway's sticky split",
}


Progress = Callable[[str, int], Callable[[int], None]]


def _no_progress(label: str, total: int) -> Callable[[int], None]:
    return lambda n: None


def users_on_arm(table: RoutingTable, arm: str, count: int, tag: str) -> list[str]:
    """``count`` user ids that the gateway's sticky split sends to ``arm``."""
    picked: list[str] = []
    index = 0
    while len(picked) < count and index < 1_000_000:
        user = f"{tag}-{index}"
        if choose_arm(table, user)[0] == arm:
            picked.append(user)
        index += 1
    return picked


def _merge(reports: list[TrafficReport]) -> TrafficReport:
    merged = TrafficReport()
    for report in reports:
        merged.answers += report.answers
        merged.feedback_posted.update(report.feedback_posted)
        merged.failures.update(report.failures)
    return merged


def run_loop(
    plan: LoopPlan,
    users: LoadedUsers,
    services: LoopServices,
    *,
    progress: Progress = _no_progress,
    on_night: Callable[[NightRecord], None] | None = None,
) -> LoopResult:
    """Run ``plan.nights`` nights, then score base and final champion on fresh prompts."""
    started = time.monotonic()
    line = plan.business_line
    traffic = UserTraffic(
        services.gateway_url,
        services.api_key,
        users,
        sampling=plan.sampling,
        concurrency=plan.concurrency,
        transport=services.transport,
        routes=services.routes,
    )
    reviewers = None
    if plan.reviews_per_round and services.review_url and services.reviewer_keys:
        reviewers = SimulatedReviewers(
            services.review_url,
            services.reviewer_keys,
            users,
            noise=plan.review_noise,
            corrections=plan.review_corrections,
            seed=plan.seed,
        )
    day = _Day(plan, users, services, traffic, reviewers, progress)
    nights: list[NightRecord] = []
    if plan.canary_traffic == "share" and plan.first_day:
        first = day.share(0, None)
        nights.append(first)
        if on_night is not None:
            on_night(first)
    for night in range(1, plan.nights + 1):
        if plan.canary_traffic == "share":
            record = day.share(night, services.nightly(line))
        else:
            record = day.picked(night)
        nights.append(record)
        if on_night is not None:
            on_night(record)
    final = final_comparison(plan, users, services, progress)
    return LoopResult(
        line=line,
        base_model=services.base_model,
        users=users.spec,
        feedback=_feedback_of(users),
        nights=nights,
        final=final,
        sampling=plan.sampling.model_dump(),
        minutes=(time.monotonic() - started) / 60,
        canary_traffic=plan.canary_traffic,
    )


@dataclass(slots=True)
class _Day:
    """One day of users around one night's flows, in either canary-traffic mode."""

    plan: LoopPlan
    users: LoadedUsers
    services: LoopServices
    traffic: UserTraffic
    reviewers: SimulatedReviewers | None
    progress: Progress

    def _requests(self, night: int) -> tuple[int, str, list[UserRequest]]:
        plan = self.plan
        seed = plan.seed * 1_000 + night
        tag = f"s{plan.seed}-n{night}"
        ids = [f"{tag}-user-{(k * 7919) % plan.pool()}" for k in range(plan.requests)]
        return seed, tag, user_requests(self.users, plan.business_line, ids, seed, f"{tag}-day")

    def _review(self, line: str, reviewed: Counter[str]) -> None:
        """A round of the reviewers' spot checks on the line's queue."""
        if self.reviewers is not None:
            if self.services.stored is not None:
                self.services.stored()
            round_reviews = self.reviewers.review(line, self.plan.reviews_per_round)
            reviewed.update(passed=round_reviews.passed, failed=round_reviews.failed)
            if round_reviews.corrected:
                reviewed.update(corrected=round_reviews.corrected)

    def _look(self, line: str, decisions: list[dict[str, str]], reviewed: Counter[str]) -> bool:
        """Reviews, then the canary flow's look; True when the canary is decided."""
        self._review(line, reviewed)
        outcome = self.services.canary(line)
        decisions.append({"action": outcome.action, "reason": outcome.reason})
        if outcome.action == "rollback":
            return True
        return outcome.action == "promote" and self.services.routes(line).canary is None

    def share(self, night: int, nightly: NightlyResult | None) -> NightRecord:
        """The night's flows (none before the first day), then a day of users in
        ``canary_rounds`` parts, the canary flow looking after each part while a canary is
        live: the canary sees its share of the day and nothing more. The reviewers check
        their sample after every part, a canary or not (spot checks of the champion are
        every day's work, and their verdicts are training labels)."""
        started = time.monotonic()
        line = self.plan.business_line
        seed, _tag, requests = self._requests(night)
        deployed = self.services.routes(line).canary
        parts = max(1, min(self.plan.canary_rounds, len(requests)))
        reports: list[TrafficReport] = []
        decisions: list[dict[str, str]] = []
        reviewed: Counter[str] = Counter()
        label = f"night {night}: users" if night else "first day: users"
        advance = self.progress(label, len(requests))
        for part in range(parts):
            chunk = requests[part * len(requests) // parts : (part + 1) * len(requests) // parts]
            reports.append(self.traffic.run(line, chunk, seed=seed, on_request=advance))
            if self.services.routes(line).canary is not None:
                self._look(line, decisions, reviewed)
            else:
                self._review(line, reviewed)
        status = nightly or NightlyResult("none", "the first day: no nightly has run yet")
        return self._record(night, started, deployed, status, reports, decisions, reviewed)

    def picked(self, night: int) -> NightRecord:
        """The night's traffic, the nightly flow, then canary rounds of users picked per arm."""
        started = time.monotonic()
        plan, services = self.plan, self.services
        line = plan.business_line
        seed, tag, requests = self._requests(night)
        day = self.traffic.run(
            line,
            requests,
            seed=seed,
            on_request=self.progress(f"night {night}: users", len(requests)),
        )
        nightly = services.nightly(line)
        reports = [day]
        decisions: list[dict[str, str]] = []
        reviewed: Counter[str] = Counter()
        deployed = services.routes(line).canary
        for round_ in range(1, plan.canary_rounds + 1):
            table = services.routes(line)
            if table.canary is None:
                break
            reports.append(
                _canary_round(
                    plan, self.users, self.traffic, table, seed, f"{tag}-r{round_}", self.progress
                )
            )
            if self._look(line, decisions, reviewed):
                break
        return self._record(night, started, deployed, nightly, reports, decisions, reviewed)

    def _record(
        self,
        night: int,
        started: float,
        deployed: str | None,
        nightly: NightlyResult,
        reports: list[TrafficReport],
        decisions: list[dict[str, str]],
        reviewed: Counter[str],
    ) -> NightRecord:
        merged = _merge(reports)
        return NightRecord(
            night=night,
            champion=self.services.routes(self.plan.business_line).champion,
            canary=deployed,
            decision=_decision(nightly, decisions),
            satisfied={arm: round(rate, 4) for arm, rate in merged.satisfied().items()},
            served=merged.served(),
            nightly=asdict(nightly),
            canary_decisions=decisions,
            reactions=merged.reactions(),
            minutes=round((time.monotonic() - started) / 60, 2),
            reviews=dict(reviewed),
            failures=dict(merged.failures),
        )


def _canary_round(
    plan: LoopPlan,
    users: LoadedUsers,
    traffic: UserTraffic,
    table: RoutingTable,
    seed: int,
    tag: str,
    progress: Progress,
) -> TrafficReport:
    other = "champion" if table.champion is not None else "base"
    canary = users_on_arm(table, "canary", plan.canary_users, f"{tag}-c")
    champion = users_on_arm(table, other, plan.champion_users, f"{tag}-h")
    # The arms take turns, so both meet the same load: sent one arm after the other, the
    # canary's first batch alone paid vLLM's first batched LoRA step (TTFT 7.1 s against the
    # champion's 0.3-0.9 s at 16 in flight) and was rolled back on latency.
    ids = [user for pair in zip_longest(canary, champion) for user in pair if user is not None]
    requests = user_requests(users, table.business_line, ids, seed + 500, tag)
    return traffic.run(
        table.business_line,
        requests,
        seed=seed + 500,
        on_request=progress(f"{tag}: canary traffic", len(requests)),
    )


def _decision(nightly: NightlyResult, decisions: list[dict[str, str]]) -> str:
    if not decisions:
        return f"no canary ({nightly.status})"
    last = decisions[-1]["action"]
    return {"promote": "promoted", "rollback": "rolled back"}.get(last, last)


def final_comparison(
    plan: LoopPlan,
    users: LoadedUsers,
    services: LoopServices,
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """Fresh prompts answered by the base model and the final champion, scored by the users;
    the gain with its paired 95% interval (``gain_interval``) where a champion answered."""
    line = plan.business_line
    prompts = users.prompts(line, plan.eval_prompts, plan.seed * 1_000 + 999_983)
    champion = services.routes(line).champion
    models = {"base": services.base_model}
    if champion is not None:
        models["champion"] = champion
    answers = asyncio.run(_answer_all(plan, services, models, prompts, progress))
    final: dict[str, Any] = {}
    judged: dict[str, list[bool]] = {}
    for arm, model in models.items():
        scored = [users.satisfied(line, p, a) for p, a in zip(prompts, answers[arm], strict=True)]
        judged[arm] = scored
        final[arm] = {
            "name": model,
            "satisfied": round(sum(scored) / len(scored), 4) if scored else 0.0,
            "n": len(scored),
            "examples": [
                {"prompt": p, "answer": a, "satisfied": s}
                for p, a, s in list(zip(prompts, answers[arm], scored, strict=True))[:5]
            ],
        }
    if "champion" not in final:
        final["champion"] = {**final["base"], "name": None}
    final["gain"] = round(final["champion"]["satisfied"] - final["base"]["satisfied"], 4)
    if judged.get("champion"):
        # Both models answer the same prompts: the gain's interval is a paired one.
        compared = compare_paired(judged["champion"], judged["base"])
        final["gain_interval"] = [round(compared.low, 4), round(compared.high, 4)]
    return final


async def _answer_all(
    plan: LoopPlan,
    services: LoopServices,
    models: dict[str, str],
    prompts: list[str],
    progress: Progress,
) -> dict[str, list[str]]:
    results: dict[str, list[str]] = {}
    semaphore = asyncio.Semaphore(plan.concurrency)
    async with httpx.AsyncClient(
        base_url=services.vllm_url, timeout=300, transport=services.vllm_transport
    ) as client:
        for arm, model in models.items():
            advance = progress(f"fresh prompts: {arm}", len(prompts))

            async def one(
                index: int, prompt: str, model: str = model, advance: Any = advance
            ) -> str:
                async with semaphore:
                    body = {
                        "model": model,
                        "messages": [{"role": "user", "content": prompt}],
                        "seed": plan.seed * 100_003 + index,
                        **plan.sampling.model_dump(),
                    }
                    response = await client.post("/v1/chat/completions", json=body)
                    response.raise_for_status()
                    advance(1)
                    return str(response.json()["choices"][0]["message"].get("content") or "")

            results[arm] = list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    return results


def _feedback_of(users: LoadedUsers) -> dict[str, Any] | None:
    """The users' feedback profile as the summary records it (None: the model's own)."""
    profile = getattr(users, "feedback", None)
    return profile.model_dump() if profile is not None else None
