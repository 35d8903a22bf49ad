"""configure(): the OpenTelemetry SDK for applications and the CLI, from arguments and the standard variables.

Libraries use the OpenTelemetry API only; an application calls this once (or sets up the SDK itself, in which case
looptrace's spans simply join its pipeline).

Exporters, in order of precedence: the ``exporters`` argument, ``LOOPTRACE_EXPORTER``, ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console``, ``none``), then what the environment sets up: ``langfuse`` when ``LANGFUSE_PUBLIC_KEY`` and
``LANGFUSE_SECRET_KEY`` are set, ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its ``_TRACES_`` variant) is, both
when both are, always beside the local trace file (``file``). Names combine: ``file,langfuse,otlp``.

Every exporter but the console sits behind a BatchSpanProcessor, so export happens off the agent's thread (tune it
with the standard ``OTEL_BSP_*``). The network ones (``langfuse``, ``otlp``) are wrapped in ``export.GuardedExporter``:
bounded, never raising, one warning per failure cause, undelivered spans saved to the spill file for
``looptrace traces push``. Metrics go over OTLP when ``otlp`` is chosen, and to a Prometheus endpoint with
``prometheus_port=`` or ``LOOPTRACE_PROMETHEUS_PORT``.

Bounds: ``Telemetry.flush(timeout_ms)`` and ``Telemetry.shutdown(timeout_ms)`` return within ``timeout_ms`` plus
about 0.1 s, whatever the backends do (default 5 s). Past the deadline, spans still queued go to the spill file rather
than being dropped; metrics that miss it are not exported (the next run's cumulative points make up for them).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .export import (
    ConfigurationError,
    GuardedExporter,
    GuardedMetricExporter,
    LangfuseSettings,
    configured_backends,
    network_exporter,
    network_metric_exporter,
)
from .logs import log
from .otlp_file import OTLPJsonFileExporter, default_trace_file
from .spill import SpillFile

__all__ = [
    "ConfigurationError",
    "Telemetry",
    "choose_exporters",
    "configure",
    "context_from_traceparent",
    "parse_exporters",
]

EXPORTER_ENV = "LOOPTRACE_EXPORTER"
PROMETHEUS_PORT_ENV = "LOOPTRACE_PROMETHEUS_PORT"
TRACEPARENT_ENV, TRACESTATE_ENV = "TRACEPARENT", "TRACESTATE"
KNOWN_EXPORTERS = ("file", "console", "otlp", "langfuse", "none")
NETWORK_EXPORTERS = ("langfuse", "otlp")
DEFAULT_SERVICE_NAME = "looptrace"
FLUSH_TIMEOUT_MS = 5_000
NETWORK_QUEUE_SPANS = 16_384


@dataclass
class Telemetry:
    """What configure() set up. Keep it to flush or shut down; the CLI does both on the way out.

    ``scores`` sends Langfuse scores (the anomaly score) when the langfuse exporter is on, and is None otherwise.
    """

    tracer_provider: TracerProvider
    exporters: list[str]
    trace_file: Path | None = None
    meter_provider: MeterProvider | None = None
    spill_file: Path | None = None
    scores: Any = None  # langfuse.LangfuseScores | None
    _processors: list = field(default_factory=list)
    _guards: list[GuardedExporter] = field(default_factory=list)
    _metric_guards: list[GuardedMetricExporter] = field(default_factory=list)
    _stopped: bool = False

    def flush(self, timeout_ms: int = FLUSH_TIMEOUT_MS) -> bool:
        """Export what is buffered, within ``timeout_ms``. True when nothing had to be spilled meanwhile."""
        if self._stopped:  # the CLI's interrupted path shuts down, then flushes in a finally: nothing left to do
            return self.spilled_spans == 0
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        spilled_before = self.spilled_spans
        with self._deadline(deadline):
            flushed = _succeeded(self.tracer_provider.force_flush, timeout_ms)
            if self.meter_provider is not None:
                flushed = _succeeded(self.meter_provider.force_flush, _remaining_ms(deadline)) and flushed
        if self.scores is not None:
            flushed = self.scores.flush(_remaining_ms(deadline) / 1000) and flushed
        return flushed and self.spilled_spans == spilled_before

    def shutdown(self, timeout_ms: int = FLUSH_TIMEOUT_MS) -> None:
        """Deliver what can be delivered within ``timeout_ms``, spill the rest, stop everything. Idempotent.

        Metrics go first: spans that miss the deadline are saved to the spill file, metrics would be lost.
        """
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.shutdown)
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        with self._deadline(deadline):
            if self.meter_provider is not None:
                _quietly(self.meter_provider.shutdown, timeout_millis=_remaining_ms(deadline))
            for processor in self._processors:
                _quietly(processor.force_flush, _remaining_ms(deadline))
        for guard in self._guards:
            guard.set_deadline(time.monotonic())  # the queues are drained; nothing may wait any more
        _quietly(self.tracer_provider.shutdown)
        if self.scores is not None:
            self.scores.close(_remaining_ms(deadline) / 1000)
        if self.spill_file is not None and self._guards:
            _quietly(SpillFile(self.spill_file).compact)  # drops batches an export delivered after all

    @property
    def spilled_spans(self) -> int:
        """Spans of this process's runs that sit undelivered in the spill file."""
        return sum(guard.spilled_spans for guard in self._guards)

    def spill_notice(self) -> str | None:
        """The line the CLI prints when spans could not be delivered, or None when all were."""
        counts = [(guard.name, guard.spilled_spans) for guard in self._guards if guard.spilled_spans]
        if not counts:
            return None
        each = ", ".join(f"{count} for {name}" for name, count in counts)
        return (f"looptrace: {sum(c for _, c in counts)} spans could not be delivered ({each}); they are saved in "
                f"{self.spill_file}. Send them later with: looptrace traces push")

    @contextlib.contextmanager
    def _deadline(self, deadline: float) -> Iterator[None]:
        guards = [*self._guards, *self._metric_guards]
        for guard in guards:
            guard.set_deadline(deadline)
        try:
            yield
        finally:
            for guard in guards:
                guard.set_deadline(None)


