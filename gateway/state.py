"""What one gateway replica holds between requests."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.gateway import GatewaySettings
from gateway.keys import KeyFileWatch, KeyRing
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.recorder import InteractionRecorder
from gateway.sessions import SessionPins
from gateway.shadow import ShadowTraffic
from gateway.upstream import Upstreams
from registry.routes import RouteSnapshot, RouteStore


@dataclass
class GatewayState:
    """Everything one replica holds between requests."""

    settings: Settings
    gateway: GatewaySettings
    store: FeedbackStore
    keys: KeyRing
    routes: RouteStore
    recorder: InteractionRecorder
    metrics: GatewayMetrics
    upstreams: Upstreams
    pins: SessionPins
    limiter: Limiter
    keys_watch: KeyFileWatch | None = None
    snapshot: RouteSnapshot = field(default_factory=lambda: RouteSnapshot({}, {}))
    routes_read_at: float = 0.0
    # When the read behind ``snapshot`` started: only a snapshot read after a replica was
    # listed may say which adapters that replica should have loaded.
    routes_started_at: float = 0.0
    base_model: str | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    shadow_traffic: ShadowTraffic = field(default_factory=ShadowTraffic)
    # User requests sent to vLLM and not finished yet (a shadow yields while there are many).
    requests_in_flight: int = 0
    # Recently accepted caller idempotency keys (line-scoped) and what they were for.
    claimed_keys: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)
    # Signals (request, type, content) this replica accepted lately: each counts once.
    given_signals: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # The live edit of each answer this replica accepted lately (request id → its signal):
    # a newer edit replaces it, so only the live one is a duplicate.
    live_edits: OrderedDict[str, str] = field(default_factory=OrderedDict)

    @property
    def lines(self) -> frozenset[str]:
        """The business lines this gateway serves (configured, or routed in the store)."""
        return frozenset(self.settings.business_lines) | self.snapshot.tables.keys()
