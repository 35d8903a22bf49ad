"""Getting spans to Langfuse and to an OpenTelemetry Collector without ever hurting the agent.

Two pieces, used by ``setup.configure()`` and by ``spill.push()`` (``looptrace traces push``):

* **Factories** that build the OpenTelemetry project's OTLP exporters from the standard variables
  (``otlp_span_exporter``, ``otlp_metric_exporter``) and from Langfuse's (``langfuse_span_exporter``).
* **GuardedExporter**, wrapped around each network exporter (behind a BatchSpanProcessor, so all of this happens off
  the agent's thread). It never raises, bounds the time of every export, turns a failure into *one* structlog warning
  per backend and cause (refused, timeout, unauthorized, server_error, rejected, failed) that names the backend and the
  endpoint but never a key or a header, and appends what it could not deliver to the spill file (``spill.py``), from
  which ``looptrace traces push`` sends it later, exactly once.

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
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import requests
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from .logs import log

if TYPE_CHECKING:
    from .spill import SpillFile

DEFAULT_TIMEOUT_S = 10.0  # the specification's default OTEL_EXPORTER_OTLP_TIMEOUT (10000 ms)
RETRY_AFTER_FAILURE_S = 10.0  # how long a failed backend is skipped before the next batch tries it again
WAIT_SLICE_S = 0.05  # how often a waiting export looks at its deadline and at what the probe saw
_GRACE_S = 1.0  # the exporters enforce their timeout themselves; this only catches one that does not

LANGFUSE_DEFAULT_BASE_URL = "https://cloud.langfuse.com"
LANGFUSE_TRACES_PATH = "/api/public/otel/v1/traces"
# Langfuse v4 processes spans in real time only when the exporter says it speaks ingestion version 4.
LANGFUSE_INGESTION_VERSION = "4"

HTTP_PROTOBUF, GRPC = "http/protobuf", "grpc"
_SIGNAL_PATHS = {"traces": "v1/traces", "metrics": "v1/metrics"}
_DEFAULT_ENDPOINTS = {HTTP_PROTOBUF: "http://localhost:4318", GRPC: "http://localhost:4317"}


class ConfigurationError(ValueError):
    """A setting that cannot work, with what to do about it."""


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
                if deadline is not None and now >= deadline:
                    return self.failed(Failure(TIMEOUT, f"no answer before the flush deadline "
                                                        f"({now - started:.1f} s)")), future
                if now >= limit:
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
            self._count_delivered(len(spans))
            return SpanExportResult.SUCCESS
        batch = self._save(spans, failure)
        if batch is not None:
            # Possibly still on the wire (the wait was cut short): if it gets through after all, the spilled copy
            # must never be pushed. A future that already ended runs the callback at once.
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
                self._count_delivered(count)
                self._delivery.recovered()
        except Exception:  # noqa: BLE001 - on the sender thread; the batch simply stays pending, push sends it
            pass

    def _count_delivered(self, count: int) -> None:
        with self._spill_lock:  # the worker thread and, for a late answer, the sender thread
            self.delivered_spans += count

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
    in a long-lived process the next export carries the cumulative totals again; a one-shot run whose final export
    fails loses that run's points (the spans, which are spilled, still hold everything the metrics count)."""

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
