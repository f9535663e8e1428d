"""LoRA SFT and DPO training with trl + peft, on CPU or GPU, resumable.

:func:`train_adapter` reads a line's dataset folder (parquet in trl's
conversational format), trains a LoRA adapter as the recipe says, and saves a
peft adapter folder that vLLM's ``/v1/load_lora_adapter`` accepts. Checkpoints
go beside it; a rerun after a crash resumes from the last one.
"""

from __future__ import annotations

import logging
import math
import resource
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.errors import FlywheelError, UsageError
from flywheel.hardware import (
    Accelerator,
    Precision,
    detect_accelerator,
    number_format,
    quantization_refusal,
    uses_gradient_checkpointing,
)
from training.base_model import base_fingerprint, write_base_record
from training.config import TrainingConfig, training_steps
from training.rows import TrainingRow, training_rows, weighted_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrainResult:
    """A trained adapter and how training went."""

    adapter_dir: Path
    history: list[dict[str, Any]]
    seconds: float
    steps: int
    examples: int
    tokens_seen: int
    peak_rss_mb: float
    resumed_from: str | None = None
    device: str = "cpu"
    weights_dtype: str = "float32"
    gradient_checkpointing: bool = True
    peak_gpu_memory_mb: float | None = None
    # With a loss guard: its measures (step, loss; step 0 is the model training started
    # from), its limit, and the step whose adapter was kept when a later one went over it.
    loss_checks: tuple[tuple[int, float], ...] = ()
    loss_limit: float | None = None
    kept_step: int | None = None

    @property
    def tokens_per_second(self) -> float:
        """Training throughput in input tokens per second."""
        return self.tokens_seen / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LossGuard:
    """A bound a training must stay inside, checked as it trains rather than after it.

    ``measure(model, tokenizer)`` scores the model being trained (e.g. its loss on a fixed
    general set, as the gate will); it is taken at ``checks`` evenly spaced steps, a few
    early ones (:func:`guard_steps`) and at the end. The limit (:func:`loss_limit`) is
    ``max_over_base`` above the base model's measure and ``max_over_start`` above the
    model's at step 0 (the adapter being continued; the base model for a fresh one), less
    ``headroom`` for the gate's own measure of the kept adapter.
    Training stops at the first measure over the limit and keeps the adapter of the last one
    at or under it: the last steps on a small set that overshoot the gate's bound are cut
    back, not the whole night refused.
    """

    measure: Callable[[Any, Any], float]
    checks: int
    max_over_base: float | None = None
    max_over_start: float | None = None
    # How far (relative) under the bounds a kept measure must be: the gate scores the saved
    # adapter again and its figure differed from the guard's by up to 0.002 (0.12%) on a
    # bfloat16 CPU, enough to refuse a night the guard kept 0.0002 inside the bound
    # (docs/results/2026-12-07-legal-ablation.md).
    headroom: float = 0.005


def guard_steps(total: int, checks: int) -> tuple[int, ...]:
    """The steps of a ``total``-step training at which a guard with ``checks`` checks
    measures: evenly spaced, the last one at ``total``, and before the first of them at steps
    1, 2, 4, ... (e.g. 48 and 8: 1, 2, 4, 6, 12, ..., 48). A continued adapter that starts
    near the bound may cross it in its first few steps (medical's third night did by step
    6: docs/results/2026-12-07-medical-guard.md), and without a measure inside the night
    keeps nothing; the early ones cost a few measures, not a step's share of every interval."""
    if total < 1 or checks < 1:
        return ()
    even = {max(1, math.ceil(total * k / checks)) for k in range(1, checks + 1)}
    early = {2**k for k in range(total.bit_length()) if 2**k < min(even)}
    return tuple(sorted(even | early))


def loss_limit(
    base: float,
    start: float,
    max_over_base: float | None,
    max_over_start: float | None,
    headroom: float = 0.0,
) -> float | None:
    """The highest measure a guarded training may keep: at most ``max_over_base`` (relative)
    above the base model's ``base`` and ``max_over_start`` above its starting point's
    ``start``, ``headroom`` (relative) under the tighter; ``None`` when neither bound is
    set."""
    limits = [
        reference * (1 + bound)
        for reference, bound in ((base, max_over_base), (start, max_over_start))
        if bound is not None
    ]
    return min(limits) * (1 - headroom) if limits else None


