"""Logged answers of one arm with a known number of thumbs-down, for tests and benches of
the canary's and the watch's decisions (the reactions are injected, not simulated users)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any


def arm_events(
    line: str,
    adapter: str | None,
    answers: int,
    unhappy: int,
    start: datetime,
    *,
    spacing: timedelta = timedelta(seconds=1),
) -> list[dict[str, Any]]:
    """``answers`` interactions of ``adapter`` (None: the base model) from ``start`` on,
    ``spacing`` apart, the first ``unhappy`` of them thumbed down; ids unique per start."""
    events: list[dict[str, Any]] = []
    tag = f"{adapter or 'base'}-{start.timestamp():.3f}"
    for index in range(answers):
        request_id = f"{tag}-{index}"
        created = (start + spacing * index).isoformat()
        events.append(
            {
                "type": "interaction",
                "request_id": request_id,
                "user_id": f"u{index}",
                "business_line": line,
                "adapter_name": adapter,
                "base_model": "base",
                "messages": [{"role": "user", "content": f"question {index}"}],
                "response": "an answer",
                "latency_ms": 100.0,
                "status": "ok",
                "created_at": created,
            }
        )
        if index < unhappy:
            events.append(
                {
                    "type": "thumbs_down",
                    "request_id": request_id,
                    "idempotency_key": f"td-{request_id}",
                    "created_at": created,
                }
            )
    return events
