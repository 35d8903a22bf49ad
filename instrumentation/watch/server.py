"""`WatchServer`: the receivers (OTLP/HTTP, OTLP/gRPC) in front of one run watcher, fed by a bounded queue.

Spans are decoded on the receiving thread, which answers at once: the detector runs on one worker thread fed by a
bounded queue, so a slow check never holds up a sender, and spans that cannot be taken (queue full, no ids) are
reported back as OTLP partial success instead of an error the sender would retry. Both listeners are bound when the
server is built, so a port that cannot be had is a `ListenError` before anything starts.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..alerts import Alerts
from ..detector import DetectorConfig
from ..logs import log
from ..tracefile.read import SpanRecord
from .grpc_receiver import grpc_server
from .http_receiver import WatchHTTPServer
from .metrics import WatchMetrics
from .settings import WatchSettings
from .sinks import watch_sinks

if TYPE_CHECKING:
    from ..langfuse.scores import LangfuseScores
from .watcher import RunWatcher

_STOP = object()


class WatchServer:
    """The receivers and the detector worker. ``start()``, then ``stop()`` (SIGTERM does it in the CLI).

    Anomalies go to the project's one fan-out (`alerts.AnomalySinks`): the log line and the settings' webhook, or
    ``alerts`` in their place when given, and ``scores`` (Langfuse), which the server closes when it stops.
    """

    def __init__(self, settings: WatchSettings, *, alerts: Alerts | None = None, scores: LangfuseScores | None = None,
                 config: DetectorConfig | None = None) -> None:
        self.settings = settings
        self.metrics = WatchMetrics()
        self.sinks = watch_sinks(settings.alert_webhook, scores).with_alerts(alerts)
        self.watcher = RunWatcher(self.sinks, self.metrics, idle_timeout_s=settings.idle_timeout_s,
                                  max_open_runs=settings.max_open_runs, capture_content=settings.capture_content,
                                  config=config)
        self._queue: queue.Queue = queue.Queue(maxsize=settings.queue_batches)
        self._http = WatchHTTPServer(self)
        self.port = self._http.port
        self._grpc: Any = None
        self.grpc_port: int | None = None
        if settings.grpc_port is not None:
            try:
                self._grpc, self.grpc_port = grpc_server(self)
            except OSError:
                self._http.server_close()  # nothing half-open stays behind
                raise
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> WatchServer:
        worker = threading.Thread(target=self._work, name="looptrace-watch-detector", daemon=True)
        http = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.1},
                                name="looptrace-watch-http", daemon=True)
        self._threads = [worker, http]
        for thread in self._threads:
            thread.start()
        if self._grpc is not None:
            self._grpc.start()
        log.info("watch_listening", host=self.settings.host, http_port=self.port, grpc_port=self.grpc_port,
                 auth="required" if self.settings.requires_auth else "off",
                 content_capture=self.settings.capture_content)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking spans, check what was queued, judge every open run, send the last alerts."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._http.shutdown()
        self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait(timeout_s)
        self._queue.put(_STOP)
        self._threads[0].join(timeout_s)
        self.sinks.wait(timeout_s)
        self.sinks.close(timeout_s)
        log.info("watch_stopped", alerts=self.watcher.alerts_sent)

    def __enter__(self) -> WatchServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything received so far has been checked."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False

    # -- receiving (any thread) ---------------------------------------------------------------------------------

    def submit(self, spans: list[SpanRecord]) -> tuple[int, str]:
        """Queue spans for the detector without waiting. Returns (rejected count, why)."""
        valid = [s for s in spans if len(s.trace_id) == 32 and len(s.span_id) == 16 and s.trace_id.strip("0")]
        rejected = len(spans) - len(valid)
        reason = "spans without a valid trace or span id" if rejected else ""
        if valid:
            try:
                self._queue.put_nowait(valid)
            except queue.Full:
                self.metrics.spans_rejected.labels(reason="overloaded").inc(len(valid))
                return len(spans), "watch is overloaded: its detector queue is full"
            self.metrics.spans_received.inc(len(valid))
            self.metrics.queue_depth.set(self._queue.qsize())
        if rejected:
            self.metrics.spans_rejected.labels(reason="invalid_id").inc(rejected)
        return rejected, reason

    # -- the detector worker ------------------------------------------------------------------------------------

    def _work(self) -> None:
        next_sweep = time.monotonic() + 1.0
        while True:
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._safely(self.watcher.close_all)
                self._queue.task_done()
                return
            if item is not None:
                self._safely(self.watcher.ingest, item)
                self._queue.task_done()
                self.metrics.queue_depth.set(self._queue.qsize())
            if time.monotonic() >= next_sweep:
                self._safely(self.watcher.sweep)
                next_sweep = time.monotonic() + 1.0

    @staticmethod
    def _safely(function: Callable[..., None], *args: Any) -> None:
        # Spans no reader expected must not take the worker down: watch keeps serving the other senders.
        try:
            function(*args)
        except Exception as exc:
            log.error("watch_detector_failed", error=type(exc).__name__)
