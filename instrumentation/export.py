"""Getting spans to Langfuse and to an OpenTelemetry Collector without ever hurting the agent.

Three pieces, used by ``setup.configure()`` and by ``looptrace traces push``:

* **Factories** that build the OpenTelemetry project's OTLP exporters from the standard variables
  (``otlp_span_exporter``, ``otlp_metric_exporter``) and from Langfuse's (``langfuse_span_exporter``).
* **GuardedExporter**, wrapped around each network exporter (behind a BatchSpanProcessor, so all of this happens off
  the agent's thread). It never raises, bounds the time of every export, turns a failure into *one* structlog warning
  per backend and cause (refused, timeout, unauthorized, server_error, rejected, failed) that names the backend and the
  endpoint but never a key or a header, and appends what it could not deliver to the spill file.
* **The spill file and push()**: undelivered spans wait in ``.looptrace/spill.jsonl`` (OTLP/JSON lines, readable by
  ``otlp_file.read_spans``), each line tagged with its backend; ``push()`` sends them later, exactly once.

Time a dead or slow backend can cost (measured figures are in tests/test_export.py and tests/test_setup.py):

* A turn: nothing. Spans are queued by the BatchSpanProcessor and exported on its own thread.
* One export on that thread: at most the export timeout (``OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT``, default 10 s;
  ``LANGFUSE_TIMEOUT`` for Langfuse). A refused connection or rejected keys end the wait at once (about 0.05 s),
  without waiting for the exporter's own retries.
* After a failure the backend is skipped for ``RETRY_AFTER_FAILURE_S``: batches go straight to the spill file.
* A flush or shutdown with a deadline: at most that deadline plus one wait slice (0.05 s). Past it every batch is
  spilled instead of sent; an export still on the wire is left to finish on its daemon thread, and if it does succeed
  its batch is marked delivered so push() will not send it again.

``OTEL_EXPORTER_OTLP_TIMEOUT`` is read in **milliseconds**, as the OpenTelemetry specification defines it and as every
other language's SDK reads it. (The Python exporters read it as seconds when left to themselves; looptrace always
passes the timeout explicitly, so the two readings never mix.) The warning for a timeout states the seconds in effect.

A timeout is ambiguous: the backend may have stored a batch whose answer never arrived. Such a batch is spilled, and
pushing it can then show it twice in Langfuse. looptrace prefers that to losing it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans as encode_spans_json
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.re import parse_env_headers

from .logs import log
from .otlp_file import decode_attributes

try:  # advisory file locks keep concurrent runs and pushes from interleaving; Windows has none, threads still lock
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we test
    fcntl = None  # type: ignore[assignment]

DEFAULT_TIMEOUT_S = 10.0  # the specification's default OTEL_EXPORTER_OTLP_TIMEOUT (10000 ms)
RETRY_AFTER_FAILURE_S = 10.0  # how long a failed backend is skipped before the next batch tries it again
WAIT_SLICE_S = 0.05  # how often a waiting export looks at its deadline and at what the probe saw
_GRACE_S = 1.0  # the exporters enforce their timeout themselves; this only catches one that does not

SPILL_FILE_ENV = "LOOPTRACE_SPILL_FILE"
DEFAULT_SPILL_FILE = Path(".looptrace") / "spill.jsonl"

LANGFUSE_DEFAULT_BASE_URL = "https://cloud.langfuse.com"
LANGFUSE_TRACES_PATH = "/api/public/otel/v1/traces"
# Langfuse v4 processes spans in real time only when the exporter says it speaks ingestion version 4.
LANGFUSE_INGESTION_VERSION = "4"

HTTP_PROTOBUF, GRPC = "http/protobuf", "grpc"
_SIGNAL_PATHS = {"traces": "v1/traces", "metrics": "v1/metrics"}
_DEFAULT_ENDPOINTS = {HTTP_PROTOBUF: "http://localhost:4318", GRPC: "http://localhost:4317"}


class ConfigurationError(ValueError):
    """A setting that cannot work, with what to do about it."""


def default_spill_file() -> Path:
    return Path(os.environ.get(SPILL_FILE_ENV) or DEFAULT_SPILL_FILE)


def safe_url(url: str) -> str:
    """The URL without user info, query or fragment: what may appear in a warning."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable endpoint>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", "")) if parts.scheme else url.split("?", 1)[0]


