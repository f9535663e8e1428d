"""The settings tree: environment, a ``.env`` file, bounds, and secrets that never print."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flywheel.errors import InvalidSettingsError
from flywheel.settings import Settings, load_settings

PASSWORD = "s3cr3t-pw-4417"
URL = f"postgresql+psycopg://flywheel:{PASSWORD}@db.internal:5432/flywheel"


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No FLYWHEEL_* variable from the caller, and a working folder without a .env."""
    import os

    for name in list(os.environ):
        if name.startswith("FLYWHEEL_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_the_environment_sets_values(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    clean_env.setenv("FLYWHEEL_BUSINESS_LINES", '["legal"]')
    clean_env.setenv("FLYWHEEL_STORE_BATCH_SIZE", "50")
    settings = load_settings()
    assert settings.home == (tmp_path / "home").resolve()
    assert settings.business_lines == ("legal",)
    assert settings.store.batch_size == 50
    assert settings.resolved_database_url == f"sqlite:///{settings.home / 'flywheel.db'}"


def test_a_dot_env_file_is_read_and_the_environment_wins(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text(
        f"FLYWHEEL_DATABASE_URL={URL}\nFLYWHEEL_CLEANING_WORKERS=3\nFLYWHEEL_STORE_BATCH_SIZE=70\n"
    )
    assert load_settings().resolved_database_url == URL
    assert load_settings().cleaning_workers == 3
    assert load_settings().store.batch_size == 70
    clean_env.setenv("FLYWHEEL_CLEANING_WORKERS", "5")
    assert load_settings().cleaning_workers == 5


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLYWHEEL_CLEANING_WORKERS", "0"),
        ("FLYWHEEL_VLLM_MAX_LORA_RANK", "100000"),
        ("FLYWHEEL_STORE_BATCH_SIZE", "-1"),
        ("FLYWHEEL_TRAINING_TIMEOUT_S", "0"),
        ("FLYWHEEL_BUSINESS_LINES", "[]"),
        ("FLYWHEEL_BUSINESS_LINES", '["Bad:Line*"]'),
        ("FLYWHEEL_BUSINESS_LINES", '["legal", "legal"]'),
        ("FLYWHEEL_GATEWAY_MAX_BODY_DEPTH", "1000"),
    ],
)
def test_values_out_of_bounds_are_refused_by_name(
    clean_env: pytest.MonkeyPatch, name: str, value: str
) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(InvalidSettingsError) as caught:
        load_settings()
    assert f"invalid settings: {name}: " in str(caught.value)
    assert caught.value.exit_code == 2


def test_a_business_line_is_named_as_adapters_and_the_store_name_it(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("FLYWHEEL_BUSINESS_LINES", '["legal", "Bad:Line*", "x", "a-b"]')
    with pytest.raises(InvalidSettingsError) as caught:
        load_settings()
    assert str(caught.value) == (
        "invalid settings: FLYWHEEL_BUSINESS_LINES: 'Bad:Line*', 'a-b': a business line's name "
        "is lowercase letters, digits and underscores, starting with a letter, at most 64 "
        "characters"
    )
    clean_env.setenv("FLYWHEEL_BUSINESS_LINES", '["customer_service", "l2", "' + "a" * 64 + '"]')
    assert len(load_settings().business_lines) == 3


def test_secrets_are_masked_in_reprs_dumps_and_logs(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("FLYWHEEL_DATABASE_URL", URL)
    clean_env.setenv("FLYWHEEL_REDIS_URL", f"redis://:{PASSWORD}@cache:6379/0")
    settings = load_settings()
    assert settings.resolved_database_url == URL  # the clients still get the real value
    with caplog.at_level(logging.INFO):
        logging.getLogger("flywheel.test").info("settings in use: %s", settings)
        logging.getLogger("flywheel.test").info("as dict: %s", settings.model_dump())
    for text in (repr(settings), str(settings), settings.model_dump_json(), caplog.text):
        assert PASSWORD not in text
    assert "**********" in repr(settings)


def test_an_empty_training_deployment_means_train_here(clean_env: pytest.MonkeyPatch) -> None:
    # docker-compose passes ${FLYWHEEL_TRAINING_DEPLOYMENT:-}: empty when unset.
    clean_env.setenv("FLYWHEEL_TRAINING_DEPLOYMENT", "")
    assert load_settings().training_deployment is None
    clean_env.setenv("FLYWHEEL_TRAINING_DEPLOYMENT", "flywheel-train-line/train-line")
    assert Settings().training_deployment == "flywheel-train-line/train-line"


def test_the_tree_has_every_section_each_from_its_own_variables(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("FLYWHEEL_GATEWAY_UPSTREAMS", "http://a:8000,http://b:8000")
    clean_env.setenv("FLYWHEEL_DASHBOARD_SESSION_LIFETIME_S", "600")
    clean_env.setenv("FLYWHEEL_CLEANING__SCRUB_ORDER", "dedup_first")
    clean_env.setenv("FLYWHEEL_CLEANING__DEDUP__THRESHOLD", "0.8")
    clean_env.setenv("FLYWHEEL_SCRUBBER_LANGUAGES", '["zh"]')
    (tmp_path / ".env").write_text(
        "FLYWHEEL_CLEANING__DATASETS__EVAL_FRACTION=0.2\nFLYWHEEL_SCRUBBER__BATCH_SIZE=64\n"
    )
    settings = load_settings()
    assert settings.gateway.upstreams == ("http://a:8000", "http://b:8000")
    assert settings.dashboard.session_lifetime_s == 600
    assert settings.cleaning.scrub_order == "dedup_first"
    assert settings.cleaning.dedup.threshold == 0.8
    assert settings.cleaning.datasets.eval_fraction == 0.2
    assert settings.scrubber.languages == ("zh",)
    assert settings.scrubber.batch_size == 64
    clean_env.setenv("FLYWHEEL_CLEANING__DEDUP__THRESHOLD", "1.5")
    with pytest.raises(InvalidSettingsError, match="FLYWHEEL_CLEANING__DEDUP__THRESHOLD"):
        load_settings()


def test_a_command_under_a_bad_setting_exits_2_naming_the_variable(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "FLYWHEEL_HOME": str(tmp_path / "home")}
    env["FLYWHEEL_BUSINESS_LINES"] = '["Bad:Line*"]'
    flywheel = Path(sys.executable).with_name("flywheel")
    for command in (["buckets"], ["canary", "status", "legal"]):
        result = subprocess.run(
            [str(flywheel), *command], capture_output=True, text=True, env=env, check=False
        )
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "FLYWHEEL_BUSINESS_LINES: 'Bad:Line*'" in result.stderr
        assert "Traceback" not in result.stderr
