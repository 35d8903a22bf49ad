"""GenAI messages read back as Messages API messages: the inverse of ``content.genai_message``.

A span holds the conversation in the OpenTelemetry GenAI shape (``{"role", "parts"}``); replaying a run needs it as
the Messages API sent and received it (``{"role", "content": [blocks]}``). Each part type ``content.genai_part``
writes maps back to the block it came from. What the GenAI shape never kept is not made up: a thinking block's
signature, and secrets that were redacted on the way in (they stay ``[REDACTED]``).
"""

from __future__ import annotations

from typing import Any


def anthropic_message(message: object) -> dict[str, Any]:
    """One GenAI message (``{"role", "parts"}``) as a Messages API message with a list of content blocks."""
    if not isinstance(message, dict):
        raise ValueError(f"a message is not an object: {type(message).__name__}")
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise ValueError("a message has no list of parts")
    return {"role": str(message.get("role") or "user"), "content": [anthropic_block(part) for part in parts]}


def anthropic_block(part: object) -> dict[str, Any]:
    """One GenAI part as the Messages API content block ``content.genai_part`` made it from."""
    if not isinstance(part, dict):
        return {"type": "text", "text": str(part)}
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": str(part.get("content", ""))}
    if kind == "tool_call":
        return {"type": "tool_use", "id": part.get("id"), "name": part.get("name"), "input": part.get("arguments")}
    if kind == "tool_call_response":
        block = {"type": "tool_result", "tool_use_id": part.get("id"), "content": part.get("response")}
        if part.get("is_error"):
            block["is_error"] = True
        return block
    if kind == "server_tool_call":
        call = dict(part.get("server_tool_call") or {})
        call.pop("type", None)  # the tool's name, repeated by genai_part; the input is the rest
        return {"type": "server_tool_use", "id": part.get("id"), "name": part.get("name"), "input": call}
    if kind == "server_tool_call_response":
        response = part.get("server_tool_call_response") or {}
        return {"type": response.get("type") or "server_tool_result", "tool_use_id": part.get("id"),
                "content": response.get("content")}
    if kind == "reasoning":
        return {"type": "thinking", "thinking": str(part.get("content", "")), "signature": ""}
    if kind == "blob":
        return {"type": _media_type(part), "source": {"type": "base64", "media_type": part.get("mime_type"),
                                                      "data": part.get("content", "")}}
    if kind == "uri":
        return {"type": _media_type(part), "source": {"type": "url", "url": part.get("uri", "")}}
    # A block genai_part kept under its own type (redacted thinking, files, newer types): its fields as they were.
    fields = part.get("content")
    return {"type": kind or "unknown", **(fields if isinstance(fields, dict) else {"content": fields})}


def _media_type(part: dict[str, Any]) -> str:
    return "image" if part.get("modality") == "image" else "document"


def text_of_parts(value: object) -> str | None:
    """The text of a list of GenAI text parts (how system instructions are stored), None if it holds none."""
    if not isinstance(value, list):
        return None
    texts = [str(part.get("content", "")) for part in value if isinstance(part, dict) and part.get("type") == "text"]
    return "\n".join(texts) if texts else None


def tool_definition(definition: object) -> dict[str, Any] | None:
    """A GenAI tool definition as a Messages API client tool; None for one of Anthropic's server tools, which an
    Agent does not run (``content.genai_tool_definition`` is the inverse)."""
    if not isinstance(definition, dict) or definition.get("type") not in ("function", None):
        return None
    schema = definition.get("parameters")
    return {"name": str(definition.get("name", "")), "description": str(definition.get("description") or ""),
            "input_schema": schema if isinstance(schema, dict) else {"type": "object", "properties": {}}}
