"""The conversation as the Messages API holds it: what the loop reads out of a response and adds to the history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from looptrace.runtime.tool_calls import tool_use_blocks

__all__ = ["add_user_text", "not_run", "nudges", "text_of", "tool_calls_of"]


def text_of(content: list[Any]) -> str:
    """The text of a response's content, its text blocks joined."""
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def tool_calls_of(content: list[Any]) -> tuple[tuple[str, Any], ...]:
    """(name, arguments) of each tool call a response asks for, in order."""
    return tuple((b.get("name", ""), b.get("input")) for b in tool_use_blocks(content))


def not_run(content: list[Any], limit: str, *, why: str | None = None) -> list[dict[str, Any]]:
    """is_error results for tool calls the run stopped before making, so the history stays valid to continue."""
    text = f"(not run: {why or f'the run stopped on its {limit} limit'})"
    return [{"type": "tool_result", "tool_use_id": block.get("id", ""), "is_error": True, "content": text}
            for block in tool_use_blocks(content)]


def nudges(texts: Sequence[str]) -> list[dict[str, Any]]:
    """The user message that carries the detector's nudges to the model (none without any)."""
    return [{"role": "user", "content": [{"type": "text", "text": text} for text in texts]}] if texts else []


def add_user_text(history: list[dict[str, Any]], text: str) -> None:
    """A person's message for the model, after the last user turn (or as a new one)."""
    block = {"type": "text", "text": text}
    last = history[-1] if history else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), list):
        history[-1] = {**last, "content": [*last["content"], block]}
    else:
        history.append({"role": "user", "content": [block]})
