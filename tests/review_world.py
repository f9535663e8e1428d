"""A store with a live canary and reviewable answers, for the review queue's tests.

The line's champion (``{line}-v1``) and canary (``{line}-v2``) each answered
``per_arm`` requests just after the canary started (English ones with a name and an
e-mail address to scrub, and Chinese ones); the recipe (in a recipes folder of the
home) has a review block; the key file has reviewers, a key without the role and a
reviewer of another line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composition.recipes import recipe_for
from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from gateway.keys import add_key
from registry.routes import RouteStore
from tests.routing import set_canary, set_champion

if TYPE_CHECKING:
    from fastapi import FastAPI

LINE = "support_desk"
OTHER_LINE = "billing"
RUBRIC = ("correct", "wrong facts", "rude", "unclear")
ENGLISH_PROMPT = "Hi, I am Jane Smith (jane.smith@example.com). Where is parcel {n}?"
CHINESE_PROMPT = "你好，我的订单{n}什么时候到？"
ANSWERS = {
    "champion": ("Your parcel {n} arrives tomorrow.", "您好，订单{n}明天送达。"),
    "canary": ("Parcel {n} is delayed, sorry.", "抱歉，订单{n}会晚到两天。"),
}


@dataclass
class ReviewWorld:
    """The home, store, keys and adapters of the review tests."""

    settings: Settings
    store: FeedbackStore
    keys: dict[str, str]
    champion: str
    canary: str
    started: datetime

    def app(self, **overrides: Any) -> FastAPI:
        """The feedback page on this home."""
        from dashboard.app import create_app
        from flywheel.settings.dashboard import DashboardSettings
        from tests.dashboard_store import shared_scrubber

        options = {"rollup_grace_s": 0, "rollup_interval_s": 0} | overrides
        return create_app(
            self.settings,
            DashboardSettings(**options),
            store=self.store,
            routes=RouteStore(self.store.engine),
            keys_file=self.settings.home / "gateway-keys.yaml",
            scrubber_factory=shared_scrubber,
            review_policy_of=lambda line: recipe_for(self.settings, line).review,
        )

    def bearer(self, name: str) -> dict[str, str]:
        """An Authorization header with one of the keys."""
        return {"Authorization": f"Bearer {self.keys[name]}"}


def write_recipe(
    recipes: Path,
    line: str,
    *,
    share: float = 1.0,
    canary_share: float | None = None,
    min_reviews: int = 0,
    margin: float = 0.1,
) -> None:
    """A recipe for ``line`` with a review block."""
    recipes.mkdir(parents=True, exist_ok=True)
    canary = share if canary_share is None else canary_share
    (recipes / f"{line}.yaml").write_text(
        f"business_line: {line}\nmethod: sft\nepochs: 1\n"
        f"review:\n  share: {{canary: {canary}, champion: {share}}}\n"
        f"  rubric: [{', '.join(RUBRIC)}]\n  min_reviews: {min_reviews}\n  margin: {margin}\n",
        encoding="utf-8",
    )


def interaction(
    request_id: str, line: str, adapter: str, prompt: str, answer: str, when: datetime
) -> dict[str, Any]:
    """A logged interaction record."""
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": f"user-{request_id}",
        "business_line": line,
        "adapter_name": adapter,
        "base_model": "tiny-base",
        "messages": [{"role": "user", "content": prompt}],
        "response": answer,
        "created_at": when.isoformat(),
    }


def build_review_world(
    home: Path, *, per_arm: int = 6, share: float = 1.0, database_url: str | None = None
) -> ReviewWorld:
    """Routes first (the canary's window starts then), then each arm's answers."""
    recipes = home / "recipes"
    write_recipe(recipes, LINE, share=share)
    write_recipe(recipes, OTHER_LINE, share=share)
    settings = load_settings(
        home=home,
        database_url=database_url or f"sqlite:///{home / 'flywheel.db'}",
        recipes_dir=recipes,
        business_lines=(LINE, OTHER_LINE),
    )
    store = FeedbackStore.open(settings)
    routes = RouteStore(store.engine)
    champion, canary = f"{LINE}-v1", f"{LINE}-v2"
    set_champion(routes, LINE, champion, actor="test")
    set_canary(routes, LINE, canary, 0.05, actor="test")
    set_champion(routes, OTHER_LINE, "billing-v1", actor="test")
    started = datetime.now(UTC)
    records = []
    for arm, adapter in (("champion", champion), ("canary", canary)):
        english, chinese = ANSWERS[arm]
        for n in range(per_arm):
            chosen = (ENGLISH_PROMPT, english) if n % 2 == 0 else (CHINESE_PROMPT, chinese)
            when = started + timedelta(milliseconds=10 * len(records) + 10)
            request_id = f"req-{arm}-{n}"
            records.append(
                interaction(
                    request_id, LINE, adapter, chosen[0].format(n=n), chosen[1].format(n=n), when
                )
            )
    records.append(
        interaction(
            "req-billing-0", OTHER_LINE, "billing-v1", "Refund?", "Done.", started + timedelta(1)
        )
    )
    report = store.ingest(records, source="test")
    assert report.quarantined == 0, report.rejections
    path = settings.home / "gateway-keys.yaml"
    keys = {
        "reviewer": add_key(path, "reviewer", [LINE, OTHER_LINE], [LINE]),
        "reviewer2": add_key(path, "reviewer2", [LINE], ["*"]),
        "viewer": add_key(path, "viewer", [LINE]),
        "billing-reviewer": add_key(path, "billing-reviewer", [OTHER_LINE], [OTHER_LINE]),
    }
    return ReviewWorld(settings, store, keys, champion, canary, started)
