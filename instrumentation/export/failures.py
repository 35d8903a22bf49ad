"""Why an export failed, in one of six words, heard first-hand from the network rather than from the exporters' logs.

The OpenTelemetry exporters answer export() with SUCCESS or FAILURE only; the cause goes to their log. An
``OutcomeProbe`` hears it instead: through the requests session of the HTTP exporters (``exporters.py``), and through
the log records of the gRPC exporter (``ExporterLogFilter``), and classifies it:

refused, timeout, unauthorized, server_error, rejected, failed.

Pure classification: nothing here sends, waits or writes.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

REFUSED, TIMEOUT, UNAUTHORIZED, SERVER_ERROR, REJECTED, FAILED = (
    "refused", "timeout", "unauthorized", "server_error", "rejected", "failed")

CAUSE_TEXT = {
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
    """The failure an HTTP status means (only called for 4xx and 5xx)."""
    if status in (401, 403):
        return Failure(UNAUTHORIZED, f"HTTP {status}")
    if status >= 500 or status == 429:
        return Failure(SERVER_ERROR, f"HTTP {status}")
    return Failure(REJECTED, f"HTTP {status}")


def failure_from_exception(error: BaseException) -> Failure:
    """The failure an exception raised by the HTTP client means."""
    from requests.exceptions import Timeout  # loaded by the HTTP exporters already; not needed before

    if isinstance(error, (Timeout, TimeoutError)):
        return Failure(TIMEOUT, type(error).__name__)
    if _caused_by_refusal(error):
        return Failure(REFUSED, type(error).__name__)
    return Failure(FAILED, type(error).__name__)


def failure_from_grpc(code: Any, details: str = "") -> Failure:
    """The failure a gRPC status code (and its details text) means."""
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


def hint(backend: str, cause: str) -> str:
    """What to do about a failure, naming the variables to check (never their values)."""
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


class OutcomeProbe:
    """What the network said to one exporter's latest attempt: an HTTP status, an exception, or a gRPC code."""

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


# --- hearing the exporters' log records ------------------------------------------------------------------------------

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
_listening = threading.local()


def listen_on_this_thread(probe: OutcomeProbe) -> None:
    """From now on, the exporters' log records on the current thread go to ``probe`` (a sender thread's first act)."""
    _listening.probe = probe


class ExporterLogFilter(logging.Filter):
    """Hears the gRPC status in the exporters' log records. An application that silences those loggers (a level
    above ERROR, or a dictConfig that disables existing loggers) leaves gRPC failures reported as "failed"."""

    def filter(self, record: logging.LogRecord) -> bool:
        probe: OutcomeProbe | None = getattr(_listening, "probe", None)
        if probe is None:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        code = next((a for a in args if type(a).__name__ == "StatusCode" and hasattr(a, "name")), None)
        if code is not None:
            details = next((a for a in reversed(args) if isinstance(a, str)), "")
            probe.record_grpc(code, details)
        return False


_log_filter = ExporterLogFilter()
_log_filter_installed = False
_log_filter_lock = threading.Lock()


def install_log_filter() -> None:
    """Put the filter first on each exporter logger, once per process."""
    global _log_filter_installed
    with _log_filter_lock:
        if not _log_filter_installed:
            for name in _EXPORTER_LOGGERS:
                # First in line: the gRPC exporter's own DuplicateFilter drops a record whose format string was seen
                # in the last 20 s (whatever its arguments) and ends the chain, so behind it the probe would miss
                # the second failure of the process.
                logging.getLogger(name).filters.insert(0, _log_filter)
            _log_filter_installed = True
