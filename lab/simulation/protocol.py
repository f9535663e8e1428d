"""The simulated-user protocol, and loading a user model from a ``--users SPEC``.

A user model is any object with these methods (a class is instantiated
without arguments)::

    prompts(business_line: str, n: int, seed: int) -> list[str]      # optional
    react(business_line: str, prompt: str, answer: str, seed: int) -> dict
    satisfied(business_line: str, prompt: str, answer: str) -> bool
    correct(business_line: str, prompt: str, answer: str) -> str    # optional

``react`` sees the answer the served model really gave and returns
``{"type": T}`` with ``T`` one of :data:`REACTION_TYPES` (an ``edit`` also
carries ``"text"``, the answer as the user rewrote it). ``satisfied`` is the
hidden judgement the loop measures success by; it is never shown to training.
``correct`` is the answer rewritten as these users wanted it, for simulated reviewers who
correct the answers they fail (``flywheel loop --review-corrections``).

SPEC is ``path/to/file.py:NAME`` or ``package.module:NAME``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from feedback.events import USER_SIGNALS, Signal
from flywheel.errors import UsageError
from flywheel.named_objects import NamedObjectError, load_named_object

if TYPE_CHECKING:
    from lab.simulation.feedback_profiles import FeedbackProfile

REACTION_TYPES: tuple[str, ...] = (Signal.NONE.value, *(signal.value for signal in USER_SIGNALS))


@runtime_checkable
class UserModel(Protocol):
    """What the loop needs of simulated users (``prompts`` is optional)."""

    def react(self, business_line: str, prompt: str, answer: str, seed: int) -> dict[str, Any]:
        """The user's reaction to ``answer``."""
        ...

    def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
        """Whether the answer meets this user's hidden preference."""
        ...


class UsersSpecError(UsageError):
    """A ``--users`` spec that does not load, lacks a method, or misbehaves."""


@dataclass(frozen=True, slots=True)
class Reaction:
    """A validated reaction: its type and, for an edit, the rewritten answer."""

    type: str
    text: str | None = None

    @property
    def says_something(self) -> bool:
        """Whether the user gave any feedback at all."""
        return self.type != "none"


