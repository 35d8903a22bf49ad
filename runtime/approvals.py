"""A person in the loop: which calls wait for a decision, what the decision is, and who made it.

A tool says whether a call needs approval (``Tool.needs_approval``: True, or a predicate over the validated
arguments). An ``approver`` given to the Agent decides in process; without one the run pauses and the calls wait on
the result (``RunResult.pending``) until ``Agent.resume`` brings the decisions.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from looptrace.runtime.tools import ToolError

if TYPE_CHECKING:
    from looptrace.runtime.tools import Tool

BY_APPROVER: Final = "approver"  # Agent(approver=...) decided, in process
BY_PERSON: Final = "person"  # a person decided on resume (Agent.resume, `looptrace resume`)
DecidedBy = Literal["approver", "person"]


@dataclass(frozen=True, slots=True)
class Decision:
    """Approve a call, or reject it with the reason the model is told (so that it can change course)."""

    approved: bool
    reason: str | None = None


def approve() -> Decision:
    """Let the call run."""
    return Decision(True)


def reject(reason: str) -> Decision:
    """Do not run the call; the model gets an is_error tool_result carrying ``reason``."""
    return Decision(False, reason)


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A call waiting for an approver's decision: the tool, the arguments the model sent, and where it stands."""

    tool: Tool
    arguments: dict[str, Any]  # as the model sent them (the approver runs in process, as the tool itself does)
    call_id: str
    turn: int
    agent: str
    trace_id: str  # the run's trace
    session_id: str | None


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call a paused run holds until a person decides (``RunResult.pending``). Plain JSON data: ``arguments`` are
    redacted as on the spans, since it is shown on terminals and written into state files."""

    call_id: str
    tool: str
    arguments: Any
    turn: int

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "tool": self.tool, "arguments": self.arguments, "turn": self.turn}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingCall:
        return cls(call_id=str(data["call_id"]), tool=str(data["tool"]), arguments=data.get("arguments"),
                   turn=int(data["turn"]))


Approver = Callable[[ApprovalRequest], "Decision | bool | Awaitable[Decision | bool | None] | None"]
"""Decides a call in process: approve(), reject(reason) (or True/False), or None to leave it to a person: the run
pauses with the call pending, as it does with no approver."""


class Rejected(ToolError):
    """The call was not run: its approver or a person rejected it. The model reads the reason."""

    kind = "rejected"

    def __init__(self, tool: str, reason: str | None, by: DecidedBy) -> None:
        who = "a person" if by == BY_PERSON else "the approver"
        super().__init__(f"{tool} was not run: {who} rejected this call" + (f": {reason}" if reason else ""))
        self.reason = reason
        self.by = by


def as_decision(answer: object) -> Decision | None:
    """An approver's answer as a Decision: a Decision as it is, True/False as approve/reject, None as "a person
    decides later". Anything else is a bug in the approver, said as such."""
    if answer is None or isinstance(answer, Decision):
        return answer
    if isinstance(answer, bool):
        return approve() if answer else reject("rejected")
    raise TypeError(f"an approver must return approve(), reject(reason) or a bool, got {type(answer).__name__}")


def resolve_sync(value: Any) -> Any:
    """A predicate's or approver's answer from synchronous code: awaited on a private event loop when it is
    awaitable (an async predicate under ``Agent.run``)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    return asyncio.run(wait())


async def resolve_async(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
