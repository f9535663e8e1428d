"""The client set of unit tests: the product's :class:`~composition.clients.Clients`, built
from the pieces that run inside a unit test.

The store is the real one on SQLite under the test's home and the registry the real local
MLflow (both run here); the scrubber is the session's (``tests.dashboard_store``: spaCy
loads once per session); vLLM is the only service a unit test cannot run, so its admin
clients go to a stand-in (``tests.stub_vllm``, by URL) or through ``vllm_transport``; there
is no Redis (the gateway counts per process). Put a set in use with
:func:`composition.clients.clients_in_use` to run a command or a flow on it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from composition.clients import Clients
from flywheel.settings import Settings

if TYPE_CHECKING:
    import httpx

    from feedback.pii import Scrubber
    from feedback.store import FeedbackStore
    from registry.routes import RouteStore
    from registry.tracking import Registry
    from registry.vllm_admin import VllmAdminClient


def fake_clients(
    settings: Settings,
    *,
    store: FeedbackStore | None = None,
    registry: Registry | None = None,
    scrubber: Callable[[], Scrubber] | None = None,
    vllm_transport: httpx.BaseTransport | None = None,
) -> Clients:
    """The unit tests' set for ``settings``: ``store`` and ``registry`` when the test holds
    them already, else opened on first use under ``settings.home``."""

    def open_store() -> FeedbackStore:
        from feedback.store import FeedbackStore

        return store if store is not None else FeedbackStore.open(settings)

    def routes(opened: FeedbackStore, clock: Callable[[], datetime] | None) -> RouteStore:
        from registry.routes import RouteStore

        return RouteStore(opened.engine, clock=clock)

    def open_registry() -> Registry:
        from registry.tracking import Registry

        if registry is not None:
            return registry
        return Registry.for_home(settings.home, settings.mlflow_tracking_uri)

    def session_scrubber() -> Scrubber:
        from tests.dashboard_store import shared_scrubber

        return shared_scrubber()

    def vllm_admin(url: str) -> VllmAdminClient:
        from registry.vllm_admin import VllmAdminClient

        return VllmAdminClient(url, transport=vllm_transport)

    return Clients(
        settings,
        store=open_store,
        routes=routes,
        registry=open_registry,
        scrubber=scrubber or session_scrubber,
        vllm_admin=vllm_admin,
    )
