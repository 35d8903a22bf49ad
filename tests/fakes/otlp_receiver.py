"""In-process stand-ins for an OTLP backend, for tests.

There is no real Langfuse or OpenTelemetry Collector in the test environment,
so these receivers play their part: they accept what the real SDK exporters
send, decode the protobuf, and keep everything they saw for assertions.

* ``OTLPReceiver``: OTLP/HTTP (protobuf or JSON, gzip/deflate) on
  ``{path_prefix}/v1/traces`` and ``{path_prefix}/v1/metrics``.  With
  ``path_prefix="/api/public/otel"`` and ``basic_auth=(public, secret)`` it
  behaves like Langfuse's OTel endpoint, including Langfuse's 401 bodies.
* ``OTLPGrpcReceiver``: OTLP/gRPC TraceService and MetricsService.
* ``unused_port()``: a port nothing listens on, for "connection refused".
* ``langfuse_view(span)``: what Langfuse's OTel ingestion makes of a received span (observation type, trace name,
  session, user, tags, metadata, environment, input, output, level), following its mapping rules, so tests assert
  what a user would see in Langfuse rather than attribute spellings. ``phoenix_view(span)``: the same for Phoenix
  (kind, Input, Output).

As a Langfuse stand-in the HTTP receiver also answers ``GET /api/public/projects`` (the project the keys belong
to, ``project_id``) and counts those look-ups in ``project_lookups``; they are not OTLP requests and stay out of
``requests``.

Both receivers can be told to misbehave for the next requests with
``fail_next(...)`` so retry and timeout paths can be exercised.

Typical use::

    with OTLPReceiver(basic_auth=("pk", "sk"), path_prefix="/api/public/otel") as rx:
        exporter = OTLPSpanExporter(endpoint=rx.traces_url, headers=...)
        ...
        spans = rx.wait_for_spans(2)
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

__all__ = [
    "LANGFUSE_INVALID_AUTH_HEADER",
    "LANGFUSE_INVALID_CREDENTIALS",
    "LANGFUSE_NO_AUTH_HEADER",
    "Delay",
    "LangfuseObservation",
    "OTLPGrpcReceiver",
    "OTLPReceiver",
    "PhoenixSpan",
    "Received",
    "ReceivedDataPoint",
    "ReceivedMetric",
    "ReceivedSpan",
    "Reject",
    "langfuse_view",
    "phoenix_view",
    "unused_port",
]

# Langfuse answers a bad or missing key with 401 and a JSON body {"message": ...}
# (web/src/features/public-api/server/apiAuth.ts and createAuthedProjectAPIRoute.ts
# in langfuse/langfuse).  The texts are mirrored so tests can assert on them.
LANGFUSE_NO_AUTH_HEADER = "No authorization header"
LANGFUSE_INVALID_AUTH_HEADER = "Invalid authorization header. Confirm that you've configured the correct host."
LANGFUSE_INVALID_CREDENTIALS = "Invalid credentials. Confirm that you've configured the correct host."

TRACES_GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
METRICS_GRPC_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


# --------------------------------------------------------------------------
# Faults that fail_next() can queue
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Delay:
    """Hold the request for ``seconds``, then handle it normally (200 if it is valid)."""

    seconds: float


@dataclass(frozen=True)
class Reject:
    """Answer with ``status`` instead of handling the request.

    ``status`` is an HTTP status (int) for ``OTLPReceiver`` or a
    ``grpc.StatusCode`` for ``OTLPGrpcReceiver``.  ``retry_after`` (seconds)
    becomes a ``Retry-After`` header (HTTP) or a ``google.rpc.RetryInfo``
    trailer (gRPC); both SDK exporters use it instead of their own exponential
    backoff, which is how a test keeps a retry fast.
    """

    status: int | grpc.StatusCode
    retry_after: float | None = None
    message: str = "injected fault"


Fault = Delay | Reject


# --------------------------------------------------------------------------
# What was received
# --------------------------------------------------------------------------


@dataclass
class ReceivedSpan:
    trace_id: str  # 32 hex chars
    span_id: str  # 16 hex chars
    parent_span_id: str | None
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind: 1 internal, 2 server, 3 client, ...
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    resource: dict[str, Any]
    scope: str
    scope_version: str = ""
    start_time_unix_nano: int = 0
    end_time_unix_nano: int = 0
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (trace_id, span_id, attributes)
    trace_state: str = ""


@dataclass
class ReceivedDataPoint:
    attributes: dict[str, Any]
    value: int | float | None = None  # sum and gauge points
    count: int | None = None  # histogram / exponential histogram / summary points
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bucket_counts: list[int] = field(default_factory=list)
    explicit_bounds: list[float] = field(default_factory=list)
    start_time_unix_nano: int = 0
    time_unix_nano: int = 0


@dataclass
class ReceivedMetric:
    name: str
    unit: str
    kind: str  # "sum", "gauge", "histogram", "exponential_histogram" or "summary"
    data_points: list[ReceivedDataPoint]
    description: str = ""
    is_monotonic: bool | None = None  # sums only
    temporality: int | None = None  # 1 delta, 2 cumulative; sums and histograms only
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


@dataclass
class Received:
    """One request, whatever became of it."""

    path: str  # HTTP path, or the gRPC method name
    headers: dict[str, str]  # lower-cased names (HTTP headers or gRPC metadata)
    status: int | grpc.StatusCode  # what was answered: HTTP status, or gRPC status code
    content_type: str = ""
    body: bytes = b""  # after decompression
    spans: list[ReceivedSpan] = field(default_factory=list)  # decoded even when rejected
    metrics: list[ReceivedMetric] = field(default_factory=list)
    error: str | None = None  # why it was rejected, if it was
    at: float = 0.0  # time.monotonic() when it arrived; lets tests measure retry spacing

    @property
    def accepted(self) -> bool:
        return self.status == 200 or self.status == grpc.StatusCode.OK


# --------------------------------------------------------------------------
# Decoding the protobuf into plain Python
# --------------------------------------------------------------------------


def _any_value(value) -> Any:
    """AnyValue -> str/bool/int/float/list/dict/bytes (None when empty)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which)


