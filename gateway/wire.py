"""The gateway's wire formats: its headers, its errors (OpenAI's error shape), the
feedback request, the messages as the store keeps them, and the completion requests
it accepts, as models: OpenAI's fields with OpenAI's bounds plus the gateway's own caps,
checked before anything reaches vLLM. The OpenAPI document is generated from the models.

What passes: every field of OpenAI's chat and text completion APIs, and vLLM's extra
sampling parameters (``min_tokens``, ``top_k``, ``repetition_penalty``, ...), which
change how an answer is sampled and nothing else. What is refused (400, the field
named) unless the caller's key has ``allow_server_fields: true``: vLLM's fields that
change how the prompt is built or how the server treats the request — a caller's own
chat template, tokenizer switches, scheduling priority, its own request id, KV-transfer
or cache controls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import orjson
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from feedback.events import (
    IDENTIFIER,
    FeedbackType,
    TaskOutcome,
)

# vLLM request fields beyond OpenAI's that reach past sampling; the key must allow them.
SERVER_FIELDS = frozenset(
    {
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "documents",
        "mm_processor_kwargs",
        "priority",
        "request_id",
        "cache_salt",
        "kv_transfer_params",
        "vllm_xargs",
        "return_tokens_as_token_ids",
        "truncate_prompt_tokens",
        "prompt_embeds",
    }
)
ROLES = ("system", "developer", "user", "assistant", "tool")


class TextPart(BaseModel):
    """A text content part (the only kind this gateway serves)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a chat request."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None


class StreamOptions(BaseModel):
    """``stream_options``: usage in the stream."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = Field(default=None, strict=True)
    continuous_usage_stats: bool | None = Field(default=None, strict=True)


class _Sampling(BaseModel):
    """What both APIs share: OpenAI's fields and vLLM's sampling extras, each typed and with
    OpenAI's (or vLLM's) bounds. Numbers and switches are strict (JSON's own types: a number
    in a string, or true for 1, is refused), since the body goes to vLLM as the caller wrote
    it."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="Your business line.")
    stream: bool | None = Field(default=None, strict=True)
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2, strict=True)
    top_p: float | None = Field(default=None, ge=0, le=1, strict=True)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, strict=True)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, strict=True)
    repetition_penalty: float | None = Field(default=None, gt=0, strict=True)
    length_penalty: float | None = Field(default=None, strict=True)
    top_k: int | None = Field(default=None, ge=-1, strict=True)
    min_p: float | None = Field(default=None, ge=0, le=1, strict=True)
    seed: int | None = Field(default=None, strict=True)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, strict=True)
    logit_bias: dict[str, float] | None = Field(default=None, strict=True)
    user: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    min_tokens: int | None = Field(default=None, ge=0, strict=True)
    n: int | None = Field(default=None, ge=1, strict=True)
    best_of: int | None = Field(default=None, ge=1, strict=True)
    prompt_logprobs: int | None = Field(default=None, ge=0, strict=True)
    ignore_eos: bool | None = Field(default=None, strict=True)
    skip_special_tokens: bool | None = Field(default=None, strict=True)
    spaces_between_special_tokens: bool | None = Field(default=None, strict=True)
    include_stop_str_in_output: bool | None = Field(default=None, strict=True)


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = Field(default=None, strict=True)
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, strict=True)
    echo: bool | None = Field(default=None, strict=True)


# OpenAI's (and vLLM's) max_tokens of a text completion that names none.
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class OutputCap:
    """The most output tokens one answer may have, and whose cap that is (the gateway's,
    the key's or the line's: the smallest)."""

    tokens: int
    owner: str


def output_limit(
    request: _Sampling,
    cap: OutputCap,
    *,
    completion_api: bool,
    max_tokens_sent: bool,
    context_tokens: int | None,
) -> int | None:
    """The ``max_tokens`` the gateway sets on a request that sets no output limit (None:
    leave the request as it is). A chat without one gets the cap; a text completion that
    leaves ``max_tokens`` out gets OpenAI's 16 (within the cap), one that sends null the cap.
    Not when the model's context (``context_tokens``, vLLM's ``max_model_len``) is no larger
    than the cap: vLLM already stops there, and refuses a prompt that leaves less room than
    a ``max_tokens`` it is sent."""
    if request.max_tokens is not None or request.max_completion_tokens is not None:
        return None
    if completion_api and not max_tokens_sent:
        return min(COMPLETION_DEFAULT_MAX_TOKENS, cap.tokens)
    if context_tokens is not None and context_tokens <= cap.tokens:
        return None
    return cap.tokens


