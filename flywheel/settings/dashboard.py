"""Typed settings of the feedback page (env prefix ``FLYWHEEL_DASHBOARD_``)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class DashboardSettings(BaseSettings):
    """How the feedback page runs; the store, keys and MLflow come from the other settings."""

    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_DASHBOARD_", env_file=".env", frozen=True, extra="ignore"
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=1, le=65_535)
    page_size: int = Field(default=50, ge=1, le=500, description="Samples per page.")
    export_limit: int = Field(
        default=1_000,
        ge=1,
        le=100_000,
        description="Most records in one CSV/JSONL export (each is scrubbed on the way out).",
    )
    max_points: int = Field(
        default=120, ge=10, le=2_000, description="Most time buckets on one plot."
    )
    scrub_cache_size: int = Field(
        default=20_000, ge=0, le=10_000_000, description="Scrubbed texts kept in memory."
    )
    rollup_grace_s: float = Field(
        default=120.0,
        ge=0,
        le=86_400,
        description="Rows younger than this are counted live, then folded into the rollup.",
    )
    rollup_interval_s: float = Field(
        default=5.0, ge=0, le=3_600, description="Least time between two rollup folds."
    )
    session_lifetime_s: float = Field(
        default=8 * 3600,
        ge=60,
        le=30 * 86_400,
        description="How long a browser login lasts from the login (logging out ends it sooner).",
    )
    failed_key_checks: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Unknown keys one client (address; IPv6: its /64) may present, at the login "
        "form or as Bearer, per failed_key_window_s; past them it gets 429 with Retry-After.",
    )
    failed_key_window_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="The time a client's allowance of failed key checks takes to refill.",
    )
    mlflow_ui_url: str | None = Field(
        default=None,
        description="MLflow UI the eval page links to; the tracking URI when it is http(s).",
    )

    @field_validator("mlflow_ui_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"mlflow_ui_url {value!r} is not an http(s) URL")
        return value.rstrip("/") if value else value

    def resolved_mlflow_ui(self, tracking_uri: str | None) -> str | None:
        """Where MLflow's UI is: the configured URL, or an http(s) tracking server."""
        if self.mlflow_ui_url:
            return self.mlflow_ui_url
        if tracking_uri and tracking_uri.startswith(("http://", "https://")):
            return tracking_uri.rstrip("/")
        return None