def _attributes(key_values) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in key_values}


def _hex_or_none(raw: bytes) -> str | None:
    return raw.hex() if raw else None


def decode_spans(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Flatten resource_spans/scope_spans/spans into ReceivedSpan records."""
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=_hex_or_none(span.parent_span_id),
                        name=span.name,
                        kind=span.kind,
                        attributes=_attributes(span.attributes),
                        events=[(event.name, _attributes(event.attributes)) for event in span.events],
                        status_code=span.status.code,
                        status_message=span.status.message,
                        resource=resource,
                        scope=scope_spans.scope.name,
                        scope_version=scope_spans.scope.version,
                        start_time_unix_nano=span.start_time_unix_nano,
                        end_time_unix_nano=span.end_time_unix_nano,
                        links=[
                            (link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
                            for link in span.links
                        ],
                        trace_state=span.trace_state,
                    )
                )
    return spans


def _number_point(point) -> ReceivedDataPoint:
    which = point.WhichOneof("value")  # as_int or as_double
    return ReceivedDataPoint(
        attributes=_attributes(point.attributes),
        value=getattr(point, which) if which else None,
        start_time_unix_nano=point.start_time_unix_nano,
        time_unix_nano=point.time_unix_nano,
    )


def _distribution_point(point) -> ReceivedDataPoint:
    """Histogram, exponential histogram and summary points all carry count and sum."""
    has = point.HasField
    return ReceivedDataPoint(
        attributes=_attributes(point.attributes),
        count=point.count,
        # sum/min/max are proto3 `optional` in histograms (absent != 0); always present in summaries.
        sum=point.sum if not _is_optional(point, "sum") or has("sum") else None,
        min=point.min if _is_optional(point, "min") and has("min") else None,
        max=point.max if _is_optional(point, "max") and has("max") else None,
        bucket_counts=list(getattr(point, "bucket_counts", [])),
        explicit_bounds=list(getattr(point, "explicit_bounds", [])),
        start_time_unix_nano=point.start_time_unix_nano,
        time_unix_nano=point.time_unix_nano,
    )


def _is_optional(message, field_name: str) -> bool:
    field_descriptor = message.DESCRIPTOR.fields_by_name.get(field_name)
    return field_descriptor is not None and field_descriptor.has_presence


def _metric(metric, resource: dict[str, Any], scope: str) -> ReceivedMetric:
    kind = metric.WhichOneof("data") or ""
    data = getattr(metric, kind) if kind else None
    if kind in ("sum", "gauge"):
        points = [_number_point(p) for p in data.data_points]
    elif data is not None:
        points = [_distribution_point(p) for p in data.data_points]
    else:
        points = []
    return ReceivedMetric(
        name=metric.name,
        unit=metric.unit,
        kind=kind,
        data_points=points,
        description=metric.description,
        is_monotonic=data.is_monotonic if kind == "sum" else None,
        temporality=getattr(data, "aggregation_temporality", None),
        resource=resource,
        scope=scope,
    )


def decode_metrics(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[ReceivedMetric]:
    metrics = []
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                metrics.append(_metric(metric, resource, scope_metrics.scope.name))
    return metrics


# OTLP/JSON departs from the standard protobuf JSON mapping in one place: trace
# and span ids are hex strings, not base64.  json_format only knows the
# standard mapping, so the ids are rewritten to base64 before parsing.
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, list):
        return [_hex_ids_to_base64(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {}
    for key, value in node.items():
        if key in _HEX_ID_KEYS and isinstance(value, str):
            value = base64.b64encode(bytes.fromhex(value)).decode("ascii")
        else:
            value = _hex_ids_to_base64(value)
        converted[key] = value
    return converted


def parse_otlp_json(body: bytes, message: Message) -> Message:
    document = json.loads(body or b"{}")
    if not isinstance(document, dict):
        raise ValueError(f"expected a JSON object, got {type(document).__name__}")
    json_format.ParseDict(_hex_ids_to_base64(document), message, ignore_unknown_fields=True)
    return message


# --------------------------------------------------------------------------
# State shared by the HTTP and gRPC receivers
# --------------------------------------------------------------------------


class _Recorder:
    """Thread-safe record of requests plus a queue of faults to inject."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._requests: list[Received] = []
        self._faults: deque[Fault] = deque()
        # Set on stop() so a Delay in progress does not hold shutdown hostage.
        self._stopping = threading.Event()

    # -- what tests read ------------------------------------------------------

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._requests)

    @property
    def spans(self) -> list[ReceivedSpan]:
        """Every span of every accepted request, in arrival order."""
        with self._lock:
            return self._accepted_spans()

    @property
    def metrics(self) -> list[ReceivedMetric]:
        """Every metric of every accepted request, in arrival order."""
        with self._lock:
            return [m for r in self._requests if r.accepted for m in r.metrics]

    def _accepted_spans(self) -> list[ReceivedSpan]:
        return [s for r in self._requests if r.accepted for s in r.spans]

    def metrics_named(self, name: str) -> list[ReceivedMetric]:
        return [m for m in self.metrics if m.name == name]

    def clear(self) -> None:
        """Forget what was received (queued faults stay)."""
        with self._lock:
            self._requests.clear()

    # -- waiting ----------------------------------------------------------------

    def wait_for_spans(self, n: int, timeout: float = 5.0) -> list[ReceivedSpan]:
        """Block until at least ``n`` spans were accepted; AssertionError on timeout."""
        return self._wait(lambda: self._accepted_spans(), n, timeout, "accepted spans")

    def wait_for_metrics(self, n: int = 1, timeout: float = 5.0) -> list[ReceivedMetric]:
        return self._wait(
            lambda: [m for r in self._requests if r.accepted for m in r.metrics], n, timeout, "accepted metrics"
        )

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[Received]:
        """Block until ``n`` requests arrived, accepted or not (useful for failure paths)."""
        return self._wait(lambda: list(self._requests), n, timeout, "requests")

    def _wait(self, collect: Callable[[], list], n: int, timeout: float, what: str) -> list:
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(items := collect()) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    statuses = [r.status for r in self._requests]
                    raise AssertionError(
                        f"expected at least {n} {what} within {timeout}s, got {len(items)}; "
                        f"request statuses so far: {statuses}"
                    )
                self._changed.wait(remaining)
            return items

    # -- faults -----------------------------------------------------------------

    def fail_next(self, *faults: int | grpc.StatusCode | Fault) -> None:
        """Queue faults, one per upcoming request to a known OTLP path (404s and 405s don't consume one).

        Each is a status (int for HTTP, grpc.StatusCode for gRPC), Reject(...) or Delay(seconds).
        A Reject answers before auth is checked; a Delay waits, then the request is handled normally.
        """
        with self._lock:
            self._faults.extend(f if isinstance(f, (Delay, Reject)) else Reject(f) for f in faults)

    def _next_fault(self) -> Fault | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    # -- recording --------------------------------------------------------------

    def _record(self, received: Received) -> None:
        with self._changed:
            self._requests.append(received)
            self._changed.notify_all()


