"""Typed settings of the gateway (env prefix ``FLYWHEEL_GATEWAY_``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """How one gateway replica runs; the store and business lines come from ``Settings``."""

    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_GATEWAY_", env_file=".env", frozen=True, extra="ignore"
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65_535)
    upstreams: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("http://127.0.0.1:8000",),
        min_length=1,
        description="Root URLs of the vLLM replicas (their OpenAI API is under /v1).",
    )
    keys_file: Path | None = Field(
        default=None,
        description="YAML file of API keys and their business lines; "
        "<FLYWHEEL_HOME>/gateway-keys.yaml when unset.",
    )
    base_model_name: str | None = Field(
        default=None,
        description="Name vLLM serves the base model under; read from /v1/models when unset.",
    )
    max_body_bytes: int = Field(default=1_048_576, ge=1_024, le=64 * 1_048_576)
    max_body_depth: int = Field(
        default=64,
        ge=2,
        le=250,
        description="Deepest nesting of arrays and objects a request body may have (deeper is "
        "a 400 before anything is counted; JSON's encoder forwards no more than 254).",
    )
    max_output_tokens: int = Field(
        default=4_096,
        ge=1,
        le=1_000_000,
        description="Largest max_tokens / max_completion_tokens a request may ask for, and the "
        "max_tokens set on a chat that asks for no limit (a key's or a line's "
        "max_output_tokens may be lower). Not set when vLLM's context (max_model_len, read "
        "from /v1/models) is no larger: vLLM stops there already.",
    )
    max_choices: int = Field(
        default=4, ge=1, le=128, description="Largest n (or best_of) a request may ask for."
    )
    body_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="A request body that stalls this long between two pieces is refused (408).",
    )
    routes_refresh_s: float = Field(
        default=0.25, gt=0, le=5, description="How often the routing tables are re-read."
    )
    replica_watch_s: float = Field(
        default=5.0,
        ge=0,
        le=600,
        description="How often every replica's loaded adapters are checked against the "
        "routing tables and missing ones loaded back (0: only on a 404).",
    )
    rate_window_s: float = Field(
        default=60.0,
        gt=0,
        le=3_600,
        description="The sliding window the per-minute rate limits are counted over "
        "(a minute; shorter only in tests).",
    )
    redis_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=30,
        description="A Redis slower than this counts as down: rate limits then count per "
        "process instead of holding requests.",
    )
    rate_limit_namespace: str = Field(
        default="flywheel",
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="Prefix of the rate-limit counters in Redis: deployments sharing one "
        "Redis keep apart; every replica of one gateway uses the same.",
    )
    regenerate_window_s: float = Field(
        default=600.0, gt=0, description="A repeat of a prompt within this time is a regenerate."
    )
    session_pin_ttl_s: float = Field(
        default=3_600.0, gt=0, description="How long a conversation stays on its adapter."
    )
    time_answers: bool = Field(
        default=True,
        description="Ask vLLM for token usage on every stream (dropped before a caller that "
        "did not ask for it) and stream plain answers it can rebuild exactly, so TTFT and "
        "TPOT are measured for every request the canary judges.",
    )
    connect_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="How long to wait for a vLLM replica to accept a connection: the gateway's "
        "requests (a replica that does not is skipped) and flywheel's admin calls (exit 7).",
    )
    read_timeout_s: float = Field(default=600.0, gt=0)
    log_batch_size: int = Field(default=500, ge=1, le=50_000)
    log_flush_s: float = Field(default=0.2, gt=0, le=60)
    feedback_lookup_wait_s: float = Field(
        default=2.0,
        ge=0,
        le=30,
        description="Feedback on a request id this replica does not know is looked up in "
        "the store again for this long (another replica may have answered it a moment ago) "
        "before the 404.",
    )
    spool_dir: Path | None = Field(
        default=None,
        description="Where interactions wait while the store is down; "
        "<FLYWHEEL_HOME>/spool/gateway when unset.",
    )
    spool_retry_s: float = Field(default=2.0, gt=0, le=600)
    shadow_max_concurrency: int = Field(
        default=4,
        ge=0,
        le=1_024,
        description="Shadow requests this process keeps in flight at most; a sampled request "
        "beyond it is skipped (counted), never queued (0: no shadow traffic from here).",
    )
    shadow_max_user_requests: int = Field(
        default=8,
        ge=0,
        le=100_000,
        description="A sampled request is mirrored only while fewer user requests than this "
        "are being answered by this process: shadows use spare capacity and yield to users "
        "under load (0: never yield). Raise it for replicas with headroom (GPUs).",
    )
    shadow_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3_600,
        description="A shadow answer not finished by then is stored as an error.",
    )
    orphan_grace_s: float = Field(
        default=600.0,
        ge=0,
        le=86_400,
        description="Feedback whose interaction is not stored yet (another replica's spool "
        "may still hold it) is retried this long before it is quarantined.",
    )

    @field_validator("upstreams", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        # FLYWHEEL_GATEWAY_UPSTREAMS is a comma-separated list (or a JSON array).
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return tuple(json.loads(value))
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("upstreams")
    @classmethod
    def _http(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} is not an http(s) URL")
        return tuple(url.rstrip("/") for url in value)

    def resolved_keys_file(self, home: Path) -> Path:
        """The API key file: the configured one or the one in FLYWHEEL_HOME."""
        return self.keys_file or home / "gateway-keys.yaml"

    def resolved_spool_dir(self, home: Path) -> Path:
        """The spool folder: the configured one or the one in FLYWHEEL_HOME."""
        return self.spool_dir or home / "spool" / "gateway"
