"""Which providers and anomaly sinks a run uses, decided at the start of each run.

1. The provider passed to the Agent, if any.
2. The global provider, once anything set one (the application's SDK, or ``configure()``): runs join it, as children
   of the current span, with the application's resource and exporters, and looptrace adds nothing to it unasked.
3. Otherwise looptrace's embedded default (``setup.default_telemetry``): the exporters the settings choose (the trace
   file when nothing else is configured), on an SDK provider of looptrace's own that is never installed globally.

The anomaly sinks go with the provider: ``configure()`` and the embedded default register the ones they built from
their settings (``alerts.register_sinks``), so a run on their provider reports to them (the Langfuse score included)
whether the CLI, an application's ``Agent`` or a test built it. A provider nobody registered (the application's own
SDK) gets the sinks the Agent's own settings describe.

Decided per run, not per Agent: an application may build its agents at import time and set up its SDK afterwards.
Only the API is imported here; the SDK loads when the embedded default is first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import metrics, trace

from .alerts import sinks_for

if TYPE_CHECKING:
    from .alerts import AnomalySinks
    from .settings import Settings


class RunProviders(NamedTuple):
    tracer_provider: Any
    meter_provider: Any  # None: the global API's
    sinks: AnomalySinks | None  # None: none registered for this provider


def providers_for_run(tracer_provider: Any, meter_provider: Any, settings: Settings) -> RunProviders:
    """The providers and anomaly sinks of the next run."""
    if tracer_provider is not None:
        return RunProviders(tracer_provider, meter_provider, sinks_for(tracer_provider))
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider) or not settings.chosen_exporters():
        return RunProviders(current, meter_provider, sinks_for(current))
    from .setup import default_telemetry

    default = default_telemetry(settings)
    if meter_provider is None:
        # None would mean the global API's provider; the embedded default's metrics go where it says, or nowhere.
        meter_provider = default.meter_provider if default.meter_provider is not None else _NO_METRICS
    return RunProviders(default.tracer_provider, meter_provider, default.sinks)


_NO_METRICS = metrics.NoOpMeterProvider()