def reaction_seed(seed: int, *parts: str) -> int:
    """A per-request seed: the same request reacts the same way in every run."""
    digest = hashlib.blake2b("\x1f".join((str(seed), *parts)).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


class LoadedUsers:
    """A user model behind the protocol, with its reactions checked.

    ``prompts`` falls back to the line's built-in prompts when the model has
    none; a reaction of an unknown type, or an edit without text, raises
    :class:`UsersSpecError` naming the spec.
    """

    def __init__(self, spec: str, model: Any) -> None:
        self.spec = spec
        self.model = model
        for method in ("react", "satisfied"):
            if not callable(getattr(model, method, None)):
                raise UsersSpecError(f"--users {spec}: the object has no {method}() method")
        self._prompts: Callable[[str, int, int], list[str]] | None = getattr(model, "prompts", None)
        self._correct: Callable[[str, str, str], str] | None = getattr(model, "correct", None)

    @property
    def corrects(self) -> bool:
        """Whether the model can rewrite an answer as its users wanted it (``correct()``)."""
        return callable(self._correct)

    @property
    def feedback(self) -> FeedbackProfile | None:
        """The feedback profile the model voices its opinions at (None: it decides its own
        rates, without a profile)."""
        return getattr(self.model, "feedback", None) if self._takes_profile else None

    @property
    def _takes_profile(self) -> bool:
        return callable(getattr(self.model, "use_feedback", None))

    def use_feedback(self, profile: FeedbackProfile) -> None:
        """Have the model voice its opinions at ``profile``'s rates; a model without
        ``use_feedback()`` decides its own feedback, and cannot take one."""
        if not self._takes_profile:
            raise UsersSpecError(
                f"--feedback {profile.name}: the user model {self.spec} decides its own feedback "
                "(it has no use_feedback(profile) method)"
            )
        self.model.use_feedback(profile)

    def describe_feedback(self) -> str:
        """The profile's line for a run's header, or that the model decides its own."""
        profile = self.feedback
        return profile.describe() if profile is not None else "feedback of the model's own"

    def prompts(self, business_line: str, n: int, seed: int) -> list[str]:
        """``n`` prompts of the line (the model's own, else the built-in ones)."""
        if self._prompts is None:
            from lab.simulation.prompts import builtin_prompts

            return builtin_prompts(business_line, n, seed)
        prompts = list(self._prompts(business_line, n, seed))
        bad = [p for p in prompts if not isinstance(p, str) or not p.strip()]
        if bad or len(prompts) < n:
            raise UsersSpecError(
                f"--users {self.spec}: prompts({business_line!r}, {n}, {seed}) must return "
                f"{n} non-empty strings (got {len(prompts)}, {len(bad)} empty or not text)"
            )
        return prompts[:n]

    def react(self, business_line: str, prompt: str, answer: str, seed: int) -> Reaction:
        """The user's checked reaction to ``answer``."""
        raw = self.model.react(business_line, prompt, answer, seed)
        return parse_reaction(raw, self.spec)

    def satisfied(self, business_line: str, prompt: str, answer: str) -> bool:
        """The hidden judgement, as a bool."""
        return bool(self.model.satisfied(business_line, prompt, answer))

    def correct(self, business_line: str, prompt: str, answer: str) -> str:
        """``answer`` rewritten as the users wanted it; :class:`UsersSpecError` when the model
        has no ``correct()`` or returns no text."""
        if self._correct is None:
            raise UsersSpecError(f"--users {self.spec}: the object has no correct() method")
        text = self._correct(business_line, prompt, answer)
        if not isinstance(text, str) or not text.strip():
            raise UsersSpecError(
                f"--users {self.spec}: correct() must return the rewritten answer, got {text!r}"
            )
        return text

    def check(self, business_line: str) -> None:
        """Call every method once on a made-up answer, before any traffic is sent."""
        prompt = self.prompts(business_line, 1, 0)[0]
        for answer in ("", "I am not sure.", prompt):
            self.react(business_line, prompt, answer, 0)
            self.satisfied(business_line, prompt, answer)
            if self.corrects:
                self.correct(business_line, prompt, answer or prompt)


def parse_reaction(raw: Any, spec: str) -> Reaction:
    """A reaction mapping checked against :data:`REACTION_TYPES`."""
    if not isinstance(raw, dict) or "type" not in raw:
        raise UsersSpecError(
            f"--users {spec}: react() must return a dict with a 'type', got {raw!r}"
        )
    kind = raw["type"]
    if kind not in REACTION_TYPES:
        raise UsersSpecError(
            f"--users {spec}: react() returned unknown type {kind!r}; "
            f"expected one of {', '.join(REACTION_TYPES)}"
        )
    text = raw.get("text")
    if kind == "edit" and (not isinstance(text, str) or not text.strip()):
        raise UsersSpecError(f"--users {spec}: an 'edit' reaction needs the edited 'text'")
    return Reaction(kind, text if kind == "edit" else None)


def load_users(spec: str, feedback: str | None = None) -> LoadedUsers:
    """The user model a ``--users`` spec names, instantiated and checked for its methods; with
    ``feedback`` (a ``--feedback`` profile name or file), voicing opinions at its rates."""
    loaded = _load_users(spec)
    if feedback is not None:
        from lab.simulation.feedback_profiles import load_profile

        loaded.use_feedback(load_profile(feedback))
    return loaded


def _load_users(spec: str) -> LoadedUsers:
    try:
        return LoadedUsers(spec, load_named_object(spec, "--users"))
    except NamedObjectError as exc:
        raise UsersSpecError(str(exc)) from None
