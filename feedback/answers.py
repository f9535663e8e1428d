"""What an answer says about itself, without a user: refusals and output length (pure).

The canary and the shadow comparison watch how often an adapter refuses and how
long it answers: a candidate that learned to refuse ("I'm sorry, but I can't
help with that") or to ramble is worse in a way thumbs are slow to show.

A refusal is recognised from the answer's opening (the first
``REFUSAL_WINDOW`` characters), where assistants state one, in English and
Chinese: a first-person "cannot / will not / am not able to" followed by a verb
of helping, an apology followed by one, or "as an AI ... I cannot". An answer
that helps first and mentions a limit later is not a refusal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REFUSAL_WINDOW = 240

_HELP_VERBS = (
    r"(?:help|assist|answer|provide|give|share|offer|comply|fulfil+|do (?:that|this)|"
    r"discuss|support|advise|recommend|respond|complete|process|continue|engage|tell)"
)
_ENGLISH = re.compile(
    r"(?:^|[.!?]\s+|,\s*)"
    r"(?:(?:i'?m|i am) (?:so |very |really )?sorry,? (?:but )?|unfortunately,? |"
    r"as an ai(?: language model| assistant| model)?,? )?"
    r"(?:i (?:can(?:no|')t|can not|won'?t|will not|must decline|(?:do not|don'?t) "
    r"(?:feel comfortable|think i (?:can|should)))|"
    r"(?:i'?m|i am) (?:not able|unable|not allowed|not permitted|not in a position) to)"
    r"(?: (?:really|currently|personally|legally|directly|further|safely|actually))?"
    rf"(?: {_HELP_VERBS}\b|$|[.,!])",
    re.IGNORECASE,
)
_CHINESE = re.compile(
    r"(?:抱歉|对不起|很遗憾|作为(?:一个)?(?:AI|人工智能)(?:语言模型|助手|模型)?)?[，,、\s]*"
    r"(?:我|本助手)?(?:不能|无法|不便|不可以|恕难|没办法|拒绝)"
    r"(?:为您|为你|帮您|帮你|向您|向你)?(?:提供|回答|帮助|协助|处理|满足|完成|讨论|透露|给出)",
)


def is_refusal(text: str) -> bool:
    """Whether ``text`` opens by declining to help (English or Chinese)."""
    opening = text.strip()[:REFUSAL_WINDOW]
    if not opening:
        return False
    return bool(_ENGLISH.search(opening) or _CHINESE.search(opening))


def output_tokens(usage: Mapping[str, Any] | None, text: str) -> int:
    """Tokens the model generated: vLLM's usage when it reported one, else an estimate of
    four characters a token (never 0 for a non-empty answer)."""
    if isinstance(usage, Mapping):
        count = usage.get("completion_tokens")
        if isinstance(count, int) and count >= 0:
            return count
    return (len(text) + 3) // 4


def time_per_output_token_ms(
    latency_ms: float | None, ttft_ms: float | None, tokens: int
) -> float | None:
    """Mean time between output tokens after the first (TPOT, vLLM's definition); None
    without two tokens or either time."""
    if latency_ms is None or ttft_ms is None or tokens < 2:
        return None
    return max(0.0, latency_ms - ttft_ms) / (tokens - 1)
