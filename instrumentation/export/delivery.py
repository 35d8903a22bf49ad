"""Guarded delivery: network exporters that never raise, never block the agent for long, never lose a span silently.

``GuardedExporter`` is wrapped around each network span exporter (behind a BatchSpanProcessor, so all of this happens
off the agent's thread). It bounds the time of every export, turns a failure into *one* warning per backend and cause
(see ``failures.py``) that names the backend and the endpoint but never a key or a header, and notes the ids of the
spans it could not deliver in the undelivered list (``tracefile/undelivered.py``). The spans themselves are in the
trace file already; ``looptrace traces push`` reads them from there and sends them later, once.

Time a dead or slow backend can cost (measured figures are in tests/test_export.py and tests/test_setup.py):

* A turn: nothing. Spans are queued by the BatchSpanProcessor and exported on its own thread.
* One export on that thread: at most the export timeout (``OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT``, default 10 s;
  ``LANGFUSE_TIMEOUT`` for Langfuse). A refused connection or rejected keys end the wait at once (about 0.05 s),
  without waiting for the exporter's own retries.
* After a failure the backend is skipped for ``RETRY_AFTER_FAILURE_S``: batches are noted as undelivered at once.
* A flush or shutdown with a deadline: at most that deadline plus one wait slice (0.05 s). Past it every batch is
  noted instead of sent; an export still on the wire is left to finish on its daemon thread, and if it does succeed
  its batch is marked delivered so push will not send it again.

A timeout is ambiguous: the backend may have stored a batch whose answer never arrived. Such a batch is noted as
*uncertain*; ``push`` resends it to Langfuse (which keeps one observation per span id) and holds it back for an OTLP
backend unless asked (docs/reliability.md). Without the trace file (an exporter list without ``file``) there is no
copy to push: what a backend could not take is lost, and the warning says so.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..logs import log
from ..settings import DEFAULT_TIMEOUT_S, safe_url
from .failures import (
    CAUSE_TEXT,
    FAILED,
    TIMEOUT,
    Failure,
    OutcomeProbe,
    hint,
    install_log_filter,
    listen_on_this_thread,
)

# What an endpoint without a metrics service answers a metrics export (details as failures.py writes them).
_NO_METRICS_SERVICE = ("HTTP 404", "UNIMPLEMENTED")
RETRY_AFTER_FAILURE_S = 10.0  # how long a failed backend is skipped before the next batch tries it again
WAIT_SLICE_S = 0.05  # how often a waiting export looks at its deadline and at what the probe saw
_GRACE_S = 1.0  # the exporters enforce their timeout themselves; this only catches one that does not


class UndeliveredSink(Protocol):
    """Where undelivered batches are noted (``tracefile.undelivered.UndeliveredList``): by span id, the spans being
    in the trace file; forgotten once delivered after all."""

    @property
    def path(self) -> Path: ...

    def append(self, backend: str, spans: Sequence[ReadableSpan], *, uncertain: bool = False) -> str:
        """Note the batch; returns its id. ``uncertain``: it may have reached the backend (no answer in time)."""
        ...

    def mark_delivered(self, batch: str) -> None:
        """The batch got through after all: it must never be pushed."""
        ...


class _Sender:
    """One daemon thread that runs one exporter's calls, one at a time.

    Being a daemon is the point: an export stuck on a dead network must never keep the process from exiting, and the
    caller can stop waiting for it (a deadline) while it finishes, or not, on its own.
    """

    def __init__(self, name: str, probe: OutcomeProbe) -> None:
        self._name = name
        self._probe = probe
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._current: Future[Any] | None = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        current = self._current
        return current is not None and not current.done()

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"looptrace-export-{self._name}", daemon=True)
                self._thread.start()
            self._current = future
        self._calls.put((future, call))
        return future

    def _run(self) -> None:
        listen_on_this_thread(self._probe)
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
        install_log_filter()
        self.name = name
        self.signal = signal
        self.endpoint = safe_url(endpoint)
        self.probe = probe
        self.timeout_s = timeout_s
        self.sender = _Sender(f"{name}-{signal}", probe)
        self.deadline: float | None = None  # time.monotonic() after which nothing is sent, only listed as undelivered
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

    def attempt(self, call: Callable[[], Any], succeeded: Callable[[Any], bool]) -> tuple[Failure | None, Future[Any]]:
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
            problem=CAUSE_TEXT[failure.cause],
            detail=failure.detail,
            endpoint=self.endpoint,
            hint=hint(self.name, failure.cause),
            **extra,
        )


class GuardedExporter(SpanExporter):
    """A network span exporter that never raises, never blocks for long, and never loses a span silently.

    ``export`` waits for the inner exporter at most ``timeout_s`` (less when a flush deadline is set, much less when
    the connection is refused or the keys are rejected). What it cannot deliver is noted in ``undelivered`` (the
    list, when the trace file holds the spans), and the first failure of each cause is reported once. After a failure
    the backend is left alone for ``RETRY_AFTER_FAILURE_S``; batches meanwhile are noted at once.
    """

    def __init__(self, name: str, inner: SpanExporter, *, endpoint: str, probe: OutcomeProbe | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, undelivered: UndeliveredSink | None = None) -> None:
        self.name = name
        self.inner = inner
        self.undelivered = undelivered
        self._delivery = _Delivery(name, "traces", endpoint, probe or OutcomeProbe(), timeout_s)
        self._undelivered: dict[str, int] = {}  # batch id -> spans, for this exporter's lifetime
        self._undelivered_lock = threading.Lock()
        self._undelivered_warned = False
        self.delivered_spans = 0
        self.lost_spans = 0  # not delivered and not noted for push (no trace file, or the list unwritable)

    @property
    def endpoint(self) -> str:
        return self._delivery.endpoint

    @property
    def last_failure(self) -> Failure | None:
        return self._delivery.last_failure

    @property
    def undelivered_spans(self) -> int:
        """Spans of this exporter's lifetime noted as undelivered (in the trace file, for push)."""
        with self._undelivered_lock:
            return sum(self._undelivered.values())

    @property
    def deadline(self) -> float | None:
        return self._delivery.deadline

    def set_deadline(self, deadline: float | None) -> None:
        """From ``deadline`` (time.monotonic()) on, batches are noted as undelivered instead of sent; None lifts it."""
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
            self._save(spans, skip, uncertain=False)  # never sent
            return SpanExportResult.FAILURE
        # Encoding, and repairing what cannot be encoded, is the inner exporter's (exporters.RepairingSpanExporter).
        failure, future = delivery.attempt(lambda: self.inner.export(spans),
                                           lambda result: result == SpanExportResult.SUCCESS)
        if failure is None:
            self._count_delivered(len(spans))
            return SpanExportResult.SUCCESS
        # A timeout may hide a batch the backend stored; a refusal, an error status or a fault of the exporter not.
        batch = self._save(spans, failure, uncertain=failure.cause == TIMEOUT)
        if batch is not None:
            # Possibly still on the wire (the wait was cut short): if it gets through after all, the listed copy
            # must never be pushed. A future that already ended runs the callback at once.
            future.add_done_callback(lambda done: self._late_answer(done, batch, len(spans)))
        return SpanExportResult.FAILURE

    def _save(self, spans: list[ReadableSpan], failure: Failure, *, uncertain: bool) -> str | None:
        batch = None
        if self.undelivered is not None:
            try:
                batch = self.undelivered.append(self.name, spans, uncertain=uncertain)
            except (OSError, ValueError, TypeError) as error:
                self._warn_undelivered(error)
            else:
                with self._undelivered_lock:
                    self._undelivered[batch] = len(spans)
        if batch is None:
            with self._undelivered_lock:
                self.lost_spans += len(spans)
        if batch is not None and self.undelivered is not None:
            self._delivery.warn_once(failure, undelivered_listed_in=str(self.undelivered.path))
        elif self.undelivered is None:
            self._delivery.warn_once(failure, lost="the trace file is off, so there is no copy for `looptrace traces "
                                                   "push` to send: these spans are lost for this backend")
        else:
            self._delivery.warn_once(failure)
        return batch

    def _late_answer(self, future: Future[Any], batch: str, count: int) -> None:
        try:
            delivered = not future.cancelled() and future.exception() is None \
                and future.result() == SpanExportResult.SUCCESS
            if delivered and self.undelivered is not None:
                self.undelivered.mark_delivered(batch)
                with self._undelivered_lock:
                    self._undelivered.pop(batch, None)
                self._count_delivered(count)
                self._delivery.recovered()
        except Exception:  # noqa: BLE001 - on the sender thread; the batch simply stays pending, push sends it
            pass

    def _count_delivered(self, count: int) -> None:
        with self._undelivered_lock:  # the worker thread and, for a late answer, the sender thread
            self.delivered_spans += count

    def _warn_undelivered(self, error: BaseException) -> None:
        if not self._undelivered_warned:
            self._undelivered_warned = True
            log.warning("undelivered_list_unwritable", backend=self.name,
                        path=str(self.undelivered.path if self.undelivered else ""), error=type(error).__name__,
                        hint="the spans this backend could not take are in the trace file, but push cannot know "
                             "which: set LOOPTRACE_UNDELIVERED_FILE to a writable path")

    def shutdown(self) -> None:
        self._delivery.closed = True
        try:
            self.inner.shutdown()  # stops the inner exporter's retries; a request on the wire ends with its timeout
        except Exception:  # noqa: BLE001
            pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # nothing is buffered here: every batch is delivered or noted before export() returns


