"""`looptrace watch`: an OTLP receiver that runs the loop detector over any agent's traces as they arrive.

Any app or collector sends it traces (OTLP/HTTP at /v1/traces, protobuf or JSON, gzip or deflate; OTLP/gRPC). Spans
are decoded on the receiving thread, which answers at once: the detector runs on one worker thread fed by a bounded
queue, so a slow check never holds up a sender, and spans that cannot be taken (queue full, no ids) are reported back
as OTLP partial success instead of an error the sender would retry.

Runs are assembled by trace (or session, see readers.py) with `trace_detect.RunRebuilder`, which reads every producer
readers.py knows. After each batch the runs it touched are checked (repeats, cycles, failing tools fire as soon as the
span that completes them arrives); a run is judged in full (ignored errors too) when its root span arrives, when it
has been idle for `idle_timeout_s`, or when it is evicted because `max_open_runs` are open (counted).

Alerts go where the agent's own go (alerts.py): a structured log line, the webhook (LOOPTRACE_ALERT_WEBHOOK), a
Langfuse score on the trace when LANGFUSE_* keys are set, and `looptrace_anomalies_total{service,agent,anomaly_type}`
on GET /metrics, beside watch's own counters.

Safety: binds 127.0.0.1 unless told otherwise; LOOPTRACE_WATCH_TOKEN (bearer) or LOOPTRACE_WATCH_USERNAME and
LOOPTRACE_WATCH_PASSWORD (basic) make every export authenticate, compared in constant time and never logged; bodies
above `max_request_bytes` get 413 before they are read, and decompression stops at `max_decompressed_bytes` (a gzip
bomb gets 413 too). With content capture off (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=NO_CONTENT or
LOOPTRACE_CAPTURE_CONTENT=false) no argument or message text reaches watch's log or webhook.
"""

from __future__ import annotations

import base64
import dataclasses
import hmac
import json
import queue
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import semconv as sc
from .alerts import AlertContext, Alerts
from .detector import Anomaly, DetectorConfig
from .logs import install_cli_rendering, log, logger
from .readers import SESSION_PREFIX, run_key
from .settings import Settings
from .trace_detect import DETECTION_KEYS, RunRebuilder, Verdict
from .tracefile.read import SpanRecord, spans_of_traces_data

SERVICE_NAME = "service.name"
_RESOURCE_KEYS = frozenset({SERVICE_NAME})


@dataclass(frozen=True, slots=True)
class WatchSettings:
    host: str = "127.0.0.1"
    port: int = 4318  # OTLP/HTTP's standard port: pointing an exporter at watch is changing only the host
    grpc_port: int | None = 4317  # None: no gRPC listener
    idle_timeout_s: float = 300.0
    max_open_runs: int = 10_000
    max_request_bytes: int = 8 * 1024 * 1024  # as sent (compressed)
    max_decompressed_bytes: int = 64 * 1024 * 1024
    queue_batches: int = 1024  # export requests waiting for the detector; beyond it spans are rejected
    capture_content: bool = True
    bearer_token: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, **overrides: Any) -> WatchSettings:
        """Auth and content capture from the environment (settings.py reads it); flags as keyword overrides."""
        settings = Settings.from_env()
        values: dict[str, Any] = {"bearer_token": settings.watch_token, "basic_auth": settings.watch_basic_auth,
                                  "capture_content": settings.capture_content}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def requires_auth(self) -> bool:
        return self.bearer_token is not None or self.basic_auth is not None


# --- authentication ---------------------------------------------------------------------------------------------

def authorized(header: str | None, settings: WatchSettings) -> bool:
    """Whether an Authorization header carries the configured token or credentials. Constant-time comparisons."""
    if not settings.requires_auth:
        return True
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if settings.bearer_token is not None and scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), settings.bearer_token.encode())
    if settings.basic_auth is not None and scheme.lower() == "basic":
        expected = base64.b64encode(":".join(settings.basic_auth).encode()).decode()
        return hmac.compare_digest(value.encode(), expected.encode())
    return False


# --- decoding ---------------------------------------------------------------------------------------------------

class RequestTooLarge(Exception):
    """The body (or what it decompresses to) is above the configured cap."""


