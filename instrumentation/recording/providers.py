"""Which providers a run records on, decided at the start of each run.

1. The provider passed to the Agent (or the one of the telemetry it was handed), if any.
2. The global provider, once anything set one (the application's SDK, or ``configure()``): runs join it, as children
   of the current span, with the application's resource and exporters, and looptrace adds nothing to it unasked.
3. Otherwise the Agent's own pipeline (``default``): the exporters its settings choose (the trace file when nothing
   else is configured), on an SDK provider that is never installed globally. Whoever built the telemetry hands it
   in, built on first use (``agent_telemetry``); without one, runs record on the API's no-op provider.

Decided per run, not per Agent: an application may build its agents at import time and set up its SDK afterwards.
Where a run's anomalies go is not decided here: the telemetry the Agent was built with hands the run its sinks.
Only the API is imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from opentelemetry import metrics, trace


class RunProviders(NamedTuple):
    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider | None  # None: the global API's


DefaultProviders = Callable[[], RunProviders]
"""The providers of a pipeline of the Agent's own, built on the first call and the same ones after it; None for its
meter provider means no metrics (no reader would ever see them)."""


def providers_for_run(tracer_provider: trace.TracerProvider | None, meter_provider: metrics.MeterProvider | None,
                      default: DefaultProviders | None) -> RunProviders:
    """The providers of the next run."""
    if tracer_provider is not None:
        return RunProviders(tracer_provider, meter_provider)
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider) or default is None:
        return RunProviders(current, meter_provider)
    own = default()
    if meter_provider is None:
        # None would mean the global API's provider; the own pipeline's metrics go where it says, or nowhere.
        meter_provider = own.meter_provider if own.meter_provider is not None else _NO_METRICS
    return RunProviders(own.tracer_provider, meter_provider)


_NO_METRICS = metrics.NoOpMeterProvider()
