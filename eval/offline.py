"""Offline metrics of one model on one line's held-out data, and on a fixed general set.

Scores are log-probabilities of whole answers given their prompt, rendered
with the tokenizer's chat template, as the served model would see them:

- **preference accuracy / mean margin** compare the chosen and the rejected
  answer of each held-out pair by their *mean log-probability per answer
  token*. Summed log-probabilities favour whichever answer is shorter, so a
  candidate that merely answered more tersely would look better; per-token
  normalisation (as in SimPO / length-normalised DPO evaluation) removes that
  bias. The margin is therefore in nats per token.
- **preferred_loss / general_loss** are token-weighted mean negative
  log-likelihoods (total NLL over total answer tokens), the usual LM loss.

Every answer is scored with the end-of-sequence token appended, so "stops
here" is part of what is measured. Generation checks use greedy decoding.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.reports import EvalReport, GenerationSample
from feedback.records import last_user_text, message_text
from flywheel.errors import FlywheelError
from flywheel.hardware import Precision, detect_accelerator, number_format
from flywheel.progress import progress_bar

if TYPE_CHECKING:
    import torch

Message = dict[str, str]
Conversation = tuple[Message, ...]
# One piece of PII found in a text: its entity type and its span (``start``, ``end``).
PiiSpan = tuple[str, int, int]
# Texts in, the PII found in each text out (e.g. ``[("EMAIL_ADDRESS", 5, 14)]``).
PiiDetector = Callable[[list[str]], list[list[PiiSpan]]]
# Whether the answers a model was trained on hold a value (eval.offline.training_answers_hold).
TrainedOn = Callable[[str], bool]

GENERAL_SET = "general_set.jsonl"
GENERATION_SEED = 0

REFUSAL_PATTERNS: tuple[str, ...] = (
    r"\bI\s+(?:can['’]?t|cannot|can not|won['’]?t be able to)\b",
    r"\bI(?:['’]m| am)\s+(?:unable|not able)\s+to\b",
    r"\bI(?:['’]m| am)\s+sorry,?\s+but\b",
    r"\bAs an AI\b",
    r"\bAs a language model\b",
    r"(?:抱歉|对不起)，?我(?:无法|不能)",
    r"我不能",
    r"我无法(?:帮助|帮您|帮你|协助|回答|提供|满足|处理|完成)",
    r"作为(?:一个)?(?:AI|人工智能|语言模型)",
)
_REFUSAL = re.compile("|".join(f"(?:{p})" for p in REFUSAL_PATTERNS), re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class HeldOutPair:
    """A held-out preference pair: the prompt, the answer users preferred, and the other one."""

    prompt: Conversation
    chosen: str
    rejected: str


@dataclass(frozen=True, slots=True)
class PromptAnswer:
    """A prompt and one good answer to it (a preferred answer, or a general-set item)."""

    prompt: Conversation
    answer: str


@dataclass(frozen=True, slots=True)
class EvalData:
    """The held-out data of one business line.

    ``preferred`` holds the chosen answer of every pair plus the SFT completions
    and the KTO answers labelled desirable; ``sample_prompts`` are distinct
    prompts for the generation checks.
    """

    pairs: tuple[HeldOutPair, ...] = ()
    preferred: tuple[PromptAnswer, ...] = ()
    sample_prompts: tuple[Conversation, ...] = ()


def load_eval_data(dataset_dir: Path, *, max_pairs: int = 200, max_samples: int = 8) -> EvalData:
    """Read the ``*_eval.parquet`` files of a dataset folder (any may be missing).

    Takes the first ``max_pairs`` pairs and at most ``max_pairs`` more preferred
    answers from SFT and KTO, and the first ``max_samples`` distinct prompts
    for generation (pairs' prompts first, then the preferred answers', then those of
    answers users disliked).
    """
    if not dataset_dir.is_dir():
        raise FlywheelError(f"dataset folder {dataset_dir} does not exist")
    dpo = _read_rows(dataset_dir / "dpo_eval.parquet")[:max_pairs]
    pairs = tuple(
        HeldOutPair(_conversation(r["prompt"]), _reply(r["chosen"]), _reply(r["rejected"]))
        for r in dpo
    )
    extra: list[PromptAnswer] = [
        PromptAnswer(_conversation(r["prompt"]), _reply(r["completion"]))
        for r in _read_rows(dataset_dir / "sft_eval.parquet")
    ]
    extra += [
        PromptAnswer(_conversation(r["prompt"]), _reply(r["completion"]))
        for r in _read_rows(dataset_dir / "kto_eval.parquet")
        if r.get("label")
    ]
    preferred = tuple(PromptAnswer(p.prompt, p.chosen) for p in pairs) + tuple(extra[:max_pairs])
    # Disliked answers' prompts are asked too: at real feedback rates they are most of the
    # held-out prompts, and what the candidate should answer better.
    disliked = [
        _conversation(r["prompt"])
        for r in _read_rows(dataset_dir / "kto_eval.parquet")
        if not r.get("label")
    ]
    prompts = [p.prompt for p in pairs] + [p.prompt for p in extra] + disliked
    return EvalData(pairs, preferred, _distinct(prompts)[:max_samples])


def load_general_set() -> tuple[PromptAnswer, ...]:
    """The fixed general-skills set shipped with flywheel (English and Chinese)."""
    text = resources.files("eval").joinpath(GENERAL_SET).read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return tuple(
        PromptAnswer(({"role": "user", "content": r["prompt"]},), r["answer"]) for r in rows
    )


def answer_logprobs(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[Message]],
    answers: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int = 512,
    advance: Callable[[int], None] | None = None,
) -> list[tuple[float, int]]:
    """Summed log-probability of each answer given its prompt, and its number of tokens.

    The prompt is rendered with the tokenizer's chat template (generation
    prompt added), the answer's tokens and the end-of-sequence token follow;
    only the answer's tokens (eos included) are scored. Sequences longer than
    ``max_length`` lose prompt tokens from the left; an answer longer than the
    window keeps its first tokens. ``advance(n)`` is called after each batch.
    """
    import torch

    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    if max_length < 2:
        raise ValueError("max_length must leave room for one prompt and one answer token")
    encoded = [
        _encode(tokenizer, prompt, answer, max_length)
        for prompt, answer in zip(prompts, answers, strict=True)
    ]
    # Longest first so each batch pads little; results go back in input order.
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][0]))
    results: list[tuple[float, int]] = [(0.0, 0)] * len(encoded)
    device = _device(model)
    pad = _pad_id(tokenizer)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            sums = _score_batch(model, [encoded[i] for i in chunk], pad, device)
            for i, total in zip(chunk, sums, strict=True):
                results[i] = (total, encoded[i][1])
            if advance is not None:
                advance(len(chunk))
    return results


def preference_margins(
    chosen: Sequence[tuple[float, int]], rejected: Sequence[tuple[float, int]]
) -> list[float]:
    """Per pair, the chosen answer's mean log-probability per token minus the rejected one's."""
    if len(chosen) != len(rejected):
        raise ValueError(f"{len(chosen)} chosen scores but {len(rejected)} rejected")
    return [_per_token(c) - _per_token(r) for c, r in zip(chosen, rejected, strict=True)]


def pair_wins(
    chosen: Sequence[tuple[float, int]], rejected: Sequence[tuple[float, int]]
) -> tuple[bool, ...]:
    """Per pair, whether the chosen answer scored above the rejected one (a tie is a loss)."""
    return tuple(margin > 0 for margin in preference_margins(chosen, rejected))


def preference_metrics(
    chosen: Sequence[tuple[float, int]], rejected: Sequence[tuple[float, int]]
) -> tuple[float | None, float | None]:
    """Preference accuracy and mean margin from per-pair scores (``None`` without pairs).

    Both compare mean log-probability per token; a tie counts as not preferred.
    """
    margins = preference_margins(chosen, rejected)
    if not margins:
        return None, None
    accuracy = sum(m > 0 for m in margins) / len(margins)
    return accuracy, sum(margins) / len(margins)


def mean_token_loss(scores: Iterable[tuple[float, int]]) -> float | None:
    """Token-weighted mean negative log-likelihood (``None`` when nothing was scored)."""
    total, tokens = 0.0, 0
    for logprob, count in scores:
        total += logprob
        tokens += count
    return -total / tokens if tokens else None


def is_refusal(answer: str) -> bool:
    """Whether an answer reads as a refusal or an "as an AI" deflection (English or Chinese)."""
    return _REFUSAL.search(answer) is not None


def check_generations(
    prompts: Sequence[str],
    answers: Sequence[str],
    *,
    canaries: Sequence[str] = (),
    pii_detector: PiiDetector | None = None,
    counted_pii: Collection[str] | None = None,
    trained_on: TrainedOn | None = None,
) -> tuple[GenerationSample, ...]:
    """What the refusal, PII and canary checks see in each generated answer. Every piece of
    PII found is masked (``<PHONE_NUMBER>``: the samples reach MLflow and the page); those of
    the ``counted_pii`` types (None: every type) count against the answer. With
    ``trained_on`` (whether the model's training answers hold a value), the counted values
    they do not hold are also named invented (``pii_invented``); raw values go no further."""
    found_pii = pii_detector(list(answers)) if pii_detector else [[] for _ in answers]
    if len(found_pii) != len(answers):
        raise ValueError(f"the PII detector answered {len(found_pii)} texts for {len(answers)}")
    samples = []
    for prompt, answer, pii in zip(prompts, answers, found_pii, strict=True):
        counted = [span for span in pii if counted_pii is None or span[0] in counted_pii]
        invented = (
            tuple(kind for kind, start, stop in counted if not trained_on(answer[start:stop]))
            if trained_on is not None
            else ()
        )
        samples.append(
            GenerationSample(
                prompt=prompt,
                answer=masked(answer, pii),
                refused=is_refusal(answer),
                pii_found=tuple(kind for kind, _, _ in counted),
                canaries_found=tuple(c for c in canaries if c and c in answer),
                pii_invented=invented,
            )
        )
    return tuple(samples)


def _comparable(text: str) -> str:
    """Letters and digits only, lower case: "4111 1111-1111 1111" holds as "4111111111111111"."""
    return "".join(ch for ch in text.lower() if ch.isalnum())


def training_answers_hold(dataset_dir: Path) -> TrainedOn:
    """Whether any answer of the dataset's training split (SFT completions, DPO chosen and
    rejected, KTO completions) holds a value, compared on letters and digits alone: a PII
    value a model generates that its training answers hold may have been learnt from them
    (a value the scrubbing missed), one they do not hold the model made up."""
    texts = [
        _reply(row[column])
        for name, columns in (
            ("sft_train.parquet", ("completion",)),
            ("dpo_train.parquet", ("chosen", "rejected")),
            ("kto_train.parquet", ("completion",)),
        )
        for row in _read_rows(dataset_dir / name)
        for column in columns
        if row.get(column)
    ]
    held = "\n".join(_comparable(text) for text in texts)

    def holds(value: str) -> bool:
        wanted = _comparable(value)
        # A value with nothing comparable left cannot be told apart: counted as held.
        return not wanted or wanted in held

    return holds


def masked(text: str, spans: Collection[PiiSpan]) -> str:
    """``text`` with each span replaced by its entity type in angle brackets (pure); of
    overlapping spans the one starting first (the longer on a tie) is masked, and a span
    outside the text is left out."""
    kept: list[PiiSpan] = []
    for span in sorted(spans, key=lambda s: (s[1], s[1] - s[2])):
        _, start, stop = span
        if 0 <= start < stop <= len(text) and (not kept or start >= kept[-1][2]):
            kept.append(span)
    out, position = [], 0
    for kind, start, stop in kept:
        out += [text[position:start], f"<{kind}>"]
        position = stop
    out.append(text[position:])
    return "".join(out)


def pii_detector_for(scrubber: Any) -> PiiDetector:
    """Adapt a :class:`feedback.pii.Scrubber` (anything whose ``detect`` returns
    results with ``entity_type``, ``start`` and ``end``) to the detector
    :func:`evaluate_model` takes."""

    def detect(texts: list[str]) -> list[list[PiiSpan]]:
        return [
            [(r.entity_type, r.start, r.end) for r in found] for found in scrubber.detect(texts)
        ]

    return detect


def generate_answers(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[Message]],
    *,
    max_new_tokens: int = 64,
    batch_size: int = 8,
) -> list[str]:
    """Greedy answers to chat prompts (left-padded batches), special tokens stripped."""
    import torch
    from transformers import GenerationConfig

    device = _device(model)
    pad = _pad_id(tokenizer)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    config = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=eos if eos is not None else tokenizer.eos_token_id,
    )
    encoded = [_prompt_ids(tokenizer, prompt) for prompt in prompts]
    answers: list[str] = []
    with torch.inference_mode():
        for start in range(0, len(encoded), batch_size):
            batch = encoded[start : start + batch_size]
            width = max(len(ids) for ids in batch)
            ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch], device=device)
            mask = torch.tensor(
                [[0] * (width - len(x)) + [1] * len(x) for x in batch], device=device
            )
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            for row in out[:, width:]:
                answers.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    return answers


def evaluate_model(
    model: Any,
    tokenizer: Any,
    data: EvalData,
    *,
    name: str,
    general_set: Sequence[PromptAnswer] | None = None,
    canaries: Sequence[str] = (),
    pii_detector: PiiDetector | None = None,
    counted_pii: Collection[str] | None = None,
    trained_on: TrainedOn | None = None,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    max_length: int = 512,
    mixed_precision: bool = False,
) -> EvalReport:
    """Every offline metric of one model on one line's held-out data.

    ``general_set`` defaults to :func:`load_general_set`. ``pii_detector`` maps
    texts to the PII found in each (``None`` skips the check): all of it is masked in the
    samples, the ``counted_pii`` types (None: all) count as PII in generations, and with
    ``trained_on`` those no training answer holds are named invented (see
    :func:`check_generations`).
    The model is put in eval mode for the run and restored afterwards.
    ``mixed_precision`` runs the forward passes under bfloat16 autocast (several
    times faster on CPUs with native bfloat16; both models of a comparison
    must be scored the same way).
    """
    import torch

    general = tuple(general_set) if general_set is not None else load_general_set()
    if not general:
        raise FlywheelError("the general set is empty; general_loss needs at least one item")
    torch.manual_seed(GENERATION_SEED)
    was_training = model.training
    model.eval()
    device_type = _device(model).type
    try:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=mixed_precision):
            items = _unique_items(data, general)
            scores: dict[tuple[str, str], tuple[float, int]] = {}
            with progress_bar(f"scoring {name}", total=len(items)) as advance:
                scored = answer_logprobs(
                    model,
                    tokenizer,
                    [list(prompt) for prompt, _ in items],
                    [answer for _, answer in items],
                    batch_size=batch_size,
                    max_length=max_length,
                    advance=advance,
                )
            for (prompt, answer), score in zip(items, scored, strict=True):
                scores[_key(prompt, answer)] = score
            answers = generate_answers(
                model,
                tokenizer,
                [list(p) for p in data.sample_prompts],
                max_new_tokens=max_new_tokens,
                batch_size=batch_size,
            )
    finally:
        model.train(was_training)

    chosen = [scores[_key(p.prompt, p.chosen)] for p in data.pairs]
    rejected = [scores[_key(p.prompt, p.rejected)] for p in data.pairs]
    accuracy, margin = preference_metrics(chosen, rejected)
    general_loss = mean_token_loss(scores[_key(g.prompt, g.answer)] for g in general)
    assert general_loss is not None  # every answer has at least its eos token
    samples = check_generations(
        [_last_user_text(p) for p in data.sample_prompts],
        answers,
        canaries=canaries,
        pii_detector=pii_detector,
        counted_pii=counted_pii,
        trained_on=trained_on,
    )
    return EvalReport(
        model=name,
        pairs=len(data.pairs),
        preference_accuracy=accuracy,
        mean_margin=margin,
        preferred_loss=mean_token_loss(scores[_key(p.prompt, p.answer)] for p in data.preferred),
        general_loss=general_loss,
        refusal_rate=sum(s.refused for s in samples) / len(samples) if samples else 0.0,
        mean_answer_length=sum(len(a) for a in answers) / len(answers) if answers else 0.0,
        pii_in_generations=sum(len(s.pii_found) for s in samples),
        canaries_in_generations=len({c for s in samples for c in s.canaries_found}),
        samples=samples,
        pair_wins=pair_wins(chosen, rejected),
    )


def general_set_loss(
    model: Any,
    tokenizer: Any,
    *,
    name: str,
    general_set: Sequence[PromptAnswer] | None = None,
    batch_size: int = 8,
    max_length: int = 512,
    mixed_precision: bool = False,
) -> float:
    """A model's token-weighted loss on the general set alone (what :func:`evaluate_model`
    reports as ``general_loss``), e.g. the base model's, for the gate's drift bound."""
    import torch

    general = tuple(general_set) if general_set is not None else load_general_set()
    if not general:
        raise FlywheelError("the general set is empty; general_loss needs at least one item")
    was_training = model.training
    model.eval()
    try:
        with (
            torch.autocast(_device(model).type, dtype=torch.bfloat16, enabled=mixed_precision),
            progress_bar(f"scoring {name} on the general set", total=len(general)) as advance,
        ):
            scored = answer_logprobs(
                model,
                tokenizer,
                [list(g.prompt) for g in general],
                [g.answer for g in general],
                batch_size=batch_size,
                max_length=max_length,
                advance=advance,
            )
    finally:
        model.train(was_training)
    loss = mean_token_loss(scored)
    assert loss is not None  # every answer has at least its eos token
    return loss


def load_for_eval(
    base_model_dir: Path,
    adapter_dir: Path | None = None,
    *,
    device: str | None = None,
    precision: Precision = "auto",
) -> tuple[Any, Any]:
    """A model (base, or base + LoRA adapter) and its tokenizer, in eval mode, from local folders.

    Loaded by training's loader (:func:`training.loader.load_model`) in the dtype a training of
    ``precision`` uses on the same device (:func:`flywheel.hardware.number_format`): float32 on
    the CPU; on CUDA bfloat16, or float16 on a GPU without it. A recipe trained in 4 bits is
    still scored on the unquantized base model, as vLLM serves it. The tokenizer comes from the
    adapter folder when it holds one, else the base.
    """
    from training.loader import load_model, load_tokenizer

    accelerator = detect_accelerator(device)
    model = load_model(
        base_model_dir,
        accelerator=accelerator,
        numbers=number_format(precision, accelerator),
        adapter_dir=adapter_dir,
    )
    model.eval()
    return model, load_tokenizer(base_model_dir, adapter_dir)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def _conversation(messages: Sequence[dict[str, Any]]) -> Conversation:
    return tuple({"role": str(m["role"]), "content": str(m["content"])} for m in messages)


def _reply(messages: Sequence[dict[str, Any]]) -> str:
    """The text of a one-message assistant column (trl's conversational format)."""
    return str(messages[-1]["content"]) if messages else ""


def _distinct(prompts: Iterable[Conversation]) -> tuple[Conversation, ...]:
    seen: set[str] = set()
    kept: list[Conversation] = []
    for prompt in prompts:
        key = json.dumps(prompt, ensure_ascii=False, sort_keys=True)
        if key not in seen:
            seen.add(key)
            kept.append(prompt)
    return tuple(kept)


def _key(prompt: Sequence[Message], answer: str) -> tuple[str, str]:
    return json.dumps(list(prompt), ensure_ascii=False, sort_keys=True), answer


def _unique_items(
    data: EvalData, general: Sequence[PromptAnswer]
) -> list[tuple[Conversation, str]]:
    """Each distinct (prompt, answer) once: a pair's chosen answer is also a preferred one."""
    candidates: list[tuple[Conversation, str]] = []
    for pair in data.pairs:
        candidates += [(pair.prompt, pair.chosen), (pair.prompt, pair.rejected)]
    candidates += [(p.prompt, p.answer) for p in data.preferred]
    candidates += [(g.prompt, g.answer) for g in general]
    unique: dict[tuple[str, str], tuple[Conversation, str]] = {}
    for prompt, answer in candidates:
        unique.setdefault(_key(prompt, answer), (prompt, answer))
    return list(unique.values())


def _last_user_text(prompt: Conversation) -> str:
    """The prompt's newest user message; without one its last message."""
    if any(message["role"] == "user" for message in prompt):
        return last_user_text(list(prompt))
    return message_text(prompt[-1]["content"]) if prompt else ""


def _per_token(score: tuple[float, int]) -> float:
    logprob, count = score
    return logprob / count if count else -math.inf


def _prompt_ids(tokenizer: Any, prompt: Sequence[Message]) -> list[int]:
    text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    # The template already writes any begin-of-sequence token itself.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _encode(
    tokenizer: Any, prompt: Sequence[Message], answer: str, max_length: int
) -> tuple[list[int], int]:
    """Prompt + answer + eos ids cut to ``max_length``, and how many trailing ids are the answer."""
    prompt_ids = _prompt_ids(tokenizer, prompt)
    if not prompt_ids:
        raise ValueError("the chat template rendered an empty prompt")
    answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        answer_ids.append(tokenizer.eos_token_id)
    answer_ids = answer_ids[: max_length - 1]
    prompt_ids = prompt_ids[-(max_length - len(answer_ids)) :]
    return prompt_ids + answer_ids, len(answer_ids)


