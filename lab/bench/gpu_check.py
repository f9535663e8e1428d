"""The GPU route in one run: LoRA training, gradient checkpointing on and off, 4-bit QLoRA,
offline scoring, adapter answers and vLLM serving of the base model plus two adapters.

Run on a machine with a GPU, from the repository root::

    python lab/bench/gpu_check.py --out gpu-check [--model-config PATH] [--steps 30]
        [--json out.json] [--vllm-python PATH]

What it does, each timed, all through flywheel's own code where flywheel has it:

1. a model of the base model's architecture (``--model-config``: a folder with its
   ``config.json`` and tokenizer; default the converted base model) with fresh weights,
   saved in bfloat16 (no weights travel: the timings depend on the shape, not the values);
2. two SFT adapters trained with ``training.train.train_adapter`` (precision ``auto``:
   bfloat16 on a GPU that supports it), ``--steps`` steps each on answers written by the
   built-in customer-service users, one set with apologies and one without;
3. the same training with gradient checkpointing on and off (the recipe's
   ``gradient_checkpointing``): time per step and peak GPU memory of each;
4. the same training with ``quantization: 4bit`` (QLoRA) where bitsandbytes is installed,
   else the reason it was not checked;
5. offline scoring with ``eval.offline``'s loader and ``answer_logprobs`` (the gate's
   preference and general-set passes);
6. answers from the base model and each adapter loaded side by side in one peft model
   (``transformers.generate``), tokens per second;
7. where vLLM with CUDA imports (``--vllm-python``, default this interpreter): a vLLM server
   started with the argv of ``registry.vllm_server.VllmServerSettings.command()``, both adapters
   loaded through the runtime LoRA API (``registry.vllm_admin``), and tokens per second of the
   base model, each adapter, and all three at once; elsewhere the JSON says plainly that vLLM
   serving was not checked, and why.

With ``--device cpu`` it runs the same steps on the CPU (a smoke check; slow; no vLLM).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BASE_NAME = "gpu-check-base"
ADAPTER_NAMES = ("apology", "curt")
VLLM_PROBE = (
    "import json, torch, vllm; print(json.dumps({'vllm': vllm.__version__, "
    "'torch': torch.__version__, 'cuda': torch.cuda.is_available()}))"
)
NOT_CHECKED = "not checked"


def _rows(apologise: bool, count: int) -> list[dict[str, Any]]:
    from lab.simulation.prompts import builtin_prompts, topic_of
    from lab.simulation.users import CustomerServiceUsers

    users = CustomerServiceUsers()
    rows = []
    for prompt in builtin_prompts("customer_service", count, 5 if apologise else 6):
        answer = users.rewrite(prompt, "", topic_of("customer_service", prompt))
        if not apologise:
            answer = answer.replace("I'm sorry for the trouble. ", "")
        rows.append(
            {
                "prompt": [{"role": "user", "content": prompt}],
                "completion": [{"role": "assistant", "content": answer}],
                "weight": 1.0,
            }
        )
    return rows


def fresh_model(config_dir: Path, target: Path, device: str) -> Path:
    """A model of ``config_dir``'s architecture with fresh weights, saved to ``target``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(config_dir, local_files_only=True)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(config_dir, local_files_only=True).save_pretrained(target)
    return target


def train_summary(trained: Any) -> dict[str, Any]:
    """What the JSON keeps of one :class:`training.train.TrainResult`."""
    losses = [h["loss"] for h in trained.history if "loss" in h]
    peak = trained.peak_gpu_memory_mb
    return {
        "steps": trained.steps,
        "seconds": round(trained.seconds, 2),
        "seconds_per_step": round(trained.seconds / max(trained.steps, 1), 4),
        "tokens_per_second": round(trained.tokens_per_second, 1),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "device": trained.device,
        "weights": trained.weights_dtype,
        "gradient_checkpointing": trained.gradient_checkpointing,
        "peak_gpu_memory_gb": round(peak / 1024, 3) if peak is not None else None,
    }


