"""What a looptrace run's root span says about the whole run, read back for the backends' mappings at export.

A run's spans carry the GenAI conventions and looptrace.* once: the agent and the session on every span, the rest on
the root alone (the user, tags and metadata; the task, the system instructions, the tool definitions). A backend that
wants some of it on every span (Langfuse reads its trace attributes per observation, and a generation's tools from
the generation) gets it there from its mapping, which reads it here: from the root as it started (a processor sees
that before any child) or as it was stored (``traces push`` reads it from the trace file).

Also the kind of each of looptrace's spans, and the texts a mapping shows (the task, the final answer, the system
prompt), read from the content attributes. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..recording import semconv as sc

__all__ = ["RunFacts", "SpanKind", "answer_text", "span_kind", "task_text"]

SpanKind = Literal["agent", "turn", "chat", "tool", "judge"]


def span_kind(attributes: Mapping[str, Any]) -> SpanKind | None:
    """Which of looptrace's spans ``attributes`` belong to (the caller checks the span is looptrace's)."""
    operation = attributes.get(sc.GEN_AI_OPERATION_NAME)
    if operation == sc.OPERATION_CHAT:
        return "judge" if attributes.get(sc.JUDGE) else "chat"
    if operation == sc.OPERATION_EXECUTE_TOOL:
        return "tool"
    if operation == sc.OPERATION_INVOKE_AGENT:
        return "agent"
    if sc.TURN_INDEX in attributes:
        return "turn"
    return None


@dataclass(frozen=True, slots=True)
class RunFacts:
    """One run, as its root span records it: what every span of the run may be shown with."""

    agent: str
    user_id: str | None = None
    tags: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()  # (key, value as text), in the root's order
    system_instructions: str | None = None  # gen_ai.system_instructions, as recorded (JSON text)
    tool_definitions: str | None = None  # gen_ai.tool.definitions, as recorded (JSON text)
    system_prompt: str | None = None  # the system instructions' text
    joins_outer_trace: bool = False  # the root has a parent that is not looptrace's (another process's, the app's)

    @classmethod
    def of_root(cls, attributes: Mapping[str, Any], *, joins_outer_trace: bool = False) -> RunFacts:
        """The facts of the run whose root span has ``attributes`` (at its start or its end)."""
        tags = attributes.get(sc.RUN_TAGS) or ()
        prefix = sc.RUN_METADATA_PREFIX
        instructions = _text_or_none(attributes.get(sc.GEN_AI_SYSTEM_INSTRUCTIONS))
        return cls(
            agent=str(attributes.get(sc.GEN_AI_AGENT_NAME) or ""),
            user_id=_text_or_none(attributes.get(sc.USER_ID)),
            tags=tuple(str(tag) for tag in tags) if isinstance(tags, (list, tuple)) else (str(tags),),
            metadata=tuple((key[len(prefix):], str(value)) for key, value in attributes.items()
                           if key.startswith(prefix)),
            system_instructions=instructions,
            tool_definitions=_text_or_none(attributes.get(sc.GEN_AI_TOOL_DEFINITIONS)),
            system_prompt=_parts_text(instructions),
            joins_outer_trace=joins_outer_trace,
        )


def task_text(attributes: Mapping[str, Any]) -> str | None:
    """The text of the newest user message of a root's input messages: what a person calls the task of a continued
    conversation ("" when that message holds no text, only tool results). None without recorded input; the recorded
    JSON itself when it cannot be read (a single message cut at the size cap)."""
    raw = attributes.get(sc.GEN_AI_INPUT_MESSAGES)
    if not isinstance(raw, str):
        return None
    messages = _json(raw)
    if not isinstance(messages, list):
        return raw
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _parts_of(message.get("parts"))
    return ""


def answer_text(attributes: Mapping[str, Any]) -> str | None:
    """The final answer a root's output messages hold, as text; None without one."""
    raw = attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
    if not isinstance(raw, str):
        return None
    messages = _json(raw)
    if not isinstance(messages, list):
        return raw
    return "".join(_parts_of(m.get("parts")) for m in messages if isinstance(m, dict))


def _parts_text(raw: str | None) -> str | None:
    """The text of a list of GenAI parts (gen_ai.system_instructions), or None when it cannot be read."""
    if raw is None:
        return None
    parts = _json(raw)
    return _parts_of(parts) if isinstance(parts, list) else None


def _parts_of(parts: Iterable[object] | None) -> str:
    return "".join(str(part.get("content", "")) for part in parts or ()
                   if isinstance(part, dict) and part.get("type") == "text")


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)
