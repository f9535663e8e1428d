"""The servers as uvicorn builds them in each worker process: settings and recipes from the
environment, handed to the apps' factories (``flywheel serve gateway|dashboard``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI


def gateway_app() -> FastAPI:
    """The gateway configured from the environment (``flywheel serve gateway`` serves it,
    with the header guards of :mod:`flywheel.http_guard`)."""
    from flywheel.settings import load_settings
    from flywheel.settings.gateway import GatewaySettings
    from gateway.app import create_app

    return create_app(load_settings(), GatewaySettings())


def dashboard_app() -> FastAPI:
    """The feedback page configured from the environment, each line's review block read
    from its recipe (``flywheel serve dashboard``)."""
    from composition.recipes import recipe_for
    from dashboard.app import create_app
    from flywheel.settings import load_settings

    settings = load_settings()
    return create_app(
        settings,
        settings.dashboard,
        review_policy_of=lambda line: recipe_for(settings, line).review,
    )
