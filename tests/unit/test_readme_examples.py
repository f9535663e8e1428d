"""The README's and docs/api.md's request and feedback examples, run against the gateway on
the stand-in vLLM.

The ``curl`` commands are read from the README's fenced ``bash`` blocks and sent as the exact
HTTP requests they describe (method, URL path, headers, body), with the gateway's address and
the API key of the test put in; the feedback example's request id is replaced by the id the
chat answer returned. The OpenAI SDK example runs as written when the ``openai`` package is
installed. An example that drifts from the API (a route, a header, a field) fails here.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
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

README = Path(__file__).resolve().parents[2] / "README.md"
API_DOC = README.parent / "docs" / "api.md"
# Each document's examples and the feedback they send: the README a thumbs-down, the API's
# page a user's edit (curl) and a regenerate of a streamed answer (the SDK).
DOCUMENTS = [pytest.param(README, id="README"), pytest.param(API_DOC, id="api")]
# The address the README's examples use: the gateway's default (`flywheel serve gateway`).
README_GATEWAY = f"http://127.0.0.1:{GatewaySettings().port}"
KEY_VARIABLE = "FLYWHEEL_API_KEY"
TEST_KEY = "fw-readme-example-key"
LINES = ("customer_service", "medical", "legal")


def _fenced(text: str, language: str) -> list[str]:
    """The README's fenced code blocks of one language, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def _commands(block: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = block.replace("\\\n", " ")
    return [line for line in joined.splitlines() if shlex.split(line, comments=True)]


@dataclass
class Curl:
    """One README ``curl`` command as the HTTP request it sends."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    data: str | None = None

    @property
    def method(self) -> str:
        return "POST" if self.data is not None else "GET"


FLAGS = {"-i", "-s", "-S", "-si", "-sS", "-is", "--include", "--silent", "--show-error"}


def _parse_curl(command: str) -> Curl:
    """The request a ``curl`` command line sends. An option this parser does not know fails
    the test rather than being guessed at; ``$FLYWHEEL_API_KEY`` is the only variable."""
    raw_words = shlex.split(command, comments=True)
    assert raw_words, command
    assert raw_words[0] == "curl", command
    words = [_expand(word, command) for word in raw_words[1:]]
    url: str | None = None
    headers: dict[str, str] = {}
    data: str | None = None
    index = 0
    while index < len(words):
        word = words[index]
        if word in FLAGS:
            index += 1
            continue
        if word in {"-H", "--header"}:
            name, _, value = words[index + 1].partition(":")
            headers[name.strip()] = value.strip()
            index += 2
            continue
        if word in {"-d", "--data", "--data-raw"}:
            data = words[index + 1]
            index += 2
            continue
        assert not word.startswith("-"), f"unknown curl option {word!r} in the README: {command}"
        assert url is None, f"two URLs in one README curl command: {command}"
        url = word
        index += 1
    assert url is not None, f"no URL in the README's curl command: {command}"
    return Curl(url, headers, data)


def _expand(word: str, command: str) -> str:
    word = word.replace(f"${{{KEY_VARIABLE}}}", TEST_KEY).replace(f"${KEY_VARIABLE}", TEST_KEY)
    assert "$" not in word, f"an unknown shell variable in the README's curl command: {command}"
    return word


def _curls(document: Path) -> tuple[Curl, Curl]:
    """A document's chat request and feedback call (the curl commands naming those routes)."""
    text = document.read_text(encoding="utf-8")
    curls = [
        _parse_curl(command)
        for block in _fenced(text, "bash")
        for command in _commands(block)
        if command.lstrip().startswith("curl ")
    ]
    chats = [c for c in curls if c.url.endswith("/v1/chat/completions")]
    feedbacks = [c for c in curls if c.url.endswith("/v1/feedback")]
    assert len(chats) == 1, (
        f"{document.name} should show one chat request by curl, not {len(chats)}"
    )
    assert len(feedbacks) == 1, (
        f"{document.name} should show one feedback call by curl, not {len(feedbacks)}"
    )
    return chats[0], feedbacks[0]


@dataclass
class Gateway:
    """The gateway on a real port in front of the stand-in vLLM, with its store."""

    url: str
    store: FeedbackStore
    app: Any

    def rows(self, table: Any) -> list[Any]:
        assert self.app.state.gateway.recorder.flush(10)
        with self.store.engine.connect() as connection:
            return list(connection.execute(select(table)).all())


@pytest.fixture
def gateway(settings: Settings) -> Iterator[Gateway]:
    store = FeedbackStore.open(settings)
    keys = KeyRing([ApiKey(name="my-app", sha256=key_digest(TEST_KEY), business_lines=LINES)])
    with running_stub(StubBehaviour()) as stub:
        config = GatewaySettings(upstreams=(stub.base_url,), log_flush_s=0.02)
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with serving(app, free_port()) as url:
            yield Gateway(url, store, app)
    store.close()


