"""looptrace's agent runtime: the loop, its tools and MCP servers, its limits and policy, the run monitor the guards
share, and what a run returns. Other packages (the CLI, the guards, ``replay``) import these names from here.

The names load on first use (like the top-level ``looptrace`` package), so importing one submodule, such as the
results the CLI maps to exit codes, does not import them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_face import lazy_face

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "Agent": ".agent", "RunInterrupted": ".agent",
    "ApprovalRequest": ".approvals", "Decision": ".approvals", "PendingCall": ".approvals", "approve": ".approvals",
    "reject": ".approvals",
    "RunState": ".state", "StateError": ".state",
    "AnomalyDetected": ".events", "Event": ".events", "ModelResponded": ".events", "RunFinished": ".events",
    "TextStreamed": ".events", "ToolFinished": ".events", "TurnStarted": ".events",
    "Limits": ".limits",
    "MCPConnections": ".mcp_connections",
    "MCPServer": ".mcp_servers", "MCPServerHTTP": ".mcp_servers", "MCPServerStdio": ".mcp_servers",
    "MCPServerUnavailable": ".mcp_servers", "check_installed": ".mcp_servers",
    "AnthropicModel": ".models", "Model": ".models", "ScriptedModel": ".models", "report_streamed_text": ".models",
    "NOTHING": ".monitor", "Reaction": ".monitor", "RunMonitor": ".monitor",
    "AnomalyPolicy": ".policy", "Policy": ".policy",
    "Price": ".pricing", "Pricing": ".pricing", "price_for": ".pricing",
    "RunResult": ".result", "RunStatus": ".result", "Usage": ".result",
    "claims_directory": ".resume_claims",
    "Tool": ".tools", "ToolError": ".tools", "tool": ".tools",
}

__all__ = [
    "NOTHING",
    "Agent",
    "AnomalyDetected",
    "AnomalyPolicy",
    "AnthropicModel",
    "ApprovalRequest",
    "Decision",
    "Event",
    "Limits",
    "MCPConnections",
    "MCPServer",
    "MCPServerHTTP",
    "MCPServerStdio",
    "MCPServerUnavailable",
    "Model",
    "ModelResponded",
    "PendingCall",
    "Policy",
    "Price",
    "Pricing",
    "Reaction",
    "RunFinished",
    "RunInterrupted",
    "RunMonitor",
    "RunResult",
    "RunState",
    "RunStatus",
    "ScriptedModel",
    "StateError",
    "TextStreamed",
    "Tool",
    "ToolError",
    "ToolFinished",
    "TurnStarted",
    "Usage",
    "approve",
    "check_installed",
    "claims_directory",
    "price_for",
    "reject",
    "report_streamed_text",
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
    from looptrace.runtime.mcp_connections import MCPConnections
    from looptrace.runtime.mcp_servers import (
        MCPServer,
        MCPServerHTTP,
        MCPServerStdio,
        MCPServerUnavailable,
        check_installed,
    )
    from looptrace.runtime.models import AnthropicModel, Model, ScriptedModel, report_streamed_text
    from looptrace.runtime.monitor import NOTHING, Reaction, RunMonitor
    from looptrace.runtime.policy import AnomalyPolicy, Policy
    from looptrace.runtime.pricing import Price, Pricing, price_for
    from looptrace.runtime.result import RunResult, RunStatus, Usage
    from looptrace.runtime.resume_claims import claims_directory
    from looptrace.runtime.state import RunState, StateError
    from looptrace.runtime.tools import Tool, ToolError, tool


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
