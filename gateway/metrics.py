"""Prometheus metrics of one gateway replica, in a registry of its own (no global state).

With several worker processes (``flywheel serve gateway --workers N``) each worker writes
its values to files in ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess
mode) and ``/metrics`` answers for all of them, whichever worker serves the scrape:
counters and histograms summed, in-flight requests summed over live workers, the
routing revision the highest, the freshness and store gauges the most recent.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
NO_ADAPTER = "base"

__all__ = ["CONTENT_TYPE_LATEST", "GatewayMetrics"]


def multiprocess_dir() -> str | None:
    """The folder the workers share their metrics through, when several serve."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class GatewayMetrics:
    """Requests, errors, latency, TTFT, in-flight and feedback per business line and adapter."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "flywheel_gateway_requests",
            "Completed requests by business line, adapter, arm and status.",
            ["business_line", "adapter", "arm", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "flywheel_gateway_errors",
            "Requests that ended in an error, by kind (upstream, client, ...).",
            ["business_line", "adapter", "kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "flywheel_gateway_latency_seconds",
            "Time from request to the last byte of the answer.",
            ["business_line", "adapter"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "flywheel_gateway_ttft_seconds",
            "Time to the first byte of the answer from vLLM (streams: the first chunk).",
            ["business_line", "adapter"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "flywheel_gateway_in_flight",
            "Requests being served right now, by adapter (drained before an unload).",
            ["business_line", "adapter"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.feedback = Counter(
            "flywheel_gateway_feedback",
            "Feedback events accepted, by business line, adapter and type.",
            ["business_line", "adapter", "type"],
            registry=self.registry,
        )
        self.shadow_requests = Counter(
            "flywheel_gateway_shadow_requests",
            "Requests mirrored to a line's shadow adapter (never answered to users), by status.",
            ["business_line", "adapter", "status"],
            registry=self.registry,
        )
        self.shadow_skipped = Counter(
            "flywheel_gateway_shadow_skipped",
            "Sampled shadow requests not sent: the process's shadow cap was full (reason "
            "'cap'), or it was busy answering users (reason 'busy').",
            ["business_line", "adapter", "reason"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "flywheel_gateway_rejected",
            "Requests refused before reaching vLLM, by HTTP status.",
            ["status"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "flywheel_gateway_rate_limit_checks",
            "Requests and feedback checked against rate limits, by line and outcome.",
            ["business_line", "outcome"],
            registry=self.registry,
        )
        self.routes_revision = Gauge(
            "flywheel_gateway_routes_revision",
            "Revision of each business line's routing table this replica applies.",
            ["business_line"],
            registry=self.registry,
            multiprocess_mode="max",
        )
        self.routes_age = Gauge(
            "flywheel_gateway_routes_age_seconds",
            "Seconds since the routing tables were last read from the store.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.spooled = Gauge(
            "flywheel_gateway_spooled_records",
            "Interactions and feedback waiting on local disk for the store.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.store_up = Gauge(
            "flywheel_gateway_store_up",
            "1 when the last write to the store succeeded.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )

    def render(self) -> bytes:
        """The text exposition format (every worker's, in multiprocess mode)."""
        folder = multiprocess_dir()
        if folder is None:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=folder)
        return generate_latest(merged)

    @staticmethod
    def worker_exited() -> None:
        """Drop this worker's live gauges (its counters keep counting in the totals)."""
        if multiprocess_dir() is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid())
