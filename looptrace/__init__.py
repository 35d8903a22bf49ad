"""looptrace: an observability-first agent runtime on the Anthropic Messages API.

Everything a user needs is importable from here::

    from looptrace import Agent, Limits, tool, configure

The names load on first use, so ``import looptrace`` (and ``looptrace --help``) stays cheap: the OpenTelemetry SDK, the
exporters and the ``anthropic`` client are imported only when a run or ``configure()`` needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from looptrace.lazy_face import lazy_face
from looptrace.version import __version__

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "Agent": "looptrace.runtime.agent",
    "RunInterrupted": "looptrace.runtime.agent",
    "ApprovalRequest": "looptrace.runtime.approvals",
    "Decision": "looptrace.runtime.approvals",
    "PendingCall": "looptrace.runtime.approvals",
    "approve": "looptrace.runtime.approvals",
    "reject": "looptrace.runtime.approvals",
    "RunState": "looptrace.runtime.state",
    "StateError": "looptrace.runtime.state",
    "AnomalyDetected": "looptrace.runtime.events",
    "Event": "looptrace.runtime.events",
    "ModelResponded": "looptrace.runtime.events",
    "RunFinished": "looptrace.runtime.events",
    "ToolFinished": "looptrace.runtime.events",
    "TurnStarted": "looptrace.runtime.events",
    "TextStreamed": "looptrace.runtime.events",
    "Limits": "looptrace.runtime.limits",
    "AnthropicModel": "looptrace.runtime.models",
    "Model": "looptrace.runtime.models",
    "ScriptedModel": "looptrace.runtime.models",
    "Price": "looptrace.runtime.pricing",
    "RunResult": "looptrace.runtime.result",
    "RunStatus": "looptrace.runtime.result",
    "Usage": "looptrace.runtime.result",
    "Tool": "looptrace.runtime.tools",
    "MCPServerHTTP": "looptrace.runtime.mcp_servers",
    "MCPServerStdio": "looptrace.runtime.mcp_servers",
    "tool": "looptrace.runtime.tools",
    "Alerts": "looptrace.instrumentation.alerts",
    "Anomaly": "looptrace.instrumentation.detector",
    "DetectorConfig": "looptrace.instrumentation.detector",
    "LoopDetector": "looptrace.instrumentation.detector",
    "ToolCall": "looptrace.instrumentation.detector",
    "Settings": "looptrace.instrumentation.settings",
    "Telemetry": "looptrace.instrumentation.export.setup",
    "configure": "looptrace.instrumentation.export.setup",
}

__all__ = [
    "Agent",
    "Alerts",
    "Anomaly",
    "AnomalyDetected",
    "AnthropicModel",
    "ApprovalRequest",
    "Decision",
    "DetectorConfig",
    "Event",
    "Limits",
    "LoopDetector",
    "MCPServerHTTP",
    "MCPServerStdio",
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
    "Settings",
    "StateError",
    "Telemetry",
    "TextStreamed",
    "Tool",
    "ToolCall",
    "ToolFinished",
    "TurnStarted",
    "Usage",
    "__version__",
    "approve",
    "configure",
    "reject",
    "tool",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the names load lazily through __getattr__
    from looptrace.instrumentation.alerts import Alerts
    from looptrace.instrumentation.detector import Anomaly, DetectorConfig, LoopDetector, ToolCall
    from looptrace.instrumentation.export.setup import Telemetry, configure
    from looptrace.instrumentation.settings import Settings
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
    from looptrace.runtime.mcp_servers import MCPServerHTTP, MCPServerStdio
    from looptrace.runtime.models import AnthropicModel, Model, ScriptedModel
    from looptrace.runtime.pricing import Price
    from looptrace.runtime.result import RunResult, RunStatus, Usage
    from looptrace.runtime.state import RunState, StateError
    from looptrace.runtime.tools import Tool, tool


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
