"""looptrace's agent runtime: the loop, its tools, its limits and what a run returns.

Names load on first use, so that `looptrace detect` and `looptrace traces` (which import this package's CLI modules)
start without loading the loop, the model client and the OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Agent": "agent", "RunInterrupted": "agent",
    "AnomalyDetected": "events", "Event": "events", "ModelResponded": "events", "RunFinished": "events",
    "ToolFinished": "events", "TurnStarted": "events",
    "Limits": "limits",
    "AnthropicModel": "models", "Model": "models", "ScriptedModel": "models",
    "Price": "pricing",
    "RunResult": "result", "RunStatus": "result", "Usage": "result",
    "Tool": "tools", "tool": "tools",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
