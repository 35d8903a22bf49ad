"""The run watcher: spans in, runs assembled, anomalies out to the sink it is given. No sockets, no threads.

Runs are assembled by trace (or session, or conversation rebuilt from the history: see readers.py) with
`trace_detect.RunRebuilder`, which reads every producer readers.py knows. After each batch the runs it touched are
checked (repeats, cycles, failing tools fire as soon as the span that completes them arrives); a run is judged in
full (ignored errors too) when its root span arrives, when it has been idle for ``idle_timeout_s`` (``sweep``), when
it is evicted because ``max_open_runs`` are open (counted), or at ``close_all``. A rootless run (a session's, a
conversation's) is judged when idle.

Drive it in process: ``ingest(spans)`` with decoded span records, ``sweep()`` now and then, ``close_all()`` at the
end. The server runs it on one worker thread; it is not safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..alerts import AlertContext, announces
from ..detector import Anomaly, DetectorConfig
from ..offline.trace_detect import RunRebuilder, Verdict
from ..recording import semconv as sc
from ..tracefile.read import SpanRecord
from .decoding import SERVICE_NAME
from .metrics import WatchMetrics


class AnomalySink(Protocol):
    """Where the watcher reports each anomaly once: `alerts.Alerts` is one (log line, webhook, callback)."""

    def send(self, anomaly: Anomaly, context: AlertContext) -> None: ...


@dataclass(slots=True)
class _RunMeta:
    service: str
    agent: str
    last_seen: float
    alerted: set[tuple[str, str]] = field(default_factory=set)
    # The real trace ids of a run assembled from several traces (a session, a conversation), oldest first.
    trace_ids: list[str] = field(default_factory=list)


MAX_TRACE_IDS_NAMED = 50  # of a conversation's traces, the latest named in an alert


class RunWatcher:
    """Assembles runs from spans and reports their anomalies to ``sink``. Single-threaded: one worker feeds it."""

    def __init__(self, sink: AnomalySink, metrics: WatchMetrics | None = None, *, idle_timeout_s: float = 300.0,
                 max_open_runs: int = 10_000, capture_content: bool = True, config: DetectorConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.metrics = metrics if metrics is not None else WatchMetrics()
        self.idle_timeout_s = idle_timeout_s
        self.max_open_runs = max_open_runs
        self.capture_content = capture_content
        self._clock = clock
        # The rebuilder's own cap stays above ours: eviction is decided (and counted) here.
        self._rebuilder = RunRebuilder(config, max_open_traces=max_open_runs + 1)
        self._runs: OrderedDict[str, _RunMeta] = OrderedDict()  # least recently seen first
        self.alerts_sent = 0

    @property
    def open_runs(self) -> int:
        return len(self._runs)

    def ingest(self, spans: list[SpanRecord]) -> None:
        """Add decoded spans to their runs; report what the runs they touched now show."""
        now = self._clock()
        touched: set[str] = set()
        for span in spans:
            verdict = self._rebuilder.add(span)
            key = self._rebuilder.last_key  # its trace, session or conversation (rebuilt from the history)
            if self._rebuilder.last_dropped is not None:  # the messageless twin of this model call: one run, not two
                self._runs.pop(self._rebuilder.last_dropped, None)
            meta = self._runs.get(key)
            if meta is None:
                meta = self._runs[key] = _RunMeta(service=str(span.resource.get(SERVICE_NAME) or "unknown"),
                                                  agent="", last_seen=now)
                while len(self._runs) > self.max_open_runs:
                    oldest = next(iter(self._runs))
                    self.metrics.runs_evicted.inc()
                    self._close(oldest, "evicted")
            else:
                meta.last_seen = now
                self._runs.move_to_end(key)
            if not meta.agent:
                meta.agent = str(span.attributes.get(sc.GEN_AI_AGENT_NAME) or "")
            if key != span.trace_id and span.trace_id not in meta.trace_ids[-4:]:  # (spans of a trace come together)
                if span.trace_id in meta.trace_ids:
                    meta.trace_ids.remove(span.trace_id)
                meta.trace_ids.append(span.trace_id)
                del meta.trace_ids[:-MAX_TRACE_IDS_NAMED]
            if verdict is not None:
                self._finish(verdict, "root")
                touched.discard(verdict.trace_id)
            else:
                touched.add(key)
        for key in touched:
            if key in self._runs:
                self._report(key, self._rebuilder.check(key))
        self.metrics.runs_open.set(len(self._runs))

    def sweep(self) -> None:
        """Judge the runs nobody has sent a span for in idle_timeout_s."""
        deadline = self._clock() - self.idle_timeout_s
        while self._runs:
            key, meta = next(iter(self._runs.items()))
            if meta.last_seen > deadline:
                break
            self._close(key, "idle")
        self.metrics.runs_open.set(len(self._runs))

    def close_all(self) -> None:
        """Judge every open run (at shutdown)."""
        for key in list(self._runs):
            self._close(key, "shutdown")
        self.metrics.runs_open.set(0)

    def _close(self, key: str, reason: str) -> None:
        verdict = self._rebuilder.close(key)
        if verdict is not None:
            self._finish(verdict, reason)
        else:
            self._runs.pop(key, None)

    def _finish(self, verdict: Verdict, reason: str) -> None:
        if verdict.trace_id in self._runs and not self._runs[verdict.trace_id].agent:
            self._runs[verdict.trace_id].agent = verdict.name
        self._report(verdict.trace_id, verdict.anomalies)
        self._runs.pop(verdict.trace_id, None)
        self.metrics.run_judged(reason)

    def _report(self, key: str, anomalies: list[Anomaly]) -> None:
        meta = self._runs.get(key)
        if meta is None or not anomalies:
            return
        agent = meta.agent or "unknown"
        context = AlertContext(agent=agent, trace_id=key, span_id="", action="warn")
        if meta.trace_ids:  # a run of several traces: named by its key and its real traces, never a made-up id
            context = AlertContext(agent=agent, trace_id=meta.trace_ids[-1], span_id="", action="warn",
                                   conversation=key, trace_ids=tuple(meta.trace_ids))
        for anomaly in anomalies:
            identity = (anomaly.type, anomaly.streak)
            if identity in meta.alerted or not announces(anomaly, context):
                continue  # a streak that grows (count 4, 5, ...), or one an earlier run of the session reported
            meta.alerted.add(identity)
            self.alerts_sent += 1
            self.metrics.anomaly_found(meta.service, agent, anomaly.type)
            self.sink.send(anomaly if self.capture_content else without_content(anomaly), context)


def without_content(anomaly: Anomaly) -> Anomaly:
    """The anomaly minus the arguments and the detector's message (which quotes them and error texts)."""
    where = f" in {anomaly.tool}" if anomaly.tool else ""
    return dataclasses.replace(anomaly, arguments=None,
                               message=f"{anomaly.type}{where} x{anomaly.count} (content capture is off)")
