"""Pausing and resuming a run: the paused run as data (``RunState``), and a resume's state and decisions checked
before anything runs.

A run pauses when a call waits for a person's decision (no approver in process) or when an anomaly's policy says
"ask". ``state_of`` turns it into a `RunState` that resumes it, here or in another process; ``accept`` checks a
resume (the state belongs to this agent, resumes once, and every pending call is decided) and claims the state, so
that of two resumes of one paused run only one runs. The resumed run itself is the loop's (``Agent._resume_loop``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looptrace.runtime.approvals import Decision
from looptrace.runtime.run import Run
from looptrace.runtime.state import RunState, StateError

__all__ = ["AgentIdentity", "Resumption", "accept", "state_of"]

StateSource = RunState | str | os.PathLike[str] | Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """What a state must match to be resumed by an agent: its name, model and tools."""

    name: str
    model: str
    tools: tuple[str, ...]  # sorted

    def describe(self) -> str:
        return f"agent {self.name!r} (model {self.model}, tools {', '.join(self.tools) or 'none'})"


@dataclass(slots=True)
class Resumption:
    state: RunState
    decisions: dict[str, Decision]
    go_on: bool | None
    message: str | None
    started: bool = False  # the resumed run began: from here on, however it ends, the state was used
    resumed_here: set[str] = field(default_factory=set)  # the agent's record of states it resumed

    def release(self) -> None:
        """A resume that failed before its run began (a required MCP server down, a damaged record) leaves the state
        resumable: the claim on it is taken back."""
        if not self.started:
            self.state.release()
            self.resumed_here.discard(self.state.state_id)


def state_of(run: Run, identity: AgentIdentity, session_id: str, version: str) -> RunState:
    """The paused run as data that resumes it, here or in another process."""
    labels, paused, usage, monitor = run.labels, run.paused, run.budget.usage, run.monitor
    return RunState(
        agent=identity.name, model=identity.model, tools=list(identity.tools), messages=run.messages,
        turns=run.budget.turns, usage={"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                                       "cache_read_input_tokens": usage.cache_read_input_tokens,
                                       "cache_creation_input_tokens": usage.cache_creation_input_tokens},
        cost_usd=run.budget.cost_usd, running_s=run.budget.running_s(), trace_id=monitor.trace.trace_id,
        span_id=monitor.trace.span_id, session_id=session_id, user_id=labels.user_id, tags=list(labels.tags),
        metadata=dict(labels.metadata) if labels.metadata is not None else None, final_text=run.final_text,
        stop_reason=run.stop_reason, pending=paused.pending if paused else [],
        settled=paused.settled if paused else {}, pending_anomaly=run.asked if paused is None else None,
        anomalies=[dict(a.to_dict()) for a in monitor.anomalies.values()], nudged=sorted(monitor.nudged),
        detector_feed=list(monitor.feed), looptrace_version=version,
    )


def accept(source: StateSource, identity: AgentIdentity, *, approve: Iterable[str],
           reject: Mapping[str, str] | None, go_on: bool | None, message: str | None,
           resumed_here: set[str], claims: Path | None = None) -> Resumption:
    """The state and decisions of a resume, checked before anything runs, and the state claimed; StateError says what
    does not fit. ``resumed_here`` is the agent's record of the states it resumed (each resumes once); ``claims`` the
    folder where a run's claim is held across processes and file names (``resume_claims``)."""
    state = _loaded(source, claims)
    if state.resumed or state.state_id in resumed_here:
        raise StateError(f"run state {state.state_id[:12]} was resumed already; a paused run resumes once")
    theirs = AgentIdentity(state.agent, state.model, tuple(sorted(state.tools)))
    if theirs != identity:
        raise StateError(f"this run state belongs to {theirs.describe()}, not to {identity.describe()}")
    approved, rejected = list(approve), dict(reject or {})
    _check_decisions(state, approved, rejected, go_on, message)
    state.claim(claims)
    resumed_here.add(state.state_id)
    decisions = {call_id: Decision(True) for call_id in approved}
    decisions.update({call_id: Decision(False, reason) for call_id, reason in rejected.items()})
    return Resumption(state, decisions, go_on, message, resumed_here=resumed_here)


def _loaded(source: StateSource, claims: Path | None) -> RunState:
    if isinstance(source, RunState):
        return source
    if isinstance(source, Mapping):
        return RunState.from_dict(source)
    if isinstance(source, (str, os.PathLike)):
        return RunState.load(source, claims=claims)
    raise TypeError(f"resume takes a RunState, a state file's path or its JSON data, not {type(source).__name__}")


def _check_decisions(state: RunState, approved: list[str], rejected: dict[str, str], go_on: bool | None,
                     message: str | None) -> None:
    pending = {p.call_id: p for p in state.pending}
    for call_id in [*approved, *rejected]:
        if call_id not in pending:
            raise StateError(f"call {call_id!r} is not pending in this run state (pending: "
                             f"{', '.join(pending) or 'none'})")
    both = set(approved) & set(rejected)
    if both:
        raise StateError(f"call {sorted(both)[0]!r} is both approved and rejected")
    undecided = [p for p in state.pending if p.call_id not in approved and p.call_id not in rejected]
    if undecided:
        raise StateError(f"call {undecided[0].call_id!r} ({undecided[0].tool}) waits for a decision: approve "
                         "or reject every pending call")
    if state.pending_anomaly is None and (go_on is not None or message is not None):
        raise StateError("no anomaly waits for a decision in this run state: go on / stop do not apply")
    if state.pending_anomaly is not None and go_on is None:
        raise StateError(f"the run waits for a decision on a {state.pending_anomaly.anomaly.type} anomaly: "
                         "go on (perhaps with a message for the model) or stop")
    if message is not None and not go_on:
        raise StateError("a message for the model goes with going on, not with stopping")
