"""A line's satisfaction model: from an answer alone, the chance its user was satisfied.

Small and fast on the CPU: the base model reads the conversation and the answer
once (no gradient), the answer tokens' last hidden states are averaged, and a
ridge-penalised logistic head on those features is fitted by Newton's method.
It learns from the line's labelled answers, the dataset the nightly already
built (scrubbed, deduplicated, with lineage):

- an SFT target (an edit, an approved answer): satisfied;
- a DPO pair: the chosen answer satisfied, the rejected one not (an edit is a
  positive for the edited text and a negative for the original);
- a KTO label: as labelled.

Each example keeps the dataset's weight (signal strength, recency). The model
is saved as one ``.npz`` (the head, the features' scaling, the base model it
reads with), so scoring needs the same base model and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from feedback.examples import CORRECTION_RULE, MODEL_RULE_PREFIX
from feedback.label_precision import REVIEW_RULE_PREFIX

Message = dict[str, str]
FEATURES = "mean of the answer tokens' last hidden states"
# Answers whose features a reader keeps (about 4.6 KB each for a 576-wide base model). The base
# model's forward passes are the satisfaction model's whole cost, and the same answers come back:
# each night rereads its window's labelled answers, a canary look rereads the day's, the night
# scores the silent answers the looks scored. In memory, for the process's life only: never
# written, so retention and forget have nothing more to reach.
FEATURE_CACHE_ROWS = 20_000


@dataclass(frozen=True, slots=True)
class LabelledAnswer:
    """One answer with its user's verdict (1 satisfied), the example's weight and rule."""

    prompt: tuple[Message, ...]
    answer: str
    label: int
    weight: float
    rule: str


def _reply(messages: Any) -> str:
    return str(messages[-1]["content"]) if messages else ""


def _prompt(messages: Any) -> tuple[Message, ...]:
    return tuple({"role": str(m["role"]), "content": str(m["content"])} for m in messages)


def labelled_answers(rows_by_kind: Mapping[str, Sequence[dict[str, Any]]]) -> list[LabelledAnswer]:
    """The labelled answers in a dataset's rows (trl's conversational format), each distinct
    (prompt, answer) once; an answer labelled both ways is dropped, and so are the labels a
    satisfaction model gave (the judge never learns from its own verdicts) and reviewers'
    verdicts and corrections (the random sample that rectifies the judge's estimates online
    must not be what it was fitted to)."""
    seen: dict[tuple[str, str], LabelledAnswer | None] = {}
    unused = (MODEL_RULE_PREFIX, REVIEW_RULE_PREFIX, CORRECTION_RULE)
    rows_by_kind = {
        kind: [r for r in rows if not str(r.get("rule", "")).startswith(unused)]
        for kind, rows in rows_by_kind.items()
    }

    def add(prompt: tuple[Message, ...], answer: str, label: int, weight: float, rule: str) -> None:
        if not answer.strip():
            return
        key = (json.dumps(prompt, sort_keys=True, ensure_ascii=False), answer)
        if key in seen:
            before = seen[key]
            if before is None or before.label != label:
                seen[key] = None
            return
        seen[key] = LabelledAnswer(prompt, answer, label, weight, rule)

    for row in rows_by_kind.get("sft", ()):
        add(
            _prompt(row["prompt"]),
            _reply(row["completion"]),
            1,
            _weight(row),
            f"sft:{row.get('rule', '')}",
        )
    for row in rows_by_kind.get("dpo", ()):
        prompt = _prompt(row["prompt"])
        rule = f"dpo:{row.get('rule', '')}"
        add(prompt, _reply(row["chosen"]), 1, _weight(row), rule)
        add(prompt, _reply(row["rejected"]), 0, _weight(row), rule)
    for row in rows_by_kind.get("kto", ()):
        label = int(bool(row["label"]))
        add(
            _prompt(row["prompt"]),
            _reply(row["completion"]),
            label,
            _weight(row),
            f"kto:{row.get('rule', '')}",
        )
    return [answer for answer in seen.values() if answer is not None]


def _weight(row: dict[str, Any]) -> float:
    weight = row.get("weight")
    return float(weight) if isinstance(weight, int | float) and weight > 0 else 1.0


def read_dataset_rows(dataset_dir: Path, split: str) -> dict[str, list[dict[str, Any]]]:
    """A dataset folder's rows of ``split`` by kind."""
    import pyarrow.parquet as pq

    rows: dict[str, list[dict[str, Any]]] = {}
    for kind in ("sft", "dpo", "kto"):
        path = dataset_dir / f"{kind}_{split}.parquet"
        rows[kind] = pq.read_table(path).to_pylist() if path.exists() else []
    return rows


