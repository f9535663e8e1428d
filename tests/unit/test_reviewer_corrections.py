"""Simulated reviewers' corrections: only failed answers are corrected, at the share asked for,
with the user model's rewrite; a user model that cannot rewrite is refused up front."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from lab.simulation.protocol import LoadedUsers, UsersSpecError
from lab.simulation.reviewers import SimulatedReviewers
from tests.cli_process import run_cli

LINE = "customer_service"
GOOD = "I am sorry for the trouble: reset the router, then call us."


class Users:
    def react(self, business_line: str, prompt: str, answer: str, seed: int) -> dict[str, Any]:
        return {"type": "none"}

    def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
        return answer.startswith("good")


class CorrectingUsers(Users):
    def correct(self, business_line: str, prompt: str, answer: str) -> str:
        return GOOD


class Page:
    """The review queue's two routes over ``items`` answers, half of them good."""

    def __init__(self, items: int) -> None:
        self.items = [("good" if n % 2 else "bad") + f" answer {n}" for n in range(items)]
        self.verdicts: dict[str, dict[str, Any]] = {}

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            if not self.items:
                return httpx.Response(200, json={"item": None, "rubric": ["correct", "wrong"]})
            answer = self.items.pop()
            messages = [{"role": "user", "content": "?"}]
            item = {"item": answer, "messages": messages, "answer": answer}
            return httpx.Response(200, json={"item": item, "rubric": ["correct", "wrong"]})
        self.verdicts[request.url.path.rsplit("/", 1)[-1]] = json.loads(request.content)
        return httpx.Response(201, json={})


def _reviewers(page: Page, users: Any, **options: Any) -> SimulatedReviewers:
    return SimulatedReviewers(
        "http://page",
        ["k1", "k2"],
        LoadedUsers("test:Users", users),
        transport=httpx.MockTransport(page.handle),
        **options,
    )


def test_only_failed_answers_are_corrected_at_the_share_asked_for() -> None:
    page = Page(2_000)
    report = _reviewers(page, CorrectingUsers(), noise=0.1, corrections=0.25, seed=3).review(
        LINE, 2_000
    )
    assert report.reviewed == 2_000
    failed = [v for v in page.verdicts.values() if v["verdict"] == "fail"]
    corrected = [v for v in failed if v["correction"] is not None]
    assert all(v["correction"] is None for v in page.verdicts.values() if v["verdict"] == "pass")
    assert {v["correction"] for v in corrected} == {GOOD}
    assert report.corrected == len(corrected)
    # Binomial(~1,000, 0.25): within four standard deviations (~55).
    assert abs(len(corrected) - 0.25 * len(failed)) < 4 * (0.25 * 0.75 * len(failed)) ** 0.5


def test_without_a_share_no_answer_is_corrected() -> None:
    page = Page(200)
    report = _reviewers(page, CorrectingUsers(), noise=0.0).review(LINE, 200)
    assert report.failed == 100
    assert report.corrected == 0
    assert all(v["correction"] is None for v in page.verdicts.values())


def test_a_user_model_that_cannot_rewrite_is_refused_before_any_review() -> None:
    page = Page(10)
    with pytest.raises(ValueError, match="has no correct"):
        _reviewers(page, Users(), corrections=0.5)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        _reviewers(page, CorrectingUsers(), corrections=1.5)
    assert len(page.items) == 10


def test_a_correction_without_text_names_the_model() -> None:
    class Blank(Users):
        def correct(self, business_line: str, prompt: str, answer: str) -> str:
            return " "

    with pytest.raises(UsersSpecError, match="correct\\(\\) must return"):
        LoadedUsers("test:Blank", Blank()).correct(LINE, "?", "bad")


def test_the_builtin_users_correct_into_their_own_edit() -> None:
    from lab.simulation.users import BuiltinUsers

    users = BuiltinUsers()
    prompt = users.prompts("legal", 1, 0)[0]
    answer = "You should write to them."
    corrected = users.correct("legal", prompt, answer)
    assert corrected.startswith("1. ")
    assert "lawyer" in corrected


def test_the_cli_exits_2_when_the_user_model_cannot_rewrite(tmp_path: Any) -> None:
    users = tmp_path / "users.py"
    users.write_text(
        "class Quiet:\n"
        "    def react(self, line, prompt, answer, seed):\n"
        "        return {'type': 'none'}\n"
        "    def satisfied(self, line, prompt, answer):\n"
        "        return False\n"
    )
    done = run_cli(
        tmp_path, "loop", "--line", "legal", "--users", f"{users}:Quiet",
        "--review-corrections", "0.2",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--review-corrections" in done.stderr
    assert "correct(" in done.stderr
    assert "Traceback" not in done.stderr
