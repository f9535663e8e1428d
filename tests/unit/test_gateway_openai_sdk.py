"""The gateway as the OpenAI Python SDK calls it, on the stand-in vLLM.

An answer's ``id`` (``response.id``, each stream chunk's ``id``) is the gateway's request id,
the one its ``x-request-id`` header carries and feedback names: a caller of the SDK gives
feedback without reaching for the headers. Checked for chat and text completions, streamed
and not, with the gateway timing answers (plain answers rebuilt from a stream) and without
(vLLM's answer relayed as it came). ``/docs`` answers with a page that works offline.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from feedback.schema import feedback_table, interactions_table
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from registry.routes import RouteStore
from registry.vllm_server import free_port
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, running_stub

KEY = "fw-sdk-test-key"
LINE = "customer_service"
QUESTION = [{"role": "user", "content": "Where is my parcel?"}]


@dataclass
class Gateway:
    """The gateway on a real port in front of the stand-in vLLM, with its store."""

    url: str
    store: FeedbackStore
    app: Any

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0)

    def rows(self, table: Any) -> list[Any]:
        assert self.app.state.gateway.recorder.flush(10)
        with self.store.engine.connect() as connection:
            return list(connection.execute(select(table)).all())


def _gateway(
    settings: Settings, *, time_answers: bool, behaviour: StubBehaviour | None = None
) -> Iterator[Gateway]:
    store = FeedbackStore.open(settings)
    keys = KeyRing([ApiKey(name="sdk", sha256=key_digest(KEY), business_lines=(LINE,))])
    with running_stub(behaviour or StubBehaviour()) as stub:
        config = GatewaySettings(
            upstreams=(stub.base_url,), log_flush_s=0.02, time_answers=time_answers
        )
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with serving(app, free_port()) as url:
            yield Gateway(url, store, app)
    store.close()


@pytest.fixture(params=[True, False], ids=["timed", "as-sent"])
def gateway(settings: Settings, request: pytest.FixtureRequest) -> Iterator[Gateway]:
    yield from _gateway(settings, time_answers=request.param)


def _ask(client: openai.OpenAI, *, completion_api: bool, stream: bool) -> tuple[str, set[str]]:
    """Ask once through the SDK; (the x-request-id header, the ids the SDK saw)."""
    api = client.completions if completion_api else client.chat.completions
    request: dict[str, Any] = (
        {"prompt": "Where is my parcel?"} if completion_api else {"messages": QUESTION}
    )
    raw = api.with_raw_response.create(model=LINE, stream=stream, **request)
    parsed = raw.parse()
    ids = {chunk.id for chunk in parsed} if stream else {parsed.id}
    return raw.headers["x-request-id"], ids


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("completion_api", [False, True], ids=["chat", "completions"])
def test_the_answers_id_is_the_request_id_that_feedback_names(
    gateway: Gateway, completion_api: bool, stream: bool
) -> None:
    client = gateway.client()
    header, ids = _ask(client, completion_api=completion_api, stream=stream)
    assert ids == {header}, "every id the SDK shows is the gateway's x-request-id"
    other, _ = _ask(client, completion_api=completion_api, stream=stream)
    assert other != header

    answer_id = ids.pop()
    accepted = client.post(
        "/feedback", body={"request_id": answer_id, "type": "thumbs_up"}, cast_to=httpx.Response
    )
    assert accepted.status_code == 202, accepted.text
    by_id = {row.request_id: row for row in gateway.rows(interactions_table)}
    assert set(by_id) == {header, other}
    [stored] = gateway.rows(feedback_table)
    assert (stored.request_id, stored.type) == (answer_id, "thumbs_up")
    assert by_id[stored.request_id].response, "the feedback names the answer that was given"


def test_the_sdks_own_calls_without_raw_responses_give_feedback(gateway: Gateway) -> None:
    """What a developer writes: ``response.id`` and ``chunk.id``, no headers."""
    client = gateway.client()
    answer = client.chat.completions.create(model=LINE, messages=QUESTION)
    chunks = list(client.chat.completions.create(model=LINE, messages=QUESTION, stream=True))
    streamed = chunks[0].id
    assert answer.choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    for answer_id, signal in ((answer.id, "thumbs_down"), (streamed, "thumbs_up")):
        client.post("/feedback", body={"request_id": answer_id, "type": signal}, cast_to=object)
    interactions = {row.request_id for row in gateway.rows(interactions_table)}
    stored = {(row.request_id, row.type) for row in gateway.rows(feedback_table)}
    assert interactions == {answer.id, streamed}
    assert stored == {(answer.id, "thumbs_down"), (streamed, "thumbs_up")}


def test_an_answer_sent_as_is_and_a_refusal_from_vllm_keep_their_shape(
    settings: Settings,
) -> None:
    """A request the gateway cannot rebuild from a stream (``n``) goes to vLLM as sent; its
    answer's id is set all the same. An error vLLM answers is relayed as vLLM wrote it."""
    behaviour = StubBehaviour()
    for gateway in _gateway(settings, time_answers=True, behaviour=behaviour):
        client = gateway.client()
        raw = client.chat.completions.with_raw_response.create(
            model=LINE,
            messages=QUESTION,
            n=1,
            logprobs=True,
        )
        assert raw.parse().id == raw.headers["x-request-id"]
        behaviour.status = 400
        refused = httpx.post(
            gateway.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": LINE, "messages": QUESTION},
            timeout=10,
        )
        assert refused.status_code == 400
        assert refused.json() == {
            "error": {"message": "stub failure", "type": "InternalServerError"}
        }


def test_docs_answer_with_a_page_that_needs_nothing_from_the_internet(settings: Settings) -> None:
    for gateway in _gateway(settings, time_answers=True):
        page = httpx.get(gateway.url + "/docs", timeout=10)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        html = page.text
        assert 'href="/openapi.json"' in html
        for route in ("/v1/chat/completions", "/v1/completions", "/v1/feedback", "/v1/models"):
            assert route in html
        assert "http://" not in html
        assert "https://" not in html
        assert "<script" not in html
