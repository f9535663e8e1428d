"""The review queue: human spot checks of a line's answers, blind to the arm.

A key with the reviewer role on a line (``ApiKey.review_lines``) asks for the next
item and gets one answer with its prompt, never its adapter, arm, user or request
id: the item is named by its claim's number. Which answers are in the sample:

- each answer of an arm is in it with the recipe's ``review.share`` of that arm,
  by a hash of its request id (:func:`in_sample`), so every reviewer draws from the
  same sample and the shares hold per arm (canary 20%, champion 2%, say);
- the next item is drawn at random among a few sampled answers of each arm, so
  the order says nothing about the arm;
- while a canary is live and its sample holds nothing left to review, any of its
  answers is drawn (the canary's queue does not run dry; the champion's sample is
  larger anyway);
- an answer already reviewed, or held by another reviewer (claimed and not yet
  expired), is not handed out; one held by another reviewer is handed out only when
  nothing else is left (then two reviewers may hold it at once);
- a reviewer never gets an answer twice: every claim is kept, reviewed or not, and
  an unreviewed claim of theirs is handed back to them first.

A verdict (pass or fail, a reason from the recipe's rubric, optionally the answer
as the reviewer corrects it) is stored as a ``review`` feedback event like any
other (idempotent per line, answer and reviewer); its correction becomes an edit
in the nightly datasets, its verdict the pass rate of the canary's test.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)

from dashboard.errors import PageError
from dashboard.queries import RawSample
from dashboard.tables import review_claims_table
from feedback.events import (
    REVIEW_REASON,
    REVIEWER,
    FeedbackType,
    InvalidEventError,
    ReviewVerdict,
    validate_event,
)
from feedback.reviews import ReviewPolicy
from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore
from registry.lifecycle import step_started
from registry.routes import RouteStore
from registry.routing import RoutingTable

# Candidates read per arm and query, and the most pages walked to find sampled ones.
PAGE_ROWS = 200
MAX_PAGES = 25
# Sampled answers per arm the next item is drawn from.
DRAW_FROM = 16
CLAIM_RETRIES = 5
MAX_CORRECTION_CHARS = 50_000


def _utc_now() -> datetime:
    return datetime.now(UTC)


# Arms whose queue draws beyond their share when their sample is all reviewed: a live
# canary's and an experiment's reviews are what their tests wait for.
_NEVER_DRY = frozenset({"canary", "experiment_a", "experiment_b"})


def in_sample(request_id: str, share: float) -> bool:
    """Whether an answer is in its arm's review sample: the same answer for every reviewer
    and every look (a hash of the request id below ``share``)."""
    if share <= 0:
        return False
    if share >= 1:
        return True
    digest = hashlib.sha256(f"review-sample:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


@dataclass(frozen=True, slots=True)
class ReviewArm:
    """One arm the queue samples: its name (never shown), adapter (None: the base model)
    and sampled share."""

    name: str
    adapter: str | None
    share: float


def review_arms(table: RoutingTable, policy: ReviewPolicy) -> list[ReviewArm]:
    """The arms of a routing table the queue samples (the champion; the canary while live;
    an A/B experiment's two arms, which serve every user of the line, while one is live)."""
    if table.experiment is not None:
        share = policy.share_of("experiment")
        return [
            ReviewArm("experiment_a", table.experiment.a, share),
            ReviewArm("experiment_b", table.experiment.b, share),
        ]
    arms = [ReviewArm("champion", table.champion, policy.share_of("champion"))]
    if table.canary is not None:
        arms.append(ReviewArm("canary", table.canary, policy.share_of("canary")))
    return arms


@dataclass(frozen=True, slots=True)
class ReviewItem:
    """An answer handed to a reviewer: the claim's number names it (raw text, for
    :class:`dashboard.scrubbed.SampleScrubber` only)."""

    item: int
    business_line: str
    messages: list[dict[str, Any]]
    response: str
    expires_at: datetime
    raw: RawSample


@dataclass(frozen=True, slots=True)
class ReviewVerdictIn:
    """A reviewer's verdict as submitted (checked by :func:`check_verdict`)."""

    verdict: str
    reason: str
    correction: str | None = None


def check_verdict(submitted: ReviewVerdictIn, rubric: Sequence[str]) -> ReviewVerdictIn:
    """The verdict with its correction trimmed (empty: none); 422 naming what is wrong."""
    if submitted.verdict not in {v.value for v in ReviewVerdict}:
        raise PageError(422, f"verdict must be 'pass' or 'fail', not {submitted.verdict!r}")
    if submitted.reason not in rubric:
        raise PageError(
            422,
            f"reason {submitted.reason!r} is not in this line's rubric; "
            f"choose one of: {', '.join(rubric)}",
        )
    correction = (submitted.correction or "").strip() or None
    if correction is not None and len(correction) > MAX_CORRECTION_CHARS:
        raise PageError(422, f"the corrected answer is over {MAX_CORRECTION_CHARS:,} characters")
    if correction is not None and "\x00" in correction:
        raise PageError(422, "the corrected answer contains a NUL character")
    return ReviewVerdictIn(submitted.verdict, submitted.reason, correction)


class ReviewQueue:
    """The review queues of every line, in the feedback store; ``review_policy_of`` gives a
    line's review block (``None``: the line has none; an exception: its recipe is missing or
    broken), ``routes`` the lines' routing tables, ``clock`` the time and ``rng`` the draws
    (tests fix them)."""

    def __init__(
        self,
        store: FeedbackStore,
        review_policy_of: Callable[[str], ReviewPolicy | None],
        *,
        routes: RouteStore,
        clock: Callable[[], datetime] = _utc_now,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.engine: Engine = store.engine
        self.routes = routes
        self.review_policy_of = review_policy_of
        self.clock = clock
        self.rng = rng or random.SystemRandom()

    def policy(self, business_line: str) -> ReviewPolicy:
        """The line's review block; 404 when its recipe has none."""
        try:
            policy = self.review_policy_of(business_line)
        except Exception as exc:  # FlywheelError: no recipe, or a broken one
            raise PageError(404, f"no review queue on {business_line}: {exc}") from None
        if policy is None:
            raise PageError(
                404,
                f"no review queue on {business_line}: its recipe has no 'review' block "
                "(share, rubric, min_reviews)",
            )
        return policy

    def has_queue(self, business_line: str) -> bool:
        """Whether the line has a review queue (its recipe has a review block), so a page
        links to it only where it exists."""
        try:
            self.policy(business_line)
        except PageError:
            return False
        return True

    # ------------------------------------------------------------------ handing out

    def next_item(self, business_line: str, reviewer: str) -> ReviewItem | None:
        """The reviewer's next answer on the line (their open one first), or None when
        nothing is left to review."""
        policy = self.policy(business_line)
        now = self.clock()
        open_claim = self._open_claim(business_line, reviewer, now, policy)
        if open_claim is not None:
            return open_claim
        table = self.routes.table(business_line)
        since = self._since(business_line, table, policy, now)
        arms = review_arms(table, policy)
        behind = self._behind(business_line, arms, since)
        for _ in range(CLAIM_RETRIES):
            request_id, contested = self._draw(business_line, reviewer, arms, since, now, behind)
            if request_id is None:
                return None
            claim = self._claim(business_line, reviewer, request_id, now, policy, contested)
            if claim is not None:
                return claim
        return None

    def _since(
        self, business_line: str, table: RoutingTable, policy: ReviewPolicy, now: datetime
    ) -> datetime:
        """Answers since the canary's share last changed (the canary test's window), else
        over the recipe's ``window_days``."""
        if table.canary is not None:
            started = step_started(self.routes.history(business_line, limit=500), table)
            if started is not None:
                return started
        return now - timedelta(days=policy.window_days)

    def _behind(
        self, business_line: str, arms: Sequence[ReviewArm], since: datetime
    ) -> frozenset[str]:
        """The champion of a live canary while it has fewer reviews than the canary: the
        canary's test compares the two arms, so with a small champion share of little traffic
        (the loop's picked users, a quiet line) the champion is drawn first, beyond its share
        if need be, until the arms are even. Which answers are reviewed stays blind to what
        they say."""
        by_name = {arm.name: arm for arm in arms}
        champion_arm = by_name.get("champion")
        if "canary" not in by_name or champion_arm is None or champion_arm.share <= 0:
            return frozenset()  # a share of 0: the recipe reviews none of the champion's
        champion, canary = arm_reviews(
            self.engine,
            business_line,
            [by_name["champion"].adapter, by_name["canary"].adapter],
            since,
        )
        return frozenset({"champion"}) if champion.reviews < canary.reviews else frozenset()

    def _draw(
        self,
        business_line: str,
        reviewer: str,
        arms: Sequence[ReviewArm],
        since: datetime,
        now: datetime,
        behind: frozenset[str] = frozenset(),
    ) -> tuple[str | None, bool]:
        """A request id drawn at random among each arm's sampled, free answers (and whether
        another reviewer holds it: only when nothing free is left); an arm that must not run
        dry draws beyond its sample when that is used up, and an arm ``behind`` is drawn
        from first (its sample, else beyond it) until it catches up."""
        for arm in arms:
            if arm.name in behind:
                found = self._candidates(
                    business_line, reviewer, arm, since, now, sampled=True
                ) or self._candidates(business_line, reviewer, arm, since, now, sampled=False)
                if found:
                    return self.rng.choice(found), False
        pool: list[str] = []
        for arm in arms:
            found = self._candidates(business_line, reviewer, arm, since, now, sampled=True)
            if not found and arm.name in _NEVER_DRY:
                found = self._candidates(business_line, reviewer, arm, since, now, sampled=False)
            pool.extend(found)
        if pool:
            return self.rng.choice(pool), False
        held: list[str] = []
        for arm in arms:
            held.extend(self._candidates(business_line, reviewer, arm, since, now, held=True))
        if held:
            return self.rng.choice(held), True
        return None, False

    def _candidates(
        self,
        business_line: str,
        reviewer: str,
        arm: ReviewArm,
        since: datetime,
        now: datetime,
        *,
        sampled: bool = True,
        held: bool = False,
    ) -> list[str]:
        """Up to :data:`DRAW_FROM` of the arm's answers since ``since``, newest first, that
        this reviewer never had: free ones (no review, no live claim), or with ``held``
        ones another reviewer holds now; ``sampled`` keeps those in the arm's sample."""
        i, c = interactions_table.c, review_claims_table.c
        served = i.adapter_name.is_(None) if arm.adapter is None else i.adapter_name == arm.adapter
        about = [c.business_line == business_line, c.request_id == i.request_id]
        mine_or_done = exists().where(
            *about, or_(c.reviewer == reviewer, c.reviewed_at.is_not(None))
        )
        live = exists().where(*about, c.reviewed_at.is_(None), c.expires_at > now)
        where: list[ColumnElement[bool]] = [
            i.business_line == business_line,
            served,
            i.status == "ok",
            i.created_at >= since,
            ~mine_or_done,
            live if held else ~live,
        ]
        found: list[str] = []
        cursor: tuple[datetime, int] | None = None
        with self.engine.connect() as connection:
            for _ in range(MAX_PAGES):
                page_where = list(where)
                if cursor is not None:
                    page_where.append(
                        or_(
                            i.created_at < cursor[0],
                            and_(i.created_at == cursor[0], i.id < cursor[1]),
                        )
                    )
                rows = connection.execute(
                    select(i.request_id, i.created_at, i.id)
                    .where(*page_where)
                    .order_by(i.created_at.desc(), i.id.desc())
                    .limit(PAGE_ROWS)
                ).all()
                for row in rows:
                    if not sampled or in_sample(row.request_id, arm.share):
                        found.append(row.request_id)
                if len(found) >= DRAW_FROM or len(rows) < PAGE_ROWS:
                    break
                cursor = (rows[-1].created_at, rows[-1].id)
        return found[:DRAW_FROM]

    def _claim(
        self,
        business_line: str,
        reviewer: str,
        request_id: str,
        now: datetime,
        policy: ReviewPolicy,
        contested: bool,
    ) -> ReviewItem | None:
        """Claim ``request_id`` for the reviewer; None when another reviewer claimed it
        first (unless ``contested``: it was handed out as held already)."""
        c = review_claims_table.c
        expires = now + timedelta(seconds=policy.claim_s)
        with self.engine.begin() as connection:
            mine = connection.execute(
                select(c.id).where(
                    c.business_line == business_line,
                    c.reviewer == reviewer,
                    c.request_id == request_id,
                )
            ).first()
            if mine is not None:  # a draw that raced this reviewer's other tab
                return None
            claim_id = connection.execute(
                insert(review_claims_table)
                .values(
                    business_line=business_line,
                    request_id=request_id,
                    reviewer=reviewer,
                    claimed_at=now,
                    expires_at=expires,
                )
                .returning(c.id)
            ).scalar_one()
        if not contested and self._taken_first(business_line, request_id, claim_id, now):
            with self.engine.begin() as connection:
                connection.execute(delete(review_claims_table).where(c.id == claim_id))
            return None
        return self._item(business_line, reviewer, claim_id)

    def _taken_first(
        self, business_line: str, request_id: str, claim_id: int, now: datetime
    ) -> bool:
        """Whether another reviewer's live or finished claim on the answer came first."""
        c = review_claims_table.c
        with self.engine.connect() as connection:
            earlier = connection.execute(
                select(func.count()).where(
                    c.business_line == business_line,
                    c.request_id == request_id,
                    c.id < claim_id,
                    or_(c.reviewed_at.is_not(None), c.expires_at > now),
                )
            ).scalar_one()
        return bool(earlier)

    def _open_claim(
        self, business_line: str, reviewer: str, now: datetime, policy: ReviewPolicy
    ) -> ReviewItem | None:
        """The reviewer's oldest unreviewed claim, renewed (a reload or a return later)."""
        c = review_claims_table.c
        with self.engine.begin() as connection:
            claim_id = connection.execute(
                select(c.id)
                .where(
                    c.business_line == business_line,
                    c.reviewer == reviewer,
                    c.reviewed_at.is_(None),
                )
                .order_by(c.id)
                .limit(1)
            ).scalar()
            if claim_id is None:
                return None
            connection.execute(
                update(review_claims_table)
                .where(c.id == claim_id)
                .values(expires_at=now + timedelta(seconds=policy.claim_s))
            )
        return self._item(business_line, reviewer, claim_id)

    def _item(self, business_line: str, reviewer: str, claim_id: int) -> ReviewItem | None:
        """A claim of this reviewer on this line as an item (None: not theirs, or not there)."""
        c, i = review_claims_table.c, interactions_table.c
        query = (
            select(
                c.expires_at,
                i.id,
                i.request_id,
                i.created_at,
                i.status,
                i.messages,
                i.response,
            )
            .join_from(review_claims_table, interactions_table, i.request_id == c.request_id)
            .where(
                c.id == claim_id,
                c.business_line == business_line,
                c.reviewer == reviewer,
                i.business_line == business_line,
            )
        )
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        if row is None:
            return None
        raw = RawSample(
            id=row.id,
            request_id=row.request_id,
            business_line=business_line,
            created_at=row.created_at,
            adapter="",
            status=row.status,
            latency_ms=None,
            user=None,
            messages=list(row.messages),
            response=row.response,
            events=(),
        )
        return ReviewItem(claim_id, business_line, raw.messages, raw.response, row.expires_at, raw)

    # ------------------------------------------------------------------ verdicts

    def submit(
        self, business_line: str, reviewer: str, item: int, submitted: ReviewVerdictIn
    ) -> str:
        """Store a verdict on the reviewer's item as a ``review`` feedback event; returns the
        event's idempotency key. 404: not an item of this reviewer on this line; 409: it
        was reviewed already; 422: a verdict, reason or correction that does not fit."""
        policy = self.policy(business_line)
        checked = check_verdict(submitted, policy.rubric)
        c = review_claims_table.c
        with self.engine.connect() as connection:
            claim = connection.execute(
                select(c.request_id, c.reviewed_at).where(
                    c.id == item, c.business_line == business_line, c.reviewer == reviewer
                )
            ).first()
        if claim is None:
            raise PageError(
                404, f"no review item {item} of yours on {business_line} (ask for the next one)"
            )
        if claim.reviewed_at is not None:
            raise PageError(409, f"review item {item} was reviewed already")
        now = self.clock()
        key = f"review:{business_line}:{claim.request_id}:{reviewer}"
        event = {
            "type": FeedbackType.REVIEW.value,
            "request_id": claim.request_id,
            "outcome": checked.verdict,
            "edited_text": checked.correction,
            "metadata": {REVIEW_REASON: checked.reason, REVIEWER: reviewer},
            "idempotency_key": key,
            "created_at": now.isoformat(),
        }
        limits = self.store.limits
        try:
            validate_event(
                event, max_text_chars=limits.max_text_chars, max_messages=limits.max_messages
            )
        except InvalidEventError as exc:  # the reason names the field, never the request
            raise PageError(422, f"review not stored: {exc.field}: {exc.reason}") from None
        report = self.store.ingest([event], source="review-queue")
        if report.quarantined:
            raise PageError(
                410, f"review item {item}'s answer is no longer stored (forgotten or expired)"
            )
        with self.engine.begin() as connection:
            connection.execute(
                update(review_claims_table).where(c.id == item).values(reviewed_at=now)
            )
        return key

    def reviewed_by(self, business_line: str, reviewer: str) -> int:
        """How many answers of the line this reviewer has reviewed."""
        c = review_claims_table.c
        with self.engine.connect() as connection:
            return int(
                connection.execute(
                    select(func.count()).where(
                        c.business_line == business_line,
                        c.reviewer == reviewer,
                        c.reviewed_at.is_not(None),
                    )
                ).scalar_one()
            )


@dataclass(frozen=True, slots=True)
class ArmReviews:
    """An arm's reviews since a time: how many, how many failed, the pass rate."""

    adapter: str
    reviews: int
    failures: int

    @property
    def pass_rate(self) -> float | None:
        """Passed reviews per review (None without reviews)."""
        return 1 - self.failures / self.reviews if self.reviews else None


def arm_reviews(
    engine: Engine, business_line: str, adapters: Sequence[str | None], since: datetime
) -> list[ArmReviews]:
    """Reviews of each adapter's answers made since ``since`` (None: the base model), as the
    canary's test counts them (``feedback.online.adapter_windows``)."""
    i, f = interactions_table.c, feedback_table.c
    joined = feedback_table.join(interactions_table, i.request_id == f.request_id)
    found = []
    with engine.connect() as connection:
        for adapter in adapters:
            served = i.adapter_name.is_(None) if adapter is None else i.adapter_name == adapter
            counts: dict[str | None, int] = dict(
                connection.execute(
                    select(f.outcome, func.count())
                    .select_from(joined)
                    .where(
                        i.business_line == business_line,
                        i.created_at >= since,
                        served,
                        f.type == FeedbackType.REVIEW.value,
                    )
                    .group_by(f.outcome)
                ).all()
            )
            total = sum(int(n) for n in counts.values())
            failed = int(counts.get(ReviewVerdict.FAIL.value, 0))
            found.append(ArmReviews(adapter or "base", total, failed))
    return found
