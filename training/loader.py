"""Training's model loader, which offline evaluation uses too: one place that turns a base
model folder (and an adapter) into a model on a device, in the dtype
:func:`flywheel.hardware.number_format` chose for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError
from flywheel.hardware import Accelerator, NumberFormat, Quantization


def load_model(
    base_model_dir: Path,
    *,
    accelerator: Accelerator,
    numbers: NumberFormat,
    adapter_dir: Path | None = None,
    trainable: bool = False,
    quantization: Quantization = "none",
) -> Any:
    """The base model on ``accelerator``'s device with its weights in ``numbers.weights``, plus
    the LoRA adapter in ``adapter_dir`` when given (trainable or not).

    ``quantization="4bit"`` loads the base model's linear layers in 4-bit NF4 (bitsandbytes,
    CUDA only; computed in ``numbers.weights``) for QLoRA training; evaluation never asks for
    it, since vLLM serves the adapter over the unquantized base model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if not (base_model_dir / "config.json").exists():
        raise FlywheelError(f"{base_model_dir} is not a model folder (no config.json)")
    if adapter_dir is not None and not (adapter_dir / "adapter_config.json").exists():
        raise FlywheelError(f"{adapter_dir} is not a LoRA adapter (no adapter_config.json)")
    dtype = getattr(torch, numbers.weights)
    placement: dict[str, Any] = {}
    if quantization == "4bit":
        from transformers import BitsAndBytesConfig

        placement = {
            "quantization_config": BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
            ),
            # A 4-bit model cannot be moved after loading: it is placed as it loads.
            "device_map": {"": torch.device(accelerator.device)},
        }
    model: Any = AutoModelForCausalLM.from_pretrained(
        base_model_dir, dtype=dtype, local_files_only=True, **placement
    )
    if quantization == "none":
        model = model.to(accelerator.device)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable)
    return model


def load_tokenizer(base_model_dir: Path, adapter_dir: Path | None = None) -> Any:
    """The tokenizer of the adapter folder when it holds one, else the base model's."""
    from transformers import AutoTokenizer

    folder = base_model_dir
    if adapter_dir is not None and (adapter_dir / "tokenizer_config.json").exists():
        folder = adapter_dir
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)
