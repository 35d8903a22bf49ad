"""What of a conversation goes on a span: secret redaction, size caps and the GenAI message shape (the capture switch
is `Settings.capture_content`)."""

from __future__ import annotations

import enum
import functools
import json
import re
from typing import Any

REDACTED = "[REDACTED]"


class CaptureMode(enum.Enum):
    """Where conversation content goes: the OpenTelemetry GenAI utilities' ContentCapturingMode, value for value."""

    NO_CONTENT = 0
    SPAN_ONLY = 1  # content attributes on the spans (looptrace's default)
    EVENT_ONLY = 2  # content on a gen_ai.client.inference.operation.details event of each chat span, not on spans
    SPAN_AND_EVENT = 3

    @property
    def on_spans(self) -> bool:
        return self in (CaptureMode.SPAN_ONLY, CaptureMode.SPAN_AND_EVENT)

    @property
    def in_events(self) -> bool:
        return self in (CaptureMode.EVENT_ONLY, CaptureMode.SPAN_AND_EVENT)


def capture_mode(value: str | None) -> CaptureMode | None:
    """One setting's capture mode (settings.capture_mode_name), None when unset. An unknown value means NO_CONTENT,
    with a warning, as in the OpenTelemetry GenAI utilities: a typo must not start recording what someone meant to keep
    off the record."""
    from ..settings import capture_mode_known, capture_mode_name

    name = capture_mode_name(value)
    if name is None:
        return None
    if not capture_mode_known(value or ""):
        from ..logs import log

        log.warning("capture_setting_unknown", assumed="NO_CONTENT",  # its value is not repeated: it may be a secret
                    expected=", ".join([*CaptureMode.__members__, "true", "false"]))
    return CaptureMode[name]


def resolve_capture(setting: bool | str | CaptureMode | None) -> CaptureMode:
    """The capture mode of an Agent's ``capture_content`` argument or of the settings' capture variable. Content is
    captured on spans unless switched off: seeing a tool's arguments is the point of tracing an agent (the Langfuse SDK
    and OpenLLMetry capture by default too). LOOPTRACE_CAPTURE_CONTENT wins over the conventions'
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT (settings.py reads both); both take the modes above or
    true/false."""
    if isinstance(setting, CaptureMode):
        return setting
    if isinstance(setting, bool):
        return CaptureMode.SPAN_ONLY if setting else CaptureMode.NO_CONTENT
    return capture_mode(setting) or CaptureMode.SPAN_ONLY


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


def redact(value: object) -> object:
    """A copy of a JSON-like value with the values of secret-looking keys replaced, in objects at any depth, lists
    included; whatever lies deeper than MAX_DEPTH is replaced by a marker.

    Iterative, with the depth bounded, because the value comes from a model: arguments nested thousands deep must
    neither exhaust the stack here nor in whatever encodes or compares the copy later (json, the detector, the CLI).
    """
    return _redact(value, None)


def redact_with_secrets(value: object) -> tuple[object, tuple[str, ...]]:
    """``redact(value)`` and the texts it hid (see ``hidden_texts``): what ``scrub`` replaces wherever the call's own
    result or error quotes them back."""
    secrets: list[str] = []
    redacted = _redact(value, secrets)
    return redacted, hidden_texts(secrets)


def _redact(value: object, secrets: list[str] | None) -> object:
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
                    if secrets is not None:
                        _collect_texts(child, secrets)
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


# A secret shorter than this is not looked for in text: replacing "ab" or "1" wherever it appears would mangle the
# text and hide nothing (a value that short is no credential).
MIN_SCRUBBED_CHARS = 4


def _collect_texts(value: object, into: list[str]) -> None:
    """The texts (strings and numbers) inside a redacted value, bounded like redact itself."""
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            into.append(item)
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            try:
                into.append(str(item))
            except ValueError:  # an integer too long to write out: no text of it can appear anywhere either
                pass
        elif isinstance(item, dict) and depth < MAX_DEPTH:
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, (list, tuple)) and depth < MAX_DEPTH:
            pending.extend((child, depth + 1) for child in item)


