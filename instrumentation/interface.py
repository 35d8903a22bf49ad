"""What the agent loop needs of telemetry, and nothing more: the one interface between runtime/ and the spans.

``runtime/agent.py`` sees only these Protocols. ``spans.Tracing`` implements them with OpenTelemetry spans and metrics;
``NoTracing`` implements them with nothing at all, for ``Agent(telemetry=False)`` and ``OTEL_SDK_DISABLED=true``. The
loop is the same either way: it never asks whether anything records.

One thing the no-op still does: it redacts tool arguments (``ToolTrace.arguments``), because the detector, the events
and the alerts quote a call's arguments whether or not anything is traced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from .content import redact

__all__ = ["AgentTracing", "ChatTrace", "NoTracing", "RunTrace", "ToolTrace", "TurnTrace"]


class ChatTrace(Protocol):
    """One model call."""

    def activate(self) -> AbstractContextManager[Any]:
        """Current while the call runs, so an HTTP client's own spans nest under it."""
        ...

    def end(self, response: Mapping[str, Any], usage: Any, *, cost_usd: float | None) -> None:
        """The call returned ``response`` (a Messages API response as a dict)."""
        ...

    def fail(self, exc: BaseException) -> None:
        """The call raised ``exc``."""
        ...


class ToolTrace(Protocol):
    """One tool call. ``arguments`` are the call's, secrets redacted: what may be quoted anywhere."""

    @property
    def arguments(self) -> Any: ...

    def activate(self) -> AbstractContextManager[Any]:
        """Current while the tool runs, so a tool's own spans nest under it."""
        ...

    def end(self, *, result: str, is_error: bool, outcome: str, error_type: str | None = None,
            duration_s: float = 0.0, full_length: int | None = None) -> None:
        """The call settled: what the model is sent, whether it is an error and why."""
        ...


class TurnTrace(Protocol):
    """One loop iteration: a model call and the tool calls it asked for."""

    def start_chat(self, params: Mapping[str, Any], *, server_address: str | None, server_port: int | None,
                   stream: bool) -> ChatTrace: ...

    def start_tool(self, *, call_id: str, name: str, description: str | None, arguments: Any) -> ToolTrace: ...

    def anomaly(self, anomaly: Any, action: str, tool_calls: Sequence[ToolTrace]) -> None:
        """The detector flagged ``anomaly`` in this turn, involving ``tool_calls``; ``action`` is the policy's."""
        ...

    def nudged(self, text: str) -> None:
        """A corrective message was sent to the model."""
        ...

    def end(self, *, stop_reason: str | None) -> None: ...


class RunTrace(Protocol):
    """One run of an agent: the root of its trace."""

    @property
    def trace_id(self) -> str:
        """32 hex digits; all zeros when nothing records."""
        ...

    @property
    def span_id(self) -> str: ...

    @property
    def trace_url(self) -> str | None:
        """The trace in a backend's UI (Langfuse), when the run's spans go there; else None."""
        ...

    def start_turn(self, index: int) -> TurnTrace: ...

    def end(self, *, status: str, turns: int, usage: Any, cost_usd: float | None, anomalies: int,
            final_text: str | None, error: str | None = None, error_type: str | None = None) -> None: ...


class AgentTracing(Protocol):
    """An agent's telemetry: starts the trace of each run."""

    def start_run(self, *, agent: str, model: str, task: str | list[dict[str, Any]], system: str | None,
                  tool_definitions: list[dict[str, Any]], session_id: str | None = None, user_id: str | None = None,
                  tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> RunTrace: ...

    def flush(self, timeout_ms: int = 5_000) -> None:
        """Best effort: push out what is buffered (on the way out of an interrupted run)."""
        ...


# --- the no-op implementation ---------------------------------------------------------------------------------------

_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16


class _NoChat:
    __slots__ = ()

    def activate(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def end(self, response: Mapping[str, Any], usage: Any, *, cost_usd: float | None) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass


class _NoTool:
    __slots__ = ("arguments",)

    def __init__(self, arguments: Any) -> None:
        self.arguments = arguments

    def activate(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def end(self, *, result: str, is_error: bool, outcome: str, error_type: str | None = None,
            duration_s: float = 0.0, full_length: int | None = None) -> None:
        pass


class _NoTurn:
    __slots__ = ()

    def start_chat(self, params: Mapping[str, Any], *, server_address: str | None, server_port: int | None,
                   stream: bool) -> ChatTrace:
        return _NO_CHAT

    def start_tool(self, *, call_id: str, name: str, description: str | None, arguments: Any) -> ToolTrace:
        return _NoTool(redact(arguments))

    def anomaly(self, anomaly: Any, action: str, tool_calls: Sequence[ToolTrace]) -> None:
        pass

    def nudged(self, text: str) -> None:
        pass

    def end(self, *, stop_reason: str | None) -> None:
        pass


class _NoRun:
    __slots__ = ()

    trace_id = _ZERO_TRACE_ID
    span_id = _ZERO_SPAN_ID
    trace_url = None

    def start_turn(self, index: int) -> TurnTrace:
        return _NO_TURN

    def end(self, *, status: str, turns: int, usage: Any, cost_usd: float | None, anomalies: int,
            final_text: str | None, error: str | None = None, error_type: str | None = None) -> None:
        pass


_NO_CHAT, _NO_TURN, _NO_RUN = _NoChat(), _NoTurn(), _NoRun()


class NoTracing:
    """Telemetry switched off: no span, no metric, no exporter; tool arguments are still redacted."""

    def start_run(self, *, agent: str, model: str, task: str | list[dict[str, Any]], system: str | None,
                  tool_definitions: list[dict[str, Any]], session_id: str | None = None, user_id: str | None = None,
                  tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None) -> RunTrace:
        from .langfuse import trace_attributes

        # Checked even here: a label Langfuse would drop should fail in tests, not once telemetry is switched on.
        trace_attributes(agent, session_id=session_id, user_id=user_id, tags=tags, metadata=metadata)
        return _NO_RUN

    def flush(self, timeout_ms: int = 5_000) -> None:
        pass
