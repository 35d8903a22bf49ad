"""The tool calls of one turn, from the model's ``tool_use`` blocks to the ``tool_result`` blocks it reads next.

Each block becomes a `ToolCallRun`: the loop's one view of the call (``ToolCallView``: redacted and canonicalised as
it is made), its trace, and what running it needs (the tool, the validated arguments) and gives (a value or an
error). A call that cannot run (an unknown tool, arguments that fail the tool's schema) carries its error from the
start; ``settle`` turns whatever happened into the result the model reads, and settles the view once, for every
reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from looptrace.instrumentation.interface import ToolCallView, ToolTrace
from looptrace.runtime import approvals
from looptrace.runtime import tools as toolkit
from looptrace.runtime.monitor import RunMonitor

__all__ = ["ToolCallRun", "plan_calls", "tool_use_blocks", "truncate_result"]


@dataclass(slots=True)
class ToolCallRun:
    """One tool call of a turn, as the loop runs it."""

    view: ToolCallView
    trace: ToolTrace
    tool: toolkit.Tool | None
    arguments: Any  # as the model sent them: what the tool and an in-process approver get
    kwargs: dict[str, Any] | None = None  # validated
    value: Any = None
    error: BaseException | None = None
    duration_s: float = 0.0
    waiting: bool = False  # needs a decision no approver gave: the run pauses before it runs

    @property
    def call_id(self) -> str:
        return self.view.call_id

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def runnable(self) -> bool:
        return self.error is None and self.tool is not None

    def invocation(self) -> tuple[toolkit.Tool, dict[str, Any]]:
        """The tool and its validated arguments, for a runnable call."""
        assert self.tool is not None, "only runnable calls are invoked"
        return self.tool, self.kwargs or {}

    def settle(self, max_result_chars: int) -> dict[str, Any]:
        """The tool_result block the model reads; the view is settled with the same result (scrubbed there)."""
        result, outcome, error_type = "", "ok", None
        if self.error is None:
            try:
                result = toolkit.result_text(self.value)
            except toolkit.UnreadableResult as exc:
                self.error = exc
        is_error = self.error is not None
        if self.error is not None:
            result = toolkit.error_text(self.error)
            outcome = self.error.kind if isinstance(self.error, toolkit.ToolError) else "error"
            original = getattr(self.error, "original", self.error)
            error_type = type(original).__qualname__ if outcome == "error" else None
        full_length = len(result)
        result = truncate_result(result, max_result_chars)
        self.view.settle(result, is_error=is_error, outcome=outcome, error_type=error_type,
                         failed=is_error and outcome != approvals.Rejected.kind, duration_s=self.duration_s,
                         full_length=full_length)
        content: str | list[dict[str, Any]] = result
        if not is_error and isinstance(self.value, toolkit.ContentBlocks):  # images and documents go as blocks
            content = self.value.message_content(max_result_chars, truncate_result)
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": self.call_id, "content": content}
        if is_error:
            block["is_error"] = True
        return block

    def decided(self, decision: approvals.Decision, by: approvals.DecidedBy, waited_s: float) -> None:
        """A person's or the approver's decision on this call, before it runs: recorded, and a rejection becomes the
        error the model is told (with the reason)."""
        self.trace.approval(decision="approved" if decision.approved else "rejected", by=by, reason=decision.reason,
                            wait_s=waited_s)
        if not decision.approved:
            self.error = approvals.Rejected(self.name, decision.reason, by)

    def interrupted(self) -> None:
        """Ctrl-C or a cancellation reached the call: its trace ends as interrupted."""
        self.view.settle("(interrupted)", is_error=True, outcome="interrupted", duration_s=self.duration_s)
        self.trace.end()


def tool_use_blocks(content: list[Any]) -> list[dict[str, Any]]:
    """The ``tool_use`` blocks of a response's content, in order."""
    return [block for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]


def plan_calls(monitor: RunMonitor, blocks: list[dict[str, Any]],
               tools: Mapping[str, toolkit.Tool]) -> list[ToolCallRun]:
    """A call per block, each with its trace started; validated against its tool's schema."""
    calls = []
    for block in blocks:
        name, arguments = block.get("name") or "", block.get("input")
        view = ToolCallView(block.get("id") or "", name, arguments)
        tool = tools.get(name)
        trace = monitor.start_call(view, description=tool.description if tool else None)
        call = ToolCallRun(view, trace, tool, arguments)
        if tool is None:
            known = ", ".join(sorted(tools)) or "none"
            call.error = toolkit.UnknownTool(f"unknown tool {name!r}; the tools available are: {known}")
        else:
            try:
                call.kwargs = tool.validate(arguments)
            except toolkit.InvalidArguments as exc:
                call.error = exc
        calls.append(call)
    return calls


def truncate_result(text: str, limit: int) -> str:
    """A result cut to ``limit`` characters, saying so and how to ask for less."""
    if len(text) <= limit:
        return text
    return (f"{text[:limit]}\n[looptrace: the result was {len(text):,} characters; only the first {limit:,} are "
            f"shown. Ask for less, e.g. a narrower query or a page of the result.]")
