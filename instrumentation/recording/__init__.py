"""Recording a run: OpenTelemetry spans with the GenAI conventions and looptrace.* (no backend's attributes: their
exporters add them, ``export.mapped``), the instrumented model, content capture and redaction, metrics, and the
protocols of what the spans hand on (``sinks``: anomaly sinks, trace links), which the layers above implement.
Imports none of alerts, langfuse or export.

``semconv``, every span, attribute, event and metric name looptrace writes, is the name readers of stored spans use
(`looptrace detect`, `traces`, `report`): a namespace of names (``semconv.RUN_STATUS``), handed out whole.

Other packages take this package's names from here; each loads on first use, so a reader of stored spans does not
pay for the OpenTelemetry SDK the spans import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ...lazy_face import lazy_face

if TYPE_CHECKING:  # the same names, for type checkers
    from . import semconv
    from .content import cap, redact, redacted_history, to_json
    from .instrumented_model import Answer, ModelLike, report_first_chunk
    from .labels import MAX_LABEL_CHARS, RunLabels, checked, run_labels
    from .mcp_tracing import MCPServerTelemetry
    from .metrics import prometheus_reader
    from .no_tracing import NoTracing
    from .prices import DEFAULT_PRICES, Price, price_for, usd_for_tokens
    from .providers import RunProviders
    from .sinks import ACTIONS, Action, AlertContext, AnomalySink, TraceLinks
    from .spans import Tracing
    from .tool_call import ToolCallView
    from .usage import CostOf, Usage

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "cap": ".content",
    "redact": ".content",
    "redacted_history": ".content",
    "to_json": ".content",
    "Answer": ".instrumented_model",
    "ModelLike": ".instrumented_model",
    "report_first_chunk": ".instrumented_model",
    "MAX_LABEL_CHARS": ".labels",
    "RunLabels": ".labels",
    "checked": ".labels",
    "run_labels": ".labels",
    "MCPServerTelemetry": ".mcp_tracing",
    "prometheus_reader": ".metrics",
    "NoTracing": ".no_tracing",
    "DEFAULT_PRICES": ".prices",
    "Price": ".prices",
    "price_for": ".prices",
    "usd_for_tokens": ".prices",
    "RunProviders": ".providers",
    "ACTIONS": ".sinks",
    "Action": ".sinks",
    "AlertContext": ".sinks",
    "AnomalySink": ".sinks",
    "TraceLinks": ".sinks",
    "Tracing": ".spans",
    "ToolCallView": ".tool_call",
    "CostOf": ".usage",
    "Usage": ".usage",
}

__all__ = [
    "ACTIONS",
    "DEFAULT_PRICES",
    "MAX_LABEL_CHARS",
    "Action",
    "AlertContext",
    "AnomalySink",
    "Answer",
    "CostOf",
    "MCPServerTelemetry",
    "ModelLike",
    "NoTracing",
    "Price",
    "RunLabels",
    "RunProviders",
    "ToolCallView",
    "TraceLinks",
    "Tracing",
    "Usage",
    "cap",
    "checked",
    "price_for",
    "prometheus_reader",
    "redact",
    "redacted_history",
    "report_first_chunk",
    "run_labels",
    "semconv",
    "to_json",
    "usd_for_tokens",
]


_face_getattr, _face_dir = lazy_face(__name__, _EXPORTS)


def __getattr__(name: str) -> object:
    if name == "semconv":  # the module itself: importing it makes it this package's attribute
        return importlib.import_module(f"{__name__}.semconv")
    return _face_getattr(name)


def __dir__() -> list[str]:
    return [*_face_dir(), "semconv"]
