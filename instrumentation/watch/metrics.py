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
        # The labelled series the detector worker bumps, by label values: `labels()` takes a lock and builds its key
        # on every call, which costs more than the increment itself, once per judged run. Prometheus keeps every
        # child it made anyway, so remembering them here holds nothing it does not.
        self._judged: dict[str, Counter] = {}
        self._found: dict[tuple[str, str, str], Counter] = {}

    def run_judged(self, reason: str) -> None:
        """Count one run judged, by what closed it (root, idle, evicted, shutdown)."""
        child = self._judged.get(reason)
        if child is None:
            child = self._judged[reason] = self.runs_judged.labels(reason=reason)
        child.inc()

    def anomaly_found(self, service: str, agent: str, anomaly_type: str) -> None:
        """Count one anomaly reported, by the service and agent it came from and its type."""
        key = (service, agent, anomaly_type)
        child = self._found.get(key)
        if child is None:
            child = self._found[key] = self.anomalies.labels(service=service, agent=agent, anomaly_type=anomaly_type)
        child.inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
