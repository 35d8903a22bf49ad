"""An Agent's telemetry, built where the Agent is: the one factory the runtime takes from instrumentation.

An Agent is one of looptrace's entry points (with ``configure()``, the CLI and ``looptrace watch``). Its telemetry is
one of:

* what ``configure()`` returned, handed over as ``Agent(telemetry=telemetry)``: its providers, its settings, its
  anomaly sinks and its trace links, exactly;
* otherwise built here, once, from ``settings`` (the environment's, read once here, when none are given): the sinks
  those settings describe (``alerts.anomaly_sinks``), the links to Langfuse's UI when they send spans there, and
  spans on the providers each run resolves (``recording.providers``): the Agent's, the global one, else a pipeline
  of the Agent's own (``export.setup.own_telemetry``), built on the first run that needs it and shut down, with the
  sinks' queued scores, when the Agent's telemetry is collected or the process exits;
* nothing but the sinks when switched off (``telemetry=False``, ``OTEL_SDK_DISABLED=true``).

``alerts`` (``Agent(alerts=...)``) takes the place of the alerts part of the sinks, whichever they are. Nothing below
this module reads the environment or looks the sinks up: the run is handed them. No process-wide table: two Agents
built without telemetry have a pipeline each, two writers of the same trace file, which rotate it safely side by side
as writers in several processes do (``tracefile.write``).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import TYPE_CHECKING

from .alerts import Alerts, AnomalySinks, anomaly_sinks
from .recording.no_tracing import NoTracing
from .recording.providers import RunProviders
from .settings import ConfigurationError, Settings

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from .export.setup import Telemetry
    from .interface import AgentTelemetry, TraceLinks
    from .recording.mcp_tracing import MCPServerTelemetry

__all__ = ["agent_telemetry", "mcp_telemetry"]  # and ``Telemetry`` for type checkers: ``export.setup``'s

CLOSE_TIMEOUT_MS = 5_000  # what closing an Agent's own pipeline may wait for its backends


def agent_telemetry(telemetry: bool | Telemetry = True, *, tracer_provider: TracerProvider | None = None,
                    meter_provider: MeterProvider | None = None, capture_content: bool | None = None,
                    alerts: Alerts | None = None, settings: Settings | None = None) -> AgentTelemetry:
    """The telemetry of an ``Agent`` (see the module's note)."""
    own: OwnPipeline | None = None
    if isinstance(telemetry, bool):
        settings = Settings.from_env() if settings is None else settings
        sinks = anomaly_sinks(settings).with_alerts(alerts)
        enabled = telemetry and not settings.telemetry_disabled
        links = _trace_links(settings) if enabled else None
        if enabled and tracer_provider is None and settings.chosen_exporters():
            own = OwnPipeline(settings, sinks)
    else:
        if tracer_provider is not None or meter_provider is not None or settings is not None:
            raise ConfigurationError("Agent(telemetry=...) brings its own providers and settings: pass either the "
                                     "telemetry configure() returned or tracer_provider/meter_provider/settings")
        settings, tracer_provider = telemetry.settings, telemetry.tracer_provider
        meter_provider = telemetry.meter_provider
        sinks = (telemetry.sinks or anomaly_sinks(settings)).with_alerts(alerts)
        enabled, links = not settings.telemetry_disabled, telemetry.trace_links
    made: AgentTelemetry
    if not enabled:
        captures = settings.capture_content if capture_content is None else capture_content
        made = NoTracing(sinks, captures_content=captures, settings=settings)
    else:
        from .recording.spans import Tracing

        made = Tracing(settings, tracer_provider=tracer_provider, meter_provider=meter_provider,
                       capture_content=capture_content, sinks=sinks, trace_links=links,
                       default_providers=own.providers if own is not None else None)
    if isinstance(telemetry, bool) and (own is not None or sinks.scores is not None):
        _close_with(made, own or _SinksOnly(sinks))
    return made


class _Opened:
    """What an Agent's telemetry opened and closes: ``close`` delivers what is buffered, boundedly, and stops."""

    def close(self) -> None:
        raise NotImplementedError

    def close_soon(self) -> None:
        """Close on a thread of its own: the Agent was collected, on whatever thread the collector ran, which must
        not wait for a backend."""
        threading.Thread(target=self.close, name="looptrace-close", daemon=True).start()


# What Agents' telemetry opened and has not closed yet, for the exit: a set of weak references, so it keeps nothing
# alive; each is closed (on a thread) when its Agent goes, and whatever is left at exit is closed there, in turn.
_open: weakref.WeakSet[_Opened] = weakref.WeakSet()


def _close_with(telemetry: object, opened: _Opened) -> None:
    finalizer = weakref.finalize(telemetry, opened.close_soon)
    finalizer.atexit = False  # at exit, _close_all closes it on this thread, within its bound
    _open.add(opened)


@atexit.register
def _close_all() -> None:
    for opened in list(_open):
        opened.close()


class OwnPipeline(_Opened):
    """The pipeline of an Agent given no provider: built on the first run that finds no global provider, the same
    for every later one. Holds no reference to the Agent, so that it can be closed when the Agent goes."""

    def __init__(self, settings: Settings, sinks: AnomalySinks) -> None:
        self.settings = settings
        self.sinks = sinks
        self.telemetry: Telemetry | None = None
        self._lock = threading.Lock()
        self._closed = False

    def providers(self) -> RunProviders:
        """The pipeline's tracer and meter providers (None: no metrics), built on the first call."""
        with self._lock:
            if self.telemetry is None:
                from .export.setup import own_telemetry

                self.telemetry = own_telemetry(self.settings, sinks=self.sinks)
            return RunProviders(self.telemetry.tracer_provider, self.telemetry.meter_provider)

    def close(self) -> None:
        """Deliver what is buffered (spans, metrics, scores), within ``CLOSE_TIMEOUT_MS``, and stop. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            telemetry = self.telemetry
        if telemetry is not None:
            telemetry.shutdown(CLOSE_TIMEOUT_MS)  # the scores too: the pipeline holds the same sinks
        else:
            self.sinks.close(CLOSE_TIMEOUT_MS / 1000)


class _SinksOnly(_Opened):
    """What an Agent's telemetry opened when it records on someone else's provider: the scores' queue alone."""

    def __init__(self, sinks: AnomalySinks) -> None:
        self.sinks = sinks

    def close(self) -> None:
        self.sinks.close(CLOSE_TIMEOUT_MS / 1000)


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