class AnswerReader:
    """The base model reading conversations: each answer's features (no gradient), the most
    recent :data:`FEATURE_CACHE_ROWS` kept by the tokens read."""

    def __init__(
        self,
        base_model_dir: Path,
        *,
        max_length: int = 384,
        batch_size: int = 16,
        cache_rows: int = FEATURE_CACHE_ROWS,
    ) -> None:
        from eval.offline import load_for_eval

        self.model, self.tokenizer = load_for_eval(base_model_dir)
        self.base_model = base_model_dir.name
        self.max_length = max_length
        self.batch_size = batch_size
        self.cache_rows = cache_rows
        self._cache: OrderedDict[bytes, npt.NDArray[np.float64]] = OrderedDict()
        self.forward_rows = 0

    def features(
        self,
        items: Sequence[tuple[Sequence[Message], str]],
        on_batch: Callable[[int], None] | None = None,
    ) -> npt.NDArray[np.float64]:
        """One row of features per (prompt, answer): the answer tokens' mean last hidden state.
        Rows of token sequences read before come from the cache; the rest are read in batches
        (``on_batch`` hears how many rows each batch, and the cache, gave)."""
        from eval.offline import _encode

        encoded = [
            _encode(self.tokenizer, prompt, answer, self.max_length) for prompt, answer in items
        ]
        keys = [_tokens_key(ids, answer_length) for ids, answer_length in encoded]
        rows: dict[bytes, npt.NDArray[np.float64]] = {}
        for key in keys:
            if key in self._cache:
                self._cache.move_to_end(key)
                rows[key] = self._cache[key]
        if rows and on_batch is not None:
            on_batch(sum(key in rows for key in keys))
        unread = {key: each for key, each in zip(keys, encoded, strict=True) if key not in rows}
        for key, row in zip(unread, self._read(list(unread.values()), on_batch), strict=True):
            rows[key] = row
            self._cache[key] = row
        while len(self._cache) > self.cache_rows:
            self._cache.popitem(last=False)
        if not keys:
            return np.zeros((0, 0))
        return np.stack([rows[key] for key in keys])

    def _read(
        self,
        encoded: Sequence[tuple[list[int], int]],
        on_batch: Callable[[int], None] | None,
    ) -> list[npt.NDArray[np.float64]]:
        """The base model's features of encoded conversations, a batch at a time."""
        import torch

        from eval.offline import _device, _pad_id, left_padded

        rows: list[npt.NDArray[np.float64]] = []
        pad, device = _pad_id(self.tokenizer), _device(self.model)
        for start in range(0, len(encoded), self.batch_size):
            batch = encoded[start : start + self.batch_size]
            input_ids, attention, positions = left_padded(batch, pad, device)
            width = input_ids.shape[1]
            # Left padding puts each answer's tokens at the end of its row.
            is_answer = torch.arange(width, device=device).unsqueeze(0) >= (
                width - torch.tensor([n for _, n in batch], device=device)
            ).unsqueeze(1)
            with torch.no_grad():
                out = self.model(
                    input_ids=input_ids,
                    attention_mask=attention,
                    position_ids=positions,
                    output_hidden_states=True,
                )
            hidden = out.hidden_states[-1].float()
            weights = is_answer.unsqueeze(-1).float()
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
            rows.extend(pooled.cpu().numpy().astype(np.float64))
            self.forward_rows += len(batch)
            if on_batch is not None:
                on_batch(len(batch))
        return rows


def _tokens_key(ids: Sequence[int], answer_length: int) -> bytes:
    """What a row of features depends on besides the model: the ids read and which are the
    answer's (a digest, so the cache holds no text)."""
    digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16)
    digest.update(answer_length.to_bytes(4, "little"))
    return digest.digest()


def fit_logistic(
    features: npt.ArrayLike,
    labels: npt.ArrayLike,
    weights: npt.ArrayLike | None = None,
    *,
    l2: float = 1.0,
    iterations: int = 50,
) -> tuple[npt.NDArray[np.float64], float]:
    """A ridge-penalised logistic regression by Newton's method: (coefficients, intercept).

    ``weights`` as given (1: an ordinary example); the penalty ``l2`` is on the coefficients'
    squares, not the intercept's."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    design = np.hstack([x, np.ones((len(x), 1))])
    penalty = np.full(design.shape[1], l2)
    penalty[-1] = 0.0
    beta = np.zeros(design.shape[1])
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-np.clip(design @ beta, -30, 30)))
        gradient = design.T @ (w * (p - y)) + penalty * beta
        hessian = (design * (w * p * (1 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return beta[:-1], float(beta[-1])


@dataclass(frozen=True)
class SatisfactionModel:
    """A fitted head over standardised features, and the base model that makes them."""

    base_model: str
    mean: npt.NDArray[np.float64]
    scale: npt.NDArray[np.float64]
    coefficients: npt.NDArray[np.float64]
    intercept: float

    @classmethod
    def fit(
        cls,
        base_model: str,
        features: npt.ArrayLike,
        labels: Sequence[int],
        weights: Sequence[float] | None = None,
        *,
        l2: float = 1.0,
    ) -> SatisfactionModel:
        """Standardise the features and fit the head."""
        x = np.asarray(features, dtype=np.float64)
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale = np.where(scale > 1e-9, scale, 1.0)
        coefficients, intercept = fit_logistic((x - mean) / scale, labels, weights, l2=l2)
        return cls(base_model, mean, scale, coefficients, intercept)

    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The predicted probability that each answer satisfied its user."""
        x = (np.asarray(features, dtype=np.float64) - self.mean) / self.scale
        logits = np.clip(x @ self.coefficients + self.intercept, -30, 30)
        return np.asarray(1 / (1 + np.exp(-logits)), dtype=np.float64)

    def save(self, path: Path) -> Path:
        """Write the model as one ``.npz``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as sink:
            np.savez(
                sink,
                mean=self.mean,
                scale=self.scale,
                coefficients=self.coefficients,
                intercept=np.array([self.intercept]),
                meta=np.array([json.dumps({"base_model": self.base_model, "features": FEATURES})]),
            )
        return path

    @classmethod
    def load(cls, path: Path) -> SatisfactionModel:
        """Read a model :meth:`save` wrote."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"][0]))
            return cls(
                meta["base_model"],
                data["mean"],
                data["scale"],
                data["coefficients"],
                float(data["intercept"][0]),
            )