def _check_basic_auth(authorization: str | None, expected: tuple[str, str]) -> str | None:
    """Return Langfuse's error message for a bad Authorization header, or None when it is good."""
    if not authorization:
        return LANGFUSE_NO_AUTH_HEADER
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return LANGFUSE_INVALID_AUTH_HEADER
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return LANGFUSE_INVALID_AUTH_HEADER
    if not sep or not user or not password:
        return LANGFUSE_INVALID_AUTH_HEADER
    if (user, password) != tuple(expected):
        return LANGFUSE_INVALID_CREDENTIALS
    return None


def _missing_headers(headers: dict[str, str], required: dict[str, str]) -> str | None:
    for name, value in required.items():
        got = headers.get(name.lower())
        if got != value:
            return f"header {name!r} must be {value!r}, got {got!r}"
    return None


def unused_port() -> int:
    """A localhost port nothing listens on (bound then released), for 'connection refused' tests."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------
# OTLP/HTTP
# --------------------------------------------------------------------------

# signal path -> (request type, response type, decoder, which Received field the decoded items go to)
_HTTP_SIGNALS = {
    "/v1/traces": (
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
        decode_spans,
        "spans",
    ),
    "/v1/metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
        decode_metrics,
        "metrics",
    ),
}


class _Rejected(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class OTLPReceiver(_Recorder):
    """OTLP/HTTP receiver on 127.0.0.1 (random port), served from a daemon thread."""

    def __init__(
        self,
        *,
        basic_auth: tuple[str, str] | None = None,
        required_headers: dict[str, str] | None = None,
        path_prefix: str = "",
        project_id: str = "cm-looptrace-test-project",
    ) -> None:
        super().__init__()
        self.basic_auth = basic_auth
        self.required_headers = dict(required_headers or {})
        self.path_prefix = path_prefix.rstrip("/")
        self.scores: list[dict] = []  # Langfuse scores posted (a Langfuse stand-in only)
        self.project_id = project_id  # what GET /api/public/projects answers (a Langfuse stand-in only)
        self.project_lookups: list[int] = []  # the HTTP status of each projects look-up
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True  # a keep-alive connection must not block stop()
        self.port: int = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.url = self.base_url + self.path_prefix  # what OTEL_EXPORTER_OTLP_ENDPOINT would be
        self.traces_url = self.url + "/v1/traces"
        self.metrics_url = self.url + "/v1/metrics"
        # A short poll interval: shutdown() waits up to one interval, and tests stop many receivers.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"otlp-http-{self.port}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(_OTLPHTTPHandler):
            pass

        Handler.receiver = receiver
        return Handler

    @property
    def is_langfuse(self) -> bool:
        return self.path_prefix == "/api/public/otel"

    def _projects(self, headers: dict[str, str]) -> tuple[int, bytes]:
        """Langfuse's GET /api/public/projects: the project of the keys, ``{"data": [{"id", "name"}]}``."""
        auth_error = _check_basic_auth(headers.get("authorization"), self.basic_auth) if self.basic_auth else None
        status, body = (401, {"message": auth_error}) if auth_error else (
            200, {"data": [{"id": self.project_id, "name": "looptrace-test"}]})
        with self._lock:
            self.project_lookups.append(status)
        return status, json.dumps(body).encode()

    # -- request handling (called from the handler thread) ------------------------

    def _handle(self, path: str, headers: dict[str, str], raw_body: bytes) -> tuple[int, str, bytes, dict[str, str]]:
        """Decide the answer to one POST and record it.  Returns (status, content type, body, extra headers)."""
        received = Received(path=path, headers=headers, status=0, content_type=headers.get("content-type", ""),
                            at=time.monotonic())
        try:
            status, content_type, body = self._process(received, raw_body)
            extra: dict[str, str] = {}
        except _Rejected as rejection:
            received.error = rejection.message
            status, content_type, extra = rejection.status, "application/json", rejection.headers
            body = json.dumps({"message": rejection.message}).encode()
        received.status = status
        self._record(received)
        return status, content_type, body, extra

    def _process(self, received: Received, raw_body: bytes) -> tuple[int, str, bytes]:
        if self.path_prefix == "/api/public/otel" and received.path.split("?", 1)[0] == "/api/public/scores":
            return self._score(received, raw_body)
        signal = self._signal_for(received.path)
        if signal is None:
            raise _Rejected(404, f"no OTLP endpoint at {received.path}")
        request_type, response_type, decode, target = signal
        headers = received.headers

        # Decode before judging, so even a rejected request shows what the exporter
        # tried to send; a body that cannot be decoded is only reported after the
        # auth check, because Langfuse authenticates first.
        undecodable: _Rejected | None = None
        try:
            received.body = self._decompress(raw_body, headers.get("content-encoding", ""))
            message = self._parse(received.body, received.content_type, request_type)
            setattr(received, target, decode(message))
        except _Rejected as rejection:
            undecodable = rejection

        fault = self._next_fault()
        if isinstance(fault, Reject):
            retry = {} if fault.retry_after is None else {"Retry-After": _retry_after_value(fault.retry_after)}
            raise _Rejected(int(fault.status), fault.message, retry)
        if isinstance(fault, Delay):
            self._sleep(fault.seconds)

        if self.basic_auth is not None:
            auth_error = _check_basic_auth(headers.get("authorization"), self.basic_auth)
            if auth_error:
                raise _Rejected(401, auth_error)
        header_error = _missing_headers(headers, self.required_headers)
        if header_error:
            raise _Rejected(400, header_error)
        if undecodable is not None:
            raise undecodable

        # Answer in the encoding the request came in, as the OTLP spec asks.
        if _is_json(received.content_type):
            return 200, "application/json", json_format.MessageToJson(response_type()).encode()
        return 200, "application/x-protobuf", response_type().SerializeToString()

    def _score(self, received: Received, raw_body: bytes) -> tuple[int, str, bytes]:
        """Langfuse's score API, as a Langfuse stand-in needs it: Basic auth, one JSON score per request."""
        if self.basic_auth is not None:
            auth_error = _check_basic_auth(received.headers.get("authorization"), self.basic_auth)
            if auth_error:
                raise _Rejected(401, auth_error)
        try:
            score = json.loads(raw_body)
        except ValueError:
            raise _Rejected(400, "the score is not JSON") from None
        with self._lock:
            self.scores.append(score)
        return 200, "application/json", json.dumps({"id": score.get("id", "score")}).encode()

    def _signal_for(self, path: str):
        path = path.split("?", 1)[0]
        if not path.startswith(self.path_prefix + "/"):
            return None
        return _HTTP_SIGNALS.get(path[len(self.path_prefix):])

    @staticmethod
    def _decompress(body: bytes, encoding: str) -> bytes:
        encoding = encoding.strip().lower()
        try:
            if encoding == "gzip":
                return gzip.decompress(body)
            if encoding == "deflate":
                # The SDK sends zlib-wrapped deflate; accept raw deflate too.
                try:
                    return zlib.decompress(body)
                except zlib.error:
                    return zlib.decompress(body, -zlib.MAX_WBITS)
        except (OSError, zlib.error, EOFError) as error:
            raise _Rejected(400, f"cannot decompress {encoding} body: {error}") from error
        if encoding in ("", "identity", "none"):
            return body
        raise _Rejected(415, f"unsupported Content-Encoding {encoding!r}")

    @staticmethod
    def _parse(body: bytes, content_type: str, request_type: type[Message]) -> Message:
        try:
            if _is_json(content_type):
                return parse_otlp_json(body, request_type())
            if "application/x-protobuf" in content_type.lower():
                message = request_type()
                message.ParseFromString(body)
                return message
        except (DecodeError, json_format.ParseError, ValueError) as error:
            raise _Rejected(400, f"cannot decode {request_type.__name__}: {error}") from error
        raise _Rejected(415, f"unsupported Content-Type {content_type!r}")


