"""A schema-driven fuzz run (schemathesis) over the gateway's OpenAPI: no input gets a 5xx.

The gateway runs on a real port in front of the stand-in vLLM, so every request
that passes validation is really proxied, logged and answered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, running_stub

KEY = "fw-fuzz-key"


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("fuzz-home")
    app_settings: Settings = load_settings(home=home, database_url=f"sqlite:///{home}/fw.db")
    store = FeedbackStore.open(app_settings)
    RouteStore(store.engine).set_champion("legal", "legal-v1", actor="fuzz")
    keys = KeyRing([ApiKey(name="fuzz", sha256=key_digest(KEY), business_lines=("legal",))])
    with running_stub(StubBehaviour(adapters={"legal-v1"}, words=2)) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.05)
        app = create_app(
            app_settings, config, store=store, routes=RouteStore(store.engine), keys=keys
        )
        with serving(app, free_port()) as url:
            yield url
    store.close()


def test_no_input_gets_a_server_error(gateway_url: str) -> None:
    # schemathesis' pytest plugin does not load under this pytest; its strategies do.
    schema = schemathesis.openapi.from_url(f"{gateway_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/feedback",
        "/v1/models",
    }
    checked: list[int] = []

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        def fuzz(case: Any) -> None:
            for headers in ({"Authorization": f"Bearer {KEY}"}, {}):
                response = case.call(headers=headers)
                checked.append(response.status_code)
                assert response.status_code < 500, (case.path, case.body, response.text[:300])
                if response.status_code >= 400:
                    assert "error" in response.json(), response.text[:300]

        fuzz()
    assert len(checked) >= 200
    assert 200 in checked
