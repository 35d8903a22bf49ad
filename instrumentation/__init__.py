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

Each subpackage hands out its public names from its own ``__init__``; this one hands out what other packages (the
CLI, the guards, ``replay``) need of the top-level modules (settings, interface, alerts, logs, agent_telemetry), and
``configure`` with the ``Telemetry`` it returns. The factory ``agent_telemetry.agent_telemetry`` is
``build_agent_telemetry`` here: a package's attribute named like one of its modules is that module once imported, so
the face cannot hand a function out under that name. Every name loads on first use, so code that only makes spans
through the API never imports the SDK's exporters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_face import lazy_face

if TYPE_CHECKING:  # the same names, for type checkers
    from .agent_telemetry import agent_telemetry as build_agent_telemetry
    from .alerts import Alerts
    from .export.setup import Telemetry, configure
    from .interface import AgentTelemetry, Answer, ToolCallView, ToolTrace, Usage
    from .logs import configure_service_logging, install_cli_rendering, logger, settings_ignored
    from .settings import DEFAULT_MODEL, ConfigurationError, Settings, http_url_problem

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "Alerts": ".alerts",
    "Telemetry": ".export.setup",
    "configure": ".export.setup",
    "AgentTelemetry": ".interface",
    "Answer": ".interface",
    "ToolCallView": ".interface",
    "ToolTrace": ".interface",
    "Usage": ".interface",
    "configure_service_logging": ".logs",
    "install_cli_rendering": ".logs",
    "logger": ".logs",
    "settings_ignored": ".logs",
    "DEFAULT_MODEL": ".settings",
    "ConfigurationError": ".settings",
    "Settings": ".settings",
    "http_url_problem": ".settings",
}
# public name -> (module, its name there), for a function named like the module that defines it: the import
# system binds a package's attribute of a submodule's name to the submodule once it is imported, so the face
# cannot hand the function out under that name
_RENAMED: dict[str, tuple[str, str]] = {
    "build_agent_telemetry": (".agent_telemetry", "agent_telemetry"),
}

__all__ = [
    "DEFAULT_MODEL",
    "AgentTelemetry",
    "Alerts",
    "Answer",
    "ConfigurationError",
    "Settings",
    "Telemetry",
    "ToolCallView",
    "ToolTrace",
    "Usage",
    "build_agent_telemetry",
    "configure",
    "configure_service_logging",
    "http_url_problem",
    "install_cli_rendering",
    "logger",
    "settings_ignored",
]


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, _RENAMED)
