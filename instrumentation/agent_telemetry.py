"""An Agent's telemetry, built where the Agent is: the one factory the runtime takes from instrumentation.

An Agent is one of looptrace's entry points (with ``configure()``, the CLI and ``looptrace watch``). Its telemetry is
one of:

* what ``configure()`` returned, handed over as ``Agent(telemetry=telemetry)``: its providers, its settings, its
  anomaly sinks and its trace links, exactly;
* otherwise built from ``settings`` (the environment's, read once here, when none are given): the sinks those
  settings describe (``alerts.anomaly_sinks``: the same settings give the same sinks, so a ``configure()`` on the
  same environment and this Agent share them), the links to Langfuse's UI when they send spans there, and spans on
  the providers each run resolves (``providers``);
* nothing but the sinks when switched off (``telemetry=False``, ``OTEL_SDK_DISABLED=true``).

``alerts`` (``Agent(alerts=...)``) takes the place of the alerts part of the sinks, whichever they are. Nothing below
this module reads the environment or looks the sinks up: the run is handed them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .alerts import Alerts, anomaly_sinks
from .recording.no_tracing import NoTracing
from .settings import ConfigurationError, Settings

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from .export.setup import Telemetry
    from .interface import AgentTelemetry, TraceLinks
    from .recording.mcp_tracing import MCPServerTelemetry

__all__ = ["agent_telemetry", "mcp_telemetry"]  # and ``Telemetry`` for type checkers: ``export.setup``'s


def agent_telemetry(telemetry: bool | Telemetry = True, *, tracer_provider: TracerProvider | None = None,
                    meter_provider: MeterProvider | None = None, capture_content: bool | None = None,
                    alerts: Alerts | None = None, settings: Settings | None = None) -> AgentTelemetry:
    """The telemetry of an ``Agent`` (see the module's note)."""
    if isinstance(telemetry, bool):
        settings = Settings.from_env() if settings is None else settings
        sinks = anomaly_sinks(settings).with_alerts(alerts)
        enabled = telemetry and not settings.telemetry_disabled
        links = _trace_links(settings) if enabled else None
    else:
        if tracer_provider is not None or meter_provider is not None or settings is not None:
            raise ConfigurationError("Agent(telemetry=...) brings its own providers and settings: pass either the "
                                     "telemetry configure() returned or tracer_provider/meter_provider/settings")
        settings, tracer_provider = telemetry.settings, telemetry.tracer_provider
        meter_provider = telemetry.meter_provider
        sinks = (telemetry.sinks or anomaly_sinks(settings)).with_alerts(alerts)
        enabled, links = not settings.telemetry_disabled, telemetry.trace_links
    if not enabled:
        captures = settings.capture_content if capture_content is None else capture_content
        return NoTracing(sinks, captures_content=captures, settings=settings)
    from .recording.spans import Tracing

    return Tracing(settings, tracer_provider=tracer_provider, meter_provider=meter_provider,
                   capture_content=capture_content, sinks=sinks, trace_links=links)


def _trace_links(settings: Settings) -> TraceLinks | None:
    """Links to each run's trace in Langfuse's UI, when the settings send spans there."""
    if settings.langfuse is None or "langfuse" not in settings.chosen_exporters():
        return None
    from .langfuse.api import TraceLinks

    return TraceLinks(settings.langfuse)


def mcp_telemetry(telemetry: AgentTelemetry | None, *, server: str, transport: str,
                  server_address: str | None = None, server_port: int | None = None) -> MCPServerTelemetry:
    """Where one MCP server's requests are recorded: a CLIENT span per request on the run's providers (none with
    ``telemetry`` None or off), the MCP duration metrics, and the scrubbing of what a server says back (see
    ``mcp_tracing``). Imported on first use: only MCP needs it."""
    from .recording.mcp_tracing import MCPServerTelemetry

    return MCPServerTelemetry(telemetry, server=server, transport=transport, server_address=server_address,
                              server_port=server_port)
