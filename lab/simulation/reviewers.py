"""Simulated reviewers on the feedback page's review queue.

Each reviewer is an API key with the reviewer role on the line. It asks the page
for its next item (``GET /api/lines/{line}/review/next``: a blind, scrubbed answer
and its prompt), judges it by the user model's hidden ``satisfied()`` (the same
judgement the loop measures success by), gets it wrong with probability ``noise``,
and posts the verdict with a reason from the line's rubric. Reviewers never see
the arm, so whatever they do to the pass rate comes from the answers alone.

With ``corrections`` above 0, a reviewer also corrects that share of the answers
it fails: the answer rewritten as the line's users wanted it (the user model's
``correct()``, the same rewrite as the users' own edits), posted with the verdict.
The page stores a correction as an edit, so a line whose users never edit
(many chat products offer no edit) still gets written examples from its review
team.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from lab.simulation.protocol import LoadedUsers


@dataclass(slots=True)
class ReviewReport:
    """What the reviewers did in one round."""

    passed: int = 0
    failed: int = 0
    corrected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def reviewed(self) -> int:
        """Verdicts stored."""
        return self.passed + self.failed

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "passed": self.passed,
            "failed": self.failed,
            "corrected": self.corrected,
            "errors": self.errors[:5],
        }


def _prompt(messages: Sequence[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


class SimulatedReviewers:
    """Reviewers (one per key) working a line's queue on the feedback page at ``page_url``."""

    def __init__(
        self,
        page_url: str,
        keys: Sequence[str],
        users: LoadedUsers,
        *,
        noise: float = 0.1,
        corrections: float = 0.0,
        seed: int = 0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not keys:
            raise ValueError("simulated reviewers need at least one key with the reviewer role")
        if not 0 <= noise <= 0.5:
            raise ValueError(f"reviewer noise must be in [0, 0.5], got {noise}")
        if not 0 <= corrections <= 1:
            raise ValueError(
                f"the share of failed answers corrected must be in [0, 1], got {corrections}"
            )
        if corrections and not users.corrects:
            raise ValueError(
                f"reviewers cannot correct answers: the user model {users.spec} has no correct()"
            )
        self.page_url = page_url.rstrip("/")
        self.keys = tuple(keys)
        self.users = users
        self.noise = noise
        self.corrections = corrections
        self.rng = random.Random(seed)
        self.transport = transport

    def verdict(self, business_line: str, prompt: str, answer: str) -> bool:
        """Pass or fail: the user model's hidden judgement, flipped with probability noise."""
        right = self.users.satisfied(business_line, prompt, answer)
        return right if self.rng.random() >= self.noise else not right

    def review(self, business_line: str, count: int) -> ReviewReport:
        """Up to ``count`` verdicts, the reviewers taking turns, until the queue is empty."""
        report = ReviewReport()
        idle: set[str] = set()
        with httpx.Client(base_url=self.page_url, timeout=60, transport=self.transport) as client:
            turn = 0
            while report.reviewed < count and len(idle) < len(self.keys):
                key = self.keys[turn % len(self.keys)]
                turn += 1
                if key in idle:
                    continue
                if not self._review_one(client, key, business_line, report):
                    idle.add(key)
        return report

    def _review_one(
        self, client: httpx.Client, key: str, business_line: str, report: ReviewReport
    ) -> bool:
        """One item reviewed by ``key``; False when its queue is empty (or refused)."""
        headers = {"Authorization": f"Bearer {key}"}
        answer = client.get(f"/api/lines/{business_line}/review/next", headers=headers)
        if answer.status_code != 200:
            report.errors.append(f"next: {answer.status_code} {answer.text[:200]}")
            return False
        body = answer.json()
        item, rubric = body.get("item"), body.get("rubric") or []
        if item is None:
            return False
        prompt = _prompt(item["messages"])
        passed = self.verdict(business_line, prompt, item["answer"])
        reason = rubric[0] if passed or len(rubric) < 2 else rubric[1]
        correction = None
        if not passed and self.corrections and self.rng.random() < self.corrections:
            correction = self.users.correct(business_line, prompt, item["answer"])
        stored = client.post(
            f"/api/lines/{business_line}/review/{item['item']}",
            headers=headers,
            json={
                "verdict": "pass" if passed else "fail",
                "reason": reason,
                "correction": correction,
            },
        )
        if stored.status_code != 201:
            report.errors.append(f"verdict: {stored.status_code} {stored.text[:200]}")
            return False
        if passed:
            report.passed += 1
        else:
            report.failed += 1
        report.corrected += correction is not None
        return True
