"""looptrace's telemetry: spans, metrics, the loop detector, alerts and exporters.

`looptrace.configure(...)` sets up the OpenTelemetry SDK for an application (it is loaded on first use, so code
that only makes spans through the API never imports the SDK's exporters).
"""

from typing import Any

__all__ = ["Telemetry", "configure"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import setup

        return getattr(setup, name)
    raise AttributeError(f"module 'instrumentation' has no attribute {name!r}")
