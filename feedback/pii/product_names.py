"""Product and model names that are never a person: "I'm SmolLM2, created by Hugging Face".

A model that names itself, its maker or the product it serves in an answer must not
have that name scrubbed: a training answer would then teach ``<PERSON_1>``. The names
come from three places: a small built-in list of well-known model families and their
makers, the scrubber's settings (``FLYWHEEL_SCRUBBER_PRODUCT_NAMES``), and the
deployment's own names (the served base model, the business lines: see
:func:`deployment_names`). A name matches whole, in any case, with a version or size
written after it ("SmolLM2-135M-Instruct", "Llama 3.1 8B", "Qwen2.5").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from presidio_analyzer import RecognizerResult

if TYPE_CHECKING:
    from flywheel.settings import Settings

BUILT_IN_PRODUCT_NAMES: tuple[str, ...] = (
    # Model families. Left out on purpose: those named like people ("Claude", "Gemma",
    # "Ernie", "Kimi", "Yi"), which a deployment serving one adds to its product names.
    "SmolLM",
    "Llama",
    "Qwen",
    "Mistral",
    "Mixtral",
    "Phi",
    "GPT",
    "ChatGPT",
    "Gemini",
    "DeepSeek",
    "Falcon",
    "Vicuna",
    "Alpaca",
    "Baichuan",
    "ChatGLM",
    "GLM",
    "InternLM",
    "Grok",
    "Copilot",
    "OLMo",
    "StarCoder",
    "CodeLlama",
    "TinyLlama",
    "Zephyr",
    "Hermes",
    "通义千问",
    "千问",
    "文心一言",
    "豆包",
    "智谱清言",
    "讯飞星火",
    "混元",
    # Their makers, which a model names when it introduces itself.
    "Hugging Face",
    "HuggingFace",
    "Meta",
    "Meta AI",
    "OpenAI",
    "Anthropic",
    "Google",
    "Google DeepMind",
    "DeepMind",
    "Microsoft",
    "Alibaba",
    "Alibaba Cloud",
    "Mistral AI",
    "NVIDIA",
    "Baidu",
    "Tencent",
    "Zhipu",
    "阿里云",
    "阿里巴巴",
    "百度",
    "腾讯",
    "字节跳动",
)
"""Well-known model families and makers (English and Chinese), never scrubbed as a person."""

_HAN = re.compile(r"[\u3400-\u9fff]")
_VERSION = r"(?:[-\s]?v?\d+(?:\.\d+)*[a-z]?|-[A-Za-z0-9.]+)*"
"""What may follow a model's name: "2", "2.5", " 3.1", "-135M", "-7B-Instruct", "v0.2"."""
_SEPARATORS = re.compile(r"[\s_-]+")
_FAMILY = re.compile(r"^([A-Za-z][A-Za-z]*?[A-Za-z])(?:[-_.]?v?\d[\w.]*)?$")


def model_name_forms(identifier: str) -> set[str]:
    """The names a served model's identifier gives: its last path part and the family
    before its first separator, without the version ("Qwen/Qwen2.5-7B-Instruct" ->
    "Qwen2.5-7B-Instruct", "Qwen2.5", "Qwen"); none for an empty identifier."""
    name = identifier.strip().rstrip("/").rsplit("/", 1)[-1].strip()
    if not name:
        return set()
    forms = {name}
    first = _SEPARATORS.split(name)[0]
    if first:
        forms.add(first)
        family = _FAMILY.match(first)
        if family:
            forms.add(family.group(1))
    return {form for form in forms if len(form) >= 2}


def deployment_names(settings: Settings) -> tuple[str, ...]:
    """Product names a deployment's settings give: the scrubber's ``product_names``, the
    served base model's (``FLYWHEEL_GATEWAY_BASE_MODEL_NAME``, the base model folder's
    name) and the business lines' names, each as written and with ``_`` as a space."""
    names: list[str] = list(settings.scrubber.product_names)
    for identifier in (settings.gateway.base_model_name, settings.base_model):
        if identifier:
            names.extend(sorted(model_name_forms(str(identifier))))
    for line in settings.business_lines:
        names.append(line)
        if "_" in line or "-" in line:
            names.append(_SEPARATORS.sub(" ", line))
    return tuple(dict.fromkeys(names))


class ProductNames:
    """Where product and model names stand in a text, and person spans without them."""

    def __init__(self, names: Iterable[str]) -> None:
        cleaned = sorted({" ".join(n.split()) for n in names if n.strip()}, key=len, reverse=True)
        self.names = tuple(cleaned)
        latin = [n for n in cleaned if not _HAN.search(n)]
        han = [n for n in cleaned if _HAN.search(n)]
        patterns = []
        if latin:
            alternatives = "|".join(_spaced(name) for name in latin)
            patterns.append(f"(?<![A-Za-z0-9])(?:{alternatives}){_VERSION}(?![A-Za-z0-9])")
        if han:
            patterns.append("|".join(re.escape(name) for name in han))
        self._pattern = re.compile("|".join(patterns), re.IGNORECASE) if patterns else None

    def spans(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` of every product name in ``text``."""
        if self._pattern is None:
            return []
        return [m.span() for m in self._pattern.finditer(text) if m.end() > m.start()]

    def is_product(self, value: str) -> bool:
        """True when ``value`` is one product name, whole."""
        return self._pattern is not None and self._pattern.fullmatch(value.strip()) is not None

    def without_products(
        self, text: str, results: Sequence[RecognizerResult]
    ) -> list[RecognizerResult]:
        """``results`` with the product names taken out of every person span: a span that
        was only a product name goes; what is left of one around it stays if it still
        holds a name-like part (two letters, or a Han character)."""
        spans = self.spans(text) if any(r.entity_type == "PERSON" for r in results) else []
        if not spans:
            return list(results)
        kept: list[RecognizerResult] = []
        for result in results:
            if result.entity_type != "PERSON" or not any(
                start < result.end and result.start < end for start, end in spans
            ):
                kept.append(result)
                continue
            for piece in _outside(result.start, result.end, spans):
                start, end = _trimmed(text, *piece)
                if _name_like(text[start:end]):
                    kept.append(RecognizerResult(result.entity_type, start, end, result.score))
        return kept


def _spaced(name: str) -> str:
    """A name's pattern: each space matches any run of spaces, hyphens or none at all."""
    return r"[\s-]?".join(re.escape(part) for part in name.split(" "))


def _outside(start: int, end: int, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pieces of ``[start, end)`` that no span covers."""
    pieces = [(start, end)]
    for cut_start, cut_end in spans:
        next_pieces = []
        for piece_start, piece_end in pieces:
            if cut_end <= piece_start or piece_end <= cut_start:
                next_pieces.append((piece_start, piece_end))
                continue
            if piece_start < cut_start:
                next_pieces.append((piece_start, cut_start))
            if cut_end < piece_end:
                next_pieces.append((cut_end, piece_end))
        pieces = next_pieces
    return pieces


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and not (text[start].isalnum()):
        start += 1
    while end > start and not (text[end - 1].isalnum()):
        end -= 1
    return start, end


def _name_like(value: str) -> bool:
    return bool(_HAN.search(value)) or sum(ch.isalpha() for ch in value) >= 2
