"""What a span recorded of the conversation, as text a person reads: the GenAI conventions' message JSON (the
`gen_ai.input.messages` / `gen_ai.output.messages` shape: a list of messages, each a role and its parts) made plain,
and any value cut to a size a page can hold.

Only what the span holds is shown: a run recorded with content capture off has none of these attributes, and nothing
here makes any up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# A value longer than this is cut on the page (the rest is counted, not shown): a tool that returned a megabyte must
# not make the page a megabyte per call.
CONTENT_CHARS = 4_000


@dataclass(frozen=True, slots=True)
class Clipped:
    """A text as the page shows it: at most ``CONTENT_CHARS`` characters, and how many more there were."""

    text: str
    more: int = 0


def clipped(value: Any, limit: int = CONTENT_CHARS) -> Clipped | None:
    """``value`` as text (JSON text indented, so that arguments and results read as data), cut at ``limit``; None for
    no value."""
    if value is None:
        return None
    text = readable(value)
    if len(text) <= limit:
        return Clipped(text)
    return Clipped(text[:limit], len(text) - limit)


def readable(value: Any) -> str:
    """A recorded value as text: JSON (in a string or not) indented two spaces, anything else as it is."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] not in ("{", "["):
            return value
        try:
            value = json.loads(stripped)
        except ValueError:
            return value  # cut at the attribute size cap when recorded, or not JSON at all
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def answer_text(raw: Any) -> str | None:
    """The text parts of a `gen_ai.output.messages` value: what the model (or the run, on its root) answered."""
    messages = _messages(raw)
    if messages is None:
        return raw if isinstance(raw, str) and raw.strip() else None  # cut JSON: its text still reads
    texts = [str(part.get("content", "")) for message in messages for part in _parts(message)
             if part.get("type") == "text"]
    text = "\n".join(t for t in texts if t)
    return text or None


def conversation_text(raw: Any, system: Any = None) -> str | None:
    """A `gen_ai.input.messages` value (and `gen_ai.system_instructions`) as a transcript: one paragraph per message,
    led by its role; tool calls and results in one line each."""
    paragraphs = []
    instructions = _messages(system) if system is not None else None
    if instructions:  # a list of parts
        text = "\n".join(str(p.get("content", "")) for p in instructions if isinstance(p, dict))
        if text:
            paragraphs.append(f"system: {text}")
    messages = _messages(raw)
    if messages is None:
        return "\n\n".join([*paragraphs, raw]) if isinstance(raw, str) and raw else ("\n\n".join(paragraphs) or None)
    for message in messages:
        role = str(message.get("role", "?")) if isinstance(message, dict) else "?"
        lines = [_part_text(part) for part in _parts(message)]
        paragraphs.append(f"{role}: " + "\n".join(line for line in lines if line))
    return "\n\n".join(paragraphs) or None


def _part_text(part: dict[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return str(part.get("content", ""))
    if kind == "tool_call":
        arguments = part.get("arguments")
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, default=str)
        return f"[tool call {part.get('name', '?')}({shown})]"
    if kind == "tool_call_response":
        response = part.get("response")
        shown = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False, default=str)
        return f"[tool result{' (error)' if part.get('is_error') else ''}: {shown}]"
    return json.dumps(part, ensure_ascii=False, default=str)


def _messages(raw: Any) -> list[Any] | None:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, list) else None


def _parts(message: Any) -> list[dict[str, Any]]:
    parts = message.get("parts") if isinstance(message, dict) else None
    return [part for part in parts if isinstance(part, dict)] if isinstance(parts, list) else []
