"""The routing table of a business line and the sticky canary split (pure).

A user (or a session, when there is no user) is hashed with the canary's
adapter name into a point of [0, 1); points below the canary fraction go to
the canary. The same user therefore always gets the same arm while the table
is unchanged; raising the fraction (5% → 10% → 30%) only moves champion users
to the canary, never back; and each new canary version samples its own users.

An A/B experiment (``registry.experiments``) splits the line's users the same way
between its arms A and B, salted with the experiment's id: its ``share`` of the
users gets B, the rest A. A line runs one rollout at a time: a table with an
experiment has no canary and no shadow.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from feedback.events import BUSINESS_LINE
from registry.names import parse_adapter_name

DEFAULT_CANARY_FRACTION = 0.05
ArmName = Literal["champion", "canary", "base", "experiment_a", "experiment_b"]
BASE_ARM = "base"


class ExperimentSplit(BaseModel):
    """The arms of a line's live A/B experiment: ``share`` of the users (sticky) get ``b``,
    the others ``a``; an arm that is None serves the base model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(ge=1, description="The experiment's id in the store (the split's salt).")
    a: str | None
    b: str | None
    share: float = Field(default=0.5, gt=0, lt=1, description="Share of the users on B.")

    @model_validator(mode="after")
    def _arms_differ(self) -> ExperimentSplit:
        if self.a == self.b:
            raise ValueError(f"an experiment needs two different arms, got {self.a or BASE_ARM}")
        return self

    @property
    def salt(self) -> str:
        """What the users are hashed with (each experiment samples its own users)."""
        return f"experiment\x1f{self.id}"


