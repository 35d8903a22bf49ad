"""Recording a run: OpenTelemetry spans with the GenAI conventions and looptrace.* (no backend's attributes: their
exporters add them, ``export.mapped``), the instrumented model, content capture and redaction, metrics, and the
protocols of what the spans hand on (``sinks``: anomaly sinks, trace links), which the layers above implement.
Imports none of alerts, langfuse or export.

``semconv``, every span, attribute, event and metric name looptrace writes, is the name readers of stored spans use
(`looptrace detect`, `traces`, `report`); it loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import semconv

__all__ = ["semconv"]


def __getattr__(name: str) -> Any:
    if name == "semconv":
        return importlib.import_module(f"{__name__}.semconv")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