def _is_json(content_type: str) -> bool:
    return "application/json" in content_type.lower()


def _retry_after_value(seconds: float) -> str:
    # RFC 9110 says delay-seconds is an integer; the Python SDK parses a float,
    # and fractions keep tests fast, so whole numbers are sent as integers only.
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


class _OTLPHTTPHandler(BaseHTTPRequestHandler):
    receiver: OTLPReceiver
    # HTTP/1.1 so the exporter's requests.Session can keep its connection alive, as with a real backend.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle and delayed ACKs add ~40 ms a request.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        body = self._read_body()
        headers = {name.lower(): value for name, value in self.headers.items()}
        status, content_type, payload, extra = self.receiver._handle(self.path, headers, body)
        self._reply(status, content_type, payload, extra)

    def do_GET(self) -> None:
        if self.receiver.is_langfuse and self.path.split("?", 1)[0] == "/api/public/projects":
            headers = {name.lower(): value for name, value in self.headers.items()}
            status, payload = self.receiver._projects(headers)
            self._reply(status, "application/json", payload, {})
            return
        self._not_allowed()

    def do_PUT(self) -> None:
        self._not_allowed()

    do_DELETE = do_PATCH = do_PUT

    def _not_allowed(self) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        self._read_body()
        received = Received(path=self.path, headers=headers, status=405, error=f"method {self.command} not allowed",
                            at=time.monotonic())
        self.receiver._record(received)
        self._reply(405, "application/json", json.dumps({"message": received.error}).encode(), {"Allow": "POST"})

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # Skip optional trailers up to the blank line that ends the body.
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk

    def _reply(self, status: int, content_type: str, payload: bytes, extra: dict[str, str]) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            # The exporter gave up (its timeout is shorter than a Delay); nothing to answer.
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean; every request is in receiver.requests anyway


