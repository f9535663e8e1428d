"""The client set (``composition.clients``): built lazily from the settings, closed together,
put in use for the edges; and product code run on the unit tests' set (``tests.fake_clients``)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from composition.clients import build_clients, clients_in_use, open_clients
from feedback.store import FeedbackStore
from feedback.watermarks import WatermarkStore
from flows.nightly import open_window
from flywheel.errors import StoreUnavailableError
from flywheel.settings import Settings, load_settings
from registry.adapter_sync import lifecycle_check
from registry.routes import RouteStore
from tests.fake_clients import fake_clients
from tests.routing import set_champion

runner = CliRunner()


def test_the_real_set_builds_each_client_on_first_use_and_closes_the_store(
    settings: Settings,
) -> None:
    clients = build_clients(settings)
    assert clients.built() == frozenset()
    assert not (settings.home / "flywheel.db").exists()  # nothing opened yet
    store = clients.store
    assert clients.store is store
    assert clients.routes.engine is store.engine
    assert clients.routes is clients.routes
    assert clients.redis is None  # no FLYWHEEL_REDIS_URL: the gateway counts per process
    with clients.vllm_admin("http://127.0.0.1:9/") as admin:
        assert admin.base_url == "http://127.0.0.1:9"
    assert clients.built() == {"store", "routes", "redis"}
    clients.close()
    assert clients.built() == {"redis"}
    assert clients.store is not store  # opened again on the next use
    clients.close()


def test_an_unreachable_store_is_a_clear_error_with_the_password_hidden(
    settings: Settings,
) -> None:
    down = load_settings(database_url="postgresql+psycopg://fw:s3cret@127.0.0.1:9/flywheel")
    with build_clients(down) as clients, pytest.raises(StoreUnavailableError) as caught:
        _ = clients.store
    assert "cannot reach the feedback store at postgresql+psycopg://fw:***@127.0.0.1:9" in str(
        caught.value
    )
    assert "s3cret" not in str(caught.value)


def test_an_edge_gets_the_set_in_use_and_leaves_it_open(settings: Settings) -> None:
    given = fake_clients(settings)
    with clients_in_use(given), open_clients(settings) as clients:
        assert clients is given
        store = clients.store
    assert given.store is store  # the edge did not close what it did not open
    with open_clients(settings) as real:
        assert real is not given
    given.close()


def test_a_command_runs_on_the_set_in_use(settings: Settings, tmp_path: Path) -> None:
    # The set's store is elsewhere than the settings' home: what the command changes there
    # shows it used the set it was given, and built nothing of its own.
    store = FeedbackStore.open(load_settings(home=tmp_path / "elsewhere"))
    given = fake_clients(settings, store=store)
    with clients_in_use(given):
        done = runner.invoke(app, ["canary", "set", "legal", "legal-v1", "--no-check"])
        shown = runner.invoke(app, ["routes", "--json"])
    assert done.exit_code == 0, done.output
    assert "legal-v1 on 5.0% of users" in done.stdout
    assert {"legal": "legal-v1"}.items() <= {
        row["business_line"]: row["canary"] for row in json.loads(shown.stdout)
    }.items()
    assert RouteStore(store.engine).table("legal").canary == "legal-v1"
    assert given.built() == {"store", "routes"}
    assert not (settings.home / "flywheel.db").exists()
    store.close()


def test_a_nightly_stage_uses_the_flow_runs_set(settings: Settings, tmp_path: Path) -> None:
    store = FeedbackStore.open(load_settings(home=tmp_path / "elsewhere"))
    with clients_in_use(fake_clients(settings, store=store)):
        window = open_window.fn(settings, "legal")
    assert window.business_line == "legal"
    assert WatermarkStore(store.engine).watermarks()["legal"]["pending_until"] is not None
    assert not (settings.home / "flywheel.db").exists()
    store.close()


class _Registry:
    """MLflow's aliases for the lifecycle check (the registry's own tests use MLflow)."""

    def __init__(self, aliases: dict[str, dict[str, int]]) -> None:
        self._aliases = aliases

    def aliases(self, line: str) -> dict[str, int]:
        return self._aliases.get(line, {})


def _vllm(adapters: list[str]) -> httpx.MockTransport:
    """A vLLM replica's model list, served in-process (no server)."""

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        models = [{"id": "base", "object": "model"}]
        models += [{"id": name, "object": "model", "parent": "base"} for name in adapters]
        return httpx.Response(200, json={"object": "list", "data": models})

    return httpx.MockTransport(handle)


def test_the_lifecycle_check_on_fake_mlflow_and_vllm(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    set_champion(RouteStore(store.engine), "legal", "legal-v1", actor="test")
    registry = _Registry({"legal": {"champion": 1}})
    agreed = fake_clients(
        settings, store=store, registry=registry, vllm_transport=_vllm(["legal-v1"])
    )
    report = lifecycle_check(settings, agreed, ["http://replica-1:8000"])
    assert report["ok"], report["problems"]
    assert report["lines"]["legal"]["loaded"] == {"http://replica-1:8000": ["legal-v1"]}
    missing = fake_clients(settings, store=store, registry=registry, vllm_transport=_vllm([]))
    drifted = lifecycle_check(settings, missing, ["http://replica-1:8000"])
    assert not drifted["ok"]
    assert any("legal-v1" in problem for problem in drifted["problems"]), drifted["problems"]
    store.close()