# --- settings from the environment ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OtlpSettings:
    """Where and how one signal goes over OTLP, resolved from the standard ``OTEL_EXPORTER_OTLP_*`` variables."""

    signal: str
    endpoint: str
    protocol: str
    headers: Mapping[str, str] = field(repr=False)  # may hold credentials: never printed
    timeout_s: float
    compression: str  # none | gzip | deflate
    insecure: bool | None  # gRPC only; None lets the exporter decide from the URL scheme

    @classmethod
    def from_env(cls, signal: str = "traces", environ: Mapping[str, str] | None = None) -> OtlpSettings:
        env = os.environ if environ is None else environ
        specific = f"OTEL_EXPORTER_OTLP_{signal.upper()}_"

        def setting(name: str) -> str | None:
            value = env.get(specific + name) or env.get("OTEL_EXPORTER_OTLP_" + name)
            return value.strip() if value and value.strip() else None

        protocol = (setting("PROTOCOL") or HTTP_PROTOBUF).lower()
        if protocol not in (HTTP_PROTOBUF, GRPC):
            hint = " (the OpenTelemetry Python exporters have no http/json)" if protocol == "http/json" else ""
            raise ConfigurationError(f"OTLP protocol {protocol!r} is not supported{hint}; use http/protobuf or grpc")
        endpoint = env.get(specific + "ENDPOINT", "").strip()
        if not endpoint:
            base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or _DEFAULT_ENDPOINTS[protocol]).rstrip("/")
            # The specification appends the signal path to the generic endpoint for HTTP only; gRPC has no paths.
            endpoint = f"{base}/{_SIGNAL_PATHS[signal]}" if protocol == HTTP_PROTOBUF else base
        compression = (setting("COMPRESSION") or "none").lower()
        if compression not in ("none", "gzip", "deflate"):
            raise ConfigurationError(f"OTLP compression {compression!r} is not supported; use gzip, deflate or none")
        insecure = setting("INSECURE")
        return cls(
            signal=signal,
            endpoint=endpoint,
            protocol=protocol,
            headers=dict(parse_env_headers(setting("HEADERS") or "", liberal=True)),
            timeout_s=_timeout_seconds(setting("TIMEOUT"), "OTEL_EXPORTER_OTLP_TIMEOUT"),
            compression=compression,
            insecure=None if insecure is None else insecure.lower() == "true",
        )


def _timeout_seconds(milliseconds: str | None, name: str) -> float:
    if milliseconds is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(milliseconds) / 1000
    except ValueError:
        raise ConfigurationError(f"{name}={milliseconds!r} is not a number of milliseconds") from None
    if value <= 0:
        raise ConfigurationError(f"{name} must be positive (milliseconds), got {milliseconds!r}")
    return value


@dataclass(frozen=True)
class LangfuseSettings:
    """A Langfuse project's OTLP endpoint and keys, from ``LANGFUSE_*`` (the variables Langfuse's own SDKs read)."""

    public_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    base_url: str = LANGFUSE_DEFAULT_BASE_URL
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LangfuseSettings | None:
        """None unless both keys are set. ``LANGFUSE_BASE_URL`` wins over the older ``LANGFUSE_HOST``;
        ``LANGFUSE_TIMEOUT`` is in seconds, as in the Langfuse SDK."""
        env = os.environ if environ is None else environ
        public, secret = env.get("LANGFUSE_PUBLIC_KEY", "").strip(), env.get("LANGFUSE_SECRET_KEY", "").strip()
        if not (public and secret):
            return None
        base = (env.get("LANGFUSE_BASE_URL") or env.get("LANGFUSE_HOST") or "").strip() or LANGFUSE_DEFAULT_BASE_URL
        timeout = env.get("LANGFUSE_TIMEOUT", "").strip()
        try:
            timeout_s = float(timeout) if timeout else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ConfigurationError(f"LANGFUSE_TIMEOUT={timeout!r} is not a number of seconds") from None
        return cls(public_key=public, secret_key=secret, base_url=base.rstrip("/"), timeout_s=timeout_s)

    @property
    def traces_url(self) -> str:
        return self.base_url + LANGFUSE_TRACES_PATH

    def authorization(self) -> str:
        token = base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode("ascii")
        return f"Basic {token}"


def configured_backends(environ: Mapping[str, str] | None = None) -> list[str]:
    """The network backends the environment sets up: ``langfuse`` when both keys are set, ``otlp`` when an OTLP
    traces endpoint is."""
    env = os.environ if environ is None else environ
    names = []
    if LangfuseSettings.from_env(env) is not None:
        names.append("langfuse")
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip() or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        names.append("otlp")
    return names


# --- exporter factories -----------------------------------------------------------------------------------------


def otlp_span_exporter(settings: OtlpSettings | None = None, *, probe: OutcomeProbe | None = None) -> SpanExporter:
    """The OpenTelemetry OTLP span exporter (HTTP/protobuf or gRPC) for a collector, from the standard variables."""
    settings = settings or OtlpSettings.from_env("traces")
    if settings.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter(**_grpc_arguments(settings))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(**_http_arguments(settings, probe))


def otlp_metric_exporter(settings: OtlpSettings | None = None, *, probe: OutcomeProbe | None = None) -> MetricExporter:
    """The OpenTelemetry OTLP metric exporter, from the same variables (``..._METRICS_...`` variants first)."""
    settings = settings or OtlpSettings.from_env("metrics")
    if settings.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter(**_grpc_arguments(settings))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(**_http_arguments(settings, probe))


