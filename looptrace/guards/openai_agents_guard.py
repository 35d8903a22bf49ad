"""The guard in the OpenAI Agents SDK, as run hooks and tool guardrails (``pip install looptrace[openai-agents]``).

    guard = OpenAIAgentsGuard(on_anomaly={"cycle": "stop"})
    agent = Agent(name="support", tools=guard.protect([lookup_order]))
    result = await Runner.run(agent, "Where is order 7?", hooks=guard)

The hooks (``on_llm_end``) see each model response: a turn, its tokens, the calls it asks for. Each protected tool
gets an input guardrail (the call starts) and an output guardrail (its result is back); when the last call of the
turn is back, the turn is judged there, before the model reads the results. A nudge rejects that output with the
result followed by the nudge's text (the model reads both); a stop trips the guardrail's wire, so ``Runner.run``
raises ``ToolOutputGuardrailTripwireTriggered`` whose ``output.output_info`` carries the anomaly. A tool failure the
SDK turns into text for the model is recognised through the tool's failure formatter, which the guard wraps.

The SDK's own tracing goes to OpenAI's trace processors, not OpenTelemetry: the guard records the run as
looptrace's spans. Runs are told apart by the run's usage object, which the SDK hands every hook and tool context.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from agents import RunHooks, ToolGuardrailFunctionOutput, ToolInputGuardrail, ToolOutputGuardrail
from agents.items import ModelResponse
from agents.tool import (
    FunctionTool,
    resolve_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from looptrace.instrumentation import Usage

from .core import LoopGuard, Reaction, RunRegistry

__all__ = ["OpenAIAgentsGuard"]

_NAME = "looptrace_loop_guard"


class OpenAIAgentsGuard(RunHooks[Any]):
    """looptrace's loop detector, policy and alerts in an Agents SDK run: pass it as ``hooks=`` and wrap the agent's
    tools with ``protect``. Takes a `LoopGuard`, or its options."""

    def __init__(self, guard: LoopGuard | None = None, **options: Any) -> None:
        self.guard = guard or LoopGuard(**options)
        self._runs = RunRegistry()
        self._protected: set[str] = set()
        self._expected: dict[int, set[str]] = {}  # run key -> the protected calls of the turn not back yet
        self._failed: set[str] = set()  # call ids whose result is the failure formatter's text
        self._input: ToolInputGuardrail[Any] = ToolInputGuardrail(self._call_started, name=_NAME)
        self._output: ToolOutputGuardrail[Any] = ToolOutputGuardrail(self._call_finished, name=_NAME)

    def protect(self, tools: Iterable[Any]) -> list[Any]:
        """``tools`` with the guard's input and output guardrails added to each function tool (in place)."""
        protected = list(tools)
        for tool in protected:
            if not isinstance(tool, FunctionTool):
                continue
            tool.tool_input_guardrails = [*(tool.tool_input_guardrails or []), self._input]
            tool.tool_output_guardrails = [*(tool.tool_output_guardrails or []), self._output]
            self._note_failures(tool)
            self._protected.add(tool.name)
        return protected

    # ---- run hooks

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        if self._runs.get(_key(context)) is None:  # a handoff continues the run
            self._runs.add(_key(context), self.guard.start_run(_task(context), model=_model_name(agent)))

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        run = self._runs.get(_key(context))
        if run is None:
            return
        calls = [(item.call_id, item.name, item.arguments) for item in response.output
                 if isinstance(item, ResponseFunctionToolCall)]
        text = "".join(part.text for item in response.output if isinstance(item, ResponseOutputMessage)
                       for part in item.content if isinstance(part, ResponseOutputText)) or None
        run.end_turn()  # a turn whose calls never all came back through the guardrails
        run.model_responded(usage=_usage(response), model=_model_name(agent), text=text, tool_calls=calls,
                            response_id=response.response_id)
        self._expected[_key(context)] = {call_id for call_id, name, _ in calls if name in self._protected}
        if not calls:
            # The final output: an ignored error is reported (a nudge has no turn left to reach the model in).
            run.model_finished(text)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        run = self._runs.pop(_key(context))
        self._expected.pop(_key(context), None)
        if run is not None:
            run.end()

    # ---- tool guardrails

    def _call_started(self, data: Any) -> ToolGuardrailFunctionOutput:
        run = self._runs.get(_key(data.context))
        if run is not None:
            run.tool_started(data.context.tool_call_id, data.context.tool_name, data.context.tool_arguments)
        return ToolGuardrailFunctionOutput.allow()

    def _call_finished(self, data: Any) -> ToolGuardrailFunctionOutput:
        key = _key(data.context)
        run = self._runs.get(key)
        call_id = data.context.tool_call_id
        if run is None:
            return ToolGuardrailFunctionOutput.allow()
        failed = call_id in self._failed
        self._failed.discard(call_id)
        run.tool_finished(call_id, data.output, is_error=failed)
        waiting = self._expected.get(key, set())
        waiting.discard(call_id)
        if waiting:
            return ToolGuardrailFunctionOutput.allow()
        reaction = run.end_turn()  # the last call of the turn is back: judge the turn before the model reads it
        if reaction.stop is not None:
            self._runs.pop(key)
            run.end()
            return ToolGuardrailFunctionOutput.raise_exception(output_info=_stop_info(reaction))
        if reaction.nudge_text:
            return ToolGuardrailFunctionOutput.reject_content(f"{_text(data.output)}\n\n{reaction.nudge_text}")
        return ToolGuardrailFunctionOutput.allow()

    def _note_failures(self, tool: FunctionTool) -> None:
        """Wrap the tool's failure formatter so that the guard knows which results are failures."""
        formatter = resolve_function_tool_failure_error_function(tool)
        if formatter is None or getattr(formatter, "_looptrace_guard", False):
            return
        failed = self._failed

        def noting_failure(context: Any, error: Exception) -> Any:
            call_id = getattr(context, "tool_call_id", None)
            if call_id:
                failed.add(call_id)
            return formatter(context, error)

        noting_failure._looptrace_guard = True  # type: ignore[attr-defined]
        set_function_tool_failure_error_function(tool, noting_failure)


def _key(context: Any) -> int:
    """The run a hook or guardrail belongs to: every context of one run shares its usage object."""
    return id(context.usage)


def _usage(response: ModelResponse) -> Usage:
    """The SDK counts cached input inside input_tokens; looptrace counts it apart."""
    usage = response.usage
    details = getattr(usage, "input_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0)
    return Usage(input_tokens=max(int(usage.input_tokens or 0) - cached, 0),
                 output_tokens=int(usage.output_tokens or 0), cache_read_input_tokens=cached)


def _task(context: Any) -> str:
    turn_input = getattr(context, "turn_input", None) or []
    for item in reversed(turn_input):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            return content if isinstance(content, str) else json.dumps(content, default=str)
    return ""


def _model_name(agent: Any) -> str | None:
    model = getattr(agent, "model", None)
    return model if isinstance(model, str) else getattr(model, "model", None)


def _text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, default=str)


def _stop_info(reaction: Reaction) -> dict[str, Any]:
    anomaly = next(a for a, action in reaction.reports if action == "stop")
    return {"looptrace": "stopped", "reason": reaction.stop, "anomaly": anomaly.to_dict()}

