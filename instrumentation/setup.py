"""configure(): the OpenTelemetry SDK for applications and the CLI, from arguments and the standard variables.

Libraries use the OpenTelemetry API only; an application calls this once (or sets up the SDK itself, in which case
looptrace's spans simply join its pipeline). Exporters are picked, in order of precedence, from the ``exporters``
argument, ``LOOPTRACE_EXPORTER``, ``OTEL_TRACES_EXPORTER``, and finally the local trace file. Every exporter sits
behind a BatchSpanProcessor, so export happens off the agent's thread (tune it with the standard ``OTEL_BSP_*``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

from .otlp_file import OTLPJsonFileExporter, default_trace_file

EXPORTER_ENV = "LOOPTRACE_EXPORTER"
KNOWN_EXPORTERS = ("file", "console", "none")
DEFAULT_SERVICE_NAME = "looptrace"


class ConfigurationError(ValueError):
    """A setting that cannot work, with what to do about it."""


@dataclass
class Telemetry:
    """What configure() set up. Keep it to flush or shut down; the CLI does both on the way out."""

    tracer_provider: TracerProvider
    exporters: list[str]
    trace_file: Path | None = None
    _processors: list = field(default_factory=list)
    _stopped: bool = False

    def flush(self, timeout_ms: int = 5_000) -> bool:
        return self.tracer_provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Flush and stop every exporter. Safe to call more than once."""
        if not self._stopped:
            self._stopped = True
            self.tracer_provider.shutdown()


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
    return ["file"]


def _otel_traces_exporter() -> str | None:
    value = os.environ.get("OTEL_TRACES_EXPORTER")
    # Only the names that mean the same here; anything else (zipkin, ...) is for other distributions to interpret.
    if value and all(v.strip() in ("console", "none") for v in value.split(",")):
        return value
    return None


def configure(
    *,
    exporters: str | Iterable[str] | None = None,
    trace_file: str | os.PathLike[str] | None = None,
    service_name: str | None = None,
    console_stream: IO[str] | None = None,
    set_global: bool = True,
) -> Telemetry:
    """Set up tracing for an application. Returns the handle to flush and shut it down.

    ``set_global=False`` leaves the global tracer provider alone; pass ``telemetry.tracer_provider`` to
    ``Agent(tracer_provider=...)`` instead (what tests and embedding applications with their own SDK set-up want).
    """
    names = choose_exporters(exporters)
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    provider = TracerProvider(resource=_resource(service_name))
    telemetry = Telemetry(tracer_provider=provider, exporters=[] if disabled else names)
    for name in telemetry.exporters:
        exporter = _exporter(name, trace_file, console_stream, telemetry)
        # The console is for a human watching: spans appear as they end. Everything else is batched off-thread.
        processor = SimpleSpanProcessor(exporter) if name == "console" else BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
        telemetry._processors.append(processor)
    # The global provider can be set once per process; an application that already set one keeps it (and looptrace
    # spans still reach this provider through Agent(tracer_provider=...)).
    if set_global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return telemetry


def _exporter(name: str, trace_file, console_stream, telemetry: Telemetry) -> SpanExporter:
    if name == "file":
        telemetry.trace_file = Path(trace_file) if trace_file else default_trace_file()
        return OTLPJsonFileExporter(telemetry.trace_file)
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=console_stream or sys.stderr)
    raise ConfigurationError(f"unknown exporter {name!r}")


def _resource(service_name: str | None) -> Resource:
    # Resource.create() reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; an explicit name wins over both, and
    # "looptrace" replaces the SDK's "unknown_service" when nothing names the service.
    resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource
