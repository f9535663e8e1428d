"""What each view of the feedback page shows, assembled from the store, datasets and MLflow.

Each method returns a plain view object that the HTML templates, the JSON API
and the exports all render, so they cannot disagree; ``flywheel buckets`` uses
:meth:`FeedbackPages.overview` too. Text from the store only ever reaches a view
through :class:`dashboard.scrubbed.SampleScrubber`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from dashboard import queries
from dashboard.evals import EvalReview, EvalRun, EvalSample
from dashboard.filters import BucketFilter, Cursor
from dashboard.lineage import (
    DatasetBuild,
    DatasetIndex,
    TrainingUse,
    drop_reasons,
    funnel_steps,
    restored_examples,
)
from dashboard.review_queue import ArmReviews, arm_reviews
from dashboard.scrubbed import Sample, SampleScrubber
from dashboard.shaping import (
    RATE_SIGNALS,
    AdapterTotals,
    ArmComparison,
    Series,
    adapter_totals,
    compare_arms,
    default_range,
    time_series,
)
from feedback.rollup import REQUESTS, RollupQuery, SignalRollup, ceil_hour, floor_hour
from feedback.shadow import shadow_counts
from flywheel.settings.dashboard import DashboardSettings
from registry.canary import PASS_RATE
from registry.decisions import latest_decisions
from registry.lifecycle import shadow_since, step_started
from registry.names import adapter_name
from registry.routes import RouteChangeRecord, RouteStore
from registry.routing import RoutingTable

DEFAULT_RANGE = timedelta(days=14)
# A trend plot aims at a few dozen points; when hourly cells would give fewer than
# FEW_POINTS, minutes are counted from the raw rows, if the window holds at most
# MINUTE_COUNT_LIMIT requests.
TREND_POINTS = 40
FEW_POINTS = 12
MINUTE_COUNT_LIMIT = 20_000


@dataclass(slots=True)
class CanaryView:
    """The canary against the champion since the canary's share last changed."""

    canary: str
    champion: str
    fraction: float
    since: datetime
    champion_requests: int
    canary_requests: int
    rows: list[ArmComparison]
    decisions: list[dict[str, Any]]
    # Reviewers' verdicts on each arm's answers since ``since`` (champion, then canary).
    reviews: list[ArmReviews] = field(default_factory=list)

    @property
    def checks(self) -> list[dict[str, Any]]:
        """Every metric of the canary flow's latest look at this canary (rates, refusals,
        output length, TTFT, TPOT, latency), with its verdict and always-valid p-values."""
        for decision in self.decisions:
            if decision.get("adapter") != self.canary:
                continue
            numbers = decision.get("numbers")
            if isinstance(numbers, dict) and isinstance(numbers.get("checks"), list):
                return [c for c in numbers["checks"] if isinstance(c, dict)]
            return []
        return []


@dataclass(slots=True)
class ShadowView:
    """The line's shadow: the requests it answered again so far (numbers only, never its
    texts) and the canary flow's latest look at it (the comparison and the decision)."""

    shadow: str
    champion: str
    fraction: float
    since: datetime | None
    answered: int
    errors: int
    look: dict[str, Any] | None

    @property
    def checks(self) -> list[dict[str, Any]]:
        """Each count of the latest look (errors, refusal, PII, length) with its verdict."""
        numbers = (self.look or {}).get("numbers")
        if isinstance(numbers, dict) and isinstance(numbers.get("checks"), list):
            return [c for c in numbers["checks"] if isinstance(c, dict)]
        return []

    @property
    def report(self) -> dict[str, Any]:
        """The latest look's comparison (``registry.shadow.ShadowReport.as_dict``)."""
        numbers = (self.look or {}).get("numbers")
        report = numbers.get("shadow") if isinstance(numbers, dict) else None
        return report if isinstance(report, dict) else {}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        look = self.look
        return {
            "shadow": self.shadow,
            "champion": self.champion,
            "fraction": self.fraction,
            "since": self.since.isoformat() if self.since else None,
            "answered": self.answered,
            "errors": self.errors,
            "latest_look": None
            if look is None
            else {
                "when": look["created_at"].isoformat(),
                "action": look["action"],
                "reasons": look["reasons"],
                "report": self.report,
                "checks": self.checks,
            },
        }


