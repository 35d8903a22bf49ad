"""An MCP tool's result as the Messages API takes a tool_result's content: text, images, documents.

Text alone is one string (the same path as a Python tool's text result); anything else is ``tools.ContentBlocks``,
whose text (images and documents as one-line placeholders) is what spans, events and the detector see.
"""

from __future__ import annotations

import json
from typing import Any

from looptrace.runtime import tools as toolkit

IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})  # what the Messages API takes


def tool_result(result: Any) -> str | toolkit.ContentBlocks:
    """An MCP CallToolResult as the Messages API takes a tool_result's content: text alone as a string (the same
    path as a Python tool's text), otherwise text, image and document blocks. Structured content is sent as JSON
    text when the server gave no content for it (the spec asks servers to mirror it in a text block as well)."""
    blocks: list[dict[str, Any]] = []
    for item in result.content:
        blocks.extend(_blocks_of(item))
    if result.structured_content is not None and not any(b["type"] == "text" for b in blocks):
        blocks.append({"type": "text", "text": json.dumps(result.structured_content, ensure_ascii=False)})
    if all(block["type"] == "text" for block in blocks):
        return "\n".join(block["text"] for block in blocks)
    return toolkit.ContentBlocks(blocks)


def _blocks_of(item: Any) -> list[dict[str, Any]]:
    kind = getattr(item, "type", None)
    if kind == "text":
        return [{"type": "text", "text": item.text}]
    if kind == "image":
        return [_base64_block(item.mime_type, item.data, what="image")]
    if kind == "audio":
        return [_note(f"[audio ({item.mime_type}) not shown: the Messages API takes no audio]")]
    if kind == "resource_link":
        return [_note(f"[resource link: {item.uri}{f' ({item.name})' if item.name else ''}]")]
    if kind == "resource":
        resource = item.resource
        mime = resource.mime_type or "unknown type"
        text = getattr(resource, "text", None)
        if text is not None:
            return [_note(f"[resource {resource.uri} ({mime})]\n{text}")]
        return [_base64_block(resource.mime_type or "", resource.blob, what=f"resource {resource.uri}")]
    return [_note(f"[a {kind or 'content'} block looptrace cannot pass on]")]


def _base64_block(mime: str, data: str, *, what: str) -> dict[str, Any]:
    if mime in IMAGE_TYPES:
        return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}
    if mime == "application/pdf":
        return {"type": "document", "source": {"type": "base64", "media_type": mime, "data": data}}
    return _note(f"[{what} ({mime or 'unknown type'}, {len(data):,} characters of base64) not shown: the Messages "
                 "API takes images (JPEG, PNG, GIF, WebP) and PDF documents]")


def _note(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