def hidden_texts(values: list[str]) -> tuple[str, ...]:
    """The forms in which redacted values can reappear in a tool's text: each value as it is, URL-encoded (an error
    quoting ``?access_token=...``) and JSON-escaped, longest first so that no shorter form cuts a longer one."""
    if not values:  # the usual call: nothing was redacted
        return ()
    from urllib.parse import quote, quote_plus

    forms: set[str] = set()
    for value in values:
        text = value.strip()
        if len(text) < MIN_SCRUBBED_CHARS:
            continue
        forms.update((text, quote(text, safe=""), quote_plus(text), json.dumps(text, ensure_ascii=False)[1:-1]))
    return tuple(sorted(forms, key=len, reverse=True))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every one of ``secrets`` (from ``redact_with_secrets``) replaced by the redaction marker."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub_content(content: object, secrets: tuple[str, ...]) -> object:
    """A tool_result's content (a text, or a list of content blocks) with ``secrets`` scrubbed from its texts."""
    if not secrets:
        return content
    if isinstance(content, str):
        return scrub(content, secrets)
    if isinstance(content, list):
        return [{**block, "text": scrub(block["text"], secrets)}
                if isinstance(block, dict) and isinstance(block.get("text"), str) else block for block in content]
    return content


CallSecrets = dict[str, tuple[str, ...]]
"""A run's hidden texts by tool_use id: filled as the model's tool calls are encoded, read for their results."""


def _secrets_of(secrets: CallSecrets, tool_result: dict[str, Any]) -> tuple[str, ...]:
    call_id = tool_result.get("tool_use_id")
    return secrets.get(call_id, ()) if isinstance(call_id, str) else ()


def redacted_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Messages API history as it may be shown (``--json``): each tool call's arguments redacted, and the texts they
    hid scrubbed from that call's result wherever the tool quoted them back. The history itself is left as it is."""
    secrets: CallSecrets = {}
    shown = []
    for message in messages:
        blocks = message.get("content") if isinstance(message, dict) else None
        if not isinstance(blocks, list):
            shown.append(message)
            continue
        copied = []
        for block in blocks:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in ("tool_use", "server_tool_use"):
                arguments, hidden = redact_with_secrets(block.get("input"))
                if hidden and isinstance(block.get("id"), str):
                    secrets[block["id"]] = hidden
                copied.append({**block, "input": arguments})
            elif kind == "tool_result" and _secrets_of(secrets, block):
                copied.append({**block, "content": scrub_content(block.get("content"), _secrets_of(secrets, block))})
            else:
                copied.append(block)
        shown.append({**message, "content": copied})
    return shown


def to_json(value: object) -> str:
    """A value as compact JSON, whatever a model put in it: an integer too long for Python to write out (over 4,300
    digits) is written as a string that says so, and anything JSON has no form for as its ``str``."""
    try:
        return _compact_json(value)
    except ValueError:  # an integer too long to write (sys.get_int_max_str_digits), or a circular value
        return _compact_json(_writable(value))
    except RecursionError:
        return '"<nested too deep to encode>"'


# json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":")) with its encoder made once: dumps makes a
# new one on every call given options, and every span with content calls this a few times.
_compact_json = json.JSONEncoder(ensure_ascii=False, default=str, separators=(",", ":")).encode


def _writable(value: object) -> object:
    """A copy of ``value`` that json can write: overlong integers described instead of written, cycles cut."""
    seen: set[int] = set()

    def copy(item: object) -> object:
        if isinstance(item, int) and not isinstance(item, bool):
            try:
                str(item)
                return item
            except ValueError:
                return f"<integer of about {int(item.bit_length() * 0.30103) + 1} digits>"
        if isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                return "<circular>"
            seen.add(id(item))
            copied: object = ({str(k): copy(v) for k, v in item.items()} if isinstance(item, dict)
                              else [copy(v) for v in item])
            seen.discard(id(item))
            return copied
        return item

    return copy(value)


# --- Anthropic messages as GenAI conventions' messages ----------------------------------------------------------------


def genai_message(message: dict[str, Any], secrets: CallSecrets | None = None) -> dict[str, Any]:
    """One Messages API message as the conventions' {"role", "parts"} shape, secrets redacted. With ``secrets`` (the
    run's, see ``CallSecrets``), each tool call's hidden texts are remembered and scrubbed from its result."""
    content = message.get("content")
    if isinstance(content, str):
        parts = [{"type": "text", "content": content}]
    else:
        parts = [genai_part(block, secrets) for block in content or ()]
    return {"role": message.get("role", "user"), "parts": parts}


