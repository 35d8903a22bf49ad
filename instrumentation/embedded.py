"""The entry point of an ``Agent`` built without telemetry of its own: the environment, read once, decides it all.

An Agent is one of looptrace's entry points (with ``configure()``, the CLI and ``looptrace watch``): when it is not
handed a ``Settings``, this reads the environment once, and the telemetry it returns carries those settings down to
everything below (spans, the embedded default's exporters, the anomaly sinks). Nothing below reads the environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .alerts import Alerts, AnomalySinks
from .no_tracing import NoTracing
from .settings import Settings

if TYPE_CHECKING:
    from .interface import AgentTelemetry


def agent_telemetry(*, enabled: bool = True, tracer_provider: Any = None, meter_provider: Any = None,
                    capture_content: bool | None = None, alerts: Alerts | None = None,
                    settings: Settings | None = None) -> AgentTelemetry:
    """An Agent's telemetry: spans and metrics on the providers each run resolves (see ``providers``), anomalies to
    the sinks registered for them or, failing that, to those ``settings`` describe; ``alerts`` replaces the alerts
    part of either. Nothing at all but the alerts when switched off (``enabled=False``, ``OTEL_SDK_DISABLED=true``).
    """
    settings = Settings.from_env() if settings is None else settings
    own = AnomalySinks.from_settings(settings).with_alerts(alerts)
    if not enabled or settings.telemetry_disabled:
        captures = settings.capture_content if capture_content is None else capture_content
        return NoTracing(own.alerts, captures_content=captures, settings=settings)
    from .spans import Tracing  # the OpenTelemetry side loads only when something records

    return Tracing(settings, tracer_provider=tracer_provider, meter_provider=meter_provider,
                   capture_content=capture_content, sinks=own, alerts=alerts)
