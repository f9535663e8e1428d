"""Feedback profiles: how often simulated users voice what they think, and the checks on them."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from lab.simulation.feedback_profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    FeedbackProfileError,
    load_profile,
)
from lab.simulation.prompts import builtin_prompts, topic_of
from lab.simulation.protocol import LoadedUsers, UsersSpecError
from lab.simulation.users import BuiltinUsers, CustomerServiceUsers, LegalUsers, MedicalUsers
from tests.cli_process import run_cli


def test_the_default_is_the_realistic_profile_and_it_is_mostly_silent() -> None:
    profile = load_profile(None)
    assert profile.name == DEFAULT_PROFILE == "realistic"
    for happy in (True, False):
        rates = profile.rates(happy)
        assert rates.get("thumbs_up", 0) + rates.get("thumbs_down", 0) <= 0.05
        assert rates.get("edit", 0) <= 0.01
        assert profile.silent_share(happy) >= 0.8
    # Implicit signals more often than explicit ones, and mostly on bad answers.
    unhappy, happy_rates = profile.rates(False), profile.rates(True)
    assert unhappy["regenerate"] + unhappy["abandon"] > unhappy["thumbs_down"]
    assert unhappy["regenerate"] > 3 * happy_rates["regenerate"]
    assert "edit" not in PROFILES["no_edits"].unsatisfied
    assert PROFILES["dense"].rates(False)["edit"] == 0.14


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("users_class", [CustomerServiceUsers, MedicalUsers, LegalUsers])
def test_the_users_honour_their_profile_rates(name: str, users_class: type) -> None:
    """Each signal's share of 6,000 reactions within 4.5 binomial standard errors of the
    profile's rate, for answers the users like and answers they do not."""
    users = users_class()
    users.use_feedback(PROFILES[name])
    line = users.line_of("x")
    prompts = builtin_prompts(line, 40, 1)
    good = {p: users.rewrite(p, "", topic_of(line, p)) for p in prompts}
    poor = "Thank you for your question, it is a very interesting one to think about"
    n = 6000
    for happy, answer_of in ((True, good), (False, dict.fromkeys(prompts, poor))):
        counts: Counter[str] = Counter()
        for seed in range(n):
            prompt = prompts[seed % len(prompts)]
            assert users.satisfied(line, prompt, answer_of[prompt]) is happy
            counts[users.react(line, prompt, answer_of[prompt], seed)["type"]] += 1
        expected = dict(PROFILES[name].rates(happy))
        expected["none"] = PROFILES[name].silent_share(happy)
        for signal, rate in expected.items():
            tolerance = 4.5 * math.sqrt(max(rate * (1 - rate), 1e-4) / n)
            assert abs(counts[signal] / n - rate) <= tolerance, (name, happy, signal)
        assert set(counts) <= set(expected)


def test_builtin_users_take_the_profile_for_every_line() -> None:
    users = LoadedUsers("lab.simulation.users:BuiltinUsers", BuiltinUsers())
    assert users.feedback is not None
    assert users.feedback.name == "realistic"
    users.use_feedback(PROFILES["dense"])
    assert {u.feedback.name for u in users.model.by_line.values()} == {"dense"}


def test_a_model_that_decides_its_own_feedback_refuses_a_profile() -> None:
    class Own:
        def react(self, business_line: str, prompt: str, answer: str, seed: int) -> dict:
            return {"type": "none"}

        def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
            return True

    users = LoadedUsers("mine:Own", Own())
    assert users.feedback is None
    with pytest.raises(UsersSpecError, match="decides its own feedback"):
        users.use_feedback(PROFILES["dense"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("satisfied: {thumbs_up: 1.5}\nunsatisfied: {}\n", r"satisfied.*\[0, 1\]"),
        ("satisfied: {thumbs_up: -0.1}\nunsatisfied: {}\n", r"\[0, 1\]"),
        (
            "satisfied: {}\nunsatisfied: {thumbs_down: 0.6, regenerate: 0.5}\n",
            "unsatisfied.*sum to 1.1, over 1",
        ),
        ("satisfied: {shrug: 0.1}\nunsatisfied: {}\n", "unknown signals"),
        ("- a list\n", "expected a mapping"),
        ("satisfied: [\n", "not valid yaml"),
    ],
)
def test_a_bad_profile_file_is_refused_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    with pytest.raises(FeedbackProfileError, match=message) as caught:
        load_profile(str(path))
    assert str(path) in str(caught.value)


def test_a_profile_file_loads_and_unknown_names_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "quiet.json"
    path.write_text('{"satisfied": {"thumbs_up": 0.01}, "unsatisfied": {"thumbs_down": 0.02}}')
    profile = load_profile(str(path))
    assert profile.name == str(path)
    assert profile.silent_share(False) == pytest.approx(0.98)
    with pytest.raises(FeedbackProfileError, match="not a profile name"):
        load_profile("chatty")
    with pytest.raises(FeedbackProfileError, match="cannot read"):
        load_profile(str(tmp_path / "missing.yaml"))
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * 200_000 + "\nsatisfied: {}\nunsatisfied: {}\n")
    with pytest.raises(FeedbackProfileError, match="larger than 64 KB"):
        load_profile(str(huge))


def test_the_cli_exits_2_naming_a_profile_whose_rates_cannot_be(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("satisfied: {thumbs_up: 0.7, task_success: 0.6}\nunsatisfied: {}\n")
    done = run_cli(tmp_path, "loop", "--line", "legal", "--feedback", str(path))
    assert done.returncode == 2, done.stderr
    assert "bad.yaml" in done.stderr
    assert "over 1" in done.stderr
    assert "Traceback" not in done.stderr
