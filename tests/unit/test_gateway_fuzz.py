"""A schema-driven fuzz run (schemathesis) over the gateway's OpenAPI, and a run of bodies
beyond the schema (any extra field, values of every JSON type, nesting deeper than anything
can forward, bodies near and over the size limit): no input gets a 5xx, and afterwards the
key's limits are whole (nothing admitted was kept).

The gateway runs on a real port in front of the stand-in vLLM, so every request
that passes validation is really proxied, logged and answered.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedback.store import FeedbackStore
from flywheel.settings import Settings, load_settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from gateway.limits import Limits
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.routing import set_champion
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, StubVllm, running_stub

KEY = "fw-fuzz-key"
# Two completions in flight at once: a single slot kept by a failed request shows.
STREAMS = 2


@dataclass
class Fuzzed:
    url: str
    app: Any
    stub: StubVllm


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    home = tmp_path_factory.mktemp("fuzz-home")
    app_settings: Settings = load_settings(home=home, database_url=f"sqlite:///{home}/fw.db")
    store = FeedbackStore.open(app_settings)
    set_champion(RouteStore(store.engine), "legal", "legal-v1", actor="fuzz")
    limits = Limits(concurrent_streams=STREAMS, requests_per_min=1_000_000)
    keys = KeyRing(
        [ApiKey(name="fuzz", sha256=key_digest(KEY), business_lines=("legal",), limits=limits)]
    )
    with running_stub(StubBehaviour(adapters={"legal-v1"}, words=2)) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.05)
        app = create_app(
            app_settings, config, store=store, routes=RouteStore(store.engine), keys=keys
        )
        with serving(app, free_port()) as url:
            yield Fuzzed(url, app, stub)
    store.close()


def _assert_limits_whole(fuzzed: Fuzzed) -> None:
    """Nothing is counted in flight, and the key's every slot is free: as many slow
    completions as it may have at once are all answered."""
    state = fuzzed.app.state.gateway
    time.sleep(0.1)  # slots are given back off the request path
    gauge = sum(
        sample.value
        for metric in state.metrics.registry.collect()
        if metric.name == "flywheel_gateway_in_flight"
        for sample in metric.samples
    )
    assert (state.requests_in_flight, gauge) == (0, 0)
    fuzzed.stub.behaviour.delay_s = 0.3
    statuses: list[int] = []
    body = {"model": "legal", "messages": [{"role": "user", "content": "whole?"}]}
    headers = {"Authorization": f"Bearer {KEY}"}

    def ask() -> None:
        answer = httpx.post(
            f"{fuzzed.url}/v1/chat/completions", json=body, headers=headers, timeout=10
        )
        statuses.append(answer.status_code)

    workers = [threading.Thread(target=ask) for _ in range(STREAMS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    fuzzed.stub.behaviour.delay_s = 0.0
    assert statuses == [200] * STREAMS


def test_no_input_gets_a_server_error(fuzzed: Fuzzed) -> None:
    # schemathesis' pytest plugin does not load under this pytest; its strategies do.
    schema = schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")
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
    _assert_limits_whole(fuzzed)


# Fields the gateway reads or vLLM samples with, and a few it passes on untouched.
_FIELDS = (
    "n", "best_of", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "stream", "stream_options", "ignore_eos", "logprobs", "top_logprobs",
    "logit_bias", "stop", "stop_token_ids", "user", "min_tokens", "repetition_penalty",
    "presence_penalty", "response_format", "tools", "metadata", "prompt_logprobs", "echo",
)  # fmt: skip
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
).map(lambda value: json.dumps(value).encode())
# What no JSON library of the path should see: nesting past every limit, numbers past a
# double, strings near and over the body limit (1 MiB).
_EXTREMES = st.one_of(
    st.sampled_from([63, 64, 65, 254, 255, 1_000, 1_024, 1_025, 20_000]).map(
        lambda depth: b"[" * depth + b"]" * depth
    ),
    st.sampled_from([64, 300]).map(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth),
    st.sampled_from([b"1" * 400, b"1e400", b"-1e400", b"1e-400", b"-0", b"18446744073709551616"]),
    st.sampled_from([900_000, 1_100_000]).map(lambda size: b'"' + b"x" * size + b'"'),
)


@st.composite
def _bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    completion = draw(st.booleans())
    start = b'{"model": "legal", ' + (
        b'"prompt": "hi"' if completion else b'"messages": [{"role": "user", "content": "hi"}]'
    )
    if draw(st.booleans()):
        start += b', "stream": true'
    names = st.sampled_from(_FIELDS) | st.text(min_size=1, max_size=10)
    fields = draw(st.lists(st.tuples(names, _VALUES | _EXTREMES), min_size=1, max_size=3))
    extra = b"".join(b", " + json.dumps(name).encode() + b": " + value for name, value in fields)
    path = "/v1/completions" if completion else "/v1/chat/completions"
    return path, start + extra + b"}"


def test_extra_fields_deep_or_huge_bodies_get_no_server_error_and_hold_nothing(
    fuzzed: Fuzzed,
) -> None:
    checked: list[int] = []
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    with httpx.Client(base_url=fuzzed.url, headers=headers, timeout=30) as client:

        @given(case=_bodies())
        @settings(
            max_examples=120,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        def fuzz(case: tuple[str, bytes]) -> None:
            path, body = case
            response = client.post(path, content=body)
            checked.append(response.status_code)
            # 429 would mean a slot kept by an earlier request: they come one at a time.
            assert response.status_code < 500, (path, body[:300], response.text[:300])
            assert response.status_code != 429, (path, body[:300], response.text[:300])
            if response.status_code >= 400:
                assert "error" in response.json(), response.text[:300]

        fuzz()
    assert {200, 400, 413} <= set(checked)
    _assert_limits_whole(fuzzed)
