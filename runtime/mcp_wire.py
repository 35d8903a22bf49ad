"""What passes between an MCP transport and the ``mcp`` package's ``ClientSession``, watched for what the session
cannot tell us itself.

``Wire`` puts a thin stream on each side of the session (the read and write streams it is given are the transport's,
passed on item by item; both are anyio's public stream types), and keeps a ``Pending`` for each request looptrace is
waiting on (``sending``, in the task that sends it):

* the JSON-RPC id the request went out with (the span's ``jsonrpc.request.id``);
* whether an error answer came *from the server* (a server may answer -32000 or -32001 itself, which the package also
  uses for "connection closed" and "request timeout": only the wire knows which it was);
* a server's error message, scrubbed of what the call's redaction hides before the session reads it, so that no span
  the package makes (on whatever provider) and no text looptrace writes carries a redacted argument back;
* a ``tools/list`` answer with a tool the package would reject (an input schema whose root is not an object, nested
  deeper than ``MAX_SCHEMA_DEPTH``, or otherwise not MCP): that tool is left out, and the rest of the list is kept;
* an answer the package could not parse (not MCP, or nested deeper than its parser goes) to a request in flight:
  that request fails at once, rather than waiting out its timeout;
* the end of the server's output (a stdio server that exited): ``on_closed`` is called, so the connection is known
  lost before anything else is sent to it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

if TYPE_CHECKING:
    from mcp.client._transport import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage

MAX_SCHEMA_DEPTH = 64  # levels of objects and lists in a tool's input schema; deeper, and the tool is left out
UNREADABLE_ANSWER = -32700  # JSON-RPC's parse error: the code of an answer the session could not read


@dataclasses.dataclass(eq=False)
class Pending:
    """A request looptrace sent, as the wire saw it."""

    method: str
    scrub: Callable[[str], str] = str
    request_id: Any = None
    answered_code: int | None = None  # the JSON-RPC error code the answer carried (the server's own error)
    unreadable: str | None = None  # why the answer could not be read
    tool_error: bool = False  # tools/call: answered with isError
    written: bool = False  # handed to the transport (False: the connection was closed before it could be sent)
    left_out: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # tools/list: (tool, why)


_SENDING: contextvars.ContextVar[Pending | None] = contextvars.ContextVar("looptrace_mcp_sending", default=None)


class Wire:
    """The streams a ``ClientSession`` is given in place of the transport's (``incoming``, ``outgoing``)."""

    def __init__(self, read: ReadStream[SessionMessage | Exception], write: WriteStream[SessionMessage], *,
                 on_closed: Callable[[], None]) -> None:
        self.incoming = _Incoming(self, read)
        self.outgoing = _Outgoing(self, write)
        self.protocol_version: str | None = None  # once initialized: the version tools/list answers are checked for
        self._on_closed = on_closed
        self._in_flight: dict[str, Pending] = {}

    def sending(self, pending: Pending) -> _Sending:
        """``with wire.sending(pending): await session.call_tool(...)``: the request sent inside is ``pending``."""
        return _Sending(self, pending)

    # --- what the streams see -------------------------------------------------------------------------------------

    def _sending(self, message: object) -> Pending | None:
        """The pending request ``message`` is (noted before it goes: its answer may come back at once)."""
        from mcp import types

        pending = _SENDING.get()
        if pending is not None and pending.request_id is None and isinstance(message, types.JSONRPCRequest):
            pending.request_id = message.id
            self._in_flight[str(message.id)] = pending
            return pending
        return None

    def _received(self, item: SessionMessage | Exception) -> SessionMessage | Exception:
        from mcp import types
        from mcp.shared.message import SessionMessage

        if isinstance(item, Exception):
            return self._unparsed(item)
        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if isinstance(message, types.JSONRPCError) and message.id is not None:
            pending = self._in_flight.pop(str(message.id), None)
            if pending is not None:
                pending.answered_code = message.error.code
                scrubbed = pending.scrub(message.error.message)
                if scrubbed != message.error.message:
                    error = message.error.model_copy(update={"message": scrubbed})
                    return SessionMessage(message.model_copy(update={"error": error}), item.metadata)
        elif isinstance(message, types.JSONRPCResponse):
            pending = self._in_flight.pop(str(message.id), None)
            if pending is not None and pending.method == "tools/list" and isinstance(message.result, dict):
                kept = self._listed(pending, message.result)
                if kept is not message.result:
                    return SessionMessage(message.model_copy(update={"result": kept}), item.metadata)
        return item

    def _listed(self, pending: Pending, result: dict[str, Any]) -> dict[str, Any]:
        """A tools/list result without the tools the session would reject (each noted in ``pending.left_out``)."""
        tools = result.get("tools")
        if not isinstance(tools, list):
            return result
        kept = []
        for tool in tools:
            problem = self._tool_problem(tool)
            if problem is None:
                kept.append(tool)
            else:
                name = tool.get("name") if isinstance(tool, dict) else None
                pending.left_out.append((name if isinstance(name, str) else "(unnamed)", problem))
        return result if len(kept) == len(tools) else {**result, "tools": kept}

    def _tool_problem(self, tool: object) -> str | None:
        from mcp_types import methods
        from pydantic import ValidationError

        if not isinstance(tool, dict):
            return "it is not an object"
        schema = tool.get("inputSchema")
        if _depth(schema) > MAX_SCHEMA_DEPTH:
            return f"its input schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
        try:
            methods.validate_server_result("tools/list", self.protocol_version or "2025-11-25", {"tools": [tool]})
        except ValidationError as exc:
            return "its definition is not valid MCP: " + validation_summary(exc)
        except (KeyError, ValueError):  # a version the package does not know: it decides
            pass
        return None

    def _unparsed(self, exc: Exception) -> SessionMessage | Exception:
        """A line the session could not parse: the answer to a request in flight fails that request at once (or, for
        tools/list, is read here with the tools the session would reject left out); anything else is passed on."""
        from mcp import types
        from mcp.shared.message import SessionMessage

        raw = _raw_input(exc)
        try:
            data = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            data = None
        pending = self._in_flight.get(str(data.get("id"))) if isinstance(data, dict) else None
        if pending is None or not isinstance(data, dict):
            return exc
        self._in_flight.pop(str(data.get("id")), None)
        result = data.get("result")
        if pending.method == "tools/list" and isinstance(result, dict):
            try:
                kept = self._listed(pending, result)
                return SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=pending.request_id, result=kept))
            except Exception:  # noqa: BLE001 - still unreadable: fail the request below
                pending.left_out.clear()
        pending.unreadable = validation_summary(exc)
        error = types.ErrorData(code=UNREADABLE_ANSWER, message="the answer could not be read")
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=pending.request_id, error=error))

    def _closed(self) -> None:
        self._on_closed()


