"""The servers as uvicorn builds them in each worker process: settings, recipes and the
worker's clients (``composition.clients``, closed when the server shuts down), handed to
the apps' factories (``flywheel serve gateway|dashboard``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI


def gateway_app() -> FastAPI:
    """The gateway configured from the environment (``flywheel serve gateway`` serves it,
    with the header guards of :mod:`flywheel.http_guard`)."""
    from composition.clients import build_clients
    from flywheel.settings import load_settings
    from gateway.app import create_app

    settings = load_settings()
    clients = build_clients(settings)
    return create_app(
        settings,
        settings.gateway,
        store=clients.store,
        routes=clients.routes,
        redis=clients.redis,
        on_shutdown=clients.close,
    )


def dashboard_app() -> FastAPI:
    """The feedback page configured from the environment, each line's review block read
    from its recipe (``flywheel serve dashboard``)."""
    from composition.clients import build_clients
    from composition.recipes import recipe_for
    from dashboard.app import create_app
    from flywheel.settings import load_settings

    settings = load_settings()
    clients = build_clients(settings)
    return create_app(
        settings,
        settings.dashboard,
        store=clients.store,
        routes=clients.routes,
        scrubber_factory=lambda: clients.scrubber,
        mlflow_client_factory=lambda: clients.registry.client,
        review_policy_of=lambda line: recipe_for(settings, line).review,
        on_shutdown=clients.close,
    )