@dataclass(slots=True)
class Overview:
    """Signals over time per adapter, routing, the canary, and the latest funnel."""

    business_line: str
    bucket: BucketFilter
    since: datetime
    until: datetime
    adapters: list[str]
    totals: list[AdapterTotals]
    series: Series
    signals: tuple[str, ...]
    routing: RoutingTable
    history: list[RouteChangeRecord]
    canary: CanaryView | None
    latest_build: DatasetBuild | None
    shadow: ShadowView | None = None
    # False for a line with traffic that the settings do not name (imported data, a
    # typo in a client): nothing routes, trains or judges it.
    configured: bool = True

    def request_series(self) -> dict[str, list[float | None]]:
        """Requests per bucket, per adapter (for the requests plot)."""
        empty = [0] * len(self.series.starts)
        return {
            adapter: [float(v) for v in counts.get(REQUESTS, empty)]
            for adapter, counts in self.series.counts.items()
        }

    def rate_series(self, signal: str) -> dict[str, list[float | None]]:
        """Rate of ``signal`` per bucket, per adapter (unknown where nothing was served)."""
        return {adapter: self.series.rates(adapter, signal) for adapter in self.series.counts}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "business_line": self.business_line,
            "configured": self.configured,
            "filter": self.bucket.params(),
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "adapters": self.adapters,
            "totals": [t.as_dict() for t in self.totals],
            "series": {
                "bucket_seconds": int(self.series.size.total_seconds()),
                "starts": [s.isoformat() for s in self.series.starts],
                "counts": self.series.counts,
            },
            "routing": self.routing.model_dump(),
            "canary": None
            if self.canary is None
            else {
                "canary": self.canary.canary,
                "champion": self.canary.champion,
                "fraction": self.canary.fraction,
                "since": self.canary.since.isoformat(),
                "champion_requests": self.canary.champion_requests,
                "canary_requests": self.canary.canary_requests,
                "rates": [
                    {
                        "signal": r.signal,
                        "champion": r.champion_rate,
                        "canary": r.canary_rate,
                        "difference": r.difference,
                    }
                    for r in self.canary.rows
                ],
                "checks": self.canary.checks,
                "reviews": [
                    {
                        "adapter": r.adapter,
                        "reviews": r.reviews,
                        "failures": r.failures,
                        "pass_rate": r.pass_rate,
                    }
                    for r in self.canary.reviews
                ],
            },
            "funnel": None if self.latest_build is None else funnel_dict(self.latest_build),
            "shadow": None if self.shadow is None else self.shadow.as_dict(),
        }


@dataclass(slots=True)
class SamplePage:
    """One page of a bucket's samples (scrubbed)."""

    business_line: str
    bucket: BucketFilter
    samples: list[Sample]
    next_cursor: str | None
    bucket_size: int | None
    used: dict[str, list[TrainingUse]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "business_line": self.business_line,
            "filter": self.bucket.params(),
            "approximate_total": self.bucket_size,
            "next_cursor": self.next_cursor,
            "samples": [
                s.as_dict() | {"training": [u.as_dict() for u in self.used.get(s.request_id, [])]}
                for s in self.samples
            ],
        }