def langfuse_span_exporter(settings: LangfuseSettings | None = None, *, probe: OutcomeProbe | None = None
                           ) -> SpanExporter:
    """A plain OTLP/HTTP exporter to ``{base}/api/public/otel/v1/traces``: Basic auth with the project's keys and
    ``x-langfuse-ingestion-version: 4``, gzip. Langfuse has no gRPC endpoint, so there is no protocol choice."""
    settings = settings or LangfuseSettings.from_env()
    if settings is None:
        raise ConfigurationError("the langfuse exporter needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY")
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    headers = {"authorization": settings.authorization(), "x-langfuse-ingestion-version": LANGFUSE_INGESTION_VERSION}
    # The HTTP exporter always merges OTEL_EXPORTER_OTLP_[TRACES_]HEADERS into its headers, and its TLS settings come
    # from OTEL_EXPORTER_OTLP_*_CERTIFICATE: both are meant for the collector. The session sends exactly our headers,
    # so a collector's token never travels to Langfuse, and it verifies TLS the ordinary way.
    session = _ProbingSession(probe, only_headers=headers)
    exporter = OTLPSpanExporter(endpoint=settings.traces_url, headers=headers, timeout=settings.timeout_s,
                                compression=Compression.Gzip, session=session)
    session.verify, session.cert = True, None
    return exporter


def _http_arguments(settings: OtlpSettings, probe: OutcomeProbe | None) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http import Compression

    return {
        "endpoint": settings.endpoint,
        "headers": dict(settings.headers),
        "timeout": settings.timeout_s,
        "compression": Compression(settings.compression),
        "session": _ProbingSession(probe),
    }


def _grpc_arguments(settings: OtlpSettings) -> dict[str, Any]:
    import grpc

    compression = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                   "deflate": grpc.Compression.Deflate}[settings.compression]
    return {
        "endpoint": settings.endpoint,
        "insecure": settings.insecure,
        "headers": dict(settings.headers),
        "timeout": settings.timeout_s,
        "compression": compression,
    }


def network_exporter(name: str, *, spill: SpillFile | None = None) -> GuardedExporter:
    """The guarded span exporter for ``"langfuse"`` or ``"otlp"``, configured from the environment."""
    probe = OutcomeProbe()
    if name == "langfuse":
        settings = LangfuseSettings.from_env()
        if settings is None:
            raise ConfigurationError("the langfuse exporter needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY "
                                     "(and LANGFUSE_BASE_URL for a self-hosted Langfuse)")
        inner = langfuse_span_exporter(settings, probe=probe)
        return GuardedExporter(name, inner, endpoint=settings.traces_url, probe=probe, timeout_s=settings.timeout_s,
                               spill=spill)
    if name == "otlp":
        otlp = OtlpSettings.from_env("traces")
        return GuardedExporter(name, otlp_span_exporter(otlp, probe=probe), endpoint=otlp.endpoint, probe=probe,
                               timeout_s=otlp.timeout_s, spill=spill)
    raise ConfigurationError(f"{name!r} is not a network exporter; choose langfuse or otlp")


def network_metric_exporter() -> GuardedMetricExporter:
    """The guarded OTLP metric exporter, configured from the environment."""
    probe = OutcomeProbe()
    settings = OtlpSettings.from_env("metrics")
    return GuardedMetricExporter("otlp", otlp_metric_exporter(settings, probe=probe), endpoint=settings.endpoint,
                                 probe=probe, timeout_s=settings.timeout_s)


# --- what went wrong ----------------------------------------------------------------------------------------------

REFUSED, TIMEOUT, UNAUTHORIZED, SERVER_ERROR, REJECTED, FAILED = (
    "refused", "timeout", "unauthorized", "server_error", "rejected", "failed")

_CAUSE_TEXT = {
    REFUSED: "connection refused or host not found",
    TIMEOUT: "no answer in time",
    UNAUTHORIZED: "credentials rejected",
    SERVER_ERROR: "server error",
    REJECTED: "request rejected",
    FAILED: "export failed",
}


@dataclass(frozen=True)
class Failure:
    """Why an export failed: one of the causes above and a short detail (a status, an error type; never a body)."""

    cause: str
    detail: str

    @property
    def definitive(self) -> bool:
        """Whether waiting longer cannot help: the exporter's own retries would only repeat the same answer."""
        return self.cause in (REFUSED, UNAUTHORIZED)


def failure_from_status(status: int) -> Failure:
    if status in (401, 403):
        return Failure(UNAUTHORIZED, f"HTTP {status}")
    if status >= 500 or status == 429:
        return Failure(SERVER_ERROR, f"HTTP {status}")
    return Failure(REJECTED, f"HTTP {status}")


def failure_from_exception(error: BaseException) -> Failure:
    if isinstance(error, (requests.exceptions.Timeout, TimeoutError)):
        return Failure(TIMEOUT, type(error).__name__)
    if _caused_by_refusal(error):
        return Failure(REFUSED, type(error).__name__)
    return Failure(FAILED, type(error).__name__)


