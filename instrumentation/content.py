"""What of a conversation goes on a span: secret redaction, size caps and the GenAI message shape (the capture switch
is `Settings.capture_content`)."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

REDACTED = "[REDACTED]"


def cap(text: str, limit: int) -> str:
    """The text cut at ``limit`` characters with a marker that says how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[truncated {len(text) - limit} of {len(text)} chars]"


# A key is secret-looking when one of its words is: "api_key" and "authToken" are, "max_tokens" is not. "key" alone
# counts ("key", "license_key"): a lookup key redacted by mistake costs a little clarity, a leaked one costs the secret.
_SECRET_WORDS = {"password", "passwd", "pass", "pwd", "token", "secret", "authorization", "auth", "bearer", "key",
                 "apikey", "credential", "credentials", "cookie", "passphrase", "privatekey", "accesskey"}
_WORD_SPLIT = re.compile(r"[^a-zA-Z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


@functools.lru_cache(maxsize=4096)  # a run asks about the same few argument names on every call
def is_secret_key(key: str) -> bool:
    words = [w.lower() for w in _WORD_SPLIT.split(key) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    joined = "".join(words)
    return any(joined.endswith(s) for s in ("apikey", "privatekey", "accesskey", "secretkey"))


MAX_DEPTH = 64  # of arguments kept on spans and shown to anything that reports on a call
TOO_DEEP = f"[looptrace: nested deeper than {MAX_DEPTH} levels]"


def redact(value: Any) -> Any:
    """A copy of a JSON-like value with the values of secret-looking keys replaced, in objects at any depth, lists
    included; whatever lies deeper than MAX_DEPTH is replaced by a marker.

    Iterative, with the depth bounded, because the value comes from a model: arguments nested thousands deep must
    neither exhaust the stack here nor in whatever encodes or compares the copy later (json, the detector, the CLI).
    """
    root: list[Any] = [None]
    # Each entry: (the value to copy, the container the copy goes into, the slot in it, the value's depth).
    pending: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
    while pending:
        item, into, slot, depth = pending.pop()
        if isinstance(item, (dict, list, tuple)) and depth >= MAX_DEPTH:
            into[slot] = TOO_DEEP
        elif isinstance(item, dict):
            copied: dict[Any, Any] = {}
            into[slot] = copied
            for key, child in item.items():
                if isinstance(key, str) and is_secret_key(key):
                    copied[key] = REDACTED
                else:
                    copied[key] = None
                    pending.append((child, copied, key, depth + 1))
        elif isinstance(item, (list, tuple)):
            items: list[Any] = [None] * len(item)
            into[slot] = items
            pending.extend((child, items, position, depth + 1) for position, child in enumerate(item))
        else:
            into[slot] = item
    return root[0]


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


# --- Anthropic messages as GenAI conventions' messages ----------------------------------------------------------------


def genai_message(message: dict[str, Any]) -> dict[str, Any]:
    """One Messages API message as the conventions' {"role", "parts"} shape, secrets redacted."""
    content = message.get("content")
    if isinstance(content, str):
        parts = [{"type": "text", "content": content}]
    else:
        parts = [genai_part(block) for block in content or ()]
    return {"role": message.get("role", "user"), "parts": parts}


def genai_part(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        return {"type": "text", "content": str(block)}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": block.get("text", "")}
    if kind in ("tool_use", "server_tool_use"):
        return {"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                "arguments": redact(block.get("input"))}
    if kind == "tool_result":
        return {"type": "tool_call_response", "id": block.get("tool_use_id"), "response": block.get("content"),
                **({"is_error": True} if block.get("is_error") else {})}
    if kind == "thinking":
        return {"type": "reasoning", "content": block.get("thinking", "")}
    # Images, documents, redacted thinking and block types newer than this code: kept, under their own type.
    return {"type": kind or "unknown", "content": redact({k: v for k, v in block.items() if k != "type"})}


class MessageLog:
    """The run's history as GenAI JSON for each model call's span.

    Each message is encoded once (the history only grows, and encoding all of it for every call would make a long run
    quadratic), and a span gets the *newest* messages that fit its size cap, as a valid JSON array: the end of the
    conversation is what the model was answering. How many older messages were left out is returned beside it.
    """

    __slots__ = ("_encoded", "_size")

    def __init__(self) -> None:
        self._encoded: list[str] = []
        self._size = 0  # of all encoded messages with their separators

    def remember(self, encoded_message: str) -> None:
        """The next message of the history, already encoded (the chat span encodes the model's answer anyway)."""
        self._encoded.append(encoded_message)
        self._size += len(encoded_message) + 1

    def input_messages_json(self, messages: list[dict[str, Any]], limit: int) -> tuple[str, int]:
        for message in messages[len(self._encoded):]:
            self.remember(to_json(genai_message(message)))
        if len(self._encoded) == len(messages) and self._size + 1 <= limit:
            return "[" + ",".join(self._encoded) + "]", 0  # the usual case: everything fits
        encoded = self._encoded[: len(messages)]
        kept: list[str] = []
        size = 2
        for text in reversed(encoded):
            if kept and size + len(text) + 1 > limit:
                break
            kept.append(text)
            size += len(text) + 1
        if len(kept) == 1 and size > limit:  # one message larger than the cap: cut it, marked
            return cap("[" + kept[0] + "]", limit), len(encoded) - 1
        return "[" + ",".join(reversed(kept)) + "]", len(encoded) - len(kept)
