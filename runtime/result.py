"""What a run returns: its status, its usage and everything needed to look at it again."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from looptrace.instrumentation.detector import Anomaly, JudgeSummary, LoopCost, UnresolvedToolError
from looptrace.instrumentation.interface import Usage

if TYPE_CHECKING:
    from looptrace.runtime.approvals import PendingCall
    from looptrace.runtime.state import RunState

__all__ = ["STATUS_FOR_STOP_REASON", "RunResult", "RunStatus", "UnresolvedToolError", "Usage"]


class RunStatus(enum.StrEnum):
    """How a run ended. Exactly one per run; the CLI maps each to its own exit code."""

    DONE = "done"  # the model ended its turn (end_turn); not proof the task succeeded
    MAX_TURNS = "max_turns"
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    TIMEOUT = "timeout"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    REFUSAL = "refusal"
    CONTEXT_WINDOW = "context_window"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    STOPPED_BY_DETECTOR = "stopped_by_detector"
    # The run's current loop burned more than Limits.max_loop_cost_usd: stopped whatever the policy said.
    LOOP_BUDGET = "loop_budget"
    # Paused: calls wait for a person's decision, or an anomaly whose policy says "ask" does (RunResult.state
    # resumes it with Agent.resume).
    AWAITING_APPROVAL = "awaiting_approval"


# Every stop_reason except the two that continue the loop (tool_use, pause_turn) ends the run with its own status.
STATUS_FOR_STOP_REASON: dict[str, RunStatus] = {
    "end_turn": RunStatus.DONE,
    "max_tokens": RunStatus.MAX_TOKENS,
    "stop_sequence": RunStatus.STOP_SEQUENCE,
    "refusal": RunStatus.REFUSAL,
    "model_context_window_exceeded": RunStatus.CONTEXT_WINDOW,
}


@dataclass(slots=True)
class RunResult:
    """What a run returns: how it ended, what it cost, what the model said last, and the trace to look it up by.

    ``messages`` is the whole history, valid to send again (``agent.run(result.messages + [...])`` continues the
    conversation); ``anomalies`` are the loop anomalies the detector reported, in order. ``unresolved_errors`` are
    the tool errors still standing when the run ended (no later success of the same tool on the same target): a fact
    recorded on every run, whatever the detector made of it (and with the detector off).
    """

    status: RunStatus
    turns: int
    final_text: str
    usage: Usage
    cost_usd: float | None
    trace_id: str  # 32 lower-case hex digits; all zeros when no tracer provider records spans
    messages: list[dict[str, Any]]
    anomalies: list[Anomaly] = field(default_factory=list)
    error: str | None = None  # "ExceptionType: message" when the status is error, timeout or interrupted
    stop_reason: str | None = None  # the last raw Anthropic stop_reason seen
    trace_url: str | None = None  # the trace in Langfuse's UI, when the run's spans go to Langfuse
    unresolved_errors: list[UnresolvedToolError] = field(default_factory=list)  # oldest tool first
    # The detector's judge in this run: calls, tokens, cost (never in usage or cost_usd), errors left unjudged.
    judge: JudgeSummary = field(default_factory=JudgeSummary)
    # A paused run (status awaiting_approval): the calls waiting for a decision, the anomaly that asks a person, and
    # the state that resumes it (Agent.resume); empty or None for a run that ended.
    pending: list[PendingCall] = field(default_factory=list)
    pending_anomaly: Anomaly | None = None
    state: RunState | None = None
    # What the turns of this run that belonged to a loop cost (each counted once), and the same over the session so
    # far (runs sharing a session_id); None without a loop, or with the detector off.
    loop_cost: LoopCost | None = None
    session_loop_cost: LoopCost | None = None

    @property
    def ok(self) -> bool:
        """Whether the model ended its turn (status ``done``): not proof the task succeeded."""
        return self.status is RunStatus.DONE

    @property
    def judge_calls(self) -> int:
        """Calls made to the detector's judge in this run (within its per-run cap)."""
        return self.judge.calls

    @property
    def judge_cost_usd(self) -> float | None:
        """What the judge's calls cost, apart from the run's ``cost_usd``; None when its model has no price."""
        return self.judge.cost_usd

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, as `looptrace run --json` prints it."""
        return {
            "status": self.status.value,
            "turns": self.turns,
            "final_text": self.final_text,
            "usage": asdict(self.usage) | {"total_tokens": self.usage.total_tokens},
            "cost_usd": self.cost_usd,
            "trace_id": self.trace_id,
            "trace_url": self.trace_url,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "anomalies": [a.to_dict() for a in self.anomalies],
            "loop_cost": None if self.loop_cost is None else self.loop_cost.to_dict(),
            "session_loop_cost": None if self.session_loop_cost is None else self.session_loop_cost.to_dict(),
            "unresolved_errors": [e.to_dict() for e in self.unresolved_errors],
            "judge": self.judge.to_dict(),
            "pending": [p.to_dict() for p in self.pending],
            "pending_anomaly": None if self.pending_anomaly is None else self.pending_anomaly.to_dict(),
            "messages": self.messages,
        }
