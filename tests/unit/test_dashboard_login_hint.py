"""The demo's way onto the feedback page works as printed: the key its command makes on
the demo's home logs in, and it may work the review queue."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from cli.commands.reports import print_feedback_page_hint
from cli.main import app as cli
from dashboard.access import login_commands
from flywheel.settings import load_settings
from tests.dashboard_store import build_page_home

REMOTE = ("10.1.2.3", 40000)


def _split(command: str) -> tuple[dict[str, str], list[str]]:
    """A printed command's variable assignments and its flywheel arguments."""
    words = shlex.split(command)
    start = next(i for i, word in enumerate(words) if word.endswith("flywheel"))
    assigned = dict(word.split("=", 1) for word in words[:start])
    return assigned, words[start + 1 :]


def test_the_printed_key_logs_in_on_the_demo_home_and_reviews(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "demo home"
    built = build_page_home(home, requests=60, with_dataset=False, with_keys=False)
    built.store.close()
    monkeypatch.delenv("FLYWHEEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("FLYWHEEL_GATEWAY_KEYS_FILE", raising=False)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "another home"))  # the shell's own
    make_key, serve = login_commands(home)
    print_feedback_page_hint(load_settings(home=home))
    printed = capsys.readouterr().out
    assert make_key in printed
    assert serve in printed

    assigned, arguments = _split(make_key)
    assert arguments[:2] == ["gateway", "add-key"]
    for name, value in assigned.items():
        monkeypatch.setenv(name, value)
    made = CliRunner().invoke(cli, arguments)
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[-1]

    assigned, arguments = _split(serve)
    assert arguments == ["serve", "dashboard"]
    for name, value in assigned.items():
        monkeypatch.setenv(name, value)
    from composition.servers import dashboard_app

    with TestClient(dashboard_app(), client=REMOTE) as browser:
        assert browser.get("/lines/customer_service").status_code == 401
        logged_in = browser.post(
            "/login",
            data={"key": token, "next": "/lines/customer_service"},
            follow_redirects=False,
        )
        assert logged_in.status_code == 303, logged_in.text
        for line in ("customer_service", "legal", "medical"):
            assert browser.get(f"/lines/{line}").status_code == 200
        review = browser.get("/lines/customer_service/review")
        assert review.status_code == 200, review.text
        assert 'class="current"' in review.text