# --------------------------------------------------------------------------
# OTLP/gRPC
# --------------------------------------------------------------------------


def _retry_info_trailer(seconds: float) -> tuple[str, bytes]:
    """The ``google.rpc.RetryInfo`` trailer the SDK gRPC exporter honours.

    RetryInfo is ``message RetryInfo { google.protobuf.Duration retry_delay = 1; }``;
    building its wire form by hand (tag 0x0A, length, Duration) avoids a
    dependency on googleapis-common-protos for one field.
    """
    whole = int(seconds)
    delay = Duration(seconds=whole, nanos=int(round((seconds - whole) * 1e9))).SerializeToString()
    return "google.rpc.retryinfo-bin", b"\x0a" + bytes([len(delay)]) + delay


def _grpc_code(status: int | grpc.StatusCode) -> grpc.StatusCode:
    """Accept a grpc.StatusCode or its number (14 == UNAVAILABLE)."""
    if isinstance(status, grpc.StatusCode):
        return status
    return next(code for code in grpc.StatusCode if code.value[0] == status)


class OTLPGrpcReceiver(_Recorder):
    """OTLP/gRPC receiver (TraceService and MetricsService) on 127.0.0.1 (random port).

    ``fail_next`` takes ``grpc.StatusCode`` values, ``Reject(code, retry_after=...)``
    or ``Delay(seconds)``.  ``required_metadata`` / ``basic_auth`` mismatches
    answer UNAUTHENTICATED.
    """

    def __init__(
        self,
        *,
        required_metadata: dict[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.required_metadata = dict(required_metadata or {})
        self.basic_auth = basic_auth
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="otlp-grpc"))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(self), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsServicer(self), self._server)
        self.port: int = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.endpoint}"  # for OTEL_EXPORTER_OTLP_ENDPOINT with the grpc protocol
        self._server.start()

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._server.stop(grace=None).wait(5)

    def _export(self, method: str, request: Message, context: grpc.ServicerContext, decode, target: str):
        metadata = {key.lower(): value for key, value in context.invocation_metadata() if isinstance(value, str)}
        received = Received(path=method, headers=metadata, status=grpc.StatusCode.OK,
                            content_type="application/grpc", body=request.SerializeToString(), at=time.monotonic())
        setattr(received, target, decode(request))
        code, message, trailers = self._decide(metadata)
        received.status = code
        if code != grpc.StatusCode.OK:
            received.error = message
        self._record(received)
        if code != grpc.StatusCode.OK:
            if trailers:
                context.set_trailing_metadata(trailers)
            context.abort(code, message)  # raises, ending the RPC with that status

    def _decide(self, metadata: dict[str, str]) -> tuple[grpc.StatusCode, str, list]:
        fault = self._next_fault()
        if isinstance(fault, Reject):
            trailers = [] if fault.retry_after is None else [_retry_info_trailer(fault.retry_after)]
            return _grpc_code(fault.status), fault.message, trailers
        if isinstance(fault, Delay):
            self._sleep(fault.seconds)
        if self.basic_auth is not None:
            auth_error = _check_basic_auth(metadata.get("authorization"), self.basic_auth)
            if auth_error:
                return grpc.StatusCode.UNAUTHENTICATED, auth_error, []
        header_error = _missing_headers(metadata, self.required_metadata)
        if header_error:
            return grpc.StatusCode.UNAUTHENTICATED, header_error, []
        return grpc.StatusCode.OK, "", []


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPGrpcReceiver) -> None:
        self._receiver = receiver

    def Export(self, request, context):
        self._receiver._export(TRACES_GRPC_METHOD, request, context, decode_spans, "spans")
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OTLPGrpcReceiver) -> None:
        self._receiver = receiver

    def Export(self, request, context):
        self._receiver._export(METRICS_GRPC_METHOD, request, context, decode_metrics, "metrics")
        return metrics_service_pb2.ExportMetricsServiceResponse()