def genai_part(block: object, secrets: CallSecrets | None = None) -> dict[str, Any]:
    if not isinstance(block, dict):
        return {"type": "text", "content": str(block)}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": block.get("text", "")}
    if kind == "tool_use":
        if secrets is None:
            arguments = redact(block.get("input"))
        else:
            arguments, hidden = redact_with_secrets(block.get("input"))
            if hidden and isinstance(block.get("id"), str):
                secrets[block["id"]] = hidden
        return {"type": "tool_call", "id": block.get("id"), "name": block.get("name"), "arguments": arguments}
    if kind == "tool_result":
        response = block.get("content")
        if secrets:
            response = scrub_content(response, _secrets_of(secrets, block))
        return {"type": "tool_call_response", "id": block.get("tool_use_id"), "response": response,
                **({"is_error": True} if block.get("is_error") else {})}
    if kind == "server_tool_use":  # run by Anthropic (web search, code execution): the conventions' server tool call
        return {"type": "server_tool_call", "id": block.get("id"), "name": block.get("name"),
                "server_tool_call": {"type": block.get("name") or "unknown", **_as_object(redact(block.get("input")))}}
    if isinstance(kind, str) and kind.endswith("_tool_result"):  # web_search_tool_result and its siblings
        return {"type": "server_tool_call_response", "id": block.get("tool_use_id"),
                "server_tool_call_response": {"type": kind, "content": redact(block.get("content"))}}
    if kind == "thinking":
        return {"type": "reasoning", "content": block.get("thinking", "")}
    if kind in ("image", "document") and isinstance(block.get("source"), dict):
        part = _media_part(kind, block["source"])
        if part is not None:
            return part
    # Redacted thinking, files, block types newer than this code: kept, under their own type (a generic part).
    return {"type": kind or "unknown", "content": redact({k: v for k, v in block.items() if k != "type"})}


def _as_object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"input": value}


def _media_part(kind: str, source: dict[str, Any]) -> dict[str, Any] | None:
    """An image or document block as the conventions' blob (inline base64) or uri part."""
    modality = "image" if kind == "image" else kind
    if source.get("type") == "base64":
        return {"type": "blob", "modality": modality, "mime_type": source.get("media_type"),
                "content": source.get("data", "")}
    if source.get("type") == "url":
        return {"type": "uri", "modality": modality, "uri": source.get("url", "")}
    return None


def genai_tool_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """A Messages API tool as the conventions' tool definition: ``{type: function, name, description, parameters}``
    for a client tool, ``{type, name}`` for one of Anthropic's server tools (web_search_20250305, ...)."""
    if "input_schema" in definition or definition.get("type") in (None, "custom"):
        tool = {"type": "function", "name": definition.get("name", "")}
        if definition.get("description"):
            tool["description"] = definition["description"]
        if "input_schema" in definition:
            tool["parameters"] = definition["input_schema"]
        return tool
    return {"type": definition["type"], "name": definition.get("name", definition["type"])}


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the newest user message: what a person would call the task of a continued conversation."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "".join(b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text")
    return ""


class MessageLog:
    """The run's history as GenAI JSON for each model call's span.

    Each message is encoded once (the history only grows, and encoding all of it for every call would make a long run
    quadratic), and a span gets the *newest* messages that fit its size cap, as a valid JSON array: the end of the
    conversation is what the model was answering. How many older messages were left out is returned beside it.
    """

    __slots__ = ("_encoded", "_size", "secrets")

    def __init__(self) -> None:
        self._encoded: list[str] = []
        self._size = 0  # of all encoded messages with their separators
        self.secrets: CallSecrets = {}  # what each tool call's redacted arguments hid, scrubbed from its result

    def remember(self, encoded_message: str) -> None:
        """The next message of the history, already encoded (the chat span encodes the model's answer anyway)."""
        self._encoded.append(encoded_message)
        self._size += len(encoded_message) + 1

    def input_messages_json(self, messages: list[dict[str, Any]], limit: int) -> tuple[str, int]:
        for message in messages[len(self._encoded):]:
            self.remember(to_json(genai_message(message, self.secrets)))
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