class RoutingTable(BaseModel):
    """Where one business line's traffic goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    business_line: str = Field(pattern=BUSINESS_LINE)
    champion: str | None = Field(default=None, description="Adapter name; None serves the base.")
    canary: str | None = None
    canary_fraction: float = Field(default=DEFAULT_CANARY_FRACTION, ge=0, le=1)
    previous: str | None = Field(
        default=None, description="The champion before the last promotion, kept for rollback."
    )
    shadow: str | None = Field(
        default=None,
        description="Adapter that also answers a sampled share of the line's requests after "
        "the user got the served answer; its answers are stored, never returned.",
    )
    shadow_fraction: float = Field(default=0.0, ge=0, le=1)
    replicas: tuple[str, ...] | None = Field(
        default=None,
        description="The replicas (upstream URLs) placed to hold this line's adapters; None: "
        "every replica. Requests go there first and fail over to the others.",
    )
    experiment: ExperimentSplit | None = Field(
        default=None, description="A live A/B experiment: its arms replace the champion's users."
    )

    @model_validator(mode="after")
    def _distinct(self) -> RoutingTable:
        if self.experiment is not None and (self.canary is not None or self.shadow is not None):
            raise ValueError(
                f"experiment {self.experiment.id} is live on {self.business_line}: stop it "
                "before a canary or a shadow (one rollout at a time)"
            )
        if self.canary is not None and self.canary == self.champion:
            raise ValueError("the canary must differ from the champion")
        if self.shadow is not None and self.shadow in (self.champion, self.canary):
            raise ValueError("the shadow must differ from the champion and the canary")
        if self.replicas is not None and not self.replicas:
            raise ValueError("a placement names at least one replica (None: every replica)")
        for role in ("champion", "canary", "previous", "shadow"):
            adapter = getattr(self, role)
            if adapter is None:
                continue
            self._check_own(role, adapter)
        if self.experiment is not None:
            for role, adapter in (("arm A", self.experiment.a), ("arm B", self.experiment.b)):
                if adapter is not None:
                    self._check_own(role, adapter)
        return self

    def _check_own(self, role: str, adapter: str) -> None:
        parsed = parse_adapter_name(adapter)
        # The per-line allow-list: a line's table can only name that line's adapters.
        if parsed is None or parsed[0] != self.business_line:
            raise ValueError(
                f"{role} {adapter!r} is not an adapter of {self.business_line} "
                f"(expected {self.business_line}-v<version>)"
            )

    @property
    def adapters(self) -> frozenset[str]:
        """Every adapter this table may send a request to (a pinned conversation included)."""
        arms = (self.experiment.a, self.experiment.b) if self.experiment else ()
        return frozenset(
            a for a in (self.champion, self.canary, self.previous, self.shadow, *arms) if a
        )

    def with_canary(self, adapter: str, fraction: float = DEFAULT_CANARY_FRACTION) -> RoutingTable:
        """This table with ``adapter`` as the canary on ``fraction`` of the users."""
        update: dict[str, object] = {"canary": adapter, "canary_fraction": fraction}
        if self.shadow == adapter:  # out of the shadow stage, onto users
            update |= {"shadow": None, "shadow_fraction": 0.0}
        return self.model_copy(update=update).checked()

    def with_shadow(self, adapter: str, fraction: float) -> RoutingTable:
        """This table with ``adapter`` answering ``fraction`` of the requests in shadow."""
        return self.model_copy(update={"shadow": adapter, "shadow_fraction": fraction}).checked()

    def without_shadow(self) -> RoutingTable:
        """This table with no shadow adapter."""
        return self.model_copy(update={"shadow": None, "shadow_fraction": 0.0})

    def placed_on(self, replicas: tuple[str, ...] | None) -> RoutingTable:
        """This table with the line's adapters placed on ``replicas`` (None: every replica)."""
        return self.model_copy(update={"replicas": replicas}).checked()

    def with_experiment(self, split: ExperimentSplit) -> RoutingTable:
        """This table with ``split``'s arms serving the line's users (no canary, no shadow)."""
        return self.model_copy(update={"experiment": split}).checked()

    def without_experiment(self) -> RoutingTable:
        """This table with no experiment: every user back on the champion."""
        return self.model_copy(update={"experiment": None})

    def without_canary(self) -> RoutingTable:
        """This table with no canary: every user on the champion (a rollback)."""
        return self.model_copy(update={"canary": None})

    def with_champion(self, adapter: str | None) -> RoutingTable:
        """This table with ``adapter`` as champion (None = the base model); the old one kept
        as ``previous``; a canary equal to the new champion is dropped."""
        if adapter == self.champion:
            return self
        canary = None if self.canary == adapter else self.canary
        update: dict[str, object] = {
            "champion": adapter,
            "canary": canary,
            "previous": self.champion,
        }
        if self.shadow is not None and self.shadow == adapter:
            update |= {"shadow": None, "shadow_fraction": 0.0}
        return self.model_copy(update=update)

    def checked(self) -> RoutingTable:
        """Validate again (``model_copy`` does not)."""
        return RoutingTable.model_validate(self.model_dump())


def split_point(key: str, salt: str) -> float:
    """A stable point of [0, 1) for ``key`` (user or session id) under ``salt``."""
    digest = hashlib.blake2b(f"{salt}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def arm_of(table: RoutingTable, adapter: str | None) -> ArmName:
    """The arm that ``adapter`` plays in ``table`` (a pinned ``previous`` counts as champion)."""
    split = table.experiment
    if split is not None and adapter in (split.a, split.b):
        return "experiment_b" if adapter == split.b else "experiment_a"
    if adapter is None:
        return "base"
    return "canary" if adapter == table.canary else "champion"


def choose_arm(table: RoutingTable, key: str) -> tuple[ArmName, str | None]:
    """The arm and adapter that serve ``key`` under ``table`` (adapter None = base model)."""
    split = table.experiment
    if split is not None:
        if split_point(key, split.salt) < split.share:
            return "experiment_b", split.b
        return "experiment_a", split.a
    canary = table.canary
    if canary is not None and split_point(key, canary) < table.canary_fraction:
        return "canary", canary
    if table.champion is None:
        return "base", None
    return "champion", table.champion
