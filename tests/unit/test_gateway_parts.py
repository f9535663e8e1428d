"""The gateway's parts on their own: the spool, the routing history, keys, the CLI, traffic."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from cli.main import app
from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore
from flywheel.errors import UsageError
from flywheel.settings import Settings
from gateway.keys import KeyRing, add_key, bearer_token
from gateway.recorder import FinishedRequest, InteractionRecorder, answer_text
from registry.routes import RouteStore
from tests.routing import set_canary, set_champion

runner = CliRunner()


class FlakyStore:
    """A real SQLite store whose writes fail while ``down`` is set (the store unplugged)."""

    def __init__(self, store: FeedbackStore) -> None:
        self._store = store
        self.engine = store.engine
        self.down = False
        self.calls = 0

    def ingest(self, items: Any, *, source: str, **options: Any) -> Any:
        self.calls += 1
        if self.down:
            raise OperationalError("INSERT", {}, ConnectionRefusedError("store unplugged"))
        return self._store.ingest(items, source=source, **options)


def _finished(index: int, session: str | None = None) -> FinishedRequest:
    return FinishedRequest(
        request_id=f"req-{index}",
        business_line="legal",
        base_model="base",
        messages=[{"role": "user", "content": f"question {index}"}],
        created_at=datetime(2026, 11, 30, tzinfo=UTC) + timedelta(seconds=index),
        session_id=session,
        user_id="u1",
        body=b'{"choices": [{"message": {"content": "answer"}}]}',
    )


def _count(store: FeedbackStore, table: Any) -> int:
    with store.engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


def test_an_unreachable_store_spools_to_disk_and_replays_in_order_once(
    settings: Settings, tmp_path: Path
) -> None:
    store = FeedbackStore.open(settings)
    flaky = FlakyStore(store)
    recorder = InteractionRecorder(flaky, tmp_path / "spool", flush_s=0.01, retry_s=0.05)  # type: ignore[arg-type]
    recorder.start()
    recorder.record(_finished(0))
    assert recorder.flush()
    flaky.down = True
    for index in range(1, 40):
        recorder.record(_finished(index))
    recorder.record_feedback(
        {
            "type": "thumbs_up",
            "request_id": "req-5",
            "idempotency_key": "k5",
            "created_at": "2026-11-30T00:01:00+00:00",
        }
    )
    assert recorder.flush()
    assert recorder.spool.records() == 40
    assert not recorder.stats.store_up
    assert _count(store, interactions_table) == 1
    flaky.down = False
    recorder.record(_finished(40))
    assert recorder.flush()
    recorder.close()
    assert recorder.spool.files() == []
    assert _count(store, interactions_table) == 41
    assert _count(store, feedback_table) == 1
    # A crash between a replayed ingest and the file's removal replays it again: no doubles.
    recorder.spool.append([{"type": "interaction", **_plain(_finished(3))}])
    recorder.spool.replay(lambda events: store.ingest(events, source="gateway"))
    assert _count(store, interactions_table) == 41
    store.close()


def _plain(finished: FinishedRequest) -> dict[str, Any]:
    from gateway.recorder import interaction_event

    event = interaction_event(finished)
    event.pop("type")
    return event


def test_a_restarted_gateway_replays_what_an_earlier_one_spooled(
    settings: Settings, tmp_path: Path
) -> None:
    store = FeedbackStore.open(settings)
    flaky = FlakyStore(store)
    flaky.down = True
    first = InteractionRecorder(flaky, tmp_path / "spool", flush_s=0.01)  # type: ignore[arg-type]
    first.start()
    for index in range(5):
        first.record(_finished(index))
    first.close()
    assert first.spool.records() == 5
    second = InteractionRecorder(store, tmp_path / "spool", flush_s=0.01)
    second.start()
    assert second.flush()
    second.close()
    assert _count(store, interactions_table) == 5
    assert second.spool.files() == []
    store.close()


def test_feedback_replayed_before_its_interaction_waits_for_it_instead_of_quarantine(
    settings: Settings, tmp_path: Path
) -> None:
    """Two replicas through a store outage: B's spool (the thumbs-down it answered 202 for)
    replays before A's (the interaction it names)."""
    from feedback.schema import quarantine_table

    store = FeedbackStore.open(settings)
    answered, rated = FlakyStore(store), FlakyStore(store)
    answered.down = rated.down = True
    a = InteractionRecorder(answered, tmp_path / "a", flush_s=0.01, retry_s=0.05)  # type: ignore[arg-type]
    b = InteractionRecorder(rated, tmp_path / "b", flush_s=0.01, retry_s=0.05)  # type: ignore[arg-type]
    a.start()
    b.start()
    finished = _finished(7)
    finished.created_at = datetime.now(UTC)
    a.record(finished)
    b.record_feedback(
        {
            "type": "thumbs_down",
            "request_id": finished.request_id,
            "idempotency_key": "gw:req-7:thumbs_down:1",
            "created_at": datetime.now(UTC).isoformat(),
        }
    )
    assert a.flush()
    assert b.flush()
    assert a.spool.records() == b.spool.records() == 1
    rated.down = False  # B's store is back first: its feedback has no interaction yet
    time.sleep(0.1)
    assert b.flush()
    assert b.spool.files() == []
    assert _count(store, feedback_table) == 0
    assert _count(store, quarantine_table) == 0
    assert b.waiting.records() == 1
    answered.down = False
    time.sleep(0.1)
    assert a.flush()
    deadline = time.monotonic() + 5
    while _count(store, feedback_table) == 0 and time.monotonic() < deadline:
        b.flush()
        time.sleep(0.05)
    a.close()
    b.close()
    assert _count(store, feedback_table) == 1
    assert _count(store, quarantine_table) == 0
    assert b.waiting.files() == []
    store.close()


