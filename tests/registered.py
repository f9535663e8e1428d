"""A registered adapter version as the nightly flow leaves it, without training one."""

from __future__ import annotations

import json
import time
from pathlib import Path

from composition.recipes import load_recipe, packaged_recipes_dir, recipe_hash, start_training_run
from flywheel.settings import Settings
from registry.tracking import Registry


def register_version(
    settings: Settings, registry: Registry, line: str, adapter_dir: Path, work: Path
) -> int:
    """Log ``adapter_dir`` in a finished training run of ``line`` and register it as a new
    version with its lineage; it is the line's gated ``candidate``."""
    recipe = load_recipe(line, settings.recipes_dir or packaged_recipes_dir())
    marker = f"{time.monotonic_ns()}"
    manifest = work / "datasets" / marker / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"business_line": line, "content_hash": marker}))
    run_id = start_training_run(registry, recipe, marker, manifest, "base", "test")
    registry.log_adapter(run_id, adapter_dir)
    lineage = {
        "base_model": "base",
        "dataset_hash": marker,
        "recipe_hash": recipe_hash(recipe),
        "code_version": "test",
    }
    version = registry.register_adapter(run_id, line, lineage)
    registry.finish_run(run_id)
    registry.set_candidate(line, version)
    return version


def fake_adapter(folder: Path, rank: int = 8) -> Path:
    """An adapter folder the stub vLLM accepts (a real vLLM would not load it)."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(folder.name.encode() * 8)
    return folder
