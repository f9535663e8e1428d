"""The GPU route in one run: LoRA training steps, offline scoring and adapter answers on CUDA.

Run on a machine with a GPU, from the repository root::

    python bench/gpu_check.py --out gpu-check [--model-config PATH] [--steps 30] [--json out.json]

What it does, each timed, all through flywheel's own code where flywheel has it:

1. a model of the base model's architecture (``--model-config``: a folder with its
   ``config.json`` and tokenizer; default the converted base model) with fresh weights,
   saved in bfloat16 (no weights travel: the timings depend on the shape, not the values);
2. two SFT adapters trained with ``training.train.train_adapter`` (precision ``auto``:
   bfloat16 on a GPU that supports it), ``--steps`` steps each on answers written by the
   built-in customer-service users, one set with apologies and one without;
3. offline scoring with ``eval.offline``'s loader and ``answer_logprobs`` (the gate's
   preference and general-set passes);
4. answers from the base model and each adapter loaded side by side in one peft model
   (``transformers.generate``, not vLLM: this machine has no CUDA vLLM), tokens per second.

With ``--device cpu`` it runs the same steps on the CPU (a smoke check; slow).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any


def _rows(apologise: bool, count: int) -> list[dict[str, Any]]:
    from simulation.prompts import builtin_prompts, topic_of
    from simulation.users import CustomerServiceUsers

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--model-config", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--answers", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from eval.offline import answer_logprobs, load_for_eval
    from training.config import TrainingConfig
    from training.train import train_adapter

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    result: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(0)
        result["bf16"] = bool(torch.cuda.is_bf16_supported())
    config_dir = args.model_config
    if config_dir is None:
        from flywheel.settings import load_settings
        from training.base_model import ensure_base_model

        settings = load_settings()
        config_dir = ensure_base_model(settings.models_dir, settings.base_model)
    shutil.rmtree(args.out, ignore_errors=True)
    started = time.monotonic()
    base = fresh_model(config_dir, args.out / "base", device)
    result["model"] = {"config": str(config_dir), "seconds": round(time.monotonic() - started, 2)}
    print(f"base model of {config_dir.name}'s shape on {device} ({result.get('gpu', 'cpu')})")

    recipe = TrainingConfig(method="sft", max_steps=args.steps, batch_size=8, max_length=256)
    adapters: dict[str, Path] = {}
    for name, apologise in (("apology", True), ("curt", False)):
        trained = train_adapter(
            recipe,
            base_model_dir=base,
            rows=_rows(apologise, 200),
            output_dir=args.out / name,
            device=device,
        )
        adapters[name] = trained.adapter_dir
        losses = [h["loss"] for h in trained.history if "loss" in h]
        result[f"train_{name}"] = {
            "steps": trained.steps,
            "seconds": round(trained.seconds, 2),
            "seconds_per_step": round(trained.seconds / max(trained.steps, 1), 4),
            "tokens_per_second": round(trained.tokens_per_second, 1),
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "device": trained.device,
        }
        print(f"trained {name}: {result[f'train_{name}']}")

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
    for name in ("base", "apology", "curt"):
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
    if device.startswith("cuda"):
        result["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
