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

DEFAULT_CANARY_FRACTION = 0.05
ArmName = Literal["champion", "canary", "base"]


class RoutingTable(BaseModel):
    """Where one business line's traffic goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    business_line: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    champion: str | None = Field(default=None, description="Adapter name; None serves the base.")
    canary: str | None = None
    canary_fraction: float = Field(default=DEFAULT_CANARY_FRACTION, ge=0, le=1)

    @model_validator(mode="after")
    def _distinct(self) -> RoutingTable:
        if self.canary is not None and self.canary == self.champion:
            raise ValueError("the canary must differ from the champion")
        return self


def split_point(key: str, salt: str) -> float:
    """A stable point of [0, 1) for ``key`` (user or session id) under ``salt``."""
    digest = hashlib.blake2b(f"{salt}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def choose_arm(table: RoutingTable, key: str) -> tuple[ArmName, str | None]:
    """The arm and adapter that serve ``key`` under ``table`` (adapter None = base model)."""
    canary = table.canary
    if canary is not None and split_point(key, canary) < table.canary_fraction:
        return "canary", canary
    if table.champion is None:
        return "base", None
    return "champion", table.champion