def failure_from_grpc(code: Any, details: str = "") -> Failure:
    name = getattr(code, "name", str(code))
    if name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return Failure(UNAUTHORIZED, name)
    if name == "DEADLINE_EXCEEDED":
        return Failure(TIMEOUT, name)
    if name == "UNAVAILABLE":
        # gRPC says UNAVAILABLE both for "cannot connect" and for "server overloaded"; only the text tells them apart.
        connect = "connect" in details.lower() or "dns" in details.lower()
        return Failure(REFUSED if connect else SERVER_ERROR, name)
    if name in ("INVALID_ARGUMENT", "NOT_FOUND", "UNIMPLEMENTED", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
        return Failure(REJECTED, name)
    return Failure(SERVER_ERROR, name)


def _caused_by_refusal(error: BaseException) -> bool:
    """A refused connection or an unknown host, somewhere in requests' chain of wrapped errors.

    A reset of a pooled keep-alive connection is deliberately *not* a refusal: the exporter retries it at once and
    usually succeeds, so it must not end the wait early.
    """
    from urllib3.exceptions import NewConnectionError

    seen: set[int] = set()
    pending: list[Any] = [error]
    while pending:
        item = pending.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, (ConnectionRefusedError, NewConnectionError)):
            return True
        pending.extend([*item.args, getattr(item, "reason", None), item.__cause__, item.__context__])
    return False