@dataclass(slots=True)
class EvalPage:
    """The line's runs and the chosen run's comparison and sample generations."""

    business_line: str
    available: bool
    runs: list[EvalRun]
    chosen: EvalRun | None
    samples: list[EvalSample]
    run_urls: dict[str, str | None]
    version_urls: dict[int, str | None]
    # Reviewers' verdicts on the chosen run's adapter and the champion (all their answers),
    # and the pass-rate check of the canary flow's latest look at that adapter.
    reviews: list[ArmReviews] = field(default_factory=list)
    review_check: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "business_line": self.business_line,
            "reviews": [
                {"adapter": r.adapter, "reviews": r.reviews, "pass_rate": r.pass_rate}
                for r in self.reviews
            ],
            "review_check": self.review_check,
            "runs": [
                r.as_dict()
                | {
                    "mlflow_url": self.run_urls.get(r.run_id),
                    "version_url": self.version_urls.get(r.version) if r.version else None,
                }
                for r in self.runs
            ],
            "chosen": self.chosen.run_id if self.chosen else None,
            "samples": [
                {
                    "prompt": s.prompt,
                    "champion_answer": s.champion_answer,
                    "candidate_answer": s.candidate_answer,
                    "champion_refused": s.champion_refused,
                    "candidate_refused": s.candidate_refused,
                    "flags": s.flags,
                }
                for s in self.samples
            ],
        }


def funnel_dict(build: DatasetBuild) -> dict[str, Any]:
    """A build's funnel as the API returns it."""
    return {
        "dataset": build.name,
        "created_at": build.created_at,
        "window": build.source,
        "steps": [{"step": name, "records": n} for name, n in funnel_steps(build.funnel)],
        "dropped": [{"why": why, "records": n} for why, n in drop_reasons(build.funnel)],
        "by_signal": build.funnel.get("steps", {}),
        "pii_replaced": build.funnel.get("pii", {}),
        "examples": build.funnel.get("examples", {}),
        "restored": [{"what": what, "examples": n} for what, n in restored_examples(build.funnel)],
        "counts": build.counts,
        "accumulated_from": list(build.accumulated_from),
        "funnel_of": build.funnel_of,
    }