class BadRequest(Exception):
    """The body is not OTLP trace data in a form watch reads."""


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """The body decompressed, never more than ``limit`` bytes of it (a gzip bomb stops there)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity", "none"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadRequest(f"unsupported Content-Encoding {encoding!r}")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    try:
        return _inflate(body, wbits, limit)
    except zlib.error:
        if encoding == "deflate":  # raw deflate, without the zlib wrapper, is sent too
            try:
                return _inflate(body, -zlib.MAX_WBITS, limit)
            except zlib.error as exc:
                raise BadRequest(f"cannot decompress deflate body: {exc}") from None
        raise BadRequest("cannot decompress gzip body") from None


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise RequestTooLarge(f"the body decompresses to more than {limit} bytes")
    return out


def parse_request(body: bytes, content_type: str) -> list[SpanRecord]:
    """Spans of an ExportTraceServiceRequest, protobuf or OTLP/JSON, with the attributes detection reads."""
    content_type = content_type.lower()
    if "json" in content_type:
        try:
            document = json.loads(body or b"{}")
            return list(spans_of_traces_data(document, DETECTION_KEYS))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise BadRequest(f"not OTLP/JSON trace data ({type(exc).__name__})") from None
    if "protobuf" in content_type or not content_type:
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError:
            raise BadRequest("not an OTLP protobuf ExportTraceServiceRequest") from None
        return spans_of_request(request)
    raise BadRequest(f"unsupported Content-Type {content_type!r}")


def spans_of_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes, _RESOURCE_KEYS)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                spans.append(SpanRecord(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None, name=span.name, kind=span.kind,
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    attributes=_attributes(span.attributes, DETECTION_KEYS), status_code=span.status.code,
                    resource=resource, scope=scope))
    return spans


def _attributes(key_values: Iterable[Any], keys: frozenset[str]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in key_values if kv.key in keys}


def _any_value(value: Any) -> Any:
    """An AnyValue as the OTLP/JSON reader gives it (tracefile.read.decode_value), so both encodings read the same."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")  # as OTLP/JSON carries bytes
    return getattr(value, which)


def export_response(rejected: int, reason: str, as_json: bool) -> bytes:
    response = trace_service_pb2.ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = reason
    if as_json:
        return json_format.MessageToJson(response).encode()
    return response.SerializeToString()


# --- metrics ----------------------------------------------------------------------------------------------------

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
        return generate_latest(self.registry)


# --- the detector side ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class _RunMeta:
    service: str
    agent: str
    last_seen: float
    alerted: set[tuple[str, str]] = field(default_factory=set)