def request_problems(
    request: _Sampling, *, output_cap: OutputCap, max_choices: int, server_fields: bool
) -> tuple[str, str] | None:
    """The first thing wrong with a parsed request beyond its schema, as (field, reason):
    the caps on output length and choices, and server fields the key may not send; None
    when it may go to vLLM."""
    for name, value in (
        ("max_tokens", request.max_tokens),
        ("max_completion_tokens", request.max_completion_tokens),
    ):
        if value is not None and value > output_cap.tokens:
            return name, f"{name} is {value}, over {output_cap.owner} {output_cap.tokens}"
    for name, value in (("n", request.n), ("best_of", request.best_of)):
        if value is not None and value > max_choices:
            return name, f"{name} is {value}, over this gateway's {max_choices} choices"
    if not server_fields:
        extra = sorted(SERVER_FIELDS & set(request.model_extra or {}))
        if extra:
            return extra[0], (
                f"{extra[0]} changes how vLLM builds or schedules the request; this key "
                "may not send it (allow_server_fields in the key file)"
            )
    return None


REQUEST_ID_HEADER = "x-request-id"


LINE_HEADER = "x-flywheel-business-line"


SESSION_HEADER = "x-session-id"


USER_HEADER = "x-user-id"


JSON_TYPE = "application/json"


class GatewayError(Exception):
    """A refusal with an HTTP status and a message for the caller (OpenAI's error shape)."""

    KINDS: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        405: "invalid_request_error",
        408: "invalid_request_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        429: "rate_limit_error",
        502: "upstream_error",
        503: "service_unavailable",
    }

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        """The JSON error body."""
        error = {
            "message": self.message,
            "type": self.KINDS.get(self.status, "error"),
            "param": self.param,
            "code": self.status,
        }
        return orjson.dumps({"error": error})

    def response(self, headers: dict[str, str] | None = None) -> Response:
        """The error as a response."""
        return Response(self.body(), status_code=self.status, media_type=JSON_TYPE, headers=headers)


class FeedbackRequest(BaseModel):
    """Feedback on one answer, named by the request id the gateway returned."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(
        pattern=IDENTIFIER, description="The answer's id (also its x-request-id header)."
    )
    type: FeedbackType
    edited_text: str | None = Field(
        default=None, min_length=1, description="For 'edit': the answer as the user corrected it."
    )
    outcome: TaskOutcome | None = Field(default=None, description="For 'task_outcome'.")
    replaced_by: str | None = Field(
        default=None, pattern=IDENTIFIER, description="For 'regenerate': the new request id."
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        # The store keeps 200 characters; the key is kept under its line's and API key's name.
        max_length=120,
        description="Replays with the same key are stored once (one per type by default); "
        "keys are per business line and API key.",
    )


class FeedbackAccepted(BaseModel):
    """The answer to an accepted feedback event."""

    status: str = "accepted"
    request_id: str
    type: FeedbackType
    idempotency_key: str


def text_of(content: object, where: str) -> str:
    """The text of a message's content (a string, or OpenAI's list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise GatewayError(
                    400, f"{where}: only text content parts are supported", param=where
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise GatewayError(400, f"{where}: a text part needs a string 'text'", param=where)
            texts.append(text)
        return "".join(texts)
    raise GatewayError(400, f"{where} must be a string or a list of text parts", param=where)


def chat_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """The request's messages as the store keeps them (role and text), or a 400."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "'messages' must be a non-empty list", param="messages")
    logged = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise GatewayError(400, f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise GatewayError(
                400, f"{where}.role must be one of {', '.join(sorted(ROLES))}", param=where
            )
        # OpenAI's developer role is its system role under a new name; the store and
        # the model's chat template know it as system.
        logged.append(
            {
                "role": "system" if role == "developer" else role,
                "content": text_of(message.get("content"), where),
            }
        )
    return logged


def completion_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """A completion prompt as one user message, or a 400."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise GatewayError(400, "'prompt' must be one non-empty string", param="prompt")
    return [{"role": "user", "content": prompt}]


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
            },
        }
    },
}


def documented(
    schema: dict[str, Any], statuses: tuple[int, ...], *, duplicate: bool = False
) -> dict[str, Any]:
    """The OpenAPI extras of a route: its request body schema and its error answers."""
    error = {"content": {JSON_TYPE: {"schema": ERROR_SCHEMA}}}
    responses: dict[str, Any] = {
        str(status): {"description": GatewayError.KINDS.get(status, "error"), **error}
        for status in statuses
    }
    if duplicate:
        responses["200"] = {
            "description": "The same signal on this answer was given already: counted once.",
            "content": {
                JSON_TYPE: {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "status": {"type": "string", "enum": ["duplicate"]},
                            "request_id": {"type": "string"},
                            "type": {"type": "string"},
                            "idempotency_key": {"type": "string"},
                        },
                    }
                }
            },
        }
    return {
        "requestBody": {"required": True, "content": {JSON_TYPE: {"schema": schema}}},
        "responses": responses,
    }
