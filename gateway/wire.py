"""The completion requests the gateway accepts, as models: OpenAI's fields with OpenAI's
bounds plus the gateway's own caps, checked before anything reaches vLLM. The OpenAPI
document is generated from these models.

What passes: every field of OpenAI's chat and text completion APIs, and vLLM's extra
sampling parameters (``min_tokens``, ``top_k``, ``repetition_penalty``, ...), which
change how an answer is sampled and nothing else. What is refused (400, the field
named) unless the caller's key has ``allow_server_fields: true``: vLLM's fields that
change how the prompt is built or how the server treats the request — a caller's own
chat template, tokenizer switches, scheduling priority, its own request id, KV-transfer
or cache controls.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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


class _Sampling(BaseModel):
    """What both APIs share, with OpenAI's bounds."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="Your business line.")
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] = Field(min_length=1)
    best_of: int | None = Field(default=None, ge=1)


def request_problems(
    request: _Sampling, *, max_output_tokens: int, max_choices: int, server_fields: bool
) -> tuple[str, str] | None:
    """The first thing wrong with a parsed request beyond its schema, as (field, reason):
    the gateway's caps on output length and choices, and server fields the key may not
    send; None when it may go to vLLM."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(request, name, None)
        if value is not None and value > max_output_tokens:
            return name, f"{name} is {value}, over this gateway's {max_output_tokens}"
    for name in ("n", "best_of"):
        value = getattr(request, name, None)
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


def request_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema for the OpenAPI document (definitions inlined as $defs)."""
    return model.model_json_schema(ref_template="#/components/schemas/{model}")
