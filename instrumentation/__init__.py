"""looptrace's telemetry: settings, spans, metrics, the loop detector, alerts and exporters. Never imports runtime/.

* ``interface``: the protocols the loop records through, and the plain types both sides speak;
  ``agent_telemetry``: the one factory the runtime calls; ``settings``: every environment variable, read once;
  ``logs``: the ``looptrace`` logger; ``alerts``: where an anomaly goes (log line, webhook, callback, score).
* ``recording/``: spans with the GenAI conventions and looptrace.*, the instrumented model, content capture, metrics.
* ``export/``: ``configure()``, the SDK's exporters built from settings, each backend's attribute mapping applied as
  its spans leave (``mapped``; OpenInference's in ``openinference``), the delivery guard, ``push``.
* ``tracefile/``: the local OTLP/JSON file: encode, read, write, rotate; no network code.
* ``offline/``: runs rebuilt from stored or received spans, ours and other producers'.
* ``langfuse/``: Langfuse's attribute mapping, scores and public-API client; ``detector/``: pure standard library;
  ``watch/``: the OTLP receiver in front of a run watcher.

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
