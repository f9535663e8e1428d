"""The review queue: sampling, claims, verdicts as feedback events, the page and API.

On a SQLite store with a live canary (``tests.review_world``): reviewers get blind,
scrubbed answers of both arms, never the same one twice and not one another
reviewer holds; verdicts are ``review`` events whose corrections become edits (SFT
and DPO with lineage) and whose pass rate the canary's test reads; bad input is a
4xx that says what is wrong.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from composition.recipes import load_recipe
from dashboard.errors import PageError
from dashboard.review_queue import ReviewQueue, ReviewVerdictIn, arm_reviews, in_sample
from dashboard.review_routes import review_token
from feedback.events import InvalidEventError, validate_event
from feedback.examples import build_examples
from feedback.online import adapter_windows
from feedback.schema import feedback_table
from feedback.signals import pull_records
from registry.canary import CanaryAction, CanaryPolicy, ReviewTest, _arm, decide_canary
from registry.routes import RouteStore
from tests.cli_process import run_cli
from tests.review_world import LINE, OTHER_LINE, RUBRIC, ReviewWorld, build_review_world

REMOTE = ("10.1.2.3", 40000)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[ReviewWorld]:
    built = build_review_world(tmp_path / "home", per_arm=6)
    yield built
    built.store.close()


def _queue(world: ReviewWorld, **options: object) -> ReviewQueue:
    recipes = world.settings.recipes_dir
    assert recipes is not None
    return ReviewQueue(
        world.store,
        lambda line: load_recipe(line, recipes).review,
        routes=RouteStore(world.store.engine),
        rng=random.Random(7),
        **options,  # type: ignore[arg-type]
    )


# --- sampling (pure) -------------------------------------------------------------------


def test_the_sample_is_the_same_for_everyone_and_holds_its_share() -> None:
    ids = [f"req-{n:05d}" for n in range(20_000)]
    picked = [rid for rid in ids if in_sample(rid, 0.2)]
    assert picked == [rid for rid in ids if in_sample(rid, 0.2)]
    assert 0.19 < len(picked) / len(ids) < 0.21
    assert not any(in_sample(rid, 0.0) for rid in ids[:100])
    assert all(in_sample(rid, 1.0) for rid in ids[:100])
    # A larger share keeps the smaller one's answers (nested samples).
    assert set(picked) <= {rid for rid in ids if in_sample(rid, 0.5)}


# --- claims -----------------------------------------------------------------------------


def test_a_reviewer_works_through_both_arms_and_never_gets_an_answer_twice(
    world: ReviewWorld,
) -> None:
    queue = _queue(world)
    seen: list[str] = []
    for _ in range(12):
        item = queue.next_item(LINE, "reviewer")
        assert item is not None
        again = queue.next_item(LINE, "reviewer")  # a reload: the same open item
        assert again is not None
        assert again.item == item.item
        seen.append(item.raw.request_id)
        queue.submit(LINE, "reviewer", item.item, ReviewVerdictIn("pass", "correct"))
    assert len(set(seen)) == 12
    assert {rid.split("-")[1] for rid in seen} == {"champion", "canary"}
    # Random order: the arms are interleaved, not one block after the other.
    arms = [rid.split("-")[1] for rid in seen]
    assert arms != sorted(arms)
    assert arms != sorted(arms, reverse=True)
    assert queue.next_item(LINE, "reviewer") is None
    assert queue.reviewed_by(LINE, "reviewer") == 12


def test_two_reviewers_do_not_hold_the_same_answer_until_nothing_else_is_left(
    world: ReviewWorld,
) -> None:
    queue = _queue(world)
    held = {}
    for reviewer in ("anna", "ben"):
        item = queue.next_item(LINE, reviewer)
        assert item is not None
        held[reviewer] = item.raw.request_id
    assert held["anna"] != held["ben"]
    # Anna holds one; Ben reviews everything else, then gets Anna's (the queue is empty
    # otherwise), and never one Anna reviewed.
    first_ben = queue.next_item(LINE, "ben")
    assert first_ben is not None
    queue.submit(LINE, "ben", first_ben.item, ReviewVerdictIn("fail", "unclear"))
    got = []
    while (item := queue.next_item(LINE, "ben")) is not None:
        got.append(item.raw.request_id)
        queue.submit(LINE, "ben", item.item, ReviewVerdictIn("pass", "correct"))
    assert got[-1] == held["anna"]
    assert held["anna"] not in got[:-1]
    assert len(got) == 11
    # Anna's open item is still hers; nothing reviewed by Ben comes to her after it.
    mine = queue.next_item(LINE, "anna")
    assert mine is not None
    assert mine.raw.request_id == held["anna"]
    queue.submit(LINE, "anna", mine.item, ReviewVerdictIn("pass", "correct"))
    assert queue.next_item(LINE, "anna") is None


def test_an_expired_claim_frees_the_answer_for_others(world: ReviewWorld) -> None:
    now = [datetime.now(UTC) + timedelta(seconds=1)]
    queue = _queue(world, clock=lambda: now[0])
    anna = queue.next_item(LINE, "anna")
    assert anna is not None
    now[0] += timedelta(hours=1)  # past claim_s (900 s)
    seen = set()
    while (item := queue.next_item(LINE, "ben")) is not None:
        seen.add(item.raw.request_id)
        queue.submit(LINE, "ben", item.item, ReviewVerdictIn("pass", "correct"))
    assert anna.raw.request_id in seen
    assert len(seen) == 12


def test_a_canary_whose_sample_is_used_up_still_gets_reviews(tmp_path: Path) -> None:
    from tests.review_world import write_recipe

    world = build_review_world(tmp_path / "home", per_arm=40)
    recipes = world.settings.recipes_dir
    assert recipes is not None
    # 1% of the canary's 40 answers: most likely none are in its sample.
    write_recipe(recipes, LINE, share=0.0, canary_share=0.01)
    queue = _queue(world)
    picked = []
    for _ in range(10):
        item = queue.next_item(LINE, "reviewer")
        assert item is not None
        picked.append(item.raw.request_id)
        queue.submit(LINE, "reviewer", item.item, ReviewVerdictIn("pass", "correct"))
    assert all("-canary-" in rid for rid in picked)
    world.store.close()


def test_keyed_state_stays_in_its_line(world: ReviewWorld) -> None:
    queue = _queue(world)
    item = queue.next_item(LINE, "reviewer")
    assert item is not None
    with pytest.raises(PageError) as other_line:
        queue.submit(OTHER_LINE, "reviewer", item.item, ReviewVerdictIn("pass", "correct"))
    assert other_line.value.status == 404
    with pytest.raises(PageError) as other_reviewer:
        queue.submit(LINE, "reviewer2", item.item, ReviewVerdictIn("pass", "correct"))
    assert other_reviewer.value.status == 404
    billing = queue.next_item(OTHER_LINE, "reviewer")
    assert billing is not None
    assert billing.raw.request_id == "req-billing-0"


# --- verdicts as events -------------------------------------------------------------------


def test_a_correction_becomes_an_edit_with_lineage_and_verdicts_feed_the_canary(
    world: ReviewWorld,
) -> None:
    queue = _queue(world)
    corrected = None
    while (item := queue.next_item(LINE, "reviewer")) is not None:
        canary = "-canary-" in item.raw.request_id
        if canary and corrected is None:
            corrected = item.raw.request_id
            queue.submit(
                LINE,
                "reviewer",
                item.item,
                ReviewVerdictIn("fail", "wrong facts", "  Parcel 0 arrives on Friday.  "),
            )
        else:
            verdict = "fail" if canary else "pass"
            queue.submit(LINE, "reviewer", item.item, ReviewVerdictIn(verdict, "unclear"))
    assert corrected is not None
    f = feedback_table.c
    with world.store.engine.connect() as connection:
        rows = connection.execute(select(feedback_table).where(f.type == "review")).all()
    assert len(rows) == 12
    stored = next(r for r in rows if r.request_id == corrected)
    assert (stored.outcome, stored.edited_text) == ("fail", "Parcel 0 arrives on Friday.")
    assert stored.metadata == {"reason": "wrong facts", "reviewer": "reviewer"}
    assert stored.business_line == LINE

    records = {r.request_id: r for r in pull_records(world.store.engine, LINE)}
    assert records[corrected].edit == "Parcel 0 arrives on Friday."
    assert records[corrected].signal == "edit"
    assert records[corrected].edit_by_reviewer
    examples = build_examples(list(records.values()))
    (sft,) = [e for e in examples.sft if e.lineage.request_ids == (corrected,)]
    (dpo,) = [e for e in examples.dpo if e.lineage.request_ids == (corrected,)]
    assert sft.completion == dpo.chosen == "Parcel 0 arrives on Friday."
    assert (sft.rule, dpo.rule) == ("correction", "correction>original")
    assert dpo.rejected == records[corrected].response
    assert stored.id in sft.lineage.event_ids
    # A verdict alone labels an answer its user left silent: passes are SFT targets, the
    # canary's other failures KTO negatives, each traced to its review.
    passed = {e.lineage.request_ids[0]: e.rule for e in examples.sft if e.rule != "correction"}
    assert passed == {f"req-champion-{i}": "review_pass" for i in range(6)}
    failed = {e.lineage.request_ids[0] for e in examples.kto if e.rule == "review_fail"}
    assert len(failed) == 5
    assert corrected not in failed
    assert all(r.startswith("req-canary-") for r in failed)

    # Reviews are not user signals: the arms' edit rates are untouched.
    windows = adapter_windows(
        world.store.engine,
        LINE,
        [world.champion, world.canary],
        world.started - timedelta(seconds=1),
        datetime.now(UTC) + timedelta(days=1),
    )
    champion, canary = _arm(windows, world.champion), _arm(windows, world.canary)
    assert (champion.reviews, champion.review_failures) == (6, 0)
    assert (canary.reviews, canary.review_failures) == (6, 6)
    assert canary.edit == champion.edit == 0
    shown = arm_reviews(world.store.engine, LINE, [world.champion, world.canary], world.started)
    assert [(a.reviews, a.pass_rate) for a in shown] == [(6, 1.0), (6, 0.0)]
    # Same everything but the pass rate: judged on it, the canary waits instead of being
    # promoted (too few reviews for the minimum), and is rolled back on enough of them.
    many = CanaryPolicy(min_requests=1, reviews=ReviewTest(min_reviews=50))
    assert decide_canary(champion, canary, many, look=1).action is not CanaryAction.PROMOTE


def test_reviews_come_only_from_the_queue() -> None:
    """The gateway's feedback endpoint builds events without the review's metadata, so a
    caller cannot post a review there; validate_event refuses it with the reason."""
    event = {
        "type": "review",
        "request_id": "req-1",
        "outcome": "pass",
        "created_at": "2026-12-01T00:00:00Z",
    }
    with pytest.raises(InvalidEventError, match="review queue"):
        validate_event(event)
    with pytest.raises(InvalidEventError, match="review verdict"):
        validate_event({**event, "type": "task_outcome"})


# --- the page and its API ------------------------------------------------------------------


@pytest.fixture
def client(world: ReviewWorld) -> Iterator[TestClient]:
    with TestClient(world.app(), client=REMOTE) as session:
        yield session


def test_the_api_hands_out_blind_scrubbed_items_and_stores_verdicts(
    world: ReviewWorld, client: TestClient
) -> None:
    headers = world.bearer("reviewer")
    seen = []
    for _ in range(12):
        body = client.get(f"/api/lines/{LINE}/review/next", headers=headers).json()
        assert body["rubric"] == list(RUBRIC)
        item = body["item"]
        text = str(item)
        for hidden in (world.champion, world.canary, "req-", "user-", "champion", "canary"):
            assert hidden not in text
        assert "jane.smith@example.com" not in text
        assert "Jane Smith" not in text
        seen.append(item["messages"][0]["content"])
        stored = client.post(
            f"/api/lines/{LINE}/review/{item['item']}",
            headers=headers,
            json={"verdict": "pass", "reason": "correct", "correction": None},
        )
        assert stored.status_code == 201, stored.text
        assert "req-" not in stored.text
    assert any("订单" in s for s in seen)
    assert any("parcel" in s for s in seen)
    done = client.get(f"/api/lines/{LINE}/review/next", headers=headers).json()
    assert done["item"] is None


def test_bad_review_input_is_a_4xx_that_says_what_is_wrong(
    world: ReviewWorld, client: TestClient
) -> None:
    headers = world.bearer("reviewer")
    item = client.get(f"/api/lines/{LINE}/review/next", headers=headers).json()["item"]["item"]
    post = f"/api/lines/{LINE}/review/{item}"

    unknown = client.post(
        f"/api/lines/{LINE}/review/999999",
        headers=headers,
        json={"verdict": "pass", "reason": "correct"},
    )
    assert unknown.status_code == 404
    assert "no review item 999999" in unknown.json()["error"]
    not_a_number = client.post(f"/api/lines/{LINE}/review/abc", headers=headers, json={})
    assert not_a_number.status_code == 404

    reason = client.post(post, headers=headers, json={"verdict": "fail", "reason": "ugly"})
    assert reason.status_code == 422
    assert "'ugly' is not in this line's rubric" in reason.json()["error"]
    assert "wrong facts" in reason.json()["error"]
    verdict = client.post(post, headers=headers, json={"verdict": "maybe", "reason": "correct"})
    assert verdict.status_code == 422
    assert "verdict must be" in verdict.json()["error"]
    extra = client.post(post, headers=headers, json={"verdict": "pass", "reason": "x", "arm": 1})
    assert extra.status_code == 422
    assert "unknown fields ['arm']" in extra.json()["error"]

    for name, line in (("viewer", LINE), ("billing-reviewer", LINE), ("reviewer", OTHER_LINE)):
        refused = client.get(f"/api/lines/{line}/review/next", headers=world.bearer(name))
        assert refused.status_code == 403, (name, line)
        if name == "viewer":
            assert "no reviewer role" in refused.json()["error"]
    role_less = client.post(
        post, headers=world.bearer("viewer"), json={"verdict": "pass", "reason": "correct"}
    )
    assert role_less.status_code == 403
    assert "no reviewer role" in role_less.json()["error"]
    # Another reviewer cannot answer this reviewer's item.
    stolen = client.post(
        post, headers=world.bearer("reviewer2"), json={"verdict": "pass", "reason": "correct"}
    )
    assert stolen.status_code == 404

    ok = client.post(post, headers=headers, json={"verdict": "pass", "reason": "correct"})
    assert ok.status_code == 201
    twice = client.post(post, headers=headers, json={"verdict": "fail", "reason": "correct"})
    assert twice.status_code == 409
    assert "reviewed already" in twice.json()["error"]
    with world.store.engine.connect() as connection:
        reviews = connection.execute(
            select(feedback_table.c.outcome).where(feedback_table.c.type == "review")
        ).all()
    assert [r.outcome for r in reviews] == ["pass"]


def test_the_form_needs_the_session_token_and_this_origin(
    world: ReviewWorld, client: TestClient
) -> None:
    login = client.post(
        "/login", data={"key": world.keys["reviewer"], "next": "/"}, follow_redirects=False
    )
    assert login.status_code == 303
    session = client.cookies.get("flywheel_session")
    assert session
    page = client.get(f"/lines/{LINE}/review")
    assert page.status_code == 200
    assert 'id="review-form"' in page.text
    assert "review queue" in page.text
    for hidden in (world.champion, world.canary, "req-", "jane.smith@example.com"):
        assert hidden not in page.text
    item = page.text.split('data-item="', 1)[1].split('"', 1)[0]
    form = {"verdict": "fail", "reason": "unclear", "correction": "Better answer."}

    no_token = client.post(f"/lines/{LINE}/review/{item}", data=form, follow_redirects=False)
    assert no_token.status_code == 403
    assert "token" in no_token.text
    forged = client.post(
        f"/lines/{LINE}/review/{item}", data=form | {"token": review_token("x" * 43)}
    )
    assert forged.status_code == 403
    token = review_token(session)
    assert f'value="{token}"' in page.text
    elsewhere = client.post(
        f"/lines/{LINE}/review/{item}",
        data=form | {"token": token},
        headers={"Origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert elsewhere.status_code == 403
    assert "evil.example" in elsewhere.text
    # A cookie-authenticated API call needs the token too.
    api = client.post(
        f"/api/lines/{LINE}/review/{item}", json={"verdict": "pass", "reason": "correct"}
    )
    assert api.status_code == 403

    saved = client.post(
        f"/lines/{LINE}/review/{item}", data=form | {"token": token}, follow_redirects=False
    )
    assert saved.status_code == 303
    assert saved.headers["location"] == f"/lines/{LINE}/review?saved={item}"
    following = client.get(saved.headers["location"])
    assert f"Saved your review of item {item}" in following.text
    assert 'id="reviewed">1<' in following.text
    # Logged out, the token is worth nothing.
    client.post("/logout")
    after = client.post(f"/lines/{LINE}/review/{item}", data=form | {"token": token})
    assert after.status_code == 401


def test_the_overview_and_eval_review_show_the_pass_rates(
    world: ReviewWorld, client: TestClient
) -> None:
    from dashboard.evals import EvalRun

    queue = _queue(world)
    while (item := queue.next_item(LINE, "reviewer")) is not None:
        verdict = "fail" if "-canary-" in item.raw.request_id else "pass"
        queue.submit(LINE, "reviewer", item.item, ReviewVerdictIn(verdict, "unclear"))
    overview = client.get(f"/api/lines/{LINE}/overview", headers=world.bearer("viewer")).json()
    assert overview["canary"]["reviews"] == [
        {"adapter": world.champion, "reviews": 6, "failures": 0, "pass_rate": 1.0},
        {"adapter": world.canary, "reviews": 6, "failures": 6, "pass_rate": 0.0},
    ]
    page = client.get(f"/lines/{LINE}", headers=world.bearer("viewer")).text
    table = page.split('id="canary-reviews"', 1)[1].split("</table>", 1)[0]
    assert "100.0%" in table
    assert "0.0%" in table
    pages = client.app.state.pages  # type: ignore[attr-defined]
    run = EvalRun(
        "r1", "e1", "run", datetime.now(UTC), "FINISHED", "sft", None, "promote", (), (), 2, (), ()
    )
    reviews, check = pages._run_reviews(LINE, run)
    assert [(r.adapter, r.reviews, r.pass_rate) for r in reviews] == [
        (world.champion, 6, 1.0),
        (world.canary, 6, 0.0),
    ]
    assert check is None  # the canary flow has not looked yet


# --- keys and the CLI --------------------------------------------------------------------


def test_a_key_file_without_review_lines_keeps_working_and_grants_no_role(tmp_path: Path) -> None:
    from gateway.keys import ApiKey, KeyRing, key_digest

    path = tmp_path / "keys.yaml"
    path.write_text(
        f"keys:\n  - name: old\n    sha256: {key_digest('fw-old')}\n    business_lines: ['*']\n",
        encoding="utf-8",
    )
    key = KeyRing.load(path).authorize("fw-old")
    assert key is not None
    assert key.may_use(LINE)
    assert not key.may_review(LINE)
    # A reviewer role only counts on a line the key may use.
    partial = ApiKey(name="r", sha256="0" * 64, business_lines=(OTHER_LINE,), review_lines=("*",))
    assert partial.may_review(OTHER_LINE)
    assert not partial.may_review(LINE)


def test_the_cli_grants_the_reviewer_role_and_loop_reviewers_need_a_review_block(
    tmp_path: Path,
) -> None:
    import yaml

    made = run_cli(
        tmp_path, "gateway", "add-key", "ana", "--lines", "medical", "--review-lines", "medical"
    )
    assert made.returncode == 0, made.stderr
    assert "reviewer on medical" in made.stdout
    stored = yaml.safe_load((tmp_path / "gateway-keys.yaml").read_text())
    assert stored["keys"][0]["review_lines"] == ["medical"]
    unknown = run_cli(
        tmp_path, "gateway", "add-key", "bo", "--lines", "medical", "--review-lines", "nope"
    )
    assert unknown.returncode == 2
    # A recipe without a review block: simulated reviewers are refused up front.
    from composition.recipes import packaged_recipes_dir, recipe_settings

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    demo = recipe_settings(packaged_recipes_dir() / "demo" / "customer_service.yaml")
    demo.pop("review")
    demo["canary"].pop("satisfaction")
    (recipes / "customer_service.yaml").write_text(yaml.safe_dump(demo))
    loop = run_cli(
        tmp_path, "loop", "--line", "customer_service", "--reviewers", "2",
        FLYWHEEL_RECIPES_DIR=str(recipes),
    )  # fmt: skip
    assert loop.returncode == 2, loop.stderr
    assert "--reviewers needs a review block" in loop.stderr


def test_forgetting_a_user_takes_the_reviews_and_claims_of_their_answers(
    world: ReviewWorld,
) -> None:
    from dashboard.tables import review_claims_table

    queue = _queue(world)
    item = queue.next_item(LINE, "reviewer")
    assert item is not None
    queue.submit(LINE, "reviewer", item.item, ReviewVerdictIn("fail", "unclear", "Better."))
    user = f"user-{item.raw.request_id}"
    erasure = world.store.forget_user(user)
    assert erasure.total("interactions") == 1
    with world.store.engine.connect() as connection:
        claims = connection.execute(select(review_claims_table)).all()
        reviews = connection.execute(
            select(feedback_table).where(feedback_table.c.request_id == item.raw.request_id)
        ).all()
    assert claims == []
    assert reviews == []


def test_an_experiment_has_both_arms_reviewed_at_the_experiment_share() -> None:
    """While an A/B experiment is live its two arms serve every user: the queue samples
    both (the recipe's ``experiment`` share, else the default), not the champion."""
    from dashboard.review_queue import review_arms
    from feedback.reviews import DEFAULT_EXPERIMENT_SHARE, ReviewPolicy
    from registry.routing import ExperimentSplit, RoutingTable

    table = RoutingTable(business_line=LINE, champion=f"{LINE}-v1").with_experiment(
        ExperimentSplit(id=3, a=f"{LINE}-v1", b=f"{LINE}-v2", share=0.5)
    )
    default = ReviewPolicy(rubric=RUBRIC)
    assert [(a.name, a.adapter, a.share) for a in review_arms(table, default)] == [
        ("experiment_a", f"{LINE}-v1", DEFAULT_EXPERIMENT_SHARE),
        ("experiment_b", f"{LINE}-v2", DEFAULT_EXPERIMENT_SHARE),
    ]
    chosen = ReviewPolicy(rubric=RUBRIC, share={"champion": 0.02, "experiment": 0.3})
    assert {a.share for a in review_arms(table, chosen)} == {0.3}
    plain = RoutingTable(business_line=LINE, champion=f"{LINE}-v1")
    assert [a.name for a in review_arms(plain, default)] == ["champion"]


def test_a_champion_whose_sample_is_used_up_is_reviewed_until_even_with_its_canary(
    tmp_path: Path,
) -> None:
    """The canary's test compares two arms: with a tiny champion share of little traffic (the
    loop's picked users, a quiet line), the champion's queue draws beyond its share while it
    has fewer reviews than the canary, so neither arm waits for the other."""
    from tests.review_world import write_recipe

    world = build_review_world(tmp_path / "home", per_arm=40)
    recipes = world.settings.recipes_dir
    assert recipes is not None
    write_recipe(recipes, LINE, share=0.01, canary_share=1.0)
    queue = _queue(world)
    picked = []
    for _ in range(30):
        item = queue.next_item(LINE, "reviewer")
        assert item is not None
        picked.append(item.raw.request_id)
        queue.submit(LINE, "reviewer", item.item, ReviewVerdictIn("pass", "correct"))
    on_canary = sum("-canary-" in rid for rid in picked)
    assert 10 <= on_canary <= 20, picked
    world.store.close()