# --------------------------------------------------------------------------
# What Phoenix shows of a span
# --------------------------------------------------------------------------


@dataclass
class PhoenixSpan:
    kind: str
    input: tuple[str, str] | None  # (mime type, value)
    output: tuple[str, str] | None


def phoenix_view(span: ReceivedSpan) -> PhoenixSpan:
    """A received span as Phoenix shows it (src/phoenix/server/api/types/Span.py in Arize-ai/phoenix, to_gql_span):
    its kind from openinference.span.kind, and its Input and Output from input.value and output.value alone, each with
    its mime type (text/plain unless said otherwise). gen_ai.* plays no part in either."""
    a = span.attributes

    def value(key: str) -> tuple[str, str] | None:
        if a.get(f"{key}.value") is None:
            return None
        return a.get(f"{key}.mime_type") or "text/plain", a[f"{key}.value"]

    return PhoenixSpan(kind=str(a.get("openinference.span.kind", "UNKNOWN")).upper(), input=value("input"),
                       output=value("output"))


# --------------------------------------------------------------------------
# What Langfuse makes of a span
# --------------------------------------------------------------------------

# Following packages/shared/src/server/otel/OtelIngestionProcessor.ts and ObservationTypeMapper.ts in
# langfuse/langfuse (the OTel ingestion's mapping, read for these rules; nothing of it is run here).
_LANGFUSE_TYPES = {"span": "SPAN", "generation": "GENERATION", "event": "EVENT", "agent": "AGENT", "tool": "TOOL",
                   "chain": "CHAIN", "retriever": "RETRIEVER", "embedding": "EMBEDDING", "guardrail": "GUARDRAIL",
                   "evaluator": "EVALUATOR"}