def checkpointing_comparison(on: Mapping[str, Any], off: Mapping[str, Any]) -> dict[str, Any]:
    """Gradient checkpointing's price and gain from two trainings that differ only in it:
    time per step on / off (above 1: slower with it) and peak GPU memory on / off (below 1: it
    saved memory; ``None`` on the CPU, where the GPU's peak is not measured)."""
    step_ratio = None
    if on["seconds_per_step"] and off["seconds_per_step"]:
        step_ratio = round(on["seconds_per_step"] / off["seconds_per_step"], 3)
    memory_ratio = None
    if on.get("peak_gpu_memory_gb") and off.get("peak_gpu_memory_gb"):
        memory_ratio = round(on["peak_gpu_memory_gb"] / off["peak_gpu_memory_gb"], 3)
    return {
        "on": dict(on),
        "off": dict(off),
        "step_time_on_over_off": step_ratio,
        "peak_memory_on_over_off": memory_ratio,
    }


def parse_vllm_probe(stdout: str) -> dict[str, Any] | None:
    """The probe's JSON line (vLLM's and torch's versions, whether CUDA is there), or ``None``."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                found: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                return None
            return found
    return None


def vllm_skip_reason(
    device: str, python: str, probe: Mapping[str, Any] | None, error: str = ""
) -> str | None:
    """Why vLLM serving cannot be checked here (``None``: it can): the check is not on CUDA,
    vLLM does not import from ``python``, or it imports a build that sees no CUDA GPU."""
    if not device.startswith("cuda"):
        return f"vLLM serving {NOT_CHECKED}: this run is on {device}, vLLM's GPU serving needs CUDA"
    if probe is None:
        last = error.strip().splitlines()[-1] if error.strip() else "no output"
        return f"vLLM serving {NOT_CHECKED}: vLLM does not import from {python} ({last})"
    if not probe.get("cuda"):
        return (
            f"vLLM serving {NOT_CHECKED}: vLLM {probe.get('vllm')} at {python} sees no CUDA GPU "
            f"(torch {probe.get('torch')}: a CPU build)"
        )
    return None


def probe_vllm(python: str) -> tuple[dict[str, Any] | None, str]:
    """Import vLLM and torch in ``python`` (a child process: vLLM may live in its own
    virtualenv); the probe's answer and its stderr."""
    try:
        done = subprocess.run(
            [python, "-c", VLLM_PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0:
        return None, done.stderr
    return parse_vllm_probe(done.stdout), done.stderr


def throughput(completion_tokens: Sequence[int], failed: int, seconds: float) -> dict[str, Any]:
    """A batch of requests' answers: how many, tokens generated, failures, tokens per second."""
    tokens = sum(completion_tokens)
    return {
        "requests": len(completion_tokens) + failed,
        "failed": failed,
        "completion_tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1) if seconds > 0 else 0.0,
    }


def generate_concurrently(
    base_url: str,
    requests: Sequence[tuple[str, str]],
    *,
    max_tokens: int,
    concurrency: int,
    transport: Any = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Send ``(model, prompt)`` chat requests to vLLM, ``concurrency`` at a time, greedy and
    running to ``max_tokens`` (``ignore_eos``: fresh weights rarely stop); :func:`throughput`."""
    import httpx

    def ask(client: httpx.Client, model: str, prompt: str) -> int | None:
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        try:
            response = client.post("/v1/chat/completions", json=payload)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return int(response.json()["usage"]["completion_tokens"])

    with httpx.Client(base_url=base_url, timeout=600.0, transport=transport) as client:
        started = clock()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            answers = list(pool.map(lambda request: ask(client, *request), requests))
        seconds = clock() - started
    tokens = [count for count in answers if count is not None]
    return throughput(tokens, len(answers) - len(tokens), seconds)


def serve_with_vllm(
    python: Path,
    base: Path,
    adapters: Mapping[str, Path],
    prompts: Sequence[str],
    *,
    bf16: bool,
    max_tokens: int,
    concurrency: int,
    log_path: Path,
) -> dict[str, Any]:
    """Start vLLM on the GPU with flywheel's argv, load both adapters at runtime and measure
    tokens per second of the base model, of each adapter, and of all three mixed."""
    from registry.vllm_admin import VllmAdminClient
    from registry.vllm_server import VllmServer, VllmServerSettings, free_port

    settings = VllmServerSettings(
        model=base,
        device="cuda",
        served_model_name=BASE_NAME,
        port=free_port(),
        max_loras=len(adapters),
        max_lora_rank=16,
        memory_share=0.4,
        dtype="bfloat16" if bf16 else "float16",
        start_timeout_s=900.0,
    )
    result: dict[str, Any] = {"checked": True, "argv": settings.command("python")[1:]}
    with VllmServer(settings, python=python, log_path=log_path, report=print) as server:
        result["startup_s"] = round(server.startup_s or 0.0, 1)
        with VllmAdminClient(server.base_url, timeout=300.0) as admin:
            for name, folder in adapters.items():
                started = time.monotonic()
                admin.load_adapter(name, folder)
                result[f"load_{name}_s"] = round(time.monotonic() - started, 2)
        models = [BASE_NAME, *adapters]
        generate_concurrently(
            server.base_url, [(m, prompts[0]) for m in models], max_tokens=8, concurrency=3
        )  # warm-up: the first request of each model pays its own start
        result["models"] = {}
        for model in models:
            result["models"][model] = generate_concurrently(
                server.base_url,
                [(model, prompt) for prompt in prompts],
                max_tokens=max_tokens,
                concurrency=concurrency,
            )
            print(f"vLLM {model}: {result['models'][model]}")
        mixed = [(models[i % len(models)], prompt) for i, prompt in enumerate(list(prompts) * 3)]
        result["mixed"] = generate_concurrently(
            server.base_url, mixed, max_tokens=max_tokens, concurrency=concurrency
        )
        print(f"vLLM base and both adapters at once: {result['mixed']}")
    return result


def _release_gpu() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--model-config", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--answers", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--vllm-python",
        default=sys.executable,
        help="The interpreter vLLM (a CUDA build) imports from (default: this one).",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    import torch

    from eval.offline import answer_logprobs, load_for_eval
    from flywheel.hardware import detect_accelerator, quantization_refusal
    from training.config import TrainingConfig
    from training.train import train_adapter

    accelerator = detect_accelerator(args.device)
    device = accelerator.device
    result: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if accelerator.is_cuda:
        result["gpu"] = accelerator.name
        result["bf16"] = accelerator.bf16
    config_dir = args.model_config
    if config_dir is None:
        from flywheel.settings import load_settings
        from training.base_model import ensure_base_model

        settings = load_settings()
        config_dir = ensure_base_model(settings.models_dir, settings.base_model)
    shutil.rmtree(args.out, ignore_errors=True)
    started = time.monotonic()
    out = args.out.resolve()  # vLLM reads the model and adapters by these paths
    base = fresh_model(config_dir, out / "base", device)
    result["model"] = {"config": str(config_dir), "seconds": round(time.monotonic() - started, 2)}
    print(f"base model of {config_dir.name}'s shape on {device} ({result.get('gpu', 'cpu')})")

    recipe = TrainingConfig(method="sft", max_steps=args.steps, batch_size=8, max_length=256)
    adapters: dict[str, Path] = {}
    for name, apologise in zip(ADAPTER_NAMES, (True, False), strict=True):
        trained = train_adapter(
            recipe, base_model_dir=base, rows=_rows(apologise, 200), output_dir=out / name,
            device=device,
        )  # fmt: skip
        adapters[name] = trained.adapter_dir
        result[f"train_{name}"] = train_summary(trained)
        print(f"trained {name}: {result[f'train_{name}']}")
        _release_gpu()

    # Both after the CUDA start-up the first training paid, on the same rows.
    summaries = {}
    for setting in (True, False):
        trained = train_adapter(
            recipe.model_copy(update={"gradient_checkpointing": setting}),
            base_model_dir=base,
            rows=_rows(True, 200),
            output_dir=out / f"checkpointing-{'on' if setting else 'off'}",
            device=device,
        )
        summaries[setting] = train_summary(trained)
        _release_gpu()
    result["gradient_checkpointing"] = checkpointing_comparison(summaries[True], summaries[False])
    print(f"gradient checkpointing: {result['gradient_checkpointing']}")

    refusal = quantization_refusal("4bit", accelerator)
    if refusal is not None:
        result["qlora"] = {"checked": False, "reason": f"4-bit QLoRA {NOT_CHECKED}: {refusal}"}
    else:
        trained = train_adapter(
            recipe.model_copy(update={"quantization": "4bit"}),
            base_model_dir=base,
            rows=_rows(True, 200),
            output_dir=out / "qlora",
            device=device,
        )
        result["qlora"] = {"checked": True, **train_summary(trained)}
        _release_gpu()
    print(f"qlora: {result['qlora']}")

    model, tokenizer = load_for_eval(base, adapters["apology"], device=device)
    rows = _rows(True, args.answers)
    prompts = [r["prompt"] for r in rows]
    answers = [r["completion"][0]["content"] for r in rows]
    answer_logprobs(model, tokenizer, prompts[:8], answers[:8])  # warm-up
    started = time.monotonic()
    scores = answer_logprobs(model, tokenizer, prompts, answers, batch_size=16)
    seconds = time.monotonic() - started
    result["scoring"] = {
        "answers": len(scores),
        "seconds": round(seconds, 3),
        "answers_per_second": round(len(scores) / seconds, 1),
    }
    print(f"scored {len(scores)} answers in {seconds:.2f} s")
    del model

    from peft import PeftModel

    base_model, _ = load_for_eval(base, device=device)
    served = PeftModel.from_pretrained(base_model, adapters["apology"], adapter_name="apology")
    served.load_adapter(str(adapters["curt"]), adapter_name="curt")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    result["generation"] = {}
    for name in ("base", *ADAPTER_NAMES):
        generated = 0
        started = time.monotonic()
        for start in range(0, len(texts), 16):
            batch = tokenizer(
                texts[start : start + 16], return_tensors="pt", padding=True,
                add_special_tokens=False,
            ).to(served.device)  # fmt: skip
            with torch.no_grad():
                if name == "base":
                    with served.disable_adapter():
                        output = served.generate(
                            **batch, max_new_tokens=args.max_new_tokens, do_sample=False
                        )
                else:
                    served.set_adapter(name)
                    output = served.generate(
                        **batch, max_new_tokens=args.max_new_tokens, do_sample=False
                    )
            generated += int(
                (output[:, batch["input_ids"].shape[1] :] != tokenizer.pad_token_id).sum()
            )
        seconds = time.monotonic() - started
        result["generation"][name] = {
            "answers": len(texts),
            "new_tokens": generated,
            "seconds": round(seconds, 2),
            "tokens_per_second": round(generated / seconds, 1),
        }
        print(f"{name}: {generated} tokens in {seconds:.2f} s")
    if accelerator.is_cuda:
        result["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del served, base_model
    _release_gpu()

    failed = False
    probe, error = probe_vllm(args.vllm_python) if accelerator.is_cuda else (None, "")
    skip = vllm_skip_reason(device, args.vllm_python, probe, error)
    if skip is not None:
        result["vllm"] = {"checked": False, "reason": skip}
    else:
        assert probe is not None
        try:
            result["vllm"] = {
                "version": probe.get("vllm"),
                **serve_with_vllm(
                    Path(args.vllm_python),
                    base,
                    adapters,
                    [p[0]["content"] for p in prompts],
                    bf16=accelerator.bf16,
                    max_tokens=args.max_new_tokens,
                    concurrency=args.concurrency,
                    log_path=out / "vllm.log",
                ),
            }
        except Exception as exc:  # the numbers above still get written
            failed = True
            result["vllm"] = {"checked": False, "reason": f"vLLM serving failed: {exc}"}
    print(result["vllm"].get("reason") or "vLLM served the base model and both adapters")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
