"""The guard as LangChain ``create_agent`` middleware (``pip install looptrace[langchain]``).

    agent = create_agent(model, tools, middleware=[LoopGuardMiddleware(on_anomaly={"cycle": "stop"})])

``wrap_tool_call`` sees every call and its ``ToolMessage`` (``status="error"`` is a failed call); ``after_model``
records the model's tokens and, when it answers without a tool call, asks whether it ignored an error;
``before_model`` judges the turn whose results the model is about to read, so a nudge reaches the model as a
``HumanMessage`` after those results and a stop jumps to the end of the graph with an ``AIMessage`` that says why,
the way LangChain's own call-limit middleware ends a run. Runs sharing a LangGraph ``thread_id`` share detector
memory. LangChain does not write OpenTelemetry spans itself: the guard records the run as looptrace's own spans.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware.types import AgentMiddleware, AgentState, PrivateStateAttr, hook_config
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.config import get_config

from looptrace.instrumentation import Usage

from .core import GuardedRun, LoopGuard, Reaction, RunRegistry

__all__ = ["LoopGuardMiddleware"]

_RUN_KEY = "looptrace_run"


class GuardState(AgentState[Any]):
    """The agent state plus the id of the guard's run, kept private to the middleware."""

    looptrace_run: NotRequired[Annotated[str | None, PrivateStateAttr]]


class LoopGuardMiddleware(AgentMiddleware[GuardState, Any, Any]):
    """looptrace's loop detector, policy and alerts inside a LangChain agent. Takes a `LoopGuard`, or its options."""

    state_schema = GuardState

    def __init__(self, guard: LoopGuard | None = None, **options: Any) -> None:
        super().__init__()
        self.guard = guard or LoopGuard(**options)
        self._runs = RunRegistry()

    # ---- the run

    def before_agent(self, state: GuardState, runtime: Any) -> dict[str, Any] | None:
        run = self.guard.start_run(_last_human_text(state), session_id=_thread_id())
        self._runs.add(run.id, run)
        return {_RUN_KEY: run.id}

    def after_agent(self, state: GuardState, runtime: Any) -> dict[str, Any] | None:
        run = self._runs.pop(state.get(_RUN_KEY))
        if run is not None:
            run.end()
        return None

    # ---- turns

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: GuardState, runtime: Any) -> dict[str, Any] | None:
        run = self._runs.get(state.get(_RUN_KEY))
        if run is None:
            return None
        reaction = run.end_turn()  # the results the model is about to read
        if reaction.stop is not None:
            return _stopping(reaction)
        run.start_turn()
        if reaction.nudge_text:
            return {"messages": [HumanMessage(reaction.nudge_text)]}
        return None

    @hook_config(can_jump_to=["model", "end"])
    def after_model(self, state: GuardState, runtime: Any) -> dict[str, Any] | None:
        run = self._runs.get(state.get(_RUN_KEY))
        message = state["messages"][-1] if state.get("messages") else None
        if run is None or not isinstance(message, AIMessage):
            return None
        text = message.text or None
        run.model_responded(usage=_usage(message), model=message.response_metadata.get("model_name"), text=text,
                            tool_calls=[(c.get("id") or "", c["name"], c.get("args")) for c in message.tool_calls],
                            response_id=message.id)
        if message.tool_calls:
            return None
        reaction = run.model_finished(text)
        if reaction.stop is not None:
            return _stopping(reaction)
        if reaction.nudge_text:  # an error the answer ignored: one more turn to deal with it
            return {"messages": [HumanMessage(reaction.nudge_text)], "jump_to": "model"}
        return None

    # ---- tool calls

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run = self._started(request)
        try:
            response = handler(request)
        except Exception as exc:
            _failed(run, request, exc)
            raise
        _finished(run, request, response)
        return response

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        run = self._started(request)
        try:
            response = await handler(request)
        except Exception as exc:
            _failed(run, request, exc)
            raise
        _finished(run, request, response)
        return response

    def _started(self, request: Any) -> GuardedRun | None:
        state = request.state if isinstance(request.state, dict) else {}
        run = self._runs.get(state.get(_RUN_KEY))
        if run is not None:
            call = request.tool_call
            run.tool_started(call.get("id") or "", call.get("name") or "", call.get("args"))
        return run


def _finished(run: GuardedRun | None, request: Any, response: Any) -> None:
    if run is None:
        return
    call_id = request.tool_call.get("id") or ""
    if isinstance(response, ToolMessage):
        run.tool_finished(call_id, response.content, is_error=response.status == "error")
    else:  # a Command: the tool changed the graph's state rather than answering
        run.tool_finished(call_id, "(command)")


def _failed(run: GuardedRun | None, request: Any, exc: Exception) -> None:
    if run is not None:
        run.tool_finished(request.tool_call.get("id") or "", f"{type(exc).__name__}: {exc}", is_error=True)


def _stopping(reaction: Reaction) -> dict[str, Any]:
    return {"jump_to": "end", "messages": [AIMessage(f"[looptrace loop detector] run stopped: {reaction.stop}")]}


def _usage(message: AIMessage) -> Usage:
    """LangChain's usage counts cache reads and writes inside input_tokens; looptrace counts them apart."""
    usage: Mapping[str, Any] = message.usage_metadata or {}
    details: Mapping[str, Any] = usage.get("input_token_details") or {}
    cache_read = int(details.get("cache_read") or 0)
    cache_creation = int(details.get("cache_creation") or 0)
    return Usage(input_tokens=max(int(usage.get("input_tokens") or 0) - cache_read - cache_creation, 0),
                 output_tokens=int(usage.get("output_tokens") or 0), cache_read_input_tokens=cache_read,
                 cache_creation_input_tokens=cache_creation)


def _last_human_text(state: GuardState) -> str:
    for message in reversed(state.get("messages") or []):
        if isinstance(message, HumanMessage):
            return message.text
    return ""


def _thread_id() -> str | None:
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # called outside a graph
        return None
    thread_id = configurable.get("thread_id")
    return str(thread_id) if thread_id is not None else None
