"""What the agent loop needs of telemetry, and nothing more: the one door between runtime/ and instrumentation/.

The loop records a run through three traces (``RunTrace`` > ``TurnTrace`` > ``ToolTrace``) and reports each anomaly
once, with the action its policy took (``TurnTrace.report``); where a report goes (span events, the metric, the log
line, the webhook, the Langfuse score) was assembled by whoever built the telemetry, never by the loop. Model calls
are not the loop's business at all: ``AgentTelemetry.instrument`` wraps the loop's model, and the wrapper opens the
chat spans (and the judge's) under whichever turn is current while it runs.

``runtime/`` imports this module, the detector's public types and one factory (``agent_telemetry``, which builds an
Agent's telemetry where the Agent is built), nothing else of instrumentation (a structure test holds it to that), so
this module also carries the few plain types both sides speak: ``Usage`` (with the one parser of a response's
usage), ``Action`` (what a policy did about an anomaly), the ``Alerts`` an Agent may be given, the ``Settings`` it
reads its judge from, the redaction of tool arguments and the log the loop writes to. It defines protocols only: the
implementations (``spans.Tracing``, ``no_tracing.NoTracing``) are the factory's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .alerts import Alerts
from .detector import Anomaly, LoopCost, UnresolvedToolError
from .logs import log
from .recording.content import redact
from .recording.instrumented_model import Answer, ModelLike, report_first_chunk
from .recording.prices import DEFAULT_PRICES, Price, price_for, usd_for_tokens
from .recording.sinks import ACTIONS, Action, TraceLinks
from .recording.tool_call import ToolCallView
from .recording.usage import CostOf, Usage
from .settings import Settings

__all__ = [
    "ACTIONS",
    "DEFAULT_PRICES",
    "Action",
    "AgentTelemetry",
    "Alerts",
    "Anomaly",
    "Answer",
    "AnsweringModel",
    "CostOf",
    "ModelLike",
    "Price",
    "RunTrace",
    "Settings",
    "ToolCallView",
    "ToolTrace",
    "TraceLinks",
    "TurnTrace",
    "Usage",
    "log",
    "price_for",
    "redact",
    "report_first_chunk",
    "usd_for_tokens",
]

class ToolTrace(Protocol):
    """One tool call, recorded from its ``view`` (``ToolCallView``): the loop made the view, redacted, canonicalised
    and, once the call came back, settled; the trace reads it and hands nothing back."""

    @property
    def view(self) -> ToolCallView: ...

    def activate(self) -> AbstractContextManager[object]:
        """Current while the tool runs, so a tool's own spans nest under it."""
        ...

    def end(self) -> None:
        """The call's view is settled (``ToolCallView.settle``): record its result and how it ended."""
        ...

    def approval(self, *, decision: str, by: str | None = None, reason: str | None = None,
                 wait_s: float | None = None) -> None:
        """The call needed approval: ``decision`` is pending (the run pauses before it runs), approved or rejected;
        ``by`` the approver or a person; ``reason`` a rejection's (content: recorded only with capture on);
        ``wait_s`` how long it waited for the decision. Called before ``end``."""
        ...


class TurnTrace(Protocol):
    """One loop iteration: a model call and the tool calls it asked for."""

    def activate(self) -> AbstractContextManager[object]:
        """Current while the turn's model call runs: the instrumented model opens its chat span under it."""
        ...

    def start_tool(self, view: ToolCallView, *, description: str | None) -> ToolTrace:
        """The trace of one tool call of this turn, from the view the loop made of it."""
        ...

    def report(self, anomaly: Anomaly, action: Action, tool_calls: Sequence[ToolTrace]) -> None:
        """The detector flagged ``anomaly`` in this turn, involving ``tool_calls``, and the policy took ``action``:
        the one report of it, which reaches every sink the telemetry was built with."""
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

    def end(self, *, status: str, turns: int, usage: Usage, cost_usd: float | None, anomalies: int,
            final_text: str | None, error: str | None = None, error_type: str | None = None,
            unresolved_errors: Sequence[UnresolvedToolError] = (), session_id: str | None = None,
            loop_cost: LoopCost | None = None, session_loop_cost: LoopCost | None = None,
            loop_cost_by_type: Mapping[str, LoopCost] | None = None) -> None:
        """``session_id``: the session a run that had none joins as it ends (a paused run: the run that resumes it
        continues in that session). ``loop_cost``, ``session_loop_cost``: what the turns that belonged to a loop
        cost in this run and in its session so far; ``loop_cost_by_type`` splits the run's by anomaly type (the
        loop cost metric)."""
        ...


class AnsweringModel(ModelLike, Protocol):
    """A model as telemetry hands it back (``AgentTelemetry.instrument``): each call answered with its usage and cost,
    worked out once for the chat span and the loop's budget alike."""

    def answer(self, params: dict[str, Any], *, timeout: float | None) -> Answer: ...

    async def aanswer(self, params: dict[str, Any], *, timeout: float | None) -> Answer: ...


class AgentTelemetry(Protocol):
    """An agent's telemetry: wraps its model, starts the trace of each run."""

    captures_content: bool
    """Whether content (arguments, messages, results) may leave the process: anomaly messages are written to match."""

    settings: Settings
    """The settings the telemetry was built from (the Agent's, or the environment's read once): the Agent takes its
    detector's judge and cap from them too."""

    def instrument(self, model: ModelLike, *, cost_of: CostOf | None = None, judge: bool = False) -> AnsweringModel:
        """``model`` with its calls traced: a chat span per call, under the current turn. ``judge`` marks the calls
        of the detector's judge, whose tokens are not the run's."""
        ...

    def start_run(self, *, agent: str, model: str, task: str | list[dict[str, Any]], system: str | None,
                  tool_definitions: list[dict[str, Any]], session_id: str | None = None, user_id: str | None = None,
                  tags: Iterable[str] = (), metadata: Mapping[str, Any] | None = None,
                  resumes: tuple[str, str] | None = None) -> RunTrace:
        """``resumes``: the (trace id, root span id) of the paused run this run resumes, which its root links to."""
        ...

    def flush(self, timeout_ms: int = 5_000) -> None:
        """Best effort: push out what is buffered (on the way out of an interrupted run)."""
        ...
