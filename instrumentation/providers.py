"""Which provider a run's spans go to, decided at the start of each run.

1. The provider passed to the Agent, if any.
2. The global provider, once anything set one (the application's SDK, or ``configure()``): runs join it, as children
   of the current span, with the application's resource and exporters, and looptrace adds nothing to it unasked.
3. Otherwise looptrace's embedded default (``setup.default_telemetry``): the exporters the settings choose (the trace
   file when nothing else is configured), on a provider of looptrace's own that is never installed globally. With
   the trace file as its only exporter, that provider is the direct path's (``direct_spans``): API spans written
   straight to the file, no SDK span pipeline.

Decided per run, not per Agent: an application may build its agents at import time and set up its SDK afterwards.
Only the API is imported here; the SDK loads when the embedded default is first needed.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics, trace

from .settings import Settings


def providers_for_run(tracer_provider: Any, meter_provider: Any, settings: Settings) -> tuple[Any, Any]:
    """The (tracer provider, meter provider) of the next run; a meter provider of None means the global API's."""
    if tracer_provider is not None:
        return tracer_provider, meter_provider
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider) or not settings.chosen_exporters():
        return current, meter_provider
    from .setup import default_telemetry

    default = default_telemetry(settings)
    if meter_provider is None:
        # None would mean the global API's provider; the embedded default's metrics go where it says, or nowhere.
        meter_provider = default.meter_provider if default.meter_provider is not None else _NO_METRICS
    return default.tracer_provider, meter_provider


_NO_METRICS = metrics.NoOpMeterProvider()