class RunWatcher:
    """Assembles runs from spans and alerts on their anomalies. Single-threaded: one worker feeds it."""

    def __init__(self, alerts: Alerts, metrics: WatchMetrics, *, idle_timeout_s: float, max_open_runs: int,
                 capture_content: bool, config: DetectorConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.alerts = alerts
        self.metrics = metrics
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
        now = self._clock()
        touched: set[str] = set()
        for span in spans:
            key = run_key(span)
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
            verdict = self._rebuilder.add(span)
            if verdict is not None:
                self._finish(verdict, "root")
                touched.discard(verdict.trace_id)
            else:
                touched.add(key)
        for key in touched:
            if key in self._runs:
                self._alert(key, self._rebuilder.check(key))
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
        self._alert(verdict.trace_id, verdict.anomalies)
        self._runs.pop(verdict.trace_id, None)
        self.metrics.runs_judged.labels(reason=reason).inc()

    def _alert(self, key: str, anomalies: list[Anomaly]) -> None:
        meta = self._runs.get(key)
        if meta is None or not anomalies:
            return
        for anomaly in anomalies:
            identity = (anomaly.type, anomaly.streak)
            if identity in meta.alerted:
                continue  # a streak that grows (count 4, 5, ...) was already reported
            meta.alerted.add(identity)
            self.alerts_sent += 1
            agent = meta.agent or "unknown"
            self.metrics.anomalies.labels(service=meta.service, agent=agent, anomaly_type=anomaly.type).inc()
            shown = anomaly if self.capture_content else _without_content(anomaly)
            self.alerts.send(shown, AlertContext(agent=agent, trace_id=key, span_id="", action="warn"))


def _trace_scores(scores: Any) -> Callable[[Any, AlertContext], None]:
    """Langfuse scores for runs that are traces; a run assembled from a session has no one trace to score."""
    def score(anomaly: Any, context: AlertContext) -> None:
        if not context.trace_id.startswith(SESSION_PREFIX):
            scores.alert_callback(anomaly, context)
    return score


def _without_content(anomaly: Anomaly) -> Anomaly:
    """The anomaly minus the arguments and the detector's message (which quotes them and error texts)."""
    where = f" in {anomaly.tool}" if anomaly.tool else ""
    return dataclasses.replace(anomaly, arguments=None,
                               message=f"{anomaly.type}{where} x{anomaly.count} (content capture is off)")


# --- the server -------------------------------------------------------------------------------------------------

_STOP = object()


class WatchServer:
    """The receivers and the detector worker. ``start()``, then ``stop()`` (SIGTERM does it in the CLI)."""

    def __init__(self, settings: WatchSettings, *, alerts: Alerts | None = None, scores: Any = None,
                 config: DetectorConfig | None = None) -> None:
        self.settings = settings
        self.metrics = WatchMetrics()
        self.scores = scores
        callback = _trace_scores(scores) if scores is not None else None
        self.alerts = alerts if alerts is not None else Alerts(callback=callback)
        self.watcher = RunWatcher(self.alerts, self.metrics, idle_timeout_s=settings.idle_timeout_s,
                                  max_open_runs=settings.max_open_runs, capture_content=settings.capture_content,
                                  config=config)
        self._queue: queue.Queue = queue.Queue(maxsize=settings.queue_batches)
        self._http = ThreadingHTTPServer((settings.host, settings.port), _handler_for(self))
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self._grpc = None
        self.grpc_port: int | None = None
        if settings.grpc_port is not None:
            self._grpc, self.grpc_port = _grpc_server(self, settings)
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self.idle = threading.Event()  # set whenever the worker has nothing queued (tests and benchmarks wait on it)

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
        self.alerts.wait(timeout_s)
        if self.scores is not None:
            self.scores.close(timeout_s)
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


def _handler_for(server: WatchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_WatchHTTPHandler):
        watch = server
    return Handler


class _WatchHTTPHandler(BaseHTTPRequestHandler):
    watch: WatchServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "looptrace-watch"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._reply(200, CONTENT_TYPE_LATEST, self.watch.metrics.render())
        elif path in ("/healthz", "/"):
            self._reply(200, "text/plain", b"ok\n")
        else:
            self._reply(404, "text/plain", b"not found\n")

    def do_POST(self) -> None:
        settings = self.watch.settings
        metrics = self.watch.metrics
        if self.path.split("?", 1)[0] != "/v1/traces":
            self._refuse(404, "only /v1/traces is served", "not_found")
            return
        if not authorized(self.headers.get("Authorization"), settings):
            # Said before the body is read: no one without the token gets to make watch decompress anything.
            self._refuse(401, "authentication required", "unauthorized",
                         {"WWW-Authenticate": 'Bearer realm="looptrace-watch"' if settings.bearer_token
                          else 'Basic realm="looptrace-watch"'})
            return
        try:
            raw = self._read_body(settings.max_request_bytes)
            body = decompress(raw, self.headers.get("Content-Encoding", ""), settings.max_decompressed_bytes)
            content_type = self.headers.get("Content-Type", "")
            spans = parse_request(body, content_type)
        except RequestTooLarge as exc:
            self._refuse(413, str(exc), "too_large")
            return
        except BadRequest as exc:
            self._refuse(400, str(exc), "bad_request")
            return
        rejected, reason = self.watch.submit(spans)
        metrics.requests.labels(transport="http", outcome="partial" if rejected else "ok").inc()
        as_json = "json" in content_type.lower()
        self._reply(200, "application/json" if as_json else "application/x-protobuf",
                    export_response(rejected, reason, as_json))

    def _read_body(self, limit: int) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked(limit)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length > limit:
            self.close_connection = True  # the body stays unread: this connection cannot be reused
            raise RequestTooLarge(f"the body is {length} bytes; the limit is {limit}")
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                size = int(self.rfile.readline(64).split(b";", 1)[0].strip() or b"0", 16)
            except ValueError:
                self.close_connection = True
                raise BadRequest("malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > limit:
                self.close_connection = True
                raise RequestTooLarge(f"the chunked body exceeds the limit of {limit} bytes")
            chunks.append(self.rfile.read(size))
            self.rfile.readline(8)

    def _refuse(self, status: int, message: str, outcome: str, headers: dict[str, str] | None = None) -> None:
        self.watch.metrics.requests.labels(transport="http", outcome=outcome).inc()
        if status in (401, 404):
            self.close_connection = True  # the body was never read
        self._reply(status, "application/json", json.dumps({"code": status, "message": message}).encode(), headers)

    def _reply(self, status: int, content_type: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            if self.close_connection:
                self.send_header("Connection", "close")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # request lines would show paths and peers on every export; the counters on /metrics say enough


# --- gRPC -------------------------------------------------------------------------------------------------------

def _grpc_server(watch: WatchServer, settings: WatchSettings) -> tuple[Any, int]:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            metadata = {key.lower(): value for key, value in context.invocation_metadata()
                        if isinstance(value, str)}
            if not authorized(metadata.get("authorization"), settings):
                watch.metrics.requests.labels(transport="grpc", outcome="unauthorized").inc()
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "authentication required")
            rejected, reason = watch.submit(spans_of_request(request))
            watch.metrics.requests.labels(transport="grpc", outcome="partial" if rejected else "ok").inc()
            response = trace_service_pb2.ExportTraceServiceResponse()
            if rejected:
                response.partial_success.rejected_spans = rejected
                response.partial_success.error_message = reason
            return response

    # gRPC enforces the message cap on the decompressed message, so one setting bounds both.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="looptrace-watch-grpc"),
                         options=[("grpc.max_receive_message_length", settings.max_decompressed_bytes)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    if port == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {settings.host}:{settings.grpc_port}")
    return server, port


# --- as a service -----------------------------------------------------------------------------------------------

def configure_service_logging() -> None:
    """One JSON object per line on stderr, INFO and up: what log collectors read from a long-running service."""
    import logging
    import sys

    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    # looptrace's records (the stdlib logger "looptrace", logs.py) rendered by the structlog chain above.
    install_cli_rendering()
    logger.setLevel(logging.INFO)


def serve(settings: WatchSettings) -> int:
    """Run until SIGTERM or SIGINT, then stop cleanly (every open run judged, last alerts sent). Returns 0."""
    import signal

    import prometheus_client

    from .langfuse import LangfuseScores

    configure_service_logging()
    prometheus_client.disable_created_metrics()  # a _created series beside every counter only doubles the scrape
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = WatchServer(settings, scores=LangfuseScores.from_env()).start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