def test_stream_chunks_become_the_logged_answer_and_usage() -> None:
    finished = _finished(1)
    finished.body = None
    finished.chunks = [
        b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\ndata: {"ch',
        b'oices": [{"delta": {"content": "Hel"}}]}\n\ndata: {"choices": [{"delta": {"content"',
        b': "lo"}}], "usage": {"completion_tokens": 2}}\n\ndata: [DONE]\n\n',
    ]
    assert answer_text(finished) == ("Hello", {"completion_tokens": 2})
    finished.chunks = [b"data: {broken\n\n"]
    assert answer_text(finished) == ("", None)


def test_route_changes_are_atomic_revisioned_and_recorded(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    routes = RouteStore(store.engine)
    assert routes.table("legal").champion is None
    set_champion(routes, "legal", "legal-v1", actor="t")
    set_canary(routes, "legal", "legal-v2", 0.05, actor="t", reason="nightly")
    set_champion(routes, "legal", "legal-v2", actor="t", reason="promoted")
    snapshot = routes.snapshot()
    table = snapshot.table("legal")
    assert (table.champion, table.canary, table.previous) == ("legal-v2", None, "legal-v1")
    assert snapshot.revisions["legal"] == 3
    history = routes.history("legal")
    assert [c.action for c in history] == ["champion_set", "canary_set", "champion_set"]
    assert history[0].reason == "promoted"
    with pytest.raises(UsageError, match="not an adapter of legal"):
        set_canary(routes, "legal", "medical-v9", actor="t")
    with pytest.raises(UsageError, match="differ from the champion"):
        set_canary(routes, "legal", "legal-v2", actor="t")
    assert routes.snapshot().revisions["legal"] == 3
    store.close()


def test_keys_are_stored_as_digests_and_scope_lines(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    support = add_key(path, "support", ["customer_service"])
    everyone = add_key(path, "platform", ["*"])
    assert support not in path.read_text()
    ring = KeyRing.load(path)
    support_key = ring.authorize(support)
    assert support_key is not None
    assert support_key.may_use("customer_service")
    assert not support_key.may_use("legal")
    platform = ring.authorize(everyone)
    assert platform is not None
    assert platform.may_use("legal")
    assert ring.authorize("fw-guess") is None
    assert ring.authorize(None) is None
    with pytest.raises(UsageError, match="exists already"):
        add_key(path, "support", ["legal"])
    assert path.stat().st_mode & 0o777 == 0o600
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("Basic abc") is None
    assert KeyRing.load(tmp_path / "missing.yaml").authorize(support) is None


def test_a_corrupt_key_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("keys: [{name: x}]\n")
    with pytest.raises(UsageError, match="not a valid key file"):
        KeyRing.load(path)


def test_canary_and_routes_commands(settings: Settings) -> None:
    # The champion moves routing and MLflow's alias together: an unregistered one is refused.
    unregistered = runner.invoke(app, ["routes", "champion", "legal", "legal-v1"])
    assert unregistered.exit_code != 0
    assert "no version 1" in str(unregistered.exception)
    assert RouteStore(FeedbackStore.open(settings).engine).table("legal").champion is None
    set_champion(RouteStore(FeedbackStore.open(settings).engine), "legal", "legal-v1", actor="t")
    result = runner.invoke(
        app, ["canary", "set", "legal", "legal-v2", "--fraction", "0.1", "--no-check"]
    )
    assert result.exit_code == 0, result.output
    assert "10.0%" in result.output
    shown = json.loads(runner.invoke(app, ["routes", "--json"]).stdout)
    legal = next(row for row in shown if row["business_line"] == "legal")
    assert (legal["champion"], legal["canary"], legal["canary_fraction"]) == (
        "legal-v1",
        "legal-v2",
        0.1,
    )
    assert runner.invoke(app, ["canary", "clear", "legal", "--reason", "bad"]).exit_code == 0
    history = json.loads(runner.invoke(app, ["routes", "--history", "legal", "--json"]).stdout)
    assert [h["action"] for h in history] == ["canary_clear", "canary_set", "champion_set"]
    assert history[0]["reason"] == "bad"
    refused = runner.invoke(app, ["canary", "set", "legal", "medical-v2", "--no-check"])
    assert isinstance(refused.exception, UsageError)
    assert "not an adapter of legal" in str(refused.exception)
    unknown = runner.invoke(app, ["canary", "clear", "shipping"])
    assert isinstance(unknown.exception, UsageError)


def test_canary_set_checks_the_adapter_is_served(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_GATEWAY_UPSTREAMS", "http://127.0.0.1:9")
    from registry.vllm_admin import VllmUnavailableError

    refused = runner.invoke(app, ["canary", "set", "legal", "legal-v2"])
    # A replica that cannot be reached is vLLM's own error (exit 7), naming the setting.
    assert isinstance(refused.exception, VllmUnavailableError)
    assert "FLYWHEEL_GATEWAY_UPSTREAMS" in str(refused.exception)


def test_canary_set_checks_only_the_replicas_the_line_is_placed_on(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica the line is not placed on (here one that does not even answer) is not
    asked; the placed one must serve the adapter."""
    from tests.stub_vllm import StubBehaviour, running_stub

    with running_stub(StubBehaviour(adapters={"legal-v2"})) as home:
        monkeypatch.setenv("FLYWHEEL_GATEWAY_UPSTREAMS", f"http://127.0.0.1:9,{home.base_url}")
        routes = RouteStore(FeedbackStore.open(settings).engine)
        routes.change(
            "legal", lambda t: t.placed_on((home.base_url,)), action="placement_set", actor="t"
        )
        result = runner.invoke(app, ["canary", "set", "legal", "legal-v2"])
        assert result.exit_code == 0, result.output
        home.behaviour.adapters.clear()
        missing = runner.invoke(app, ["canary", "set", "legal", "legal-v2"])
    assert isinstance(missing.exception, UsageError)
    assert f"not loaded on {home.base_url}" in str(missing.exception)


def test_gateway_add_key_prints_the_key_once(settings: Settings) -> None:
    result = runner.invoke(app, ["gateway", "add-key", "support", "--lines", "legal,medical"])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("fw-")
    key = KeyRing.load(settings.home / "gateway-keys.yaml").authorize(token)
    assert key is not None
    assert key.business_lines == ("legal", "medical")
    assert not key.operator


def test_a_rotated_key_keeps_its_name_and_lines_and_the_old_secret_stops(
    settings: Settings,
) -> None:
    made = runner.invoke(
        app, ["gateway", "add-key", "support", "--lines", "legal", "--review-lines", "legal"]
    )
    old = made.stdout.strip().splitlines()[-1]
    rotated = runner.invoke(app, ["gateway", "rotate-key", "support"])
    assert rotated.exit_code == 0, rotated.output
    new = rotated.stdout.strip().splitlines()[-1]
    assert new.startswith("fw-")
    assert new != old
    ring = KeyRing.load(settings.home / "gateway-keys.yaml")
    assert ring.authorize(old) is None
    key = ring.authorize(new)
    assert key is not None
    assert (key.name, key.business_lines, key.review_lines) == ("support", ("legal",), ("legal",))
    assert len(ring) == 1
    unknown = runner.invoke(app, ["gateway", "rotate-key", "nobody"])
    assert isinstance(unknown.exception, UsageError)
    assert "no key named 'nobody'" in str(unknown.exception)


def test_an_operator_key_is_made_in_the_same_key_file_and_needs_no_lines(
    settings: Settings,
) -> None:
    result = runner.invoke(app, ["gateway", "add-key", "prometheus", "--operator"])
    assert result.exit_code == 0, result.output
    assert "operator" in result.stdout
    path = settings.home / "gateway-keys.yaml"
    assert "operator: true" in path.read_text()
    key = KeyRing.load(path).authorize(result.stdout.strip().splitlines()[-1])
    assert key is not None
    assert key.operator
    assert key.business_lines == ()
    assert not key.may_use("legal")
    # Every other key still names its lines.
    refused = runner.invoke(app, ["gateway", "add-key", "nobody"])
    assert isinstance(refused.exception, UsageError)
    assert "--lines" in str(refused.exception)
    lineless = settings.home / "lineless.yaml"
    lineless.write_text("keys: [{name: x, sha256: '" + "0" * 64 + "'}]\n")
    with pytest.raises(UsageError, match="business_lines"):
        KeyRing.load(lineless)
