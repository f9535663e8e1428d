"""How an adapter is trained: the typed training configuration beside the trainer.

A line's recipe (``composition.recipes``) is a ``TrainingConfig`` plus the
policies that judge its candidates; :mod:`training.train` maps it onto trl's
``SFTConfig``, ``DPOConfig`` and ``KTOConfig``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flywheel.hardware import GradientCheckpointing, Precision, Quantization

# Modules vLLM can serve LoRA on for Llama-style models (see --lora-target-modules).
SERVABLE_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
)


class LoraShape(BaseModel):
    """The adapter's shape: it must fit the serving vLLM's ``--max-lora-rank``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(default=16, ge=1, le=256)
    alpha: int = Field(default=32, ge=1, le=1024)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    @model_validator(mode="after")
    def _servable(self) -> LoraShape:
        unknown = set(self.target_modules) - SERVABLE_MODULES
        if unknown:
            raise ValueError(
                f"target_modules {sorted(unknown)} cannot be served by vLLM; "
                f"choose from {sorted(SERVABLE_MODULES)}"
            )
        return self


class TrainingConfig(BaseModel):
    """Method, LoRA shape and schedule of a training; which data it accumulates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["sft", "dpo", "kto"]
    kto_below_pairs: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="DPO recipes: when the training set holds fewer preference pairs than "
        "this and more labelled answers (KTO examples: liked or disliked, unpaired), train "
        "KTO on those instead; users give thumbs far more often than two answers to compare.",
    )
    lora: LoraShape = Field(default_factory=LoraShape)
    learning_rate: float = Field(default=2e-4, gt=0, le=1)
    epochs: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="Passes over the training rows (after weighting). With max_steps too, "
        "this many passes, at most max_steps steps (a large window's night stays bounded).",
    )
    max_steps: int | None = Field(default=None, ge=1, le=1_000_000)
    batch_size: int = Field(default=4, ge=1, le=1024)
    gradient_accumulation: int = Field(default=1, ge=1, le=1024)
    max_length: int = Field(default=512, ge=32, le=32_768)
    beta: float = Field(default=0.1, gt=0, le=10, description="DPO / KTO temperature.")
    sft_weight: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="DPO only: weight of an added SFT loss on the chosen answers (RPO).",
    )
    dpo_loss: Literal["sigmoid", "sigmoid_norm"] = Field(
        default="sigmoid",
        description="DPO only: 'sigmoid' compares log-ratios summed over each answer (the "
        "paper's); 'sigmoid_norm' averages them per answer token, so a pair weighs the same "
        "whatever its answers' lengths and the loss matches a per-token preference score "
        "(beta then acts per token: a few units, not 0.1).",
    )
    history_days: float = Field(
        default=0.0,
        ge=0,
        le=3_650,
        description="Train on every dataset of the line from this many days back (0: the "
        "night's window only); held-out examples of any of them are never trained on.",
    )
    half_life_days: float = Field(
        default=7.0, gt=0, le=3_650, description="An accumulated example's weight halves so."
    )
    start_from: Literal["base", "champion"] = Field(
        default="base",
        description="Train a fresh adapter on the base model, or continue the champion's "
        "adapter (its LoRA shape wins).",
    )
    continue_learning_rate: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Learning rate when continuing the champion's adapter (default: "
        "learning_rate). Each night's schedule restarts at its peak, so a lower rate keeps "
        "nights of continuation from compounding their drift away from the base model.",
    )
    loss_checks: int = Field(
        default=0,
        ge=0,
        le=100,
        description="How many times, evenly along its schedule, a training measures the "
        "general-set loss against the gate's bounds on it (max_general_loss_drift over the "
        "base model, max_general_loss_increase over the champion) and stops at the first "
        "measure over them, keeping the adapter of the last one inside: a night whose last "
        "steps overshoot the bound is cut back instead of refused. 0: never (the gate alone "
        "judges the trained adapter).",
    )
    copies_per_weight: float = Field(
        default=2.0,
        ge=1,
        le=10,
        description="Expected copies of an example in training per unit of its signal weight "
        "(edits and thumbs weigh 1, regenerates 0.5, abandons 0.25).",
    )
    precision: Precision = Field(
        default="auto",
        description="'auto': bfloat16 where the hardware has it (a GPU that supports it, "
        "a CPU with AVX512-BF16 or AMX: autocast, measured faster by "
        "lab/bench/precision_bench.py), "
        "else float32; 'bf16' / 'fp32' force one (training and the gate's evaluation).",
    )
    gradient_checkpointing: GradientCheckpointing = Field(
        default="auto",
        description="Recompute activations in the backward pass instead of keeping them: "
        "less memory, about a fifth more compute. 'auto': on (flywheel.hardware."
        "uses_gradient_checkpointing); true / false force it.",
    )
    quantization: Quantization = Field(
        default="none",
        description="'4bit': QLoRA, the base model's weights held in 4-bit NF4 while the "
        "adapter trains (a quarter of bfloat16's memory); needs a CUDA GPU and bitsandbytes "
        "(the 'gpu' extra), else a training refuses the recipe. Evaluation and vLLM use the "
        "unquantized base model.",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _one_schedule(self) -> TrainingConfig:
        if self.epochs is None and self.max_steps is None:
            raise ValueError("set 'epochs', 'max_steps' or both (epochs capped at max_steps)")
        return self


def training_steps(recipe: TrainingConfig, rows: int) -> int | None:
    """The optimizer steps a training of ``rows`` weighted rows takes under ``recipe``: its
    ``max_steps``, or with ``epochs`` too, that many passes over the rows if fewer; ``None``
    when only ``epochs`` is set (the trainer counts the passes itself)."""
    if recipe.max_steps is None:
        return None
    if recipe.epochs is None:
        return recipe.max_steps
    batches = math.ceil(max(rows, 1) / recipe.batch_size)
    per_pass = batches / recipe.gradient_accumulation
    return max(1, min(recipe.max_steps, math.ceil(recipe.epochs * per_pass)))


def training_method(
    recipe: TrainingConfig, train_counts: Mapping[str, int]
) -> tuple[str, str | None]:
    """The method to train ``recipe`` with on a training set of ``train_counts`` examples
    per method, and why when it is not the recipe's own (KTO where pairs are scarce)."""
    if recipe.method != "dpo" or recipe.kto_below_pairs is None:
        return recipe.method, None
    pairs, labelled = train_counts.get("dpo", 0), train_counts.get("kto", 0)
    if pairs < recipe.kto_below_pairs and labelled > pairs:
        return "kto", (
            f"{pairs} preference pairs, fewer than kto_below_pairs {recipe.kto_below_pairs}: "
            f"KTO on {labelled} labelled answers instead"
        )
    return "dpo", None