def _send(gateway: Gateway, curl: Curl) -> httpx.Response:
    assert curl.url.startswith(README_GATEWAY + "/"), (
        f"the README's example should call the gateway at its default {README_GATEWAY}: {curl.url}"
    )
    url = gateway.url + curl.url.removeprefix(README_GATEWAY)
    content = curl.data.encode() if curl.data is not None else None
    return httpx.request(curl.method, url, headers=curl.headers, content=content, timeout=10)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_curl_request_and_feedback_are_served_and_stored(
    gateway: Gateway, document: Path
) -> None:
    chat, feedback = _curls(document)
    assert chat.headers.get("Authorization") == f"Bearer {TEST_KEY}"
    answer = _send(gateway, chat)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    request_id = answer.headers["x-request-id"]
    assert answer.json()["id"] == request_id  # the README: the answer's id, also the header
    [interaction] = gateway.rows(interactions_table)
    assert interaction.request_id == request_id
    assert interaction.business_line == json.loads(chat.data or "{}")["model"]

    # The README shows a request id of the gateway's shape; the test sends the real one.
    body = json.loads(feedback.data or "{}")
    assert re.fullmatch(r"req-[0-9a-f]{32}", body["request_id"]), body
    body["request_id"] = request_id
    sent = Curl(feedback.url, feedback.headers, json.dumps(body))
    accepted = _send(gateway, sent)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["status"] == "accepted"
    [stored] = gateway.rows(feedback_table)
    assert (stored.request_id, stored.type) == (request_id, body["type"])
    assert stored.edited_text == body.get("edited_text")

    # Sent again, the same signal counts once: 200 "duplicate", as the README says.
    again = _send(gateway, sent)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "duplicate"
    assert len(gateway.rows(feedback_table)) == 1


def _run_sdk_example(
    document: Path, gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Run a document's OpenAI SDK example as written, against the test's gateway."""
    pytest.importorskip("openai", reason="the openai package is not installed in this virtualenv")
    blocks = _fenced(document.read_text(encoding="utf-8"), "python")
    [example] = [b for b in blocks if "openai" in b]
    assert README_GATEWAY in example
    monkeypatch.setenv(KEY_VARIABLE, TEST_KEY)
    namespace: dict[str, Any] = {}
    exec(compile(example.replace(README_GATEWAY, gateway.url), document.name, "exec"), namespace)
    return namespace


def test_the_readmes_openai_sdk_example_sends_a_request_and_its_feedback(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    request_id = _run_sdk_example(README, gateway, monkeypatch)["request_id"]
    assert capsys.readouterr().out.strip()  # the answer was printed
    [interaction] = gateway.rows(interactions_table)
    assert interaction.request_id == request_id
    [stored] = gateway.rows(feedback_table)
    assert (stored.request_id, stored.type) == (request_id, "thumbs_down")


def test_the_api_pages_streamed_sdk_example_names_both_answers_in_its_regenerate(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = _run_sdk_example(API_DOC, gateway, monkeypatch)
    first, second = namespace["first_id"], namespace["second_id"]
    assert first != second
    assert capsys.readouterr().out.strip()  # the streamed answer was printed whole
    assert {row.request_id for row in gateway.rows(interactions_table)} == {first, second}
    [stored] = gateway.rows(feedback_table)
    assert (stored.request_id, stored.type, stored.replaced_by) == (first, "regenerate", second)


def test_the_curl_parser_reads_what_a_shell_would_send() -> None:
    """The parser the tests above rely on: quotes, continuation lines, the key variable."""
    block = (
        "curl -i http://127.0.0.1:8080/v1/feedback \\\n"
        f'  -H "Authorization: Bearer ${KEY_VARIABLE}" \\\n'
        '  -d \'{"type": "thumbs_up"}\'  # a comment\n'
    )
    [command] = _commands(block)
    curl = _parse_curl(command)
    assert curl.url == "http://127.0.0.1:8080/v1/feedback"
    assert curl.headers == {"Authorization": f"Bearer {TEST_KEY}"}
    assert (curl.method, curl.data) == ("POST", '{"type": "thumbs_up"}')
    with pytest.raises(AssertionError, match="unknown curl option"):
        _parse_curl("curl -X PUT http://127.0.0.1:8080/v1/feedback")
    with pytest.raises(AssertionError, match="unknown shell variable"):
        _parse_curl('curl -H "Authorization: Bearer $OTHER" http://127.0.0.1:8080/v1/models')