def _remaining_ms(deadline: float) -> int:
    return max(int((deadline - time.monotonic()) * 1000), 0)


def _succeeded(call, *args) -> bool:
    try:
        return bool(call(*args))
    except Exception:  # noqa: BLE001 - the SDK's MeterProvider raises when its deadline has passed: not our caller's problem
        return False


def _quietly(call, *args, **kwargs) -> None:
    try:
        call(*args, **kwargs)
    except Exception:  # noqa: BLE001 - shutting down must not fail on a backend; the guards already reported it
        pass


class _BoundedBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor whose force_flush keeps its timeout.

    The SDK's exports everything on the caller's thread whatever the timeout (opentelemetry-python#4568). Here the
    timeout becomes the guard's deadline: batches past it are spilled in microseconds instead of sent, so the queue
    still drains completely, in time, and no span is dropped. Whoever calls it (Telemetry.flush, the agent's own flush
    on Ctrl-C, TracerProvider.force_flush) gets the bound.
    """

    def __init__(self, guard: GuardedExporter) -> None:
        # A network backend can stall a batch for its whole timeout; the SDK's 2,048-span queue then overflows within
        # a second of a busy process and drops spans before they could be spilled. A larger queue (a few tens of MB
        # at most) rides out the stall; OTEL_BSP_MAX_QUEUE_SIZE still decides when it is set.
        explicit = os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE")
        super().__init__(guard, max_queue_size=None if explicit else NETWORK_QUEUE_SPANS)
        self.guard = guard

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
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


def parse_exporters(value: str | Iterable[str] | None) -> list[str]:
    """A comma list (or a list) of exporter names, validated, duplicates removed, order kept."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in (i.strip().lower() for i in items):
        if not item:
            continue
        if item not in KNOWN_EXPORTERS:
            raise ConfigurationError(f"unknown exporter {item!r}; choose from {', '.join(KNOWN_EXPORTERS)}")
        if item not in names:
            names.append(item)
    return names


def choose_exporters(explicit: str | Iterable[str] | None = None) -> list[str]:
    for source in (explicit, os.environ.get(EXPORTER_ENV), _otel_traces_exporter()):
        names = parse_exporters(source)
        if names:
            return [] if names == ["none"] else [n for n in names if n != "none"]
    # Picked from the environment: the local file stays on beside any backend, so every run can be looked at with
    # `looptrace traces show` whatever else receives it. An explicit choice above is taken exactly.
    return ["file", *configured_backends()]


def _otel_traces_exporter() -> str | None:
    value = os.environ.get("OTEL_TRACES_EXPORTER")
    # Only the names that mean the same here; anything else (zipkin, ...) is for other distributions to interpret.
    if value and all(v.strip().lower() in ("otlp", "console", "none") for v in value.split(",")):
        return value
    return None


def configure(
    *,
    exporters: str | Iterable[str] | None = None,
    trace_file: str | os.PathLike[str] | None = None,
    service_name: str | None = None,
    console_stream: IO[str] | None = None,
    set_global: bool = True,
    spill_file: str | os.PathLike[str] | None = None,
    prometheus_port: int | None = None,
) -> Telemetry:
    """Set up tracing (and metrics) for an application. Returns the handle to flush and shut it down.

    ``set_global=False`` leaves the global providers alone; pass ``telemetry.tracer_provider`` (and
    ``telemetry.meter_provider``) to the Agent instead (what tests and embedding applications with their own SDK
    set-up want). ``spill_file`` defaults to ``LOOPTRACE_SPILL_FILE`` or ``.looptrace/spill.jsonl``.
    A bounded ``shutdown()`` also runs at interpreter exit if the application does not call it.
    """
    names = choose_exporters(exporters)
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    resource = _resource(service_name)
    # Not the SDK's own exit hook: it joins the export thread for up to 30 s and drops what is left.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    telemetry = Telemetry(tracer_provider=provider, exporters=[] if disabled else names)
    spill = SpillFile(spill_file)  # the path only; nothing is written unless a backend fails
    for name in telemetry.exporters:
        if name in NETWORK_EXPORTERS:
            guard = network_exporter(name, spill=spill)
            telemetry._guards.append(guard)
            telemetry.spill_file = spill.path
            processor = _BoundedBatchSpanProcessor(guard)
        else:
            exporter = _local_exporter(name, trace_file, console_stream, telemetry)
            # The console is for a human watching: spans appear as they end. The file is batched off-thread.
            processor = SimpleSpanProcessor(exporter) if name == "console" else BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
        telemetry._processors.append(processor)
    if "langfuse" in telemetry.exporters:
        from .langfuse import LangfuseScores, TraceLinks, register_trace_links

        settings = LangfuseSettings.from_env()
        telemetry.scores = LangfuseScores.from_settings(settings) if settings else None
        if settings is not None:  # runs on this provider get a link to their trace in Langfuse's UI
            register_trace_links(provider, TraceLinks(settings))
    telemetry.meter_provider = _meter_provider(telemetry, resource, disabled, prometheus_port)
    # The global providers can be set once per process; an application that already set one keeps it (and looptrace
    # spans still reach this provider through Agent(tracer_provider=...)).
    if set_global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    if set_global:
        from opentelemetry import metrics
        from opentelemetry.metrics import _internal as metrics_internal

        if isinstance(metrics.get_meter_provider(), metrics_internal._ProxyMeterProvider):
            metrics.set_meter_provider(telemetry.meter_provider)
    atexit.register(telemetry.shutdown)
    return telemetry


def _local_exporter(name: str, trace_file, console_stream, telemetry: Telemetry) -> SpanExporter:
    if name == "file":
        telemetry.trace_file = Path(trace_file) if trace_file else default_trace_file()
        return OTLPJsonFileExporter(telemetry.trace_file)
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=console_stream or sys.stderr)
    raise ConfigurationError(f"unknown exporter {name!r}")


