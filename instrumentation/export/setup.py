"""configure(): looptrace's exporters, on a provider of its own or on the application's, from one Settings.

Libraries use the OpenTelemetry API only, and looptrace never replaces what an application set up:

* ``configure()`` with no global provider set: a provider of looptrace's own, made global (``set_global=True``).
* ``configure(tracer_provider=app_provider)``: looptrace's processors (file, Langfuse, OTLP) are added to the
  application's SDK provider; its resource, sampler and exporters stay as they are.
* ``configure()`` when the application already set a global SDK provider: that provider stays, and a warning (once)
  says how to add looptrace's exporters to it; the returned provider is looptrace's own, used only where passed.
* No ``configure()`` at all: an ``Agent`` joins the application's global provider when there is one, and otherwise
  writes through ``default_telemetry()``, a provider of looptrace's own built from the same settings as the CLI and
  never installed globally.

A provider of looptrace's own (``configure()`` without ``tracer_provider``, and the embedded default) is always the
OpenTelemetry SDK's ``TracerProvider``, built in one place (``_build``): its spans are SDK spans, so an application's
own processor (``telemetry.tracer_provider.add_span_processor``) sees every span a run makes, and the SDK applies the
sampler and span limits the environment sets.

Exporters, in order of precedence: the ``exporters`` argument, ``LOOPTRACE_EXPORTER``, ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console``, ``none``), then what the environment sets up: ``langfuse`` when ``LANGFUSE_PUBLIC_KEY`` and
``LANGFUSE_SECRET_KEY`` are set, ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its ``_TRACES_`` variant) is, both
when both are, always beside the local trace file (``file``). Names combine: ``file,langfuse,otlp``.

The network exporters sit behind a BatchSpanProcessor, so export happens off the agent's thread (tune it with the
standard ``OTEL_BSP_*``); the trace file gets each span as it ends (no queue, and a crash loses only the spans still
open). The network ones (``langfuse``, ``otlp``) are wrapped in ``delivery.GuardedExporter``: bounded, never raising,
one warning per failure cause, the ids of undelivered spans noted in the undelivered list
(``tracefile.undelivered``) for ``looptrace traces push``, which reads the spans back from the trace file. The
SDK's OTLP exporters encode and send (``exporters``), after the one repair step for values they cannot encode
(``encodable``). Metrics go over
OTLP when ``otlp`` is chosen, and to a Prometheus endpoint with ``prometheus_port=`` or ``LOOPTRACE_PROMETHEUS_PORT``.

Bounds: ``Telemetry.flush(timeout_ms)`` and ``Telemetry.shutdown(timeout_ms)`` return within ``timeout_ms`` plus
about 0.1 s, whatever the backends do (default 5 s); the span and metric parts run side by side against the one
deadline. On the way out, ``Telemetry.leaving()`` makes every later flush and the shutdown share a single deadline, so
the whole exit is bounded once (the CLI's 5 s). Past the deadline, spans still queued are noted as undelivered rather
than dropped; metrics that miss it are not exported (the next run's cumulative points make up for them), and
``undelivered_notice()`` says so.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..alerts import AnomalySinks, anomaly_sinks
from ..logs import log, settings_ignored
from ..settings import NETWORK_EXPORTERS, ConfigurationError, Settings, parse_exporters
from ..tracefile.undelivered import UndeliveredList
from ..tracefile.write import Rotation, TraceFileProcessor
from .deadline import Deadline
from .delivery import WAIT_SLICE_S, GuardedExporter, GuardedMetricExporter
from .exporters import network_exporter, network_metric_exporter

if TYPE_CHECKING:
    from ..langfuse.api import TraceLinks
    from ..langfuse.scores import LangfuseScores

__all__ = [
    "ConfigurationError",
    "Settings",
    "Telemetry",
    "choose_exporters",
    "configure",
    "context_from_traceparent",
    "default_telemetry",
    "parse_exporters",
]

DEFAULT_SERVICE_NAME = "looptrace"
FLUSH_TIMEOUT_MS = 5_000
NETWORK_QUEUE_SPANS = 16_384


@dataclass
class Telemetry:
    """What configure() set up. Keep it to flush or shut down; the CLI does both on the way out.

    ``owns_provider`` is False when looptrace's processors were added to the application's provider: flush and shutdown
    then touch looptrace's processors only, never the application's. ``sinks`` is the anomaly fan-out (log line,
    webhook, score) and ``trace_links`` the links to Langfuse's UI (when the langfuse exporter is on) of the runs of
    an Agent handed this telemetry (``Agent(telemetry=telemetry)``); an Agent built on the same settings without it
    gets the same sinks (``alerts.anomaly_sinks``). ``scores`` is the sinks' Langfuse score queue, or None.
    """

    tracer_provider: TracerProvider
    exporters: list[str]
    settings: Settings = field(default_factory=Settings)
    trace_file: Path | None = None
    meter_provider: MeterProvider | None = None
    undelivered_file: Path | None = None
    scores: LangfuseScores | None = None
    sinks: AnomalySinks | None = None  # where the anomalies of runs recorded through this telemetry go
    trace_links: TraceLinks | None = None  # the link of each run to its trace in Langfuse's UI
    owns_provider: bool = True
    processors: list[SpanProcessor] = field(default_factory=list)
    guards: list[GuardedExporter] = field(default_factory=list)
    metric_guards: list[GuardedMetricExporter] = field(default_factory=list)
    exit_deadline: Deadline | None = None  # set by leaving(): what every later flush and the shutdown share
    _metric_readers: int = 0  # how many readers the meter provider was given (none: nothing ever sees its metrics)
    _stopped: bool = False
    _metrics_missed: bool = False

    def leaving(self, timeout_ms: int = FLUSH_TIMEOUT_MS) -> Deadline:
        """The process is on its way out: every flush and the shutdown from now on share this one deadline, so the
        whole exit waits at most ``timeout_ms`` for the backends, however many calls it takes (the CLI flushes as a
        run ends and shuts down after printing). The first call sets it; a later one keeps it."""
        if self.exit_deadline is None:
            self.exit_deadline = Deadline.after_ms(timeout_ms)
        return self.exit_deadline

    def _deadline_for(self, timeout_ms: int) -> Deadline:
        fresh = Deadline.after_ms(timeout_ms)
        return fresh if self.exit_deadline is None else self.exit_deadline.sooner(timeout_ms)

    def flush(self, timeout_ms: int = FLUSH_TIMEOUT_MS) -> bool:
        """Export what is buffered, within ``timeout_ms`` (or what is left of the exit deadline, see ``leaving``).
        True when nothing had to be listed as undelivered meanwhile."""
        if self._stopped:  # the CLI's interrupted path shuts down, then flushes in a finally: nothing left to do
            return self.undelivered_spans == 0
        deadline = self._deadline_for(timeout_ms)
        undelivered_before = self.undelivered_spans
        with self._guards_until(deadline, then=None):
            meter = self.meter_provider
            flushed = self._side_by_side(
                deadline, self._flush_processors,
                None if meter is None else lambda left: _succeeded(meter.force_flush, left.remaining_ms()))
        if self.scores is not None:
            flushed = self.scores.flush(deadline.remaining_s()) and flushed
        return flushed and self.undelivered_spans == undelivered_before

    def shutdown(self, timeout_ms: int = FLUSH_TIMEOUT_MS) -> None:
        """Deliver what can be delivered within ``timeout_ms`` (or what is left of the exit deadline), note the
        rest as undelivered, stop everything. Idempotent. Spans that miss the deadline are listed for push (they are
        in the trace file); metrics that miss it are lost, and ``undelivered_notice`` says so."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.shutdown)
        deadline = self._deadline_for(timeout_ms)
        with self._guards_until(deadline, then=time.monotonic):  # past the deadline nothing may wait any more
            meter = self.meter_provider
            metrics_out = self._side_by_side(
                deadline, self._flush_processors,
                None if meter is None else lambda left: _succeeded(
                    lambda: meter.shutdown(timeout_millis=left.remaining_ms()) or True))
        self._metrics_missed = meter is not None and bool(self.metric_guards) and not (
            metrics_out and not any(guard.undelivered for guard in self.metric_guards))
        if self.owns_provider:
            _quietly(self.tracer_provider.shutdown)
        else:  # the application's provider stays up; only what looptrace added to it stops
            for processor in self.processors:
                _quietly(processor.shutdown)
        if self.scores is not None:
            self.scores.close(deadline.remaining_s())

    def _flush_processors(self, deadline: Deadline) -> bool:
        if self.owns_provider:
            return _succeeded(self.tracer_provider.force_flush, deadline.remaining_ms())
        return all([_succeeded(p.force_flush, deadline.remaining_ms()) for p in self.processors])

    def _side_by_side(self, deadline: Deadline, spans: Callable[[Deadline], bool],
                      metrics: Callable[[Deadline], bool] | None) -> bool:
        """The span part and the metric part against one deadline, at the same time when metrics go over the
        network: a backend that holds one of them can neither starve the other nor make the two take twice as long.
        True when both finished, successfully, in time."""
        if metrics is None:
            return spans(deadline)
        if not self.metric_guards:  # a local reader (Prometheus) only: nothing to wait for
            delivered = spans(deadline)
            return metrics(deadline) and delivered
        outcome: list[bool] = []
        worker = threading.Thread(target=lambda: outcome.append(metrics(deadline)), name="looptrace-metrics-flush",
                                  daemon=True)
        worker.start()
        delivered = spans(deadline)
        worker.join(deadline.remaining_s() + WAIT_SLICE_S)
        return delivered and bool(outcome) and outcome[0]

    @property
    def undelivered_spans(self) -> int:
        """Spans of this process's runs that a backend did not take, listed for push."""
        return sum(guard.undelivered_spans for guard in self.guards)

    @property
    def lost_spans(self) -> int:
        """Spans a backend could not take and that push cannot send: no trace file holds them."""
        return sum(guard.lost_spans for guard in self.guards)

    @property
    def dropped_spans(self) -> int:
        """Spans a network exporter's full queue turned away: lost, and said so in undelivered_notice()."""
        return sum(p.dropped_spans for p in self.processors if isinstance(p, _BoundedBatchSpanProcessor))

    @property
    def metrics_missed(self) -> bool:
        """Whether the final metrics of this process missed their backend (set by ``shutdown``)."""
        return self._metrics_missed

    def undelivered_notice(self) -> str | None:
        """The lines the CLI prints when spans or the final metrics could not be delivered, or None when all were."""
        lines = []
        counts = [(guard.name, guard.undelivered_spans) for guard in self.guards if guard.undelivered_spans]
        if counts:
            each = ", ".join(f"{count} for {name}" for name, count in counts)
            lines.append(f"looptrace: {sum(c for _, c in counts)} spans could not be delivered ({each}); they are "
                         f"in the trace file {self.trace_file} and listed in {self.undelivered_file}. Send them later "
                         "with: looptrace traces push")
        lost = [(guard.name, guard.lost_spans) for guard in self.guards if guard.lost_spans]
        if lost:
            each = ", ".join(f"{count} for {name}" for name, count in lost)
            lines.append(f"looptrace: {sum(c for _, c in lost)} spans could not be delivered ({each}) and are lost: "
                         "no trace file holds a copy to push (add the file exporter to keep one)")
        if self.dropped_spans:
            lines.append(f"looptrace: {self.dropped_spans} spans were dropped because the export queue was full "
                         "(OTEL_BSP_MAX_QUEUE_SIZE); they are lost")
        if self._metrics_missed:
            causes = sorted({guard.why_undelivered for guard in self.metric_guards if guard.why_undelivered}) or [
                "no answer before the deadline"]
            where = ", ".join(sorted({guard.endpoint for guard in self.metric_guards}))
            lines.append(f"looptrace: the metrics could not be delivered to {where} ({'; '.join(causes)}); metrics "
                         "are not saved (the spans, delivered or saved, hold what they count)")
        return "\n".join(lines) or None

    @contextlib.contextmanager
    def _guards_until(self, deadline: Deadline, *, then: Callable[[], float] | None) -> Iterator[None]:
        """Every guard keeps ``deadline`` while the block runs; afterwards none (``then=None``: a flush) or the
        moment ``then`` gives (a shutdown: an export still waiting gives up at once)."""
        guards: list[GuardedExporter | GuardedMetricExporter] = [*self.guards, *self.metric_guards]
        for guard in guards:
            guard.set_deadline(deadline.at)
        try:
            yield
        finally:
            after = None if then is None else then()
            for guard in guards:
                guard.set_deadline(after)