class FeedbackPages:
    """Builds every view from the store, the dataset manifests and MLflow."""

    def __init__(
        self,
        engine: Engine,
        settings: DashboardSettings,
        *,
        routes: RouteStore,
        rollup: SignalRollup,
        scrubber: SampleScrubber,
        datasets: DatasetIndex,
        evals: EvalReview,
        configured_lines: tuple[str, ...] | None = None,
    ) -> None:
        self.engine = engine
        self.configured_lines = configured_lines
        self.settings = settings
        self.rollup = rollup
        self.scrubber = scrubber
        self.datasets = datasets
        self.evals = evals
        self.routes = routes

    def _range(self, business_line: str, bucket: BucketFilter) -> tuple[datetime, datetime]:
        span = self.rollup.span(business_line)
        if bucket.since is None and span is not None:
            # From the first traffic of the last DEFAULT_RANGE, not from its start: a line
            # with old imported records and an hour of fresh traffic shows that hour.
            end = bucket.until or span[1]
            query = RollupQuery(business_line, floor_hour(end - DEFAULT_RANGE), ceil_hour(end))
            served = [c.hour for c in self.rollup.counts(query) if c.signal == REQUESTS]
            span = (min(served, default=max(span[0], end - DEFAULT_RANGE)), span[1])
        since, until = default_range(span, bucket.since, bucket.until)
        return floor_hour(since), ceil_hour(until)

    def totals(
        self, business_line: str, bucket: BucketFilter
    ) -> tuple[datetime, datetime, list[AdapterTotals]]:
        """The range a view shows and the per-adapter totals in it (``flywheel buckets``
        prints exactly these)."""
        since, until = self._range(business_line, bucket)
        adapters = self.rollup.adapters(business_line)
        cells = self.rollup.counts(RollupQuery(business_line, since, until, bucket.adapter))
        return since, until, adapter_totals(cells, adapters)

    def overview(self, business_line: str, bucket: BucketFilter) -> Overview:
        """Counts and rates over time per adapter, routing and canary, latest funnel."""
        since, until = self._range(business_line, bucket)
        adapters = self.rollup.adapters(business_line)
        cells = self.rollup.counts(RollupQuery(business_line, since, until, bucket.adapter))
        shown = [bucket.adapter] if bucket.adapter else adapters
        points = min(self.settings.max_points, TREND_POINTS)
        served = sum(c.count for c in cells if c.signal == REQUESTS)
        if (until - since) / timedelta(hours=1) < FEW_POINTS and served <= MINUTE_COUNT_LIMIT:
            fine = queries.minute_counts(self.engine, business_line, since, until, bucket.adapter)
            series = time_series(fine, since, until, points, shown, finest=timedelta(minutes=1))
        else:
            series = time_series(cells, since, until, points, shown)
        signals = (
            RATE_SIGNALS
            if bucket.signal is None or bucket.signal not in RATE_SIGNALS
            else (bucket.signal,)
        )
        routing = self.routes.table(business_line)
        history = self.routes.history(business_line, limit=10)
        builds = self.datasets.builds(business_line)
        return Overview(
            business_line=business_line,
            bucket=bucket,
            since=since,
            until=until,
            adapters=adapters,
            totals=adapter_totals(cells, adapters),
            series=series,
            signals=signals,
            routing=routing,
            history=history,
            canary=self._canary(business_line, routing, history),
            latest_build=builds[0] if builds else None,
            shadow=self._shadow(business_line, routing),
            configured=self.configured_lines is None or business_line in self.configured_lines,
        )

    def _shadow(self, business_line: str, routing: RoutingTable) -> ShadowView | None:
        if routing.shadow is None:
            return None
        since = shadow_since(self.routes.history(business_line, limit=500), routing)
        answered, errors = shadow_counts(
            self.engine, business_line, routing.shadow, since or datetime.min.replace(tzinfo=UTC)
        )
        looks = [
            d
            for d in latest_decisions(self.engine, business_line, limit=20)
            if d.get("adapter") == routing.shadow
            and isinstance(d.get("numbers"), dict)
            and "shadow" in d["numbers"]
        ]
        return ShadowView(
            shadow=routing.shadow,
            champion=routing.champion or "base",
            fraction=routing.shadow_fraction,
            since=since,
            answered=answered,
            errors=errors,
            look=looks[0] if looks else None,
        )

    def _canary(
        self, business_line: str, routing: RoutingTable, history: list[RouteChangeRecord]
    ) -> CanaryView | None:
        if routing.canary is None:
            return None
        started = step_started(history, routing) or (
            history[-1].created_at if history else floor_hour(datetime.now().astimezone())
        )
        champion = routing.champion or "base"
        cells = self.rollup.counts(RollupQuery(business_line, floor_hour(started)))
        champion_requests, canary_requests, rows = compare_arms(cells, champion, routing.canary)
        return CanaryView(
            canary=routing.canary,
            champion=champion,
            fraction=routing.canary_fraction,
            since=started,
            champion_requests=champion_requests,
            canary_requests=canary_requests,
            rows=rows,
            decisions=latest_decisions(self.engine, business_line, limit=5),
            reviews=arm_reviews(
                self.engine, business_line, [routing.champion, routing.canary], started
            ),
        )

    def bucket_size(self, business_line: str, bucket: BucketFilter) -> int | None:
        """About how many samples a bucket holds (from the hourly rollup; ``None`` for
        'no feedback', which the rollup does not count)."""
        if bucket.signal == "none":
            return None
        since = floor_hour(bucket.since) if bucket.since else None
        until = ceil_hour(bucket.until) if bucket.until else None
        query = RollupQuery(business_line, since, until, bucket.adapter)
        return self.rollup.total(query, bucket.signal or REQUESTS)

    def samples(
        self, business_line: str, bucket: BucketFilter, cursor: Cursor | None
    ) -> SamplePage:
        """One page of the bucket, scrubbed, with where each sample went into training."""
        raws, following = queries.sample_page(
            self.engine, business_line, bucket, cursor, self.settings.page_size
        )
        samples = self.scrubber.scrub(raws)
        return SamplePage(
            business_line=business_line,
            bucket=bucket,
            samples=samples,
            next_cursor=following.encode() if following else None,
            bucket_size=self.bucket_size(business_line, bucket),
            used={s.request_id: self.datasets.uses(business_line, s.request_id) for s in samples},
        )

    def sample(self, business_line: str, request_id: str) -> tuple[Sample, list[TrainingUse]]:
        """One sample, scrubbed, and the training examples it went into (404 if unknown)."""
        from dashboard.errors import PageError

        raw = queries.sample(self.engine, business_line, request_id)
        if raw is None:
            raise PageError(404, f"no sample {request_id!r} in {business_line}")
        (found,) = self.scrubber.scrub([raw])
        return found, self.datasets.uses(business_line, request_id)

    def export(self, business_line: str, bucket: BucketFilter) -> Iterator[Sample]:
        """The bucket's newest samples up to the export limit, scrubbed, a page at a time."""
        left = self.settings.export_limit
        cursor: Cursor | None = None
        while left > 0:
            raws, cursor = queries.sample_page(
                self.engine, business_line, bucket, cursor, min(left, self.settings.page_size)
            )
            yield from self.scrubber.scrub(raws)
            left -= len(raws)
            if cursor is None:
                return

    def funnel(self, business_line: str) -> list[DatasetBuild]:
        """The line's dataset builds, newest first (each with its funnel)."""
        return self.datasets.builds(business_line)

    def eval_page(self, business_line: str, run_id: str | None) -> EvalPage:
        """The line's runs; the chosen one (or the newest evaluated) with its samples."""
        runs = self.evals.runs(business_line)
        chosen = next((r for r in runs if r.run_id == run_id), None) if run_id else None
        if chosen is None and run_id:
            from dashboard.errors import PageError

            raise PageError(404, f"no run {run_id!r} among the latest runs of {business_line}")
        chosen = chosen or next((r for r in runs if r.metrics), runs[0] if runs else None)
        samples: list[EvalSample] = []
        if chosen is not None:
            raw = self.evals.samples(chosen.run_id)
            texts = self.scrubber.scrub_texts(
                [t for s in raw for t in (s.prompt, s.champion_answer, s.candidate_answer)]
            )
            for i, s in enumerate(raw):
                prompt, champion, candidate = texts[3 * i : 3 * i + 3]
                samples.append(
                    EvalSample(
                        prompt=prompt or "",
                        champion_answer=champion,
                        candidate_answer=candidate,
                        champion_refused=s.champion_refused,
                        candidate_refused=s.candidate_refused,
                        flags=s.flags,
                    )
                )
        reviews, review_check = self._run_reviews(business_line, chosen)
        return EvalPage(
            business_line=business_line,
            reviews=reviews,
            review_check=review_check,
            available=self.evals.available(),
            runs=runs,
            chosen=chosen,
            samples=samples,
            run_urls={r.run_id: self.evals.run_url(r) for r in runs},
            version_urls={
                r.version: self.evals.version_url(business_line, r.version)
                for r in runs
                if r.version is not None
            },
        )

    def _run_reviews(
        self, business_line: str, run: EvalRun | None
    ) -> tuple[list[ArmReviews], dict[str, Any] | None]:
        """Human reviews of a registered run's adapter against the champion's, and the
        pass-rate check of the canary flow's latest look at it (if it was a canary)."""
        if run is None or run.version is None:
            return [], None
        adapter = adapter_name(business_line, run.version)
        champion = self.routes.table(business_line).champion
        adapters = list(dict.fromkeys([champion, adapter]))
        reviews = arm_reviews(
            self.engine, business_line, adapters, datetime.min.replace(tzinfo=UTC)
        )
        for decision in latest_decisions(self.engine, business_line, limit=50):
            numbers = decision.get("numbers")
            if decision.get("adapter") != adapter or not isinstance(numbers, dict):
                continue
            for check in numbers.get("checks") or []:
                if isinstance(check, dict) and check.get("metric") == PASS_RATE:
                    return reviews, check
        return reviews, None
