"""Telemetry switched off: the interface's protocols implemented with nothing at all, but for two duties.

The loop's view of each tool call is redacted all the same (it makes it, ``ToolCallView``), model calls are still
priced for the budget (``PricedModel``), and anomaly reports still reach the sinks the telemetry was given (the log
line, the webhook, a callback; no score: there is no trace to put it on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ..detector import Anomaly, LoopCost, UnresolvedToolError
from ..logs import telemetry_failed
from ..settings import Settings
from .instrumented_model import ModelLike, PricedModel
from .labels import checked, run_labels
from .sinks import Action, AlertContext, AnomalySink
from .tool_call import ToolCallView
from .usage import CostOf, Usage

__all__ = ["NoTracing"]

_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16


class _NoTool:
    __slots__ = ("view",)

    def __init__(self, view: ToolCallView) -> None:
        self.view = view

    def activate(self) -> AbstractContextManager[None]:
        return nullcontext()

    def end(self) -> None:
        pass

    def approval(self, *, decision: str, by: str | None = None, reason: str | None = None,
                 wait_s: float | None = None) -> None:
        pass


class _NoTurn:
    __slots__ = ("run",)

    def __init__(self, run: _NoRun) -> None:
        self.run = run

    def activate(self) -> AbstractContextManager[None]:
        return nullcontext()

    def start_tool(self, view: ToolCallView, *, description: str | None) -> _NoTool:
        return _NoTool(view)

    def report(self, anomaly: Anomaly, action: Action, tool_calls: Sequence[object]) -> None:
        sinks = self.run.sinks
        if sinks is None:
            return
        try:
            sinks.send(anomaly, AlertContext(agent=self.run.agent, trace_id=_ZERO_TRACE_ID, span_id=_ZERO_SPAN_ID,
                                             action=action))
        except Exception as exc:  # a sink that fails is the sink's business, never the run's
            telemetry_failed("anomaly alert", exc)

    def nudged(self, text: str) -> None:
        pass

    def end(self, *, stop_reason: str | None) -> None:
        pass


class _NoRun:
    __slots__ = ("agent", "sinks", "turn")

    trace_id = _ZERO_TRACE_ID
    span_id = _ZERO_SPAN_ID
    trace_url = None

    def __init__(self, agent: str, sinks: AnomalySink | None) -> None:
        self.agent = agent
        self.sinks = sinks
        self.turn = _NoTurn(self)

    def start_turn(self, index: int) -> _NoTurn:
        return self.turn

    def end(self, *, status: str, turns: int, usage: Usage, cost_usd: float | None, anomalies: int,
            final_text: str | None, error: str | None = None, error_type: str | None = None,
            unresolved_errors: Sequence[UnresolvedToolError] = (), session_id: str | None = None,
            loop_cost: LoopCost | None = None, session_loop_cost: LoopCost | None = None,
            loop_cost_by_type: Mapping[str, LoopCost] | None = None) -> None:
        pass


class NoTracing:
    """Telemetry switched off: no span, no metric, no exporter. Tool arguments are still redacted, and anomalies still
    reach ``sinks`` (the log line, the webhook, a callback) when given."""

    trace_links = None

    def __init__(self, sinks: AnomalySink | None = None, *, captures_content: bool = True,
                 settings: Settings | None = None) -> None:
        self.sinks = sinks
        self.captures_content = captures_content
        self.settings = Settings() if settings is None else settings  # what the Agent takes its judge from

    def instrument(self, model: ModelLike, *, cost_of: CostOf | None = None, judge: bool = False) -> PricedModel:
        return PricedModel(model, cost_of=cost_of)

    def start_run(self, *, agent: str, model: str, task: str | list[dict[str, Any]], system: str | None,
                  tool_definitions: list[dict[str, Any]], session_id: str | None = None, user_id: str | None = None,
                  tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None,
                  resumes: tuple[str, str] | None = None) -> _NoRun:
        # Checked even here: a label a backend would drop should fail in tests, not once telemetry is switched on.
        checked("trace name", agent)
        run_labels(session_id=session_id, user_id=user_id, tags=tags, metadata=metadata)
        return _NoRun(agent, self.sinks)

    def flush(self, timeout_ms: int = 5_000) -> None:
        pass