def left_padded(
    batch: Sequence[tuple[list[int], int]], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of encoded conversations (:func:`_encode`) padded on the left: input ids,
    attention mask, and position ids that start at 0 on each row's first real token."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([[pad] * (width - len(x)) + x for x, _ in batch], device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x, _ in batch], device=device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _score_batch(
    model: Any, batch: Sequence[tuple[list[int], int]], pad: int, device: torch.device
) -> list[float]:
    """Summed answer log-probabilities of one left-padded batch."""
    import torch

    ids, mask, positions = left_padded(batch, pad, device)
    width = ids.shape[1]
    # Left padding puts every answer at the end, so only the last logits are needed:
    # a (batch, keep, vocab) tensor instead of (batch, width, vocab).
    keep = max(n for _, n in batch) + 1
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep)
    logits = out.logits[:, -keep:-1].float()
    targets = ids[:, width - keep + 1 :]
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    slot = torch.arange(keep - 1, device=device)
    answer_len = torch.tensor([n for _, n in batch], device=device)
    is_answer = slot.unsqueeze(0) >= (keep - 1 - answer_len).unsqueeze(1)
    return torch.where(is_answer, logprobs, 0.0).sum(-1).tolist()


def _device(model: Any) -> torch.device:
    device: torch.device = next(model.parameters()).device
    return device


def _pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0
