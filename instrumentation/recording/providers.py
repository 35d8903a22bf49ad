"""Which providers a run records on, decided at the start of each run.

1. The provider passed to the Agent (or the one of the telemetry it was handed), if any.
2. The global provider, once anything set one (the application's SDK, or ``configure()``): runs join it, as children
   of the current span, with the application's resource and exporters, and looptrace adds nothing to it unasked.
3. Otherwise looptrace's embedded default (``setup.default_telemetry``): the exporters the settings choose (the trace
   file when nothing else is configured), on an SDK provider of looptrace's own that is never installed globally.

Decided per run, not per Agent: an application may build its agents at import time and set up its SDK afterwards.
Where a run's anomalies go is not decided here: the telemetry the Agent was built with hands the run its sinks.
Only the API is imported here; the SDK loads when the embedded default is first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from opentelemetry import metrics, trace

if TYPE_CHECKING:
    from ..settings import Settings


class RunProviders(NamedTuple):
    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider | None  # None: the global API's


def providers_for_run(tracer_provider: trace.TracerProvider | None, meter_provider: metrics.MeterProvider | None,
                      settings: Settings) -> RunProviders:
    """The providers of the next run."""
    if tracer_provider is not None:
        return RunProviders(tracer_provider, meter_provider)
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider) or not settings.chosen_exporters():
        return RunProviders(current, meter_provider)
    from ..export.setup import default_telemetry

    default = default_telemetry(settings)
    if meter_provider is None:
        # None would mean the global API's provider; the embedded default's metrics go where it says, or nowhere.
        meter_provider = default.meter_provider if default.meter_provider is not None else _NO_METRICS
    return RunProviders(default.tracer_provider, meter_provider)


_NO_METRICS = metrics.NoOpMeterProvider()
