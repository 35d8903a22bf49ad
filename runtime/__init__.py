"""looptrace's agent runtime: the loop, its tools, its limits and what a run returns.

The names load on first use (like the top-level ``looptrace`` package), so importing one submodule, such as the
results the CLI maps to exit codes, does not import them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "Agent": "agent", "RunInterrupted": "agent",
    "ApprovalRequest": "approvals", "Decision": "approvals", "PendingCall": "approvals", "approve": "approvals",
    "reject": "approvals",
    "RunState": "state", "StateError": "state",
    "AnomalyDetected": "events", "Event": "events", "ModelResponded": "events", "RunFinished": "events",
    "TextStreamed": "events", "ToolFinished": "events", "TurnStarted": "events",
    "Limits": "limits",
    "AnthropicModel": "models", "Model": "models", "ScriptedModel": "models",
    "Price": "pricing",
    "RunResult": "result", "RunStatus": "result", "Usage": "result",
    "Tool": "tools", "tool": "tools",
}

__all__ = [
    "Agent",
    "AnomalyDetected",
    "AnthropicModel",
    "ApprovalRequest",
    "Decision",
    "Event",
    "Limits",
    "Model",
    "ModelResponded",
    "PendingCall",
    "Price",
    "RunFinished",
    "RunInterrupted",
    "RunResult",
    "RunState",
    "RunStatus",
    "ScriptedModel",
    "StateError",
    "TextStreamed",
    "Tool",
    "ToolFinished",
    "TurnStarted",
    "Usage",
    "approve",
    "reject",
    "tool",
]

if TYPE_CHECKING:
    from looptrace.runtime.agent import Agent, RunInterrupted
    from looptrace.runtime.approvals import ApprovalRequest, Decision, PendingCall, approve, reject
    from looptrace.runtime.events import (
        AnomalyDetected,
        Event,
        ModelResponded,
        RunFinished,
        TextStreamed,
        ToolFinished,
        TurnStarted,
    )
    from looptrace.runtime.limits import Limits
    from looptrace.runtime.models import AnthropicModel, Model, ScriptedModel
    from looptrace.runtime.pricing import Price
    from looptrace.runtime.result import RunResult, RunStatus, Usage
    from looptrace.runtime.state import RunState, StateError
    from looptrace.runtime.tools import Tool, tool


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