class OutcomeProbe:
    """What the network said to one exporter's latest attempt: an HTTP status, an exception, or a gRPC code.

    The OpenTelemetry exporters answer export() with SUCCESS or FAILURE only; the cause goes to their log. The probe
    hears it first-hand instead: through the requests session of the HTTP exporters, and through the log records of
    the gRPC exporter (see ``_ExporterLogFilter``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failure: Failure | None = None

    def clear(self) -> None:
        with self._lock:
            self._failure = None

    @property
    def failure(self) -> Failure | None:
        with self._lock:
            return self._failure

    def record_status(self, status: int) -> None:
        with self._lock:
            self._failure = None if status < 400 else failure_from_status(status)

    def record_exception(self, error: BaseException) -> None:
        with self._lock:
            self._failure = failure_from_exception(error)

    def record_grpc(self, code: Any, details: str) -> None:
        with self._lock:
            self._failure = failure_from_grpc(code, details)


class _ProbingSession(requests.Session):
    """The requests session of an OTLP/HTTP exporter: tells the probe how each request ended.

    ``only_headers``, when given, replaces the exporter's own header set (content headers aside).
    """

    _CONTENT_HEADERS = ("content-type", "content-encoding", "user-agent")

    def __init__(self, probe: OutcomeProbe | None, only_headers: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._probe = probe
        self._only_headers = dict(only_headers) if only_headers is not None else None

    def request(self, method, url, *args, **kwargs):  # noqa: ANN001 - requests' own signature
        if self._only_headers is not None:
            given = kwargs.get("headers") or {}
            kept = {k: v for k, v in given.items() if k.lower() in self._CONTENT_HEADERS}
            kwargs["headers"] = {**kept, **self._only_headers}
        try:
            response = super().request(method, url, *args, **kwargs)
        except Exception as error:
            if self._probe is not None:
                self._probe.record_exception(error)
            raise
        if self._probe is not None:
            self._probe.record_status(response.status_code)
        return response


# The exporters log every failed batch (and every retry) at WARNING or ERROR, with a traceback for some gRPC codes.
# While one of our sender threads runs an export, those records are heard by the probe and then dropped: the guard
# reports the failure once, in its own words. Records from anyone else's exporters pass through untouched.
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
)
_sender_thread = threading.local()


class _ExporterLogFilter(logging.Filter):
    """Hears the gRPC status in the exporters' log records. An application that silences those loggers (a level
    above ERROR, or a dictConfig that disables existing loggers) leaves gRPC failures reported as "failed"."""

    def filter(self, record: logging.LogRecord) -> bool:
        probe: OutcomeProbe | None = getattr(_sender_thread, "probe", None)
        if probe is None:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        code = next((a for a in args if type(a).__name__ == "StatusCode" and hasattr(a, "name")), None)
        if code is not None:
            details = next((a for a in reversed(args) if isinstance(a, str)), "")
            probe.record_grpc(code, details)
        return False


_log_filter = _ExporterLogFilter()
_log_filter_installed = False
_log_filter_lock = threading.Lock()


def _install_log_filter() -> None:
    global _log_filter_installed
    with _log_filter_lock:
        if not _log_filter_installed:
            for name in _EXPORTER_LOGGERS:
                # First in line: the gRPC exporter's own DuplicateFilter drops a record whose format string was seen
                # in the last 20 s (whatever its arguments) and ends the chain, so behind it the probe would miss
                # the second failure of the process.
                logging.getLogger(name).filters.insert(0, _log_filter)
            _log_filter_installed = True


# --- bounded, never-raising delivery ------------------------------------------------------------------------------


class _Sender:
    """One daemon thread that runs one exporter's calls, one at a time.

    Being a daemon is the point: an export stuck on a dead network must never keep the process from exiting, and the
    caller can stop waiting for it (a deadline) while it finishes, or not, on its own.
    """

    def __init__(self, name: str, probe: OutcomeProbe) -> None:
        self._name = name
        self._probe = probe
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._current: Future | None = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        current = self._current
        return current is not None and not current.done()

    def submit(self, call: Callable[[], Any]) -> Future:
        future: Future = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"looptrace-export-{self._name}", daemon=True)
                self._thread.start()
            self._current = future
        self._calls.put((future, call))
        return future

    def _run(self) -> None:
        _sender_thread.probe = self._probe
        while True:
            future, call = self._calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as error:  # noqa: BLE001 - handed to the waiting side, which classifies it
                future.set_exception(error)


class _Delivery:
    """What every guarded exporter shares: the sender, the deadline, the pause after a failure, the warnings."""

    def __init__(self, name: str, signal: str, endpoint: str, probe: OutcomeProbe, timeout_s: float) -> None:
        _install_log_filter()
        self.name = name
        self.signal = signal
        self.endpoint = safe_url(endpoint)
        self.probe = probe
        self.timeout_s = timeout_s
        self.sender = _Sender(f"{name}-{signal}", probe)
        self.deadline: float | None = None  # time.monotonic() after which nothing is sent any more, only spilled
        self.closed = False
        self.last_failure: Failure | None = None
        self._paused_until = 0.0
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def reason_to_skip(self) -> Failure | None:
        """Why the next batch should not even try the network, or None."""
        now = time.monotonic()
        if self.closed:
            return Failure(FAILED, "the exporter is shut down")
        if self.deadline is not None and now >= self.deadline:
            return self.last_failure or Failure(TIMEOUT, "not sent before the flush deadline")
        if now < self._paused_until and self.last_failure is not None:
            return self.last_failure
        if self.sender.busy:
            return Failure(TIMEOUT, "the previous export is still waiting for an answer")
        return None

    def attempt(self, call: Callable[[], Any], succeeded: Callable[[Any], bool]) -> tuple[Failure | None, Future]:
        """Run ``call`` on the sender and wait for it within the bounds. Returns (None, future) on success."""
        self.probe.clear()
        started = time.monotonic()
        future = self.sender.submit(call)
        limit = started + self.timeout_s + _GRACE_S
        while True:
            try:
                result = future.result(timeout=WAIT_SLICE_S)
            except TimeoutError:
                now = time.monotonic()
                deadline = self.deadline
                seen = self.probe.failure
                if seen is not None and seen.definitive:
                    return self.failed(seen), future
                if now >= limit or (deadline is not None and now >= deadline):
                    return self.failed(Failure(TIMEOUT, f"no answer within {now - started:.1f} s "
                                                        f"(timeout {self.timeout_s:g} s)")), future
                continue
            except Exception as error:  # the exporter itself raised; same treatment as a failed export
                return self.failed(Failure(FAILED, type(error).__name__)), future
            if succeeded(result):
                self.recovered()
                return None, future
            seen = self.probe.failure
            if seen is None and time.monotonic() - started >= self.timeout_s:
                seen = Failure(TIMEOUT, f"no answer within the timeout ({self.timeout_s:g} s)")
            return self.failed(seen or Failure(FAILED, "the exporter reported a failure")), future

    def failed(self, failure: Failure) -> Failure:
        with self._lock:
            self.last_failure = failure
            self._paused_until = time.monotonic() + RETRY_AFTER_FAILURE_S
        return failure

    def recovered(self) -> None:
        with self._lock:
            self.last_failure = None
            self._paused_until = 0.0
            self._warned.clear()  # a later failure is news again

    def warn_once(self, failure: Failure, **extra: Any) -> None:
        with self._lock:
            if failure.cause in self._warned:
                return
            self._warned.add(failure.cause)
        log.warning(
            "export_failed",
            backend=self.name,
            signal=self.signal,
            cause=failure.cause,
            problem=_CAUSE_TEXT[failure.cause],
            detail=failure.detail,
            endpoint=self.endpoint,
            hint=_hint(self.name, failure.cause),
            **extra,
        )


def _hint(backend: str, cause: str) -> str:
    if cause == UNAUTHORIZED:
        return ("check LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY, and that LANGFUSE_BASE_URL is the host the keys "
                "belong to" if backend == "langfuse" else "check the credentials in OTEL_EXPORTER_OTLP_HEADERS")
    if cause == REFUSED:
        return (f"is {backend} running and reachable? "
                + ("set LANGFUSE_BASE_URL" if backend == "langfuse" else "set OTEL_EXPORTER_OTLP_ENDPOINT"))
    if cause == TIMEOUT:
        return ("the backend is slow or unreachable; raise LANGFUSE_TIMEOUT (seconds)" if backend == "langfuse" else
                "the backend is slow or unreachable; raise OTEL_EXPORTER_OTLP_TIMEOUT (milliseconds)")
    if cause == SERVER_ERROR:
        return "the backend is failing; try again later"
    if cause == REJECTED:
        return "the endpoint does not accept OTLP here: check the URL (and the protocol)"
    return "see the backend's logs"


class GuardedExporter(SpanExporter):
    """A network span exporter that never raises, never blocks for long, and never loses a span silently.

    ``export`` waits for the inner exporter at most ``timeout_s`` (less when a flush deadline is set, much less when
    the connection is refused or the keys are rejected). What it cannot deliver goes to ``spill`` (when given), and
    the first failure of each cause is reported once. After a failure the backend is left alone for
    ``RETRY_AFTER_FAILURE_S``; batches meanwhile go straight to the spill file.
    """

    def __init__(self, name: str, inner: SpanExporter, *, endpoint: str, probe: OutcomeProbe | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, spill: SpillFile | None = None) -> None:
        self.name = name
        self.inner = inner
        self.spill = spill
        self._delivery = _Delivery(name, "traces", endpoint, probe or OutcomeProbe(), timeout_s)
        self._spilled: dict[str, int] = {}  # batch id -> spans, for this exporter's lifetime
        self._spill_lock = threading.Lock()
        self._spill_warned = False
        self.delivered_spans = 0

    @property
    def endpoint(self) -> str:
        return self._delivery.endpoint

    @property
    def last_failure(self) -> Failure | None:
        return self._delivery.last_failure

    @property
    def spilled_spans(self) -> int:
        """Spans of this exporter's lifetime that sit in the spill file, undelivered."""
        with self._spill_lock:
            return sum(self._spilled.values())

    @property
    def deadline(self) -> float | None:
        return self._delivery.deadline

    def set_deadline(self, deadline: float | None) -> None:
        """From ``deadline`` (time.monotonic()) on, batches are spilled instead of sent; None lifts it."""
        self._delivery.deadline = deadline

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        spans = list(spans)
        try:
            return self._export(spans)
        except Exception as error:  # a bug of ours may cost this batch, never the agent
            failure = Failure(FAILED, f"looptrace: {type(error).__name__}")
            self._delivery.warn_once(failure)
            return SpanExportResult.FAILURE

    def _export(self, spans: list[ReadableSpan]) -> SpanExportResult:
        delivery = self._delivery
        skip = delivery.reason_to_skip()
        if skip is not None:
            self._save(spans, skip)
            return SpanExportResult.FAILURE
        failure, future = delivery.attempt(lambda: self.inner.export(spans),
                                           lambda result: result == SpanExportResult.SUCCESS)
        if failure is None:
            self.delivered_spans += len(spans)
            return SpanExportResult.SUCCESS
        batch = self._save(spans, failure)
        if batch is not None and not future.done():
            # Still on the wire: if it gets through after all, the spilled copy must never be pushed.
            future.add_done_callback(lambda done: self._late_answer(done, batch, len(spans)))
        return SpanExportResult.FAILURE

    def _save(self, spans: list[ReadableSpan], failure: Failure) -> str | None:
        batch = None
        if self.spill is not None:
            try:
                batch = self.spill.append(self.name, spans)
            except (OSError, ValueError, TypeError) as error:
                self._warn_spill(error)
            else:
                with self._spill_lock:
                    self._spilled[batch] = len(spans)
        if batch is not None:
            self._delivery.warn_once(failure, spans_saved_to=str(self.spill.path))
        else:
            self._delivery.warn_once(failure)
        return batch

    def _late_answer(self, future: Future, batch: str, count: int) -> None:
        try:
            delivered = not future.cancelled() and future.exception() is None \
                and future.result() == SpanExportResult.SUCCESS
            if delivered and self.spill is not None:
                self.spill.mark_delivered(batch)
                with self._spill_lock:
                    self._spilled.pop(batch, None)
                self.delivered_spans += count
                self._delivery.recovered()
        except Exception:  # noqa: BLE001 - on the sender thread; the batch simply stays pending, push sends it
            pass

    def _warn_spill(self, error: BaseException) -> None:
        if not self._spill_warned:
            self._spill_warned = True
            log.warning("spill_file_unwritable", backend=self.name, path=str(self.spill.path if self.spill else ""),
                        error=type(error).__name__, hint="undelivered spans are lost; set LOOPTRACE_SPILL_FILE to a "
                        "writable path")

    def shutdown(self) -> None:
        self._delivery.closed = True
        try:
            self.inner.shutdown()  # stops the inner exporter's retries; a request on the wire ends with its timeout
        except Exception:  # noqa: BLE001
            pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # nothing is buffered here: every batch is delivered or spilled before export() returns


