"""Typed settings for every flywheel component: one tree, loaded from the environment.

:class:`Settings` is the root (``FLYWHEEL_*``). Its sections are typed models:
``store`` (``FLYWHEEL_STORE_*``), ``gateway`` (``FLYWHEEL_GATEWAY_*``),
``dashboard`` (``FLYWHEEL_DASHBOARD_*``), ``scrubber`` (``FLYWHEEL_SCRUBBER_*``) and
``cleaning`` (``FLYWHEEL_CLEANING__*``,
nested fields with ``__``: ``FLYWHEEL_CLEANING__DEDUP__THRESHOLD``). A ``.env`` file
in the working folder is read by every section, the environment winning. Nothing
here runs at import time: call :func:`load_settings` at the edge (the CLI, a flow,
a server factory) and pass the result, or one of its sections, down.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from flywheel.errors import InvalidSettingsError
from flywheel.install import DEFAULT_TORCH_INDEX
from flywheel.lines import LINE_NAME_RULE, is_line_name
from flywheel.settings.cleaning import CleaningSettings
from flywheel.settings.dashboard import DashboardSettings
from flywheel.settings.gateway import GatewaySettings
from flywheel.settings.scrubber import ScrubberSettings

DEFAULT_BUSINESS_LINES = ("customer_service", "medical", "legal")


class StoreSettings(BaseSettings):
    """Limits on what the feedback store accepts."""

    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_STORE_", env_file=".env", frozen=True, extra="ignore"
    )

    batch_size: int = Field(default=2_000, ge=1, le=100_000)
    connect_timeout_s: int = Field(
        default=10,
        ge=2,
        le=300,
        description="How long to wait for a PostgreSQL store to accept a connection (libpq's "
        "connect_timeout, whole seconds, at least 2; a connect_timeout in the URL wins).",
    )
    max_text_chars: int = Field(default=200_000, ge=1_000, le=10_000_000)
    max_messages: int = Field(default=512, ge=1, le=100_000)


class Settings(BaseSettings):
    """Root settings (env prefix ``FLYWHEEL_``; a ``.env`` file in the working folder is read
    too, the environment winning). Secrets (the store URL, Redis) print masked."""

    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_",
        env_file=".env",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
    )

    home: Path = Field(
        default=Path.home() / ".flywheel",
        description="Local data folder: SQLite store, MLflow store, models, datasets, spool.",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy URL of the feedback store (it may hold a password: shown "
        "masked); SQLite inside FLYWHEEL_HOME when unset.",
    )
    business_lines: tuple[str, ...] = Field(default=DEFAULT_BUSINESS_LINES, min_length=1)
    base_model: Path | None = Field(
        default=None,
        description="Local base model folder; SmolLM2-135M-Instruct from its wheel when unset.",
    )
    recipes_dir: Path | None = Field(
        default=None,
        description="Folder of <business_line>.yaml recipes; the packaged ones when unset.",
    )
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking server; a local SQLite store in FLYWHEEL_HOME when unset.",
    )
    mlflow_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How long a command waits for the MLflow server to connect and answer "
        "its first request before it stops with exit 4 (MLflow's own requests after that: "
        "MLFLOW_HTTP_REQUEST_TIMEOUT, 60 s unless set).",
    )
    prefect_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How long a command waits for Prefect's API (PREFECT_API_URL, when set) to "
        "connect and answer before it stops with exit 5.",
    )
    redis_url: SecretStr | None = Field(
        default=None,
        description="Redis for state every gateway replica and worker shares (rate limits); "
        "each process keeps its own when unset (redis://127.0.0.1:6379/0).",
    )
    cleaning_workers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Dask worker processes for the nightly cleaning stage; 1 runs it in-process.",
    )
    dask_address: str | None = Field(
        default=None,
        description="A running Dask scheduler for the cleaning stage (tcp://host:8786); "
        "a local cluster of cleaning_workers processes when unset.",
    )
    torch_index: str | None = Field(
        default=DEFAULT_TORCH_INDEX,
        description="Wheel index for torch in the virtualenvs flywheel builds (vLLM's): "
        "PyTorch's CPU index by default; empty for the usual index alone (PyPI's CUDA "
        "build on x86_64 Linux). A local wheel that satisfies the pin is used first.",
    )
    vllm_max_lora_rank: int = Field(
        default=16,
        ge=1,
        le=512,
        description="The serving vLLM's --max-lora-rank (same variable as `flywheel serve "
        "vllm`): a recipe with a higher LoRA rank is refused before training.",
    )
    vllm_max_loras: int = Field(
        default=4,
        ge=1,
        le=64,
        description="The serving vLLM's --max-loras: every line's champion, canary and "
        "previous together must fit, or a new canary is refused with the reason.",
    )
    training_deployment: str | None = Field(
        default=None,
        description="Prefect deployment that trains a line on a work pool "
        "(flywheel-train-line/train-line); the nightly and `flywheel train` train in their "
        "own process when unset.",
    )
    training_timeout_s: float = Field(
        default=6 * 3600,
        gt=0,
        le=7 * 24 * 3600,
        description="How long the nightly waits for a line's training run on the work pool.",
    )
    store: StoreSettings = Field(default_factory=StoreSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    cleaning: CleaningSettings = Field(default_factory=CleaningSettings)
    scrubber: ScrubberSettings = Field(default_factory=ScrubberSettings)

    @field_validator("business_lines")
    @classmethod
    def _line_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        wrong = [line for line in value if not is_line_name(line)]
        if wrong:
            names = ", ".join(repr(line) for line in wrong)
            raise ValueError(f"{names}: a business line's name is {LINE_NAME_RULE} characters")
        if len(set(value)) < len(value):
            raise ValueError("a business line is named twice")
        return value

    @field_validator("torch_index", "training_deployment")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("home")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("database_url")
    @classmethod
    def _store_url(cls, value: SecretStr | None) -> SecretStr | None:
        """A URL SQLAlchemy can open, checked now rather than at the store's first use (the
        message never quotes the URL: it may hold a password)."""
        if value is None or not value.get_secret_value():
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            url = make_url(value.get_secret_value())
        except ArgumentError:
            raise ValueError(
                "not a SQLAlchemy URL (dialect+driver://user:password@host:port/database)"
            ) from None
        try:
            url.get_dialect()
        except NoSuchModuleError:
            raise ValueError(
                f"no database driver for {url.drivername!r}: use postgresql+psycopg:// or sqlite:///"
            ) from None
        return value

    @property
    def models_dir(self) -> Path:
        """Where converted base models are kept."""
        return self.home / "models"

    @property
    def runs_dir(self) -> Path:
        """Where training runs keep checkpoints and adapters before MLflow takes them."""
        return self.home / "runs"

    @property
    def datasets_dir(self) -> Path:
        """Where training datasets and their manifests are written."""
        return self.home / "datasets"

    @property
    def resolved_database_url(self) -> str:
        """The store URL: the configured one, or SQLite under ``home``."""
        if self.database_url is not None and self.database_url.get_secret_value():
            return self.database_url.get_secret_value()
        return f"sqlite:///{self.home / 'flywheel.db'}"


def _variable(section: str, location: tuple[int | str, ...]) -> str:
    """The environment variable behind an error at ``location`` of the settings class
    named ``section`` (a section builds itself from its own prefix)."""
    classes = (Settings, StoreSettings, GatewaySettings, DashboardSettings, ScrubberSettings)
    prefix = next(
        (str(c.model_config.get("env_prefix", "")) for c in classes if c.__name__ == section),
        "FLYWHEEL_",
    )
    path = [str(part) for part in location if isinstance(part, str)]
    return (prefix + "__".join(path)).upper()


def settings_error(exc: ValidationError) -> InvalidSettingsError:
    """``exc`` (from a settings class) as a message a user can act on: one line per wrong
    variable, its name as the environment spells it."""
    lines = []
    for error in exc.errors(include_url=False):
        reason = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"{_variable(exc.title, tuple(error['loc']))}: {reason}")
    return InvalidSettingsError("invalid settings: " + "; ".join(lines))


def _unparsed_error(exc: PydanticSettingsError) -> InvalidSettingsError:
    """A value pydantic-settings could not parse (a list or mapping is JSON in the
    environment) as a message naming its variable."""
    found = re.search(r'field "([^"]+)"', str(exc))
    if found is None:
        return InvalidSettingsError(f"invalid settings: {exc}")
    field = found.group(1)
    classes = (Settings, StoreSettings, GatewaySettings, DashboardSettings, ScrubberSettings)
    owner = next((c for c in classes if field in c.model_fields), Settings)
    variable = _variable(owner.__name__, (field,))
    return InvalidSettingsError(
        f"invalid settings: {variable}: not valid JSON (a list is written "
        '["a", "b"], a mapping {"key": "value"})'
    )


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment (``FLYWHEEL_*``), with explicit overrides on top;
    a value that does not validate is an :class:`~flywheel.errors.InvalidSettingsError`
    naming its variable (the CLI exits 2 with it)."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise settings_error(exc) from None
    except PydanticSettingsError as exc:
        raise _unparsed_error(exc) from None


_IN_USE: ContextVar[Settings | None] = ContextVar("flywheel_settings", default=None)


@contextmanager
def settings_in_use(settings: Settings) -> Iterator[Settings]:
    """Run the block with ``settings`` as :func:`current_settings` (in this context: flows
    called from it see them; a flow's parameters never carry them)."""
    token = _IN_USE.set(settings)
    try:
        yield settings
    finally:
        _IN_USE.reset(token)


def current_settings() -> Settings:
    """The settings a caller set with :func:`settings_in_use`, else from the environment."""
    return _IN_USE.get() or load_settings()
