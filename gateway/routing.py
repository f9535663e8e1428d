"""The routing table of a business line and the sticky canary split (pure).

A user (or a session, when there is no user) is hashed with the canary's
adapter name into a point of [0, 1); points below the canary fraction go to
the canary. The same user therefore always gets the same arm while the table
is unchanged; raising the fraction (5% → 10% → 30%) only moves champion users
to the canary, never back; and each new canary version samples its own users.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from feedback.events import BUSINESS_LINE
from registry.names import parse_adapter_name

DEFAULT_CANARY_FRACTION = 0.05
ArmName = Literal["champion", "canary", "base"]


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

    @model_validator(mode="after")
    def _distinct(self) -> RoutingTable:
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
            parsed = parse_adapter_name(adapter)
            # The per-line allow-list: a line's table can only name that line's adapters.
            if parsed is None or parsed[0] != self.business_line:
                raise ValueError(
                    f"{role} {adapter!r} is not an adapter of {self.business_line} "
                    f"(expected {self.business_line}-v<version>)"
                )
        return self

    @property
    def adapters(self) -> frozenset[str]:
        """Every adapter this table may send a request to (a pinned conversation included)."""
        return frozenset(a for a in (self.champion, self.canary, self.previous, self.shadow) if a)

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
    if adapter is None:
        return "base"
    return "canary" if adapter == table.canary else "champion"


def choose_arm(table: RoutingTable, key: str) -> tuple[ArmName, str | None]:
    """The arm and adapter that serve ``key`` under ``table`` (adapter None = base model)."""
    canary = table.canary
    if canary is not None and split_point(key, canary) < table.canary_fraction:
        return "canary", canary
    if table.champion is None:
        return "base", None
    return "champion", table.champion
