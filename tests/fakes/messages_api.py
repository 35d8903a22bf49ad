"""A scripted stand-in for the Anthropic Messages API, for tests.

The runtime talks to Claude through the real ``anthropic`` SDK, and the part
worth testing is exactly what the SDK does on the wire: retries, streaming,
error mapping. Mocking the client would skip all of that. Instead this module
runs a small HTTP server on 127.0.0.1 that answers ``POST /v1/messages`` the way
the real API does, so a test points ``base_url`` at it and exercises the SDK
unmodified.

Each request consumes the next item of a *script*:

    with FakeMessagesAPI([
        {"stop_reason": "tool_use",
         "content": [{"type": "tool_use", "id": "toolu_01", "name": "search",
                      "input": {"q": "otel"}}]},
        Error(429, "rate_limit_error", "slow down", retry_after=0.01),
        {"content": "Done."},
    ]) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="test-key")

Script items:

* a dict in the response shape of a Message, possibly partial; missing fields
  are filled in as the API would (``complete_message``). ``content`` may be a
  plain string as shorthand for one text block. Unknown ``stop_reason`` values
  and block types are passed through untouched.
* a callable ``f(request_body) -> item`` for answers that depend on the request.
* ``Error``, ``Delay``, ``DropConnection``, ``NotStreamed`` and ``Trickle`` for
  failure modes; ``Held`` for a stream the test lets finish when it chooses.

A request that forces a tool call (``tool_choice`` ``{"type": "tool", "name": N}``,
as the detector's judge sends for its ``verdict``) can be answered apart from the
script: ``forced={"verdict": verdict_answer(True)}`` answers every such request
with that item (any script item: a callable, an ``Error``, a ``Delay``), without
consuming the script, so a test need not know how many times a judge is asked.
``forced_requests(name)`` lists the requests that forced it.

A request with ``"stream": true`` gets the same message as a server-sent event
stream (``stream_events``), so streaming and non-streaming calls reconstruct
equal Messages. Requests are checked against the API's own rules first
(``validate=False`` turns that off); a rejected request does not consume a
script item, because the real API would not have produced an answer for it.

Standard library only, so it works wherever the tests do.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Delay",
    "DropConnection",
    "Error",
    "FakeMessagesAPI",
    "Held",
    "NotStreamed",
    "Trickle",
    "complete_message",
    "stream_events",
    "verdict_answer",
]


# --------------------------------------------------------------------------
# Script items
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Error:
    """Answer with an API error: ``status`` and the real error body.

    ``retry_after`` (seconds, fractions allowed) becomes a ``retry-after``
    header, which the SDK honours when it is > 0; 0 or None fall back to the
    SDK's own backoff (about half a second), so tests should pass something
    like 0.01. ``headers`` adds any others, e.g. ``{"x-should-retry": "false"}``,
    which the SDK obeys over its status-code rules.
    """

    status: int
    error_type: str
    message: str
    retry_after: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` before answering with ``item`` (to trip client timeouts)."""

    seconds: float
    item: Any


@dataclass(frozen=True)
class DropConnection:
    """Close the socket without finishing the answer.

    A streaming request first gets ``after_events`` events of ``item``'s stream
    (a short text message when not given); a non-streaming one gets nothing,
    which the SDK treats as a connection error and retries.
    """

    after_events: int = 0
    item: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NotStreamed:
    """Answer with ``item`` as one JSON body even when the request asked to
    stream, as a proxy or a stand-in server that ignores ``"stream": true``
    does."""

    item: Mapping[str, Any]


@dataclass(frozen=True)
class Trickle:
    """Answer with ``item`` slowly: the body (or, streaming, each event) goes out
    in ``pieces`` parts ``interval`` seconds apart, as a slow or congested
    server sends it. Every read gets bytes quickly, so a per-read client timeout
    never fires; only a bound on the whole call does. ``finished`` is set once
    the last byte is sent (never when the client went away first).
    """

    interval: float
    item: Any
    pieces: int = 20
    finished: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True)
class Held:
    """Stream ``item``'s first ``after_events`` server-sent events, then wait until the test sets ``release`` (60 s
    at most) before sending the rest: what a client shows while a call is still streaming can be looked at then. A
    request that does not stream gets ``item`` at once."""

    item: Any
    after_events: int
    release: threading.Event = field(default_factory=threading.Event, compare=False)
    expired: threading.Event = field(default_factory=threading.Event, compare=False)  # set: nobody released it


ScriptItem = Any  # dict | Callable[[dict], ScriptItem] | Error | Delay | DropConnection | Trickle | Held