_OPENINFERENCE_TYPES = {"CHAIN": "CHAIN", "RETRIEVER": "RETRIEVER", "LLM": "GENERATION", "EMBEDDING": "EMBEDDING",
                        "AGENT": "AGENT", "TOOL": "TOOL", "GUARDRAIL": "GUARDRAIL", "EVALUATOR": "EVALUATOR"}
_GENAI_TYPES = {"chat": "GENERATION", "text_completion": "GENERATION", "generate_content": "GENERATION",
                "embeddings": "EMBEDDING", "invoke_agent": "AGENT", "create_agent": "AGENT", "execute_tool": "TOOL"}


@dataclass
class LangfuseObservation:
    type: str
    trace_name: str | None
    session_id: str | None
    user_id: str | None
    tags: list[str]
    trace_metadata: dict[str, Any]
    environment: str
    release: str | None
    input: Any
    output: Any
    level: str
    status_message: str | None
    usage_details: dict[str, Any] | None
    is_trace_root: bool  # the trace-create path: no parent, or langfuse.internal.as_root
    is_events_root: bool  # the v4 events path's root test: parent_span_id = '' OR is_app_root = true
    trace_input: Any
    trace_output: Any


def _first(attributes: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if attributes.get(key):
            return attributes[key]
    return None


def _langfuse_input_and_output(a: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> tuple[Any, Any]:
    """An observation's input and output, in the order of extractInputAndOutput (the part looptrace's spans touch):
    Langfuse's own keys; the GenAI operation-details event; OpenInference's input.value/output.value, taken as a pair
    as soon as either is set; then the GenAI messages and tool call (extractOpenTelemetryGenAiInputAndOutput)."""
    if a.get("langfuse.observation.input") is not None or a.get("langfuse.observation.output") is not None:
        return a.get("langfuse.observation.input"), a.get("langfuse.observation.output")
    for name, attributes in events:
        if name == "gen_ai.client.inference.operation.details":
            found = _genai_input_and_output(attributes)
            if found is not None:
                return found
    if a.get("input.value") or a.get("output.value"):
        return a.get("input.value"), a.get("output.value")
    return _genai_input_and_output(a) or (None, None)


def _genai_input_and_output(a: dict[str, Any]) -> tuple[Any, Any] | None:
    messages, output = a.get("gen_ai.input.messages"), a.get("gen_ai.output.messages")
    if messages and a.get("gen_ai.system_instructions"):
        messages = _with_system_first(messages, a["gen_ai.system_instructions"])
    if messages or output:
        return messages, output
    if a.get("gen_ai.tool.call.arguments") or a.get("gen_ai.tool.call.result"):
        return a.get("gen_ai.tool.call.arguments"), a.get("gen_ai.tool.call.result")
    return None


def _with_system_first(messages: Any, instructions: Any) -> Any:
    """prependSystemInstructions: the instructions' text parts joined by newlines, as a first system message, unless
    the messages already hold one or are no JSON list (then they are shown as they are)."""
    try:
        parsed = json.loads(messages) if isinstance(messages, str) else messages
    except ValueError:
        return messages
    if not isinstance(parsed, list) or any(isinstance(m, dict) and m.get("role") == "system" for m in parsed):
        return messages
    try:
        parts = json.loads(instructions) if isinstance(instructions, str) else instructions
    except ValueError:
        parts = instructions
    if isinstance(parts, list):
        content = "\n".join(str(p["content"]) if isinstance(p, dict) and p.get("content") else str(p) for p in parts)
    else:
        content = str(parts)
    merged = [{"role": "system", "content": content}, *parsed]
    return json.dumps(merged, ensure_ascii=False, separators=(",", ":")) if isinstance(messages, str) else merged


def langfuse_view(span: ReceivedSpan) -> LangfuseObservation:
    """One received span as a Langfuse observation, by Langfuse's rules (the subset looptrace's spans touch)."""
    a, resource = span.attributes, span.resource
    kind = (_LANGFUSE_TYPES.get(a.get("langfuse.observation.type", ""))
            or _OPENINFERENCE_TYPES.get(a.get("openinference.span.kind", ""))
            or _GENAI_TYPES.get(a.get("gen_ai.operation.name", ""))
            or ("TOOL" if a.get("gen_ai.tool.name") or a.get("gen_ai.tool.call.id") else None)
            or ("GENERATION" if a.get("gen_ai.request.model") or a.get("gen_ai.response.model") else "SPAN"))
    environment = "default"
    for key in ("langfuse.environment", "deployment.environment.name", "deployment.environment"):
        if a.get(key) or resource.get(key):
            environment = a.get(key) or resource[key]
            break
    prefix = "langfuse.trace.metadata."
    metadata = {key[len(prefix):]: value for key, value in a.items() if key.startswith(prefix)}
    tags = a.get("langfuse.trace.tags") or []
    observed_input, observed_output = _langfuse_input_and_output(a, span.events)
    usage = a.get("langfuse.observation.usage_details")
    is_root = span.parent_span_id is None or str(a.get("langfuse.internal.as_root")).lower() == "true"
    return LangfuseObservation(
        type=kind,
        trace_name=a.get("langfuse.trace.name"),
        session_id=_first(a, "langfuse.session.id", "session.id", "gen_ai.conversation.id"),
        user_id=_first(a, "langfuse.user.id", "user.id"),
        tags=list(tags) if isinstance(tags, (list, tuple)) else [tags],
        trace_metadata=metadata,
        environment=environment,
        release=a.get("langfuse.release") or resource.get("langfuse.release"),
        input=observed_input,
        output=observed_output,
        level=a.get("langfuse.observation.level") or ("ERROR" if span.status_code == 2 else "DEFAULT"),
        status_message=a.get("langfuse.observation.status_message") or span.status_message or None,
        usage_details=json.loads(usage) if isinstance(usage, str) else None,
        is_trace_root=is_root,
        is_events_root=span.parent_span_id is None or str(a.get("langfuse.internal.is_app_root")).lower() == "true",
        trace_input=a.get("langfuse.trace.input") or (observed_input if is_root else None),
        trace_output=a.get("langfuse.trace.output") or (observed_output if is_root else None),
    )
