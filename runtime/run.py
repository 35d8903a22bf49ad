"""One run as the loop carries it from turn to turn: its budget, its history, its monitor, its tools."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from looptrace.runtime.approvals import PendingCall
from looptrace.runtime.limits import Budget
from looptrace.runtime.monitor import RunMonitor
from looptrace.runtime.state import PendingAnomaly

if TYPE_CHECKING:
    from looptrace.runtime.mcp_sessions import RunServers
    from looptrace.runtime.tools import Tool

__all__ = ["Labels", "Pause", "Run"]


@dataclass(frozen=True, slots=True)
class Labels:
    """What the caller says about a run, for the trace: Langfuse's session, user, tags and metadata."""

    session_id: str | None
    user_id: str | None
    tags: tuple[str, ...]
    metadata: Mapping[str, Any] | None


@dataclass(slots=True)
class Pause:
    """A round paused for decisions: the calls that wait, and the tool_results of those that ran."""

    pending: list[PendingCall]
    settled: dict[str, dict[str, Any]]


@dataclass(slots=True)
class Run:
    """One run as the loop carries it from turn to turn."""

    budget: Budget
    messages: list[dict[str, Any]]
    monitor: RunMonitor
    labels: Labels
    tools: dict[str, Tool]  # the agent's own and its MCP servers'
    tool_definitions: list[dict[str, Any]]
    servers: RunServers | None = None
    servers_version: int = 0  # of the servers' tool lists this run's tools were built from
    final_text: str = ""
    stop_reason: str | None = None
    error: BaseException | None = None
    paused: Pause | None = None
    asked: PendingAnomaly | None = None  # an anomaly whose policy said "ask"