class GuardedMetricExporter(MetricExporter):
    """The metric side of GuardedExporter: bounded, never raising, one warning per cause. Metrics are not listed:
    in a long-lived process the next export carries the cumulative totals again; a one-shot run whose final export
    fails loses that run's points (the spans, which are listed, still hold everything the metrics count), and
    ``undelivered`` lets the exit say so.

    An endpoint that has no metrics service (HTTP 404, gRPC UNIMPLEMENTED: ``looptrace watch``, a traces-only
    collector) is told apart from one that fails: one warning, and no metrics go there again in this process.
    """

    def __init__(self, name: str, inner: MetricExporter, *, endpoint: str, probe: OutcomeProbe | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, preferred_temporality: dict[type, Any] | None = None,
                 preferred_aggregation: dict[type, Any] | None = None) -> None:
        # The reader asks this guard, not the inner exporter, what it prefers: the same preferences the inner got.
        super().__init__(preferred_temporality=preferred_temporality, preferred_aggregation=preferred_aggregation)
        self.name = name
        self.inner = inner
        self._delivery = _Delivery(name, "metrics", endpoint, probe or OutcomeProbe(), timeout_s)
        self.takes_no_metrics = False  # the endpoint said it has no metrics service: nothing is sent any more
        self._failed_since_success = 0
        self._exporting = 0  # exports under way (the reader's thread and a flush's may overlap)
        self._count_lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return self._delivery.endpoint

    @property
    def deadline(self) -> float | None:
        return self._delivery.deadline

    def set_deadline(self, deadline: float | None) -> None:
        self._delivery.deadline = deadline

    @property
    def undelivered(self) -> bool:
        """Whether the newest metrics did not get through: an export failed since the last success, or one is still
        waiting for an answer. False for an endpoint that takes no metrics (said once, when it was found out)."""
        return not self.takes_no_metrics and (self._failed_since_success > 0 or self._exporting > 0)

    @property
    def why_undelivered(self) -> str | None:
        if not self.undelivered:
            return None
        failure = self._delivery.last_failure
        return CAUSE_TEXT[failure.cause] if failure is not None and not self._exporting else "no answer in time"

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if self.takes_no_metrics:
            return MetricExportResult.FAILURE  # said once; the SDK's reader does nothing with the result
        with self._count_lock:
            self._exporting += 1
        try:
            return self._export(metrics_data, timeout_millis, **kwargs)
        finally:
            with self._count_lock:
                self._exporting -= 1

    def _export(self, metrics_data: MetricsData, timeout_millis: float, **kwargs: Any) -> MetricExportResult:
        try:
            skip = self._delivery.reason_to_skip()
            if skip is not None:
                self._delivery.warn_once(skip)
                self._failed_since_success += 1
                return MetricExportResult.FAILURE
            failure, _ = self._delivery.attempt(
                lambda: self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
                lambda result: result == MetricExportResult.SUCCESS)
            if failure is None:
                self._failed_since_success = 0
                return MetricExportResult.SUCCESS
            if failure.detail in _NO_METRICS_SERVICE:
                self._no_metrics_here(failure)
                return MetricExportResult.FAILURE
            self._delivery.warn_once(failure)
        except Exception as error:  # noqa: BLE001
            self._delivery.warn_once(Failure(FAILED, f"looptrace: {type(error).__name__}"))
        self._failed_since_success += 1
        return MetricExportResult.FAILURE

    def _no_metrics_here(self, failure: Failure) -> None:
        self.takes_no_metrics = True
        log.warning("metrics_not_accepted", backend=self.name, endpoint=self.endpoint, detail=failure.detail,
                    problem="the endpoint has no OTLP metrics service (looptrace watch and traces-only collectors "
                            "take traces only)",
                    hint="no more metrics are sent there by this process; set OTEL_METRICS_EXPORTER=none to send "
                         "none at all")

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._delivery.closed = True
        try:
            self.inner.shutdown(timeout_millis=timeout_millis)
        except Exception:  # noqa: BLE001
            pass