def trains_in_bf16(precision: Precision, on_gpu: bool) -> bool:
    """Whether a training (and its evaluation) runs in bfloat16 for ``precision``
    (:func:`flywheel.hardware.number_format` on this machine's GPU or CPU).

    ``auto``: bfloat16 on a GPU that supports it, and autocast on a CPU with
    native bfloat16 (``lab/bench/precision_bench.py``, quiet 2-core AVX512-BF16 CPU:
    a training step 0.72x and a scoring pass 0.55x float32's time).
    """
    if precision == "fp32":
        return False
    accelerator = detect_accelerator("cuda" if on_gpu else "cpu")
    return number_format(precision, accelerator).mixed == "bf16"


def trainer_options(
    recipe: TrainingConfig,
    accelerator: Accelerator,
    *,
    output_dir: Path,
    rows: int,
    continues: bool = False,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """The trl config's arguments every method shares, for ``recipe`` on ``accelerator``:
    the schedule, checkpoints, precision (:func:`flywheel.hardware.number_format`) and gradient
    checkpointing (:func:`flywheel.hardware.uses_gradient_checkpointing`). ``rows``: the
    training rows after weighting; ``continues``: an adapter is continued, not started."""
    numbers = number_format(recipe.precision, accelerator)
    checkpointing = uses_gradient_checkpointing(recipe.gradient_checkpointing, accelerator)
    steps = training_steps(recipe, rows)
    schedule: dict[str, Any] = (
        {"max_steps": steps} if steps is not None else {"num_train_epochs": recipe.epochs}
    )
    steps_hint = steps or max(1, rows // recipe.batch_size)
    return {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": recipe.batch_size,
        "gradient_accumulation_steps": recipe.gradient_accumulation,
        "learning_rate": (
            recipe.continue_learning_rate
            if continues and recipe.continue_learning_rate is not None
            else recipe.learning_rate
        ),
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": max(5, steps_hint // 4),
        "save_total_limit": 2,
        "report_to": [],
        "seed": recipe.seed,
        "max_length": recipe.max_length,
        "use_cpu": not accelerator.is_cuda,
        "bf16": numbers.mixed == "bf16",
        "fp16": numbers.mixed == "fp16",
        # Non-reentrant: the recomputed forward needs no input that requires grad, which a
        # LoRA model's frozen embeddings never give (trl also turns on peft's
        # enable_input_require_grads for the reentrant kind).
        "activation_checkpointing": checkpointing,
        "activation_checkpointing_kwargs": {"use_reentrant": False} if checkpointing else None,
        "dataloader_num_workers": 0,
        "include_num_input_tokens_seen": True,
        # Few distinct shapes: oneDNN builds a kernel per shape, costly in bfloat16 on CPU.
        "pad_to_multiple_of": 64,
        **schedule,
        # A time budget's schedule is set once training begins (_decay_over_time).
        **({"lr_scheduler_type": "constant"} if max_seconds is not None else {}),
    }


def time_decay(elapsed_s: float, budget_s: float) -> float:
    """The learning rate's share of its peak after ``elapsed_s`` of a ``budget_s`` training
    budget: linear from 1 to 0 over the budget's wall time."""
    return max(0.0, 1.0 - elapsed_s / budget_s)


def _decay_over_time(trainer: Any, started: float, budget_s: float) -> None:
    """Make the trainer's constant schedule follow :func:`time_decay` of the wall time since
    ``started``: the trainer built it just before training began, and its factor is read at
    each scheduler step."""
    scheduler = getattr(trainer, "lr_scheduler", None)
    scheduler = getattr(scheduler, "scheduler", scheduler)
    if not hasattr(scheduler, "lr_lambdas"):
        raise FlywheelError("the trainer's learning-rate schedule cannot follow a time budget")
    scheduler.lr_lambdas = [
        lambda _step: time_decay(time.perf_counter() - started, budget_s)
    ] * len(scheduler.lr_lambdas)


def _last_checkpoint(folder: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    if not folder.is_dir():
        return None
    return get_last_checkpoint(str(folder))


def train_adapter(
    recipe: TrainingConfig,
    *,
    base_model_dir: Path,
    dataset_dir: Path | None = None,
    rows: Sequence[TrainingRow | Mapping[str, Any]] | None = None,
    output_dir: Path,
    device: str | None = None,
    max_seconds: float | None = None,
    on_log: Callable[[dict[str, Any]], None] | None = None,
    init_adapter: Path | None = None,
    loss_guard: LossGuard | None = None,
) -> TrainResult:
    """Train the recipe's adapter on a dataset folder (or given rows); resumes if interrupted.

    ``rows`` are typed rows (:func:`training.rows.training_rows`) or plain trl rows as a
    bench writes them (read with :meth:`TrainingRow.from_dict`).

    The adapter lands in ``output_dir/adapter`` and checkpoints in
    ``output_dir/checkpoints`` (removed once the adapter is saved). With
    ``max_seconds``, training stops after the step that crosses the budget and the
    learning rate decays linearly over that budget's wall time (:func:`time_decay`), not
    over steps it would never reach.
    ``init_adapter`` continues a trained adapter (e.g. the champion's) instead
    of starting a fresh one, at the recipe's ``continue_learning_rate`` when it has one.
    ``loss_guard`` keeps the adapter inside a bound as it trains (:class:`LossGuard`); a
    resumed training measures its start again, as it restarts from the checkpoint.
    """
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback

    from training.loader import load_model, load_tokenizer

    accelerator = detect_accelerator(device)
    refusal = quantization_refusal(recipe.quantization, accelerator)
    if refusal is not None:
        raise UsageError(refusal)
    if rows is None:
        if dataset_dir is None:
            raise FlywheelError("train_adapter needs a dataset folder or rows")
        typed = training_rows(dataset_dir, recipe.method)
    else:
        typed = [r if isinstance(r, TrainingRow) else TrainingRow.from_dict(r) for r in rows]
    if not typed:
        raise FlywheelError(f"no {recipe.method.upper()} examples to train on")
    examples = len(typed)
    trl_rows = weighted_rows(typed, recipe.copies_per_weight, recipe.seed)
    # transformers 5 renamed gradient checkpointing; trl still calls the old names.
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    torch.manual_seed(recipe.seed)
    tokenizer = load_tokenizer(base_model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    numbers = number_format(recipe.precision, accelerator)
    model = load_model(
        base_model_dir,
        accelerator=accelerator,
        numbers=numbers,
        adapter_dir=init_adapter,
        trainable=True,
        quantization=recipe.quantization,
    )
    lora: LoraConfig | None = None
    if init_adapter is None:
        lora = LoraConfig(
            r=recipe.lora.rank,
            lora_alpha=recipe.lora.alpha,
            lora_dropout=recipe.lora.dropout,
            target_modules=list(recipe.lora.target_modules),
            task_type="CAUSAL_LM",
        )
    checkpoints = output_dir / "checkpoints"
    common = trainer_options(
        recipe,
        accelerator,
        output_dir=checkpoints,
        rows=len(trl_rows),
        continues=init_adapter is not None,
        max_seconds=max_seconds,
    )
    dataset = Dataset.from_list(trl_rows)

    class _Forward(TrainerCallback):  # type: ignore[misc]
        started = time.perf_counter()

        trainer: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.started = time.perf_counter()
            if max_seconds is not None:
                _decay_over_time(self.trainer, self.started, max_seconds)
            log_training_step(state.global_step, state.max_steps, None, {})

        def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            kept = guarding.kept_step if guarding is not None else None
            log_training_step(state.global_step, state.max_steps, None, {}, done=True, kept=kept)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if logs:
                loss = logs.get("loss")
                loss = float(loss) if isinstance(loss, int | float) else None
                log_training_step(state.global_step, state.max_steps, loss, logs)
            if on_log is not None and logs:
                on_log({"step": state.global_step, **logs})

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if max_seconds is not None and time.perf_counter() - self.started > max_seconds:
                control.should_training_stop = True

    forward = _Forward()
    guarding = _Guard(loss_guard, tokenizer) if loss_guard is not None else None
    # The guard's callback first: at the end it puts back the kept adapter before _Forward
    # reports the training done, with the kept step.
    callbacks: list[Any] = ([guarding.callback()] if guarding is not None else []) + [forward]
    trainer = _trainer(recipe, model, dataset, tokenizer, lora, common, callbacks)
    forward.trainer = trainer
    _quiet_trainer(trainer)
    resume = _last_checkpoint(checkpoints)
    if accelerator.is_cuda:
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - started
    adapter_dir = _save_adapter(trainer.model, output_dir, base_model_dir)
    shutil.rmtree(checkpoints, ignore_errors=True)
    state = trainer.state
    return TrainResult(
        adapter_dir=adapter_dir,
        history=list(state.log_history),
        seconds=seconds,
        steps=state.global_step,
        examples=examples,
        tokens_seen=int(getattr(state, "num_input_tokens_seen", 0) or 0),
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        resumed_from=resume,
        device=accelerator.device,
        weights_dtype=numbers.weights,
        gradient_checkpointing=bool(common["activation_checkpointing"]),
        peak_gpu_memory_mb=(
            torch.cuda.max_memory_allocated(accelerator.device) / 2**20
            if accelerator.is_cuda
            else None
        ),
        loss_checks=tuple(guarding.checks) if guarding is not None else (),
        loss_limit=guarding.limit if guarding is not None else None,
        kept_step=guarding.kept_step if guarding is not None else None,
    )


class _Guard:
    """A :class:`LossGuard` at work in one training: its measures, the adapter weights of the
    last check inside the limit, and whether a later check went over it."""

    def __init__(self, guard: LossGuard, tokenizer: Any) -> None:
        self.guard = guard
        self.tokenizer = tokenizer
        self.checks: list[tuple[int, float]] = []
        self.limit: float | None = None
        self.inside: tuple[int, dict[str, Any]] | None = None
        self.kept_step: int | None = None
        self.over = False

    def measure(self, model: Any, step: int) -> float:
        loss = self.guard.measure(model, self.tokenizer)
        self.checks.append((step, loss))
        return loss

    def start(self, model: Any, step: int) -> None:
        """The limit, from the base model's measure and the starting model's."""
        started = self.measure(model, step)
        base = started
        if step > 0 or _has_trained_adapter(model):
            with model.disable_adapter():
                base = self.guard.measure(model, self.tokenizer)
        guard = self.guard
        self.limit = loss_limit(
            base, started, guard.max_over_base, guard.max_over_start, guard.headroom
        )
        logger.info(
            "training guard: general-set loss %.3f at step %d (base model %.3f), limit %s",
            started,
            step,
            base,
            "none" if self.limit is None else f"{self.limit:.3f}",
        )

    def check(self, model: Any, step: int) -> bool:
        """Measure at ``step``; whether training goes on (the measure is inside the limit)."""
        from peft import get_peft_model_state_dict

        loss = self.measure(model, step)
        if self.limit is None or loss <= self.limit:
            weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
            self.inside = (step, weights)
            return True
        self.over = True
        logger.info(
            "training guard: general-set loss %.3f at step %d is over the limit %.3f: "
            "training stops and keeps %s",
            loss,
            step,
            self.limit,
            f"step {self.inside[0]}" if self.inside else "this adapter (no check was inside)",
        )
        return False

    def finish(self, model: Any, step: int) -> None:
        """After training: measure the last step if no check did, and put back the last
        weights inside the limit when a later check went over it."""
        from peft import set_peft_model_state_dict

        if not self.over and (not self.checks or self.checks[-1][0] != step):
            self.check(model, step)
        if self.over and self.inside is not None:
            set_peft_model_state_dict(model, self.inside[1])
            self.kept_step = self.inside[0]
            logger.info(
                "training guard: the adapter of step %d is kept (trained to step %d)",
                self.kept_step,
                step,
            )

    def callback(self) -> Any:
        """The trainer callback that measures at the guard's steps and stops when over."""
        from transformers import TrainerCallback

        guard = self

        class _Checks(TrainerCallback):  # type: ignore[misc]
            steps: tuple[int, ...] = ()

            def on_train_begin(
                self, args: Any, state: Any, control: Any, model: Any = None, **_: Any
            ) -> None:
                guard.start(model, state.global_step)
                self.steps = guard_steps(state.max_steps, guard.guard.checks)

            def on_step_end(
                self, args: Any, state: Any, control: Any, model: Any = None, **_: Any
            ) -> None:
                if state.global_step in self.steps and not guard.check(model, state.global_step):
                    control.should_training_stop = True

            def on_train_end(
                self, args: Any, state: Any, control: Any, model: Any = None, **_: Any
            ) -> None:
                guard.finish(model, state.global_step)

        return _Checks()


def _has_trained_adapter(model: Any) -> bool:
    """Whether ``model`` carries LoRA weights that already differ from the base model's (a
    continued adapter): a fresh LoRA's B matrices start at zero."""
    from peft import get_peft_model_state_dict

    return any(
        "lora_B" in name and bool(weight.abs().sum() > 0)
        for name, weight in get_peft_model_state_dict(model).items()
    )


def _save_adapter(model: Any, output_dir: Path, base_model_dir: Path) -> Path:
    """Save the trained adapter as ``output_dir/adapter`` (written aside, then renamed) with
    ``flywheel_base.json``, the base it was trained on: a replica serving another base
    refuses it, and the adapter's digest covers the record."""
    adapter_dir = output_dir / "adapter"
    staging = output_dir / "adapter.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging))
    write_base_record(staging, base_fingerprint(base_model_dir))
    shutil.rmtree(adapter_dir, ignore_errors=True)
    staging.rename(adapter_dir)
    return adapter_dir


def log_training_step(
    step: int,
    total: int,
    loss: float | None,
    logs: dict[str, Any],
    *,
    done: bool = False,
    kept: int | None = None,
) -> None:
    """One line of training progress on this module's logger (INFO): the step, the steps in
    all, the latest loss, whether training ended and the step whose adapter a loss guard
    kept as record attributes (``training_step``, ``training_total``, ``training_loss``,
    ``training_done``, ``training_kept_step``) for a progress display, the trainer's numbers
    in words for a log file."""
    from flywheel.wording import in_words

    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in logs.items()}
    logger.info(
        "training %s step %d/%d%s%s",
        "ended at" if done else "at",
        step,
        total,
        f": {in_words(shown)}" if shown else "",
        f", the adapter of step {kept} kept" if kept is not None else "",
        extra={
            "training_step": step,
            "training_total": total,
            "training_loss": loss,
            "training_done": done,
            "training_kept_step": kept,
        },
    )


def _quiet_trainer(trainer: Any) -> None:
    """Take out the trainer's own progress bar and the callback that prints every log dict
    to stdout: progress goes through :func:`log_training_step` instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for printing in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(printing)


def _trainer(
    recipe: TrainingConfig,
    model: Any,
    dataset: Any,
    tokenizer: Any,
    lora: Any,
    common: dict[str, Any],
    callbacks: list[Any],
) -> Any:
    """The trl trainer of the recipe's method, with its config."""
    if recipe.method == "sft":
        from trl import SFTConfig, SFTTrainer

        return SFTTrainer(
            model=model,
            args=SFTConfig(**common),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=callbacks,
        )
    if recipe.method == "kto":
        from trl import KTOConfig, KTOTrainer

        return KTOTrainer(
            model=model,
            args=KTOConfig(beta=recipe.beta, **common),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=callbacks,
        )
    from trl import DPOConfig, DPOTrainer

    losses: dict[str, Any] = (
        {"loss_type": [recipe.dpo_loss, "sft"], "loss_weights": [1.0, recipe.sft_weight]}
        if recipe.sft_weight > 0
        else {"loss_type": [recipe.dpo_loss]}
    )
    return DPOTrainer(
        model=model,
        args=DPOConfig(beta=recipe.beta, **losses, **common),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=callbacks,
    )
