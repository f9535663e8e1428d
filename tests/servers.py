"""Serving an ASGI app (the gateway, the feedback page) on a thread, for any test tier.

The unit tests put it in front of the stub vLLM (``tests/stub_vllm.py``); the
integration tests in front of a real vLLM, PostgreSQL and a browser.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving(app: Any, port: int, **options: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a thread (``options`` go to uvicorn's config, e.g.
    ``flywheel.http_guard.server_options()``); yields its base URL."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        **options,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)
