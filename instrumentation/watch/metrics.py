"""Watch's own Prometheus series, served on GET /metrics: the anomalies found, and how watch itself is doing.

A registry per `WatchMetrics`, not the process-wide default, so that several watchers (tests, benchmarks) never
share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class WatchMetrics:
    """What /metrics shows: the anomalies found, and how watch itself is doing."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.anomalies = Counter("looptrace_anomalies", "Loop anomalies found in received traces.",
                                 ["service", "agent", "anomaly_type"], registry=self.registry)
        self.spans_received = Counter("looptrace_watch_spans_received", "Spans accepted for checking.",
                                      registry=self.registry)
        self.spans_rejected = Counter("looptrace_watch_spans_rejected", "Spans refused (partial success or error).",
                                      ["reason"], registry=self.registry)
        self.requests = Counter("looptrace_watch_requests", "Export requests by transport and answer.",
                                ["transport", "outcome"], registry=self.registry)
        self.runs_evicted = Counter("looptrace_watch_runs_evicted", "Open runs closed early: too many were open.",
                                    registry=self.registry)
        self.runs_judged = Counter("looptrace_watch_runs_judged", "Runs judged, by what closed them.", ["reason"],
                                   registry=self.registry)
        self.runs_open = Gauge("looptrace_watch_runs_open", "Runs being assembled.", registry=self.registry)
        self.queue_depth = Gauge("looptrace_watch_queue_batches", "Export requests waiting for the detector.",
                                 registry=self.registry)

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
