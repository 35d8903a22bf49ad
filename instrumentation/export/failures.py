"""Why an export failed, heard first-hand from the network rather than from the exporters' logs.

The OpenTelemetry exporters answer export() with SUCCESS or FAILURE only; the cause goes to their log. An
``OutcomeProbe`` hears it instead: through the requests session of the HTTP exporters (``exporters.py``), and through
the log records of the gRPC exporter (``ExporterLogFilter``), and classifies it in the six words of
``langfuse.failures`` (the vocabulary the Langfuse client speaks too): refused, timeout, unauthorized, server_error,
rejected, failed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..langfuse.failures import (
    CAUSE_TEXT,
    FAILED,
    REFUSED,
    REJECTED,
    SERVER_ERROR,
    TIMEOUT,
    UNAUTHORIZED,
    Failure,
    failure_from_exception,
    failure_from_grpc,
    failure_from_status,
    hint,
)

__all__ = ["CAUSE_TEXT", "FAILED", "REFUSED", "REJECTED", "SERVER_ERROR", "TIMEOUT", "UNAUTHORIZED",
           "ExporterLogFilter", "Failure", "OutcomeProbe", "failure_from_exception", "failure_from_grpc",
           "failure_from_status", "hint", "install_log_filter", "listen_on_this_thread"]


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
