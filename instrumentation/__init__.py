"""looptrace's telemetry: settings, spans, metrics, the loop detector, alerts and exporters.

``looptrace.configure(...)`` sets up exporters for an application and ``looptrace.Settings`` holds the configuration;
both load on first use, so code that only makes spans through the API never imports the SDK's exporters.
"""

from typing import Any

__all__ = ["Settings", "Telemetry", "configure"]


def __getattr__(name: str) -> Any:
    if name == "Settings":
        from .settings import Settings

        return Settings
    if name in __all__:
        from .export import setup

        return getattr(setup, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
