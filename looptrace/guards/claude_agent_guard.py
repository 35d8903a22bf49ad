"""The guard in the Claude Agent SDK, as hooks (``pip install looptrace[claude-agent-sdk]``).

    guard = ClaudeAgentGuard(on_anomaly={"cycle": "stop"})
    options = ClaudeAgentOptions(hooks=guard.hooks)
    async for message in query(prompt="Fix the failing test", options=options):
        guard.record(message)  # optional: each model call's tokens, for the loop's cost

``PreToolUse`` and ``PostToolUse`` / ``PostToolUseFailure`` see every call and its result. The hooks are not told
where one model response ends, so a turn is a batch of calls that overlap in time: when the last call in flight is
back, the turn is judged in that ``PostToolUse``, before the model reads the results. A nudge is that hook's
``additionalContext`` (the model reads it with the result, where looptrace's own Agent puts it); a stop is
``continue: false`` with the anomaly as ``stopReason``, and any call the model still makes in the run is denied in
``PreToolUse`` with the same reason. At ``Stop`` the guard asks whether the answer ignored an error; a nudge there
blocks the stop with the nudge as the reason, which is how a Stop hook asks Claude to keep going.

Each Claude Code session is a session of the detector: a call that keeps failing across prompts is still caught.
Claude Code's own telemetry is exported by the CLI process, not in this one: the guard records looptrace's spans.
"""

from __future__ import annotations

from typing import Any

from claude_agent_sdk import HookMatcher
from claude_agent_sdk.types import AssistantMessage, HookContext, HookEvent, HookJSONOutput, TextBlock, ToolUseBlock

from looptrace.instrumentation import Usage

from .core import GuardedRun, LoopGuard, RunRegistry

__all__ = ["ClaudeAgentGuard"]

_NOTHING: HookJSONOutput = {}


class ClaudeAgentGuard:
    """looptrace's loop detector, policy and alerts in a Claude Agent SDK session: ``ClaudeAgentOptions(hooks=
    guard.hooks)``. Takes a `LoopGuard`, or its options."""

    def __init__(self, guard: LoopGuard | None = None, **options: Any) -> None:
        self.guard = guard or LoopGuard(**options)
        self._runs = RunRegistry()
        self._counted: dict[str, str] = {}  # run id -> the id of the latest response counted

    @property
    def hooks(self) -> dict[HookEvent, list[HookMatcher]]:
        """The hooks to pass as ``ClaudeAgentOptions(hooks=...)`` (merge them with your own per event)."""
        return {
            "UserPromptSubmit": [HookMatcher(hooks=[self.prompt_submitted])],
            "PreToolUse": [HookMatcher(hooks=[self.pre_tool_use])],
            "PostToolUse": [HookMatcher(hooks=[self.post_tool_use])],
            "PostToolUseFailure": [HookMatcher(hooks=[self.post_tool_use])],
            "Stop": [HookMatcher(hooks=[self.stop])],
        }

    def record(self, message: Any) -> None:
        """A message from the ``query`` stream: an assistant message is a model call's answer, whose tokens count
        towards its run's cost in the turn it opens. Claude Code sends a response's blocks as messages of their own,
        each with the response's usage: a response is counted once, by its message id."""
        if not isinstance(message, AssistantMessage) or not message.usage or message.session_id is None:
            return
        run = self._runs.get(message.session_id)
        if run is None or (message.message_id is not None and message.message_id == self._counted.get(run.id)):
            return
        if message.message_id is not None:
            self._counted[run.id] = message.message_id
        usage = Usage.from_response({"usage": message.usage})
        if run.in_turn:  # the turn's calls started before the stream said whose answer they were
            run.add_model_call(usage, message.model)
        else:
            run.model_responded(usage=usage, model=message.model, text=_text_of(message) or None,
                                tool_calls=_tool_uses_of(message), response_id=message.message_id)

    # ---- the hook callables (HookCallback: input, tool_use_id, context)

    async def prompt_submitted(self, data: Any, tool_use_id: str | None, context: HookContext) -> HookJSONOutput:
        previous = self._runs.pop(data["session_id"])
        if previous is not None:
            self._counted.pop(previous.id, None)
            previous.end()
        self._run_of(data, task=data.get("prompt") or "")
        return _NOTHING

    async def pre_tool_use(self, data: Any, tool_use_id: str | None, context: HookContext) -> HookJSONOutput:
        run = self._run_of(data)
        if run.stopped is not None:  # the session went on after the guard stopped it: no more calls
            reason = _stop_text(run.stopped)
            return {"continue_": False, "stopReason": reason,
                    "hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                           "permissionDecisionReason": reason}}
        run.tool_started(data.get("tool_use_id") or tool_use_id or "", data["tool_name"], data.get("tool_input"))
        return _NOTHING

    async def post_tool_use(self, data: Any, tool_use_id: str | None, context: HookContext) -> HookJSONOutput:
        run = self._run_of(data)
        call_id = data.get("tool_use_id") or tool_use_id or ""
        event = data["hook_event_name"]
        if event == "PostToolUseFailure":
            run.tool_finished(call_id, data.get("error") or "", is_error=True)
        else:
            run.tool_finished(call_id, data.get("tool_response"), is_error=_is_error(data.get("tool_response")))
        if run.pending:
            return _NOTHING
        reaction = run.end_turn()
        if reaction.stop is not None:
            return {"continue_": False, "stopReason": _stop_text(reaction.stop)}
        if reaction.nudge_text:
            return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": reaction.nudge_text}}
        return _NOTHING

    async def stop(self, data: Any, tool_use_id: str | None, context: HookContext) -> HookJSONOutput:
        run = self._runs.get(data["session_id"])
        if run is None:
            return _NOTHING
        reaction = run.model_finished(data.get("last_assistant_message"))
        if reaction.nudge_text and not data.get("stop_hook_active"):
            return {"decision": "block", "reason": reaction.nudge_text}
        self._runs.pop(data["session_id"])
        self._counted.pop(run.id, None)
        run.end()
        return _NOTHING

    def _run_of(self, data: Any, task: str = "") -> GuardedRun:
        session = data["session_id"]
        run = self._runs.get(session)
        if run is None:  # a session whose prompt the hooks did not see: the run starts at its first call
            run = self._runs.add(session, self.guard.start_run(task, session_id=session))
        return run


def _text_of(message: AssistantMessage) -> str:
    return "".join(block.text for block in message.content if isinstance(block, TextBlock))


def _tool_uses_of(message: AssistantMessage) -> list[tuple[str, str, Any]]:
    return [(block.id, block.name, block.input) for block in message.content if isinstance(block, ToolUseBlock)]


def _is_error(response: Any) -> bool:
    """An MCP tool's result says so itself (``isError``); built-in tools' failures arrive as PostToolUseFailure."""
    return isinstance(response, dict) and bool(response.get("isError") or response.get("is_error"))


def _stop_text(reason: str) -> str:
    return f"[looptrace loop detector] run stopped: {reason}"