_FAILURE_ITEMS = (Error, Delay, DropConnection, NotStreamed)


def verdict_answer(ignored: bool, reason: str = "scripted", *, input_tokens: int = 120,
                   output_tokens: int = 15) -> dict[str, Any]:
    """The answer to a judge's forced ``verdict`` tool call: ignored or not, with the usage to price."""
    return {"stop_reason": "tool_use", "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
            "content": [{"type": "tool_use", "name": "verdict", "input": {"ignored": ignored, "reason": reason}}]}


def forced_tool(body: Mapping[str, Any]) -> str | None:
    """The tool a request forces the model to call (``tool_choice`` of type ``tool``), if any."""
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "tool":
        name = choice.get("name")
        return name if isinstance(name, str) else None
    return None


# --------------------------------------------------------------------------
# Messages: filling in a scripted response
# --------------------------------------------------------------------------

# Small but non-zero, like a real short exchange; scripts override them
# when a test is about token accounting.
DEFAULT_USAGE = {
    "input_tokens": 10,
    "output_tokens": 5,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _complete_block(block: Mapping[str, Any]) -> dict[str, Any]:
    block = dict(block)
    if block.get("type") == "tool_use":
        block.setdefault("id", _new_id("toolu_"))
        block.setdefault("input", {})
    return block


def complete_message(partial: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """A full Message body from a scripted, possibly partial one.

    Only absent fields are filled; anything given (including values the SDK
    has never heard of) is kept as is, since surviving those is the point of
    some tests.
    """
    content = partial.get("content", [])
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    content = [_complete_block(block) for block in content]
    # The API reports tool_use whenever the turn ends in a tool call.
    calls_tool = any(block.get("type") == "tool_use" for block in content)

    message: dict[str, Any] = {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": request.get("model"),
        "content": content,
        "stop_reason": "tool_use" if calls_tool else "end_turn",
        "stop_sequence": None,
    }
    message.update((key, value) for key, value in partial.items() if key not in ("content", "usage"))
    message["usage"] = {**DEFAULT_USAGE, **partial.get("usage", {})}
    return message


# --------------------------------------------------------------------------
# Streaming: one Message as the API's event sequence
# --------------------------------------------------------------------------

# Pieces are cut small so that every block gets several deltas, as it would
# from the model, and accumulating them is actually exercised.
CHUNK_CHARS = 12


def _pieces(text: str) -> list[str]:
    return [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]


def _block_events(index: int, block: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """content_block_start, its deltas, content_block_stop for one block.

    The start event carries the block with its growing part emptied; the
    deltas carry that part. Blocks of a type without deltas (including ones
    unknown here) arrive whole in the start event.
    """
    kind = block.get("type")

    def delta(payload: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": payload}

    if kind == "text":
        yield {"type": "content_block_start", "index": index, "content_block": {**block, "text": ""}}
        for piece in _pieces(block.get("text", "")):
            yield delta({"type": "text_delta", "text": piece})
    elif kind == "thinking":
        start = {**block, "thinking": "", "signature": ""}
        yield {"type": "content_block_start", "index": index, "content_block": start}
        for piece in _pieces(block.get("thinking", "")):
            yield delta({"type": "thinking_delta", "thinking": piece})
        if block.get("signature"):
            yield delta({"type": "signature_delta", "signature": block["signature"]})
    elif kind in ("tool_use", "server_tool_use"):
        yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
        # The API opens every tool input with an empty fragment; an empty input
        # gets nothing more, and the client keeps the {} from the start event.
        yield delta({"type": "input_json_delta", "partial_json": ""})
        if block.get("input"):
            for piece in _pieces(json.dumps(block["input"])):
                yield delta({"type": "input_json_delta", "partial_json": piece})
    else:
        yield {"type": "content_block_start", "index": index, "content_block": dict(block)}
    yield {"type": "content_block_stop", "index": index}


def stream_events(message: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The SSE events that stream ``message``, in the API's order.

    message_start (no content, no stop_reason, input-side usage), a ping after
    the first block opens, each block's events, message_delta (stop_reason,
    stop_sequence and the final, cumulative usage), message_stop.
    """
    usage = message["usage"]
    # Output tokens are still being counted at message_start; the API sends a
    # token or so here and the real total in message_delta.
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": min(1, usage.get("output_tokens", 0))}
    if "stop_details" in message:
        start["stop_details"] = None  # like stop_reason, only known at the end
    yield {"type": "message_start", "message": start}
    for index, block in enumerate(message["content"]):
        for event in _block_events(index, block):
            yield event
            if index == 0 and event["type"] == "content_block_start":
                yield {"type": "ping"}

    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    if "stop_details" in message:
        delta["stop_details"] = message["stop_details"]
    yield {"type": "message_delta", "delta": delta, "usage": dict(usage)}
    yield {"type": "message_stop"}


def _sse(event: Mapping[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


# --------------------------------------------------------------------------
# Validation: the API's own rules, with its wording
# --------------------------------------------------------------------------
# Each check returns the error message for the first violation, or None.


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content", [])
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _tool_use_ids(message: Mapping[str, Any]) -> list[str]:
    return [block.get("id") for block in _blocks(message) if block.get("type") == "tool_use"]


def check_required_fields(body: Mapping[str, Any]) -> str | None:
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    return None


# Custom tools only: server tools (web_search_..., bash_...) have their own shapes.
TOOL_NAME_PATTERN = "^[a-zA-Z0-9_-]{1,128}$"


def check_tool_definitions(body: Mapping[str, Any]) -> str | None:
    for i, tool in enumerate(body.get("tools") or []):
        if tool.get("type", "custom") != "custom":
            continue
        where = f"tools.{i}.custom"
        if "name" not in tool:
            return f"{where}.name: Field required"
        if not re.fullmatch(TOOL_NAME_PATTERN, str(tool["name"])):
            return f"{where}.name: String should match pattern '{TOOL_NAME_PATTERN}'"
        if "input_schema" not in tool:
            return f"{where}.input_schema: Field required"
        schema = tool["input_schema"]
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            return f"{where}.input_schema.type: Input should be 'object'"
    return None


def check_messages_not_empty(body: Mapping[str, Any]) -> str | None:
    return None if body["messages"] else "messages: at least one message is required"


def check_first_message_is_user(body: Mapping[str, Any]) -> str | None:
    if body["messages"][0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    return None


def check_roles_alternate(body: Mapping[str, Any]) -> str | None:
    roles = [message.get("role") for message in body["messages"]]
    for previous, current in zip(roles, roles[1:]):
        if previous == current:
            return (
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{current}" roles in a row'
            )
    return None


def check_tool_results_follow_tool_uses(body: Mapping[str, Any]) -> str | None:
    """Every tool_use is answered at the start of the very next (user) message.

    Both messages point at the user message that should hold the results,
    ``messages.N``, and the stray result's block, ``messages.N.content.M``.
    """
    messages = body["messages"]
    for i, message in enumerate(messages):
        if message.get("role") != "user":
            continue
        previous = messages[i - 1] if i > 0 else {}
        expected = _tool_use_ids(previous) if previous.get("role") == "assistant" else []
        blocks = _blocks(message)

        for j, block in enumerate(blocks):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in expected:
                return (
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message."
                )

        # Only results that come before any other block count as "immediately after".
        answered = set()
        for block in blocks:
            if block.get("type") != "tool_result":
                break
            answered.add(block.get("tool_use_id"))
        missing = [tool_use_id for tool_use_id in expected if tool_use_id not in answered]
        if missing:
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` "
                "block in the next message."
            )
    return None


# What a tool_result's content may hold when it is a list of blocks, and the image types the API decodes.
TOOL_RESULT_BLOCK_TYPES = ("text", "image", "document", "search_result")
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def check_tool_result_content(body: Mapping[str, Any]) -> str | None:
    """A tool_result's content is a string or a list of text, image, document or search_result blocks; a base64
    image names a media type the API supports and carries data."""
    for i, message in enumerate(body["messages"]):
        for j, block in enumerate(_blocks(message)):
            if block.get("type") != "tool_result" or isinstance(block.get("content", ""), str):
                continue
            content = block["content"]
            if not isinstance(content, list):
                return f"messages.{i}.content.{j}.content: Input should be a valid string or a valid list"
            for k, item in enumerate(content):
                where = f"messages.{i}.content.{j}.content.{k}"
                kind = item.get("type") if isinstance(item, dict) else None
                if kind not in TOOL_RESULT_BLOCK_TYPES:
                    return f"{where}.type: Input tag {kind!r} does not match any of the expected tags"
                if kind == "text" and not isinstance(item.get("text"), str):
                    return f"{where}.text: Field required"
                source = item.get("source")
                if kind == "image":
                    if not isinstance(source, dict) or source.get("type") != "base64" or not source.get("data"):
                        return f"{where}.source: a base64 source with data is required"
                    if source.get("media_type") not in IMAGE_MEDIA_TYPES:
                        return f"{where}.source.media_type: Input should be {', '.join(IMAGE_MEDIA_TYPES)}"
    return None


# In order: the shape of the body first, then how the conversation hangs together.
BODY_CHECKS: tuple[Callable[[Mapping[str, Any]], str | None], ...] = (
    check_required_fields,
    check_tool_definitions,
    check_messages_not_empty,
    check_first_message_is_user,
    check_roles_alternate,
    check_tool_results_follow_tool_uses,
    check_tool_result_content,
)


def presents_key(headers: Mapping[str, str], api_key: str) -> bool:
    """Whether the request carries ``api_key`` in either header the API takes.

    Older SDKs send it as ``x-api-key``; anthropic 2.x sends the same key as
    ``authorization: Bearer ...``, so accepting only one would lock out the other.
    """
    return headers.get("x-api-key") == api_key or headers.get("authorization") == f"Bearer {api_key}"


def check_request(headers: Mapping[str, str], body: Mapping[str, Any], *, api_key: str) -> Error | None:
    """The error the real API would answer this request with, if any."""
    if not presents_key(headers, api_key):
        return Error(401, "authentication_error", "invalid x-api-key")
    if "anthropic-version" not in headers:
        return Error(400, "invalid_request_error", "anthropic-version: header is required")
    for check in BODY_CHECKS:
        problem = check(body)
        if problem:
            # The API tells the SDK not to retry a request that cannot succeed.
            return Error(400, "invalid_request_error", problem, headers={"x-should-retry": "false"})
    return None


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class FakeMessagesAPI:
    """A local Messages API answering from a script; use it as a context manager.

    ``url`` is set once started; ``requests`` and ``headers`` record every
    ``/v1/messages`` request (parsed body, lower-cased header names), rejected
    ones included, in arrival order.
    """

    def __init__(self, script: Iterable[ScriptItem] = (), *, api_key: str = "test-key", validate: bool = True,
                 forced: Mapping[str, ScriptItem] | None = None):
        self.api_key = api_key
        self.validate = validate
        self.forced = dict(forced or {})  # tool name -> the answer to every request forcing that tool
        self.url = ""
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._script: deque[ScriptItem] = deque(script)
        self._lock = threading.Lock()  # handlers run on one thread per connection
        self._server: _Server | None = None
        self._stopping = threading.Event()  # ends a Trickle still sending when the test is over

    def add(self, *items: ScriptItem) -> None:
        """Append answers to the script (also while serving)."""
        with self._lock:
            self._script.extend(items)

    def forced_requests(self, name: str) -> list[dict]:
        """The requests (rejected ones included) that forced a call of tool ``name``."""
        with self._lock:
            return [body for body in self.requests if isinstance(body, dict) and forced_tool(body) == name]

    @property
    def remaining(self) -> int:
        """Script items not yet used: a test can assert it consumed them all."""
        with self._lock:
            return len(self._script)

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> FakeMessagesAPI:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        # serve_forever notices shutdown() only between polls; the default half
        # second would be added to every test that uses the fake.
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-messages-api", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeMessagesAPI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- answering ---------------------------------------------------------

    def _record(self, headers: Mapping[str, str], body: Any) -> None:
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(headers))

    def _next_item(self) -> ScriptItem:
        with self._lock:
            if self._script:
                return self._script.popleft()
        # Retrying cannot help, so tell the SDK not to: the test fails at once.
        return Error(500, "api_error", "script exhausted", headers={"x-should-retry": "false"})

    def _answer(self, handler: _Handler, headers: Mapping[str, str], body: Any) -> None:
        self._record(headers, body)
        try:
            item = self._decide(headers, body)
        except Exception as exc:  # a broken callable or odd body must fail the test, not hang it
            item = Error(500, "api_error", f"fake: {exc!r}", headers={"x-should-retry": "false"})

        if isinstance(item, Error):
            handler.send_error_body(item)
        elif isinstance(item, DropConnection):
            if body.get("stream"):
                message = complete_message(item.item or {"content": "This answer is cut off"}, body)
                handler.send_stream(message, stop_after=item.after_events)
            handler.drop()
        elif isinstance(item, NotStreamed):
            handler.send_json(200, complete_message(item.item, body))
        elif isinstance(item, Trickle):
            handler.send_slowly(complete_message(item.item, body), item, stream=bool(body.get("stream")),
                                stopping=self._stopping)
        elif isinstance(item, Held) and body.get("stream"):
            handler.send_stream(complete_message(item.item, body), hold=item)
        elif isinstance(item, Held):
            handler.send_json(200, complete_message(item.item, body))
        elif body.get("stream"):
            handler.send_stream(complete_message(item, body))
        else:
            handler.send_json(200, complete_message(item, body))

    def _decide(self, headers: Mapping[str, str], body: Any) -> ScriptItem:
        """The API's rejection of the request if any, else the next scripted answer."""
        if not isinstance(body, dict):
            return Error(400, "invalid_request_error", "The request body is not valid JSON")
        rejection = check_request(headers, body, api_key=self.api_key) if self.validate else None
        if rejection:
            return rejection
        forced = forced_tool(body)
        if forced in self.forced:
            return self._resolve(self.forced[forced], body)
        return self._resolve(self._next_item(), body)

    def _resolve(self, item: ScriptItem, body: dict) -> ScriptItem:
        """Run callables and sit out delays until a concrete answer remains."""
        while True:
            if isinstance(item, Delay):
                time.sleep(item.seconds)
                item = item.item
            elif callable(item):
                item = item(body)
            elif isinstance(item, (Mapping, Trickle, Held, *_FAILURE_ITEMS)):
                return item
            else:
                raise TypeError(f"not a script item: {item!r}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler still sleeping in a Delay must not hold up exit
    fake: FakeMessagesAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or was told to drop has gone away; writing to
        # it fails, and that is part of the scenario rather than a fault here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 for keep-alive and, above all, chunked streams: a stream cut
    # short is then visibly incomplete to the client instead of merely ended.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle and delayed ACKs add ~40 ms a request.
    disable_nagle_algorithm = True
    server_version = "fake-messages-api"
    sys_version = ""
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.path.split("?")[0] != "/v1/messages":
            self.send_error_body(Error(404, "not_found_error", "Not Found"))
            return
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")  # recorded as text; answered with a 400
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.fake._answer(self, headers, body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean; the fake's records are in .requests

    # -- responses ---------------------------------------------------------

    def _start(self, status: int, content_type: str, extra: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        # Every API response carries one; the SDK exposes it as ._request_id.
        for name, value in {"request-id": _new_id("req_"), **(extra or {})}.items():
            self.send_header(name, value)

    def send_json(self, status: int, payload: Any, extra: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._start(status, "application/json", extra)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_body(self, error: Error) -> None:
        # The API repeats the request id inside error bodies, as SDK error
        # messages (and so logs) show it.
        request_id = _new_id("req_")
        extra = {"request-id": request_id, **error.headers}
        if error.retry_after is not None:
            extra["retry-after"] = f"{error.retry_after:g}"
        detail = {"type": error.error_type, "message": error.message}
        self.send_json(error.status, {"type": "error", "error": detail, "request_id": request_id}, extra)

    def send_stream(self, message: Mapping[str, Any], stop_after: int | None = None,
                    hold: Held | None = None) -> None:
        """Send ``message`` as SSE; with ``stop_after``, only that many events; with ``hold``, wait for its release
        after its ``after_events``."""
        self._start(200, "text/event-stream; charset=utf-8", {"cache-control": "no-cache"})
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for count, event in enumerate(stream_events(message)):
            if count == stop_after:
                return
            if hold is not None and count == hold.after_events and not hold.release.wait(60):
                hold.expired.set()
            self._write_chunk(_sse(event))
        self._write_chunk(b"")  # the zero-length chunk that ends the body

    def send_slowly(self, message: Mapping[str, Any], trickle: Trickle, *, stream: bool,
                    stopping: threading.Event) -> None:
        """``message`` as JSON or SSE, in ``trickle.pieces`` parts with pauses between them."""
        if stream:
            data = b"".join(_sse(event) for event in stream_events(message))
            self._start(200, "text/event-stream; charset=utf-8", {"cache-control": "no-cache"})
            self.send_header("transfer-encoding", "chunked")
        else:
            data = json.dumps(message).encode()
            self._start(200, "application/json")
            self.send_header("content-length", str(len(data)))
        self.end_headers()
        size = -(-len(data) // max(trickle.pieces, 1))
        for start in range(0, len(data), size):
            if start and stopping.wait(trickle.interval):
                return
            piece = data[start:start + size]
            if stream:
                self._write_chunk(piece)
            else:
                self.wfile.write(piece)
                self.wfile.flush()
        if stream:
            self._write_chunk(b"")
        trickle.finished.set()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def drop(self) -> None:
        """Close the connection mid-answer, the way a failing network would."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client went first; nothing left to cut