class _Sending:
    __slots__ = ("pending", "token", "wire")

    def __init__(self, wire: Wire, pending: Pending) -> None:
        self.wire, self.pending = wire, pending

    def __enter__(self) -> Pending:
        self.token = _SENDING.set(self.pending)
        return self.pending

    def __exit__(self, *exc_info: object) -> None:
        _SENDING.reset(self.token)
        if self.pending.request_id is not None:
            self.wire._in_flight.pop(str(self.pending.request_id), None)


class _Outgoing(ObjectSendStream["SessionMessage"]):
    """The session's write stream: notes the id of the request being sent (in the sender's task), then passes it on."""

    def __init__(self, wire: Wire, inner: WriteStream[SessionMessage]) -> None:
        self._wire, self._inner = wire, inner

    async def send(self, item: SessionMessage) -> None:
        pending = self._wire._sending(getattr(item, "message", None))
        await self._inner.send(item)
        if pending is not None:
            pending.written = True

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Incoming(ObjectReceiveStream["SessionMessage | Exception"]):
    """The session's read stream: each item as the wire makes it (see ``Wire._received``); its end is reported."""

    def __init__(self, wire: Wire, inner: ReadStream[SessionMessage | Exception]) -> None:
        self._wire, self._inner = wire, inner

    async def receive(self) -> SessionMessage | Exception:
        try:
            item = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._wire._closed()
            raise
        return self._wire._received(item)

    async def aclose(self) -> None:
        await self._inner.aclose()


def validation_summary(exc: BaseException) -> str:
    """What a parsing or validation error says, without the input it quotes (a result may echo the arguments)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            found = errors(include_input=False, include_url=False, include_context=False)
        except TypeError:  # not pydantic's
            found = None
        if found:
            first = found[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or "message"
            more = f" (and {len(found) - 1} more problem{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
            return f"{where}: {first.get('msg', '')}{more}"
    return type(exc).__name__


def _raw_input(exc: Exception) -> str | None:
    """The line a pydantic ValidationError failed to parse, when it says (the stdio client hands those on)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return None
    try:
        found = errors()
    except Exception:  # noqa: BLE001
        return None
    raw = found[0].get("input") if found else None
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None


def _depth(value: object) -> int:
    """How many levels of objects and lists ``value`` has (iteratively: it comes from a server)."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_SCHEMA_DEPTH:
            return deepest
        pending.extend((child, level + 1) for child in children)
    return deepest
