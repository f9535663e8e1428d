"""What one user and one API key may move (pure): a training set, a canary's or an
experiment's look.

Users are not requests: a few hyperactive users, or one key posting as many invented
users, must not decide what an adapter learns or whether a canary is promoted. Every
contribution has an *owner*, the user it came from, and a *key*, the API key its request
came with (by name; the store's ``interactions.key_name``).

- A training set keeps each owner's newest examples up to a share of the set (a key's
  anonymous examples are one owner), then each key's up to its own share
  (``feedback.datasets.cap_contributions``).
- A look counts, per arm, each owner's first ``per_user`` answers in its window, then each
  key's first answers up to ``key_share`` of the arm's counted answers
  (:func:`counted_requests`). Both keep the *earliest* answers, so what a look counts only
  grows from one look to the next, as the canary's anytime-valid tests assume.

Either share is at least ``1 / keys``: a key alone on a line (an application serving all
its users through one key) holds what it holds, and two keys can each hold half. What
one key can move against another is bounded; what a line's only key sends is trusted to
name its users, and the gateway tells no caller which arm answered, so no key can aim its
users or feedback at the canary. A key is its name: a client whose secret is replaced
(``flywheel gateway rotate-key``) stays one key; one given a second key under a new name
is two, and its older key's answers in a look's window bound the newer one's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

Item = TypeVar("Item")
# Answers one owner may count per arm in a look, and the most one key may hold of an arm.
DEFAULT_ANSWERS_PER_USER = 20
DEFAULT_KEY_SHARE = 0.5


def user_cap(counts: Sequence[int], share: float) -> int:
    """The largest per-owner count ``c`` such that every owner's capped count is at most
    ``share`` of the capped total (and at least one per owner)."""
    if not counts:
        return 0
    low, high = 1, max(counts)
    while low < high:
        middle = (low + high + 1) // 2
        total = sum(min(n, middle) for n in counts)
        if middle <= share * total:
            low = middle
        else:
            high = middle - 1
    return low


def keep_per_key(
    items: Iterable[Item],
    key_of: Callable[[Item], str | None],
    share: float,
    order: Callable[[list[Item]], list[Item]],
) -> list[Item]:
    """Each key's first items (in ``order``) up to the cap that keeps every key within
    ``share`` of the kept items (at least ``1 / keys``); items without a key are kept."""
    per_key: dict[str | None, list[Item]] = defaultdict(list)
    for item in items:
        per_key[key_of(item)].append(item)
    keyed = {key: group for key, group in per_key.items() if key is not None}
    if len(keyed) < 2:
        return [item for group in per_key.values() for item in group]
    cap = user_cap([len(group) for group in keyed.values()], max(share, 1 / len(keyed)))
    kept = list(per_key.get(None, []))
    for group in keyed.values():
        kept.extend(order(group)[:cap])
    return kept


@dataclass(frozen=True, slots=True)
class LookBound:
    """What one owner and one key may move in a look: ``per_user`` answers per arm, and
    ``key_share`` of an arm's counted answers (at least ``1 / keys``)."""

    per_user: int = DEFAULT_ANSWERS_PER_USER
    key_share: float = DEFAULT_KEY_SHARE

    def __post_init__(self) -> None:
        if self.per_user < 1:
            raise ValueError(f"per_user must be at least 1, got {self.per_user}")
        if not 0 < self.key_share <= 1:
            raise ValueError(f"key_share must be in (0, 1], got {self.key_share}")


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer of an arm in a look's window, with who asked for it."""

    request_id: str
    created_at: datetime
    user_id: str | None = None
    session_id: str | None = None
    key_name: str | None = None

    @property
    def owner(self) -> str:
        """Whom the answer counts against: its user; without one its session (the sticky
        split's unit then); without either the key's anonymous traffic, as one owner; an
        answer with none of them (imported) is its own."""
        if self.user_id:
            return f"user:{self.user_id}"
        if self.session_id:
            return f"session:{self.session_id}"
        if self.key_name:
            return f"key:{self.key_name}"
        return f"request:{self.request_id}"


def _earliest(answers: list[Answer]) -> list[Answer]:
    return sorted(answers, key=lambda a: (a.created_at, a.request_id))


def counted_requests(answers: Iterable[Answer], bound: LookBound) -> set[str]:
    """The request ids one arm's look counts under ``bound`` (pure): each owner's earliest
    ``per_user`` answers, then each key's earliest counted answers up to its share."""
    per_owner: dict[str, list[Answer]] = defaultdict(list)
    for answer in answers:
        per_owner[answer.owner].append(answer)
    within = [a for group in per_owner.values() for a in _earliest(group)[: bound.per_user]]
    kept = keep_per_key(within, lambda a: a.key_name, bound.key_share, _earliest)
    return {answer.request_id for answer in kept}