def _succeeded(call: Callable[..., Any], *args: Any) -> bool:
    try:
        return bool(call(*args))
    except Exception:  # noqa: BLE001 - the SDK's MeterProvider raises when its deadline has passed: not our caller's problem
        return False


def _quietly(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except Exception:  # noqa: BLE001 - shutting down must not fail on a backend; the guards already reported it
        pass


class _BoundedBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor whose force_flush keeps its timeout.

    The SDK's exports everything on the caller's thread whatever the timeout (opentelemetry-python#4568). Here the
    timeout becomes the guard's deadline: batches past it are noted as undelivered in microseconds instead of sent, so
    the queue still drains completely, in time, and no span is dropped. Whoever calls it (Telemetry.flush, the agent's
    own flush on Ctrl-C, TracerProvider.force_flush) gets the bound.

    The queue is in memory, as every OpenTelemetry exporter's is: a process killed while spans wait in it loses them
    for this backend (they are in the trace file, which is written as each span ends).

    The SDK keeps its queue private, so the processor counts what it queued and what its exporter was handed
    (``_CountedExporter``): the difference is the queue's length, through public calls only.
    """

    def __init__(self, guard: GuardedExporter, settings: Settings) -> None:
        # A network backend can stall a batch for its whole timeout; the SDK's 2,048-span queue then overflows within
        # a second of a busy process and drops spans before they could be listed as undelivered. A larger queue (a
        # few tens of MB at most) rides out the stall; OTEL_BSP_MAX_QUEUE_SIZE still decides when it is set.
        arguments = {"max_queue_size": NETWORK_QUEUE_SPANS, **settings.batch.arguments()}
        self.counted = _CountedExporter(guard)
        super().__init__(self.counted, **arguments)
        self.guard = guard
        self.max_queue_size: int = arguments["max_queue_size"]
        self.dropped_spans = 0

    def on_end(self, span: ReadableSpan) -> None:
        # When the queue is full the SDK drops a span and logs one warning per span, which nothing adds up. Counted
        # here instead: one warning at the first drop, the total in Telemetry.undelivered_notice() at the end.
        if self.counted.waiting() >= self.max_queue_size:
            self.dropped_spans += 1
            if self.dropped_spans == 1:
                log.warning("export_queue_full", backend=self.guard.name, queue_size=self.max_queue_size,
                            hint="spans are dropped until the backend catches up; raise OTEL_BSP_MAX_QUEUE_SIZE")
            return
        if not span.context.trace_flags.sampled:  # the SDK queues sampled spans only
            return
        self.counted.queued()
        super().on_end(span)

    def force_flush(self, timeout_millis: int | None = 30_000) -> bool:
        timeout_millis = 30_000 if timeout_millis is None else timeout_millis
        previous = self.guard.deadline
        mine = time.monotonic() + max(timeout_millis, 0) / 1000
        self.guard.set_deadline(mine if previous is None else min(previous, mine))
        try:
            return super().force_flush(timeout_millis)
        finally:
            self.guard.set_deadline(previous)

    def shutdown(self) -> None:
        self.force_flush(FLUSH_TIMEOUT_MS)
        self.guard.set_deadline(time.monotonic())
        super().shutdown()


class _CountedExporter(SpanExporter):
    """The guard as the BatchSpanProcessor's exporter, counting the spans handed to it against those queued."""

    def __init__(self, guard: GuardedExporter) -> None:
        self.guard = guard
        self._queued = 0
        self._taken = 0
        self._lock = threading.Lock()

    def queued(self) -> None:
        with self._lock:
            self._queued += 1

    def waiting(self) -> int:
        """Spans queued and not yet handed to the exporter: the processor's queue."""
        return self._queued - self._taken

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._taken += len(spans)
        return self.guard.export(spans)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.guard.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.guard.shutdown()


def choose_exporters(explicit: str | Iterable[str] | None = None, settings: Settings | None = None) -> list[str]:
    """The exporters a run uses: ``explicit`` (a comma list or a list), else what the settings choose."""
    settings = (settings or Settings.from_env()).with_overrides(exporters=explicit)
    return settings.chosen_exporters()


def configure(
    settings: Settings | None = None,
    *,
    exporters: str | Iterable[str] | None = None,
    trace_file: str | os.PathLike[str] | None = None,
    service_name: str | None = None,
    console_stream: IO[str] | None = None,
    set_global: bool = True,
    undelivered_file: str | os.PathLike[str] | None = None,
    prometheus_port: int | None = None,
    tracer_provider: TracerProvider | None = None,
    spill_file: str | os.PathLike[str] | None = None,
) -> Telemetry:
    """Set up looptrace's exporters (and metrics) for an application. Returns the handle to flush and shut them down.

    Args:
        settings: the configuration; ``Settings.from_env()`` when omitted. The keyword arguments below override
            its fields.
        exporters: comma list or list of ``file``, ``console``, ``otlp``, ``langfuse``, ``none``.
        trace_file: where the file exporter writes.
        service_name: the resource's ``service.name`` (a provider of looptrace's own only).
        console_stream: where the console exporter prints (standard error by default).
        set_global: make looptrace's own provider the global one, if no application set one before. Never replaces
            a global provider that is already set.
        undelivered_file: the undelivered list: which spans (by id; the trace file holds them) and scores a backend did
            not take, for ``looptrace traces push``.
        prometheus_port: serve metrics for Prometheus on this port.
        tracer_provider: the application's SDK TracerProvider: looptrace's processors are added to it (nothing of the
            application's is replaced), and runs of an Agent given no provider join it through the global API or
            by passing it.
        spill_file: the old name of ``undelivered_file``; deprecated.

    A bounded ``shutdown()`` also runs at interpreter exit if the application does not call it.
    """
    if spill_file is not None:
        warnings.warn("configure(spill_file=...) is deprecated: pass undelivered_file=...", DeprecationWarning,
                      stacklevel=2)
        undelivered_file = undelivered_file if undelivered_file is not None else spill_file
    settings = (settings or Settings.from_env()).with_overrides(
        exporters=exporters, trace_file=trace_file, undelivered_file=undelivered_file, prometheus_port=prometheus_port,
        service_name=service_name)
    if tracer_provider is not None:
        if not isinstance(tracer_provider, TracerProvider):
            raise ConfigurationError(f"tracer_provider must be an OpenTelemetry SDK TracerProvider, got "
                                     f"{type(tracer_provider).__name__}")
        telemetry = _build(settings, console_stream, tracer_provider)
    else:
        telemetry = _build(settings, console_stream, None)
        if set_global:
            _install_globally(telemetry)
    atexit.register(telemetry.shutdown)
    return telemetry


_default_lock = threading.Lock()
_defaults: dict[tuple[Any, ...], Telemetry] = {}


def default_telemetry(settings: Settings | None = None) -> Telemetry:
    """looptrace's embedded default: what an Agent writes through when neither it nor the application configured
    anything. One per distinct configuration, made on first use, never installed globally, shut down at exit.
    Serves no Prometheus port (only configure() opens one: two defaults could not share it)."""
    settings = settings or Settings.from_env()
    names = settings.chosen_exporters()
    # The files by their absolute paths: the same relative default names another file in another directory.
    key = (tuple(names), settings.sdk_span_settings, os.path.abspath(settings.trace_file),
           os.path.abspath(settings.undelivered_file), settings.service_name,
           repr(settings.langfuse), settings.langfuse.public_key if settings.langfuse else None,
           settings.otlp.endpoint, settings.otlp.protocol)
    with _default_lock:
        telemetry = _defaults.get(key)
        if telemetry is None:
            import dataclasses

            embedded = dataclasses.replace(settings, prometheus_port=None)
            telemetry = _build(embedded, None, None)
            if telemetry.meter_provider is not None and not telemetry._metric_readers:
                # Metrics no reader can ever collect (an SDK MeterProvider takes its readers at creation) cost the
                # loop SDK calls every turn for nothing: runs on this default record into the API's no-op instead.
                _quietly(telemetry.meter_provider.shutdown)
                telemetry.meter_provider = None
            atexit.register(telemetry.shutdown)
            _defaults[key] = telemetry
        return telemetry


def _build(settings: Settings, console_stream: IO[str] | None, app_provider: TracerProvider | None) -> Telemetry:
    settings_ignored(settings.ignored)
    names = settings.chosen_exporters()
    if app_provider is None:
        resource = _resource(settings)
        # Not the SDK's own exit hook: it joins the export thread for up to 30 s and drops what is left.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    else:
        provider, resource = app_provider, app_provider.resource
    telemetry = Telemetry(tracer_provider=provider, exporters=names, settings=settings,
                          owns_provider=app_provider is None)
    processors = _processors(settings, names, console_stream, telemetry)
    try:
        finished = _finish(telemetry, settings, processors, provider, resource)
    except BaseException:  # e.g. the Prometheus port is taken: nothing of this set-up stays open or attached
        for processor in processors:
            _quietly(processor.shutdown)
        raise
    for processor in processors:
        provider.add_span_processor(processor)
    return finished


def _rotation(settings: Settings) -> Rotation:
    return Rotation(max_bytes=settings.trace_file_max_bytes, backups=settings.trace_file_backups)


def _processors(settings: Settings, names: list[str], console_stream: IO[str] | None,
                telemetry: Telemetry) -> list[SpanProcessor]:
    """One span processor per exporter named; if one cannot be built, those already built are shut down."""
    # What a backend cannot take is noted by id; the trace file holds the spans. Without the file, nothing is kept.
    keeps_spans = "file" in settings.chosen_exporters()
    undelivered = UndeliveredList(settings.undelivered_file, trace_file=settings.trace_file if keeps_spans else None)
    processors: list[SpanProcessor] = []
    try:
        for name in names:
            processors.append(_processor(name, settings, undelivered, console_stream, telemetry))
    except BaseException:
        for processor in processors:
            _quietly(processor.shutdown)
        raise
    return processors


def _finish(telemetry: Telemetry, settings: Settings, processors: list[SpanProcessor], provider: TracerProvider,
            resource: Resource) -> Telemetry:
    """What both paths add once their processors are on the provider: metrics, the anomaly sinks (the Langfuse score
    filed in the environment of the provider's resource), the trace links."""
    telemetry.processors = processors
    telemetry.meter_provider = _meter_provider(telemetry, resource, settings)
    telemetry.sinks = anomaly_sinks(settings, resource_attributes=resource.attributes)
    telemetry.scores = telemetry.sinks.scores
    if "langfuse" in telemetry.exporters and settings.langfuse is not None:
        from ..langfuse.api import TraceLinks

        telemetry.trace_links = TraceLinks(settings.langfuse)  # RunResult.trace_url
    return telemetry


def _processor(name: str, settings: Settings, undelivered: UndeliveredList, console_stream: IO[str] | None,
               telemetry: Telemetry) -> SpanProcessor:
    if name in NETWORK_EXPORTERS:
        kept_for_push = undelivered if undelivered.trace_file is not None else None
        guard = network_exporter(name, settings, undelivered=kept_for_push)
        telemetry.guards.append(guard)
        telemetry.undelivered_file = undelivered.path
        return _BoundedBatchSpanProcessor(guard, settings)
    if name == "file":
        telemetry.trace_file = settings.trace_file
        # Each span is written as it ends: no queue to overflow, and a crash loses only the spans still open.
        return TraceFileProcessor(settings.trace_file, _rotation(settings))
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # The console is for a human watching: spans appear as they end.
        exporter: SpanExporter = ConsoleSpanExporter(out=console_stream or sys.stderr)
        return SimpleSpanProcessor(exporter)
    raise ConfigurationError(f"unknown exporter {name!r}")


_warned_global = False


def _install_globally(telemetry: Telemetry) -> None:
    """Make looptrace's providers the global ones, unless the application set its own: that one stays, and a warning
    (once per process) says how to add looptrace's exporters to it."""
    global _warned_global
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(telemetry.tracer_provider)
    elif not _warned_global:
        _warned_global = True
        log.warning("global_tracer_provider_kept",
                    problem="the application already set a global TracerProvider; looptrace does not replace it, so "
                            "its exporters are not on it and runs go to the application's exporters",
                    hint="pass configure(tracer_provider=<the application's provider>) to add looptrace's exporters "
                         "to it, or configure(set_global=False) to keep looptrace's provider to yourself")
    from opentelemetry import metrics

    # Unlike the tracer provider's, the API's stand-in for an unset meter provider is not public. What an application
    # sets is the SDK's MeterProvider or the API's no-op one; anything else is the stand-in.
    if not isinstance(metrics.get_meter_provider(), (MeterProvider, metrics.NoOpMeterProvider)) \
            and telemetry.meter_provider is not None:
        metrics.set_meter_provider(telemetry.meter_provider)


def _meter_provider(telemetry: Telemetry, resource: Resource, settings: Settings) -> MeterProvider:
    readers: list[MetricReader] = []
    if "otlp" in telemetry.exporters and not settings.otlp_metrics_disabled:
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        guard = network_metric_exporter(settings)
        telemetry.metric_guards.append(guard)
        readers.append(PeriodicExportingMetricReader(guard))
    if settings.prometheus_port is not None and not settings.telemetry_disabled:
        from ..recording.metrics import prometheus_reader

        readers.append(prometheus_reader(settings.prometheus_port))
    telemetry._metric_readers = len(readers)
    return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)


def _resource(settings: Settings) -> Resource:
    # Resource.create() adds the SDK's telemetry.sdk.* attributes; the service name and attributes come from the
    # settings (OTEL_SERVICE_NAME wins over a service.name in OTEL_RESOURCE_ATTRIBUTES, as the specification says),
    # and "looptrace" replaces the SDK's "unknown_service" when nothing names the service.
    attributes: dict[str, Any] = dict(settings.resource_attributes)
    if settings.service_name:
        attributes[SERVICE_NAME] = settings.service_name
    attributes.setdefault(SERVICE_NAME, DEFAULT_SERVICE_NAME)
    if settings.langfuse is not None:  # LANGFUSE_TRACING_ENVIRONMENT / LANGFUSE_RELEASE: once per batch, not per span
        from ..langfuse.mapping import resource_attributes

        attributes.update(resource_attributes(settings.langfuse))
    return Resource.create(attributes)


# --- joining a caller's trace -------------------------------------------------------------------------------------


def context_from_traceparent(traceparent: str | None = None, tracestate: str | None = None, *,
                             settings: Settings | None = None) -> Context | None:
    """The context a W3C ``traceparent`` header hands over, for a run to join that trace as a child.

    With no argument, reads ``TRACEPARENT`` (and ``TRACESTATE``), which is how job schedulers and CI systems pass a
    trace to a process. Returns None when there is nothing to join. An invalid value given explicitly raises
    ValueError (a usage error for ``--traceparent``); one from the environment costs a warning and is ignored.
    The CLI runs the agent under it: ``token = opentelemetry.context.attach(ctx)`` ... ``detach(token)``.
    """
    from_environment = traceparent is None
    if from_environment:
        settings = settings or Settings.from_env()
        traceparent, tracestate = settings.traceparent, tracestate or settings.tracestate
    value = traceparent or ""
    if not value.strip():
        return None
    carrier = {"traceparent": value.strip()}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = TraceContextTextMapPropagator().extract(carrier, context=Context())
    if trace.get_current_span(context).get_span_context().is_valid:
        return context
    problem = f"not a W3C traceparent: {value.strip()[:80]!r} (expected 00-<32 hex>-<16 hex>-<2 hex>)"
    if not from_environment:
        raise ValueError(problem)
    log.warning("traceparent_ignored", variable="TRACEPARENT", problem=problem)
    return None