class GuardedMetricExporter(MetricExporter):
    """The metric side of GuardedExporter: bounded, never raising, one warning per cause. Metrics are not spilled:
    a missed export is made good by the next one, since the points are cumulative."""

    def __init__(self, name: str, inner: MetricExporter, *, endpoint: str, probe: OutcomeProbe | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                         preferred_aggregation=getattr(inner, "_preferred_aggregation", None))
        self.name = name
        self.inner = inner
        self._delivery = _Delivery(name, "metrics", endpoint, probe or OutcomeProbe(), timeout_s)

    @property
    def deadline(self) -> float | None:
        return self._delivery.deadline

    def set_deadline(self, deadline: float | None) -> None:
        self._delivery.deadline = deadline

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        try:
            skip = self._delivery.reason_to_skip()
            if skip is not None:
                self._delivery.warn_once(skip)
                return MetricExportResult.FAILURE
            failure, _ = self._delivery.attempt(
                lambda: self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
                lambda result: result == MetricExportResult.SUCCESS)
            if failure is None:
                return MetricExportResult.SUCCESS
            self._delivery.warn_once(failure)
        except Exception as error:  # noqa: BLE001
            self._delivery.warn_once(Failure(FAILED, f"looptrace: {type(error).__name__}"))
        return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._delivery.closed = True
        try:
            self.inner.shutdown(timeout_millis=timeout_millis)
        except Exception:  # noqa: BLE001
            pass


