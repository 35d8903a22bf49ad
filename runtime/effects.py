"""What the loop's core asks its drivers to do, and how each is done, blocking (``perform_sync``) or in asyncio
(``perform_async``): a model call, a round of tool calls, the approval gate of a turn's calls.

The core (``agent.Agent._turns`` and what it calls) is a generator that yields these effects and receives their
outcomes; an effect that raises is sent back in as `Raised`, for the core to decide what it means for the run.
Everything here is I/O and waiting; no rule about the run lives here.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from looptrace.instrumentation.interface import Answer, AnsweringModel, TurnTrace, log
from looptrace.runtime import approvals, tool_threads
from looptrace.runtime import tools as toolkit
from looptrace.runtime.approvals import ApprovalRequest, Approver, Decision
from looptrace.runtime.limits import Budget
from looptrace.runtime.models import Model, aprepare_model, prepare_model, streamed_text_to
from looptrace.runtime.tool_calls import ToolCallRun

__all__ = ["Effect", "Gate", "GateAnswer", "ModelCall", "Outcome", "PrepareModel", "Raised", "ToolRound"]

GateAnswer = tuple[bool, Decision | None, float]  # (approval needed, the decision or None, seconds waited)


@dataclass(slots=True)
class Raised:
    """An effect that raised; sent into the core instead of a value."""

    exc: BaseException


Outcome: TypeAlias = "Answer | list[GateAnswer] | Raised | None"
"""What the core is sent back for the effect it yielded: a ModelCall's Answer, a Gate's answer per call, None for
the others, or Raised."""


class Effect:
    def perform_sync(self) -> object:
        raise NotImplementedError

    async def perform_async(self) -> object:
        raise NotImplementedError


@dataclass(slots=True)
class PrepareModel(Effect):
    """The model's set-up (an AnthropicModel builds its client, importing the SDK), once a run has started and before
    its first turn: counted on the run, not on the first model call, and waited for no longer than the run's time."""

    model: Model
    timeout_s: float | None

    def perform_sync(self) -> None:
        prepare_model(self.model, timeout_s=self.timeout_s)

    async def perform_async(self) -> None:
        await aprepare_model(self.model, timeout_s=self.timeout_s)


@dataclass(slots=True)
class ModelCall(Effect):
    """The turn's model call, made with the turn current so that the instrumented model opens its chat span there;
    a streaming call hands its text to ``on_text`` as it arrives. Answers the response with its usage and cost
    (``interface.Answer``)."""

    model: AnsweringModel
    params: dict[str, Any]
    turn: TurnTrace
    timeout_s: float | None
    on_text: Callable[[str], None] | None = None

    def perform_sync(self) -> Answer:
        with self.turn.activate(), streamed_text_to(self.on_text):
            return self.model.answer(self.params, timeout=self.timeout_s)

    async def perform_async(self) -> Answer:
        with self.turn.activate(), streamed_text_to(self.on_text):
            return await self.model.aanswer(self.params, timeout=self.timeout_s)


@dataclass(slots=True)
class ToolRound(Effect):
    """A turn's runnable calls: one after another blocking, concurrently in asyncio; each within the run's clock."""

    calls: list[ToolCallRun]
    budget: Budget

    def perform_sync(self) -> None:
        for call in self.calls:
            if call.runnable:
                with call.trace.activate():
                    _timed(call, functools.partial(tool_threads.run_sync, *call.invocation(),
                                                   self.budget.tool_timeout_s()))

    async def perform_async(self) -> None:
        async def one(call: ToolCallRun) -> None:
            started = time.perf_counter()
            with call.trace.activate():
                try:
                    call.value = await tool_threads.run_async(*call.invocation(), self.budget.tool_timeout_s())
                except (KeyboardInterrupt, asyncio.CancelledError):
                    raise
                except BaseException as exc:
                    call.error = exc
            call.duration_s = time.perf_counter() - started

        await asyncio.gather(*(one(call) for call in self.calls if call.runnable))


@dataclass(slots=True)
class Gate(Effect):
    """Whether each call needs approval (its tool's predicate, perhaps async) and, with an approver, its decision.
    Answers a `GateAnswer` per call."""

    calls: list[ToolCallRun]
    requests: list[ApprovalRequest]
    approver: Approver | None

    def perform_sync(self) -> list[GateAnswer]:
        answers: list[GateAnswer] = []
        for call, request in zip(self.calls, self.requests, strict=True):
            needed = _needs_approval(call, approvals.resolve_sync)
            if not needed or self.approver is None:
                answers.append((needed, None, 0.0))
                continue
            started = time.perf_counter()
            try:
                decision = approvals.as_decision(approvals.resolve_sync(self.approver(request)))
            except Exception as exc:  # an approver's bug rejects the call: a call nobody approved does not run
                decision = _approver_failed(call, exc)
            answers.append((True, decision, time.perf_counter() - started))
        return answers

    async def perform_async(self) -> list[GateAnswer]:
        answers: list[GateAnswer] = []
        for call, request in zip(self.calls, self.requests, strict=True):
            needed = await _needs_approval_async(call)
            if not needed or self.approver is None:
                answers.append((needed, None, 0.0))
                continue
            started = time.perf_counter()
            try:
                decision = approvals.as_decision(await approvals.resolve_async(self.approver(request)))
            except Exception as exc:
                decision = _approver_failed(call, exc)
            answers.append((True, decision, time.perf_counter() - started))
        return answers


def _needs_approval(call: ToolCallRun, resolve: Callable[[bool | Awaitable[bool]], object]) -> bool:
    """The tool's answer for this call; a predicate that fails holds the call for a decision (fail closed)."""
    rule = call.tool.needs_approval if call.tool is not None else False
    if isinstance(rule, bool):
        return rule
    try:
        return bool(resolve(rule(call.kwargs or {})))
    except Exception as exc:
        return _predicate_failed(call, exc)


async def _needs_approval_async(call: ToolCallRun) -> bool:
    rule = call.tool.needs_approval if call.tool is not None else False
    if isinstance(rule, bool):
        return rule
    try:
        return bool(await approvals.resolve_async(rule(call.kwargs or {})))
    except Exception as exc:
        return _predicate_failed(call, exc)


def _predicate_failed(call: ToolCallRun, exc: Exception) -> bool:
    log.warning("approval_predicate_failed", tool=call.name, call_id=call.call_id, error=toolkit.error_text(exc),
                hint="the call waits for a decision, as if the predicate had said it needs one")
    return True


def _approver_failed(call: ToolCallRun, exc: Exception) -> Decision:
    text = toolkit.error_text(exc)
    log.warning("approver_failed", call_id=call.call_id, error=text,
                hint="the call was rejected: a call nobody approved does not run")
    return Decision(False, f"the approver failed ({text})")


def _timed(call: ToolCallRun, work: Callable[[], object]) -> None:
    started = time.perf_counter()
    try:
        call.value = work()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        call.error = exc
    call.duration_s = time.perf_counter() - started