def _meter_provider(telemetry: Telemetry, resource: Resource, disabled: bool,
                    prometheus_port: int | None) -> MeterProvider:
    readers = []
    if not disabled:
        metrics_off = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "none"
        if "otlp" in telemetry.exporters and not metrics_off:
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            guard = network_metric_exporter()
            telemetry._metric_guards.append(guard)
            readers.append(PeriodicExportingMetricReader(guard))
        port = prometheus_port if prometheus_port is not None else _port_from_env()
        if port is not None:
            from .metrics import prometheus_reader

            readers.append(prometheus_reader(port))
    return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)


def _port_from_env() -> int | None:
    value = os.environ.get(PROMETHEUS_PORT_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigurationError(f"{PROMETHEUS_PORT_ENV}={value!r} is not a port number")
    return int(value)


def _resource(service_name: str | None) -> Resource:
    # Resource.create() reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; an explicit name wins over both, and
    # "looptrace" replaces the SDK's "unknown_service" when nothing names the service.
    resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    from .langfuse import resource_attributes  # LANGFUSE_TRACING_ENVIRONMENT / LANGFUSE_RELEASE, once per batch

    return resource.merge(Resource(resource_attributes()))


# --- joining a caller's trace -------------------------------------------------------------------------------------


def context_from_traceparent(traceparent: str | None = None, tracestate: str | None = None) -> Context | None:
    """The context a W3C ``traceparent`` header hands over, for a run to join that trace as a child.

    With no argument, reads ``TRACEPARENT`` (and ``TRACESTATE``), which is how job schedulers and CI systems pass a
    trace to a process. Returns None when there is nothing to join. An invalid value given explicitly raises
    ValueError (a usage error for ``--traceparent``); one from the environment costs a warning and is ignored.
    The CLI runs the agent under it: ``token = opentelemetry.context.attach(ctx)`` ... ``detach(token)``.
    """
    from_environment = traceparent is None
    value = (os.environ.get(TRACEPARENT_ENV) if from_environment else traceparent) or ""
    if not value.strip():
        return None
    carrier = {"traceparent": value.strip()}
    state = os.environ.get(TRACESTATE_ENV) if from_environment and tracestate is None else tracestate
    if state:
        carrier["tracestate"] = state
    context = TraceContextTextMapPropagator().extract(carrier, context=Context())
    if trace.get_current_span(context).get_span_context().is_valid:
        return context
    problem = f"not a W3C traceparent: {value.strip()[:80]!r} (expected 00-<32 hex>-<16 hex>-<2 hex>)"
    if not from_environment:
        raise ValueError(problem)
    log.warning("traceparent_ignored", variable=TRACEPARENT_ENV, problem=problem)
    return None