# --- the spill file -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PendingBatch:
    """One undelivered batch: a line of the spill file."""

    backend: str
    batch: str
    data: Mapping[str, Any]  # the OTLP/JSON TracesData of the line

    @property
    def span_count(self) -> int:
        return sum(len(ss.get("spans") or ()) for rs in self.data.get("resourceSpans") or ()
                   for ss in rs.get("scopeSpans") or ())

    def readable_spans(self) -> list[ReadableSpan]:
        return readable_spans(self.data)


class SpillFile:
    """Spans not yet delivered: one OTLP/JSON ``TracesData`` per line, like the trace file, plus one extra key::

        {"looptrace": {"backend": "langfuse", "batch": "<id>"}, "resourceSpans": [...]}

    Delivered batches are written to a ledger beside it (``<file>.sent``, one batch id per line, fsynced) and only
    then dropped from the spill file by an atomic rewrite (``compact``). The ledger is what makes delivery exactly
    once: whatever the moment a push is interrupted, a batch is either still pending or in the ledger.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_spill_file()
        self.ledger = self.path.with_name(self.path.name + ".sent")
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._push_lock_path = self.path.with_name(self.path.name + ".push-lock")
        self._thread_lock = threading.RLock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._lock_path, "a") as handle:
                if fcntl is not None:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    if fcntl is not None:
                        fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def pushing(self) -> Iterator[None]:
        """Held for a whole push: a second push at the same time is refused rather than sending the same batches."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._push_lock_path, "a") as handle:
            if fcntl is not None:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise PushInProgress(f"another push is sending {self.path}; try again when it is done") from None
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def append(self, backend: str, spans: Sequence[ReadableSpan]) -> str:
        """Add one batch for ``backend``; returns its batch id."""
        batch = uuid.uuid4().hex
        document = {"looptrace": {"backend": backend, "batch": batch}, **encode_spans_json(spans).to_dict()}
        line = json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n"
        with self._locked(), open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
        return batch

    def mark_delivered(self, batch: str) -> None:
        with self._locked(), open(self.ledger, "a", encoding="utf-8") as handle:
            handle.write(batch + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def delivered(self) -> set[str]:
        try:
            return set(self.ledger.read_text(encoding="utf-8").split())
        except FileNotFoundError:
            return set()

    def pending(self, backends: Iterable[str] | None = None) -> list[PendingBatch]:
        """The batches not yet delivered, in file order (for ``backends`` only, when given)."""
        wanted = None if backends is None else set(backends)
        with self._locked():
            delivered = self.delivered()
            lines = self._lines()
        batches = []
        for raw in lines:
            parsed = _parse_spill_line(raw)
            if parsed is None or parsed.batch in delivered or (wanted is not None and parsed.backend not in wanted):
                continue
            batches.append(parsed)
        return batches

    def pending_spans(self, backend: str | None = None) -> int:
        return sum(b.span_count for b in self.pending(None if backend is None else [backend]))

    def compact(self) -> None:
        """Drop delivered batches from the file (atomically), then empty the ledger; remove both when nothing is
        left. Lines that cannot be parsed are kept: they are someone's data, and `looptrace traces` reports them."""
        with self._locked():
            delivered = self.delivered()
            if not delivered:
                return
            kept = [raw for raw in self._lines()
                    if (parsed := _parse_spill_line(raw)) is None or parsed.batch not in delivered]
            if kept:
                temporary = self.path.with_name(self.path.name + ".tmp")
                with open(temporary, "w", encoding="utf-8") as handle:
                    handle.writelines(kept)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, self.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            # Every id in the ledger named a line that is now gone: the ledger has nothing left to protect.
            self.ledger.unlink()

    def _lines(self) -> list[str]:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                return [line if line.endswith("\n") else line + "\n" for line in handle if line.strip()]
        except FileNotFoundError:
            return []


def _parse_spill_line(raw: str) -> PendingBatch | None:
    try:
        document = json.loads(raw)
        tag = document.pop("looptrace")
        return PendingBatch(backend=str(tag["backend"]), batch=str(tag["batch"]), data=document)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class PushInProgress(RuntimeError):
    """Another push holds the spill file."""


# --- OTLP/JSON back to spans, for push ----------------------------------------------------------------------------

_KIND_BY_OTLP = {1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER,
                 5: SpanKind.CONSUMER}
_OTLP_KIND_NAMES = {"SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
                    "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_STATUS_BY_OTLP = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_OTLP_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_PARENT_IS_REMOTE = 0x200  # OTLP span flags: bit 8 says "is_remote is known", bit 9 is its value


def readable_spans(data: Mapping[str, Any]) -> list[ReadableSpan]:
    """The spans of one OTLP/JSON ``TracesData`` document, rebuilt as SDK spans an exporter can send again.

    What the OTLP encoder reads from a span survives the round trip (ids, parent, names, kind, times, attributes,
    events, links, status, resource, scope); bytes attributes come back as their base64 text.
    """
    spans = []
    for resource_spans in data.get("resourceSpans") or ():
        resource = Resource(decode_attributes((resource_spans.get("resource") or {}).get("attributes")),
                            schema_url=resource_spans.get("schemaUrl") or None)
        for scope_spans in resource_spans.get("scopeSpans") or ():
            scope = scope_spans.get("scope") or {}
            instrumentation = InstrumentationScope(scope.get("name", ""), scope.get("version") or None,
                                                   scope_spans.get("schemaUrl") or None,
                                                   decode_attributes(scope.get("attributes")) or None)
            for span in scope_spans.get("spans") or ():
                spans.append(_readable_span(span, resource, instrumentation))
    return spans


def _readable_span(span: Mapping[str, Any], resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id = int(span["traceId"], 16)
    flags = int(span.get("flags") or 0)
    parent_id = span.get("parentSpanId")
    parent = SpanContext(trace_id, int(parent_id, 16), is_remote=bool(flags & _PARENT_IS_REMOTE),
                         trace_flags=TraceFlags(TraceFlags.SAMPLED)) if parent_id else None
    status = span.get("status") or {}
    code = _enum(status.get("code", 0), _OTLP_STATUS_NAMES)
    kind = _enum(span.get("kind", 1), _OTLP_KIND_NAMES)
    return ReadableSpan(
        name=span.get("name", ""),
        context=SpanContext(trace_id, int(span["spanId"], 16), is_remote=False,
                            trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=_trace_state(span)),
        parent=parent,
        resource=resource,
        attributes=_attributes(span.get("attributes")),
        events=[Event(e.get("name", ""), _attributes(e.get("attributes")), int(e.get("timeUnixNano") or 0))
                for e in span.get("events") or ()],
        links=[Link(SpanContext(int(link["traceId"], 16), int(link["spanId"], 16), is_remote=True,
                                trace_state=_trace_state(link)), _attributes(link.get("attributes")))
               for link in span.get("links") or ()],
        kind=_KIND_BY_OTLP.get(kind, SpanKind.INTERNAL),
        status=Status(_STATUS_BY_OTLP.get(code, StatusCode.UNSET), status.get("message") or None),
        start_time=int(span.get("startTimeUnixNano") or 0),
        end_time=int(span.get("endTimeUnixNano") or 0),
        instrumentation_scope=scope,
    )


def _attributes(items: Any) -> dict[str, Any]:
    # The SDK wants sequences as tuples, so that attributes stay immutable.
    return {k: tuple(v) if isinstance(v, list) else v for k, v in decode_attributes(items).items()}


def _trace_state(item: Mapping[str, Any]) -> TraceState | None:
    header = item.get("traceState")
    return TraceState.from_header([header]) if header else None


def _enum(value: Any, names: Mapping[str, int]) -> int:
    return value if isinstance(value, int) else names.get(str(value), 0)


# --- push ---------------------------------------------------------------------------------------------------------


@dataclass
class PushReport:
    """What a push did, per backend, in spans."""

    path: Path
    sent: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)  # tried and still pending
    skipped: Counter = field(default_factory=Counter)  # pending for a backend not targeted or not configured

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        if not (self.sent or self.failed or self.skipped):
            return f"nothing to push: {self.path} holds no pending spans"
        parts = [f"sent {n} spans to {b}" for b, n in sorted(self.sent.items())]
        parts += [f"{n} spans for {b} still pending (it failed; see the warning)" for b, n in sorted(self.failed.items())]
        parts += [f"{n} spans for {b} left pending (not configured or not chosen with --to)"
                  for b, n in sorted(self.skipped.items())]
        return "; ".join(parts)


def push(spill_path: str | os.PathLike[str] | None = None, exporters: Mapping[str, SpanExporter] | None = None, *,
         to: Iterable[str] | None = None) -> PushReport:
    """Send what the spill file holds, exactly once, and keep what still fails.

    ``exporters`` maps backend names to exporters (tests pass their own); by default every backend the environment
    configures (``configured_backends()``) gets a guarded exporter. ``to`` limits the push to those backends. A
    backend that fails is not tried again in the same push; its batches stay pending.
    """
    spill = SpillFile(spill_path)
    own = exporters is None
    if exporters is None:
        exporters = {name: network_exporter(name) for name in configured_backends()}
    targets = set(to) if to else set(exporters)
    missing = targets - set(exporters)
    if missing:
        raise ConfigurationError(f"cannot push to {', '.join(sorted(missing))}: it is not configured "
                                 "(langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY, otlp needs "
                                 "OTEL_EXPORTER_OTLP_ENDPOINT)")
    report = PushReport(spill.path)
    try:
        with spill.pushing():
            for batch in spill.pending():
                if batch.backend not in targets:
                    report.skipped[batch.backend] += batch.span_count
                elif batch.backend in report.failed:
                    report.failed[batch.backend] += batch.span_count
                elif _send(exporters[batch.backend], batch):
                    spill.mark_delivered(batch.batch)
                    report.sent[batch.backend] += batch.span_count
                else:
                    report.failed[batch.backend] += batch.span_count
            spill.compact()
    finally:
        if own:
            for exporter in exporters.values():
                exporter.shutdown()
    return report


def _send(exporter: SpanExporter, batch: PendingBatch) -> bool:
    try:
        return exporter.export(batch.readable_spans()) == SpanExportResult.SUCCESS
    except Exception:  # noqa: BLE001 - an unguarded exporter from a caller: the batch stays pending
        return False
