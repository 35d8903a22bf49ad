"""One MCP server's link: its connection's state, how it is opened (stdio or streamable HTTP), its stderr, and the
tools it offers the model. ``mcp_connections`` owns the links and drives them on its event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO
from urllib.parse import urlsplit

from looptrace.instrumentation.agent_telemetry import mcp_telemetry
from looptrace.instrumentation.interface import log
from looptrace.runtime.mcp_failures import RequestFailed, describe, failure_of
from looptrace.runtime.mcp_servers import (
    MCPServer,
    MCPServerHTTP,
    MCPServerStdio,
    MCPServerUnavailable,
    MCPTool,
    approval_for,
    tool_name,
)
from looptrace.runtime.mcp_wire import Pending, Wire

if TYPE_CHECKING:
    import httpx2
    from mcp import ClientSession
    from mcp.client._transport import TransportStreams
    from mcp.types import Tool

    from looptrace.instrumentation.agent_telemetry import MCPServerTelemetry
    from looptrace.instrumentation.interface import AgentTelemetry

__all__ = ["Offered", "ServerLink", "build_tools", "log_stderr", "not_connected", "open_transport",
           "quiet_package_logs", "requesting", "settle_future", "settle_ready", "telemetry_for"]

STDERR_LINES_LOGGED = 50
TOOL_ERROR = "tool_error"  # error.type of a call answered with isError (the MCP conventions' value)

CallTool = Callable[["ServerLink", str, dict[str, Any]], Awaitable[object]]


@dataclasses.dataclass(eq=False)
class ServerLink:
    """One server's connection as the connections keep it: its session and wire, its tools, and its state."""

    config: MCPServer
    label: str
    telemetry: MCPServerTelemetry
    session: ClientSession | None = None
    wire: Wire | None = None
    tools: list[Tool] = dataclasses.field(default_factory=list)
    checkers: dict[str, Any] = dataclasses.field(default_factory=dict)  # compiled input-schema validators
    left_out: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (tool, why) from its last list
    failure: str | None = None
    protocol_version: str | None = None
    session_id: str | None = None
    stderr: TextIO | None = None
    stale: bool = False  # the server said its tool list changed; not listed again yet
    last_stderr: str = ""  # the last line the server wrote to stderr, for the reason it could not start
    stop: asyncio.Event | None = None  # set: the connection's task closes it
    keeper: asyncio.Task | None = None  # the task that owns the connection
    connecting: asyncio.Future | None = None  # the connect under way, which concurrent runs share
    checking: asyncio.Future | None = None  # the ping of a held connection under way: its calls wait for it
    session_gone: bool = False  # HTTP: the server answered 404 to our session (it restarted, or dropped it)
    starting: bool = False  # its connection is being opened (a close cancels that; never a connection's unwinding)
    closing: bool = False  # looptrace is closing it (a server exiting then is not "lost")
    lost: bool = False  # the server's output ended while the connection was open
    garbled: int = 0  # lines it wrote that are not MCP, on this connection

    @property
    def is_stdio(self) -> bool:
        return isinstance(self.config, MCPServerStdio)


def open_transport(server: ServerLink) -> contextlib.AbstractAsyncContextManager[TransportStreams]:
    """The server's read and write streams: its process started (stdio), or its endpoint reached (HTTP)."""
    config = server.config
    if isinstance(config, MCPServerStdio):
        import tempfile

        from mcp.client.stdio import StdioServerParameters, stdio_client

        # Closed by log_stderr once the server has stopped: it must outlive this function.
        server.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        # A byte that is not UTF-8 becomes U+FFFD: one bad byte costs one line, not the connection.
        parameters = StdioServerParameters(command=config.command, args=list(config.args),
                                           env=dict(config.env) if config.env else None, cwd=config.cwd,
                                           encoding_error_handler="replace")
        return stdio_client(parameters, errlog=server.stderr)
    return _http_transport(server, config)


@contextlib.asynccontextmanager
async def _http_transport(server: ServerLink, config: MCPServerHTTP) -> AsyncIterator[TransportStreams]:
    import httpx2  # the HTTP client the mcp package is built on
    from mcp.client.streamable_http import streamable_http_client

    async def remember_session(response: httpx2.Response) -> None:  # mcp.session.id, from the header the server assigns
        session_id = response.headers.get("mcp-session-id")
        if session_id:
            server.session_id = session_id
        elif response.status_code == 404 and response.request.headers.get("mcp-session-id"):
            server.session_gone = True  # the spec's signal that the session is over: start a new one

    # The package's own defaults: 30 s to connect or write, 300 s to read (a server may hold a stream open).
    client = httpx2.AsyncClient(headers=dict(config.headers or {}), timeout=httpx2.Timeout(30.0, read=300.0),
                                event_hooks={"response": [remember_session]})
    async with client, streamable_http_client(config.url, http_client=client) as streams:
        yield streams


class Offered(NamedTuple):
    """A tool offered to the model, and the server's listing of it."""

    tool: MCPTool
    listed: Tool


def build_tools(servers: Iterable[ServerLink], taken: frozenset[str], call: CallTool, *,
                warn: bool = True) -> dict[str, Offered]:
    """The servers' tools by the names the model sees (see ``mcp_servers`` on clashes): a tool whose name is taken
    (``taken``, or by an earlier server's) is offered as ``<server>_<tool>``, left out if that is taken too; a tool
    whose input schema is not an object is left out. Each is said (a warning, or at debug level without ``warn``)."""
    said = log.warning if warn else log.debug
    used = set(taken)
    built: dict[str, Offered] = {}
    for server in servers:
        for listed in server.tools:
            name = tool_name(listed.name)
            if name in used:
                name = tool_name(f"{server.label}_{listed.name}")
            if name in used:
                said("mcp_tool_skipped", server=server.label, tool=listed.name,
                     reason=f"the name {name!r} is already taken")
                continue
            schema = listed.input_schema if isinstance(listed.input_schema, dict) else {}
            if schema.get("type", "object") != "object":
                said("mcp_tool_skipped", server=server.label, tool=listed.name,
                     reason="its input schema is not an object, which the Messages API requires")
                continue
            used.add(name)
            built[name] = Offered(_tool(server, listed, name, {"type": "object", **schema}, call), listed)
    return built


def _tool(server: ServerLink, listed: Tool, name: str, schema: dict[str, Any], call: CallTool) -> MCPTool:
    remote = listed.name

    async def call_mcp_tool(**arguments: Any) -> object:
        return await call(server, remote, arguments)

    return MCPTool(name=name, description=listed.description or listed.title or remote, input_schema=schema,
                   fn=call_mcp_tool, needs_approval=approval_for(server.config, remote), server=server.label,
                   remote_name=remote, checker=server.checkers.get(remote))


def not_connected(server: ServerLink) -> str:
    return f"MCP server {server.label!r} is not connected ({server.failure or 'it exited, or closed the connection'})"


def telemetry_for(telemetry: AgentTelemetry | None, config: MCPServer) -> MCPServerTelemetry:
    """Where one server's requests are recorded (``agent_telemetry.mcp_telemetry``), with its transport's names."""
    if isinstance(config, MCPServerStdio):
        return mcp_telemetry(telemetry, server=config.label, transport="pipe")
    parts = urlsplit(config.url)
    return mcp_telemetry(telemetry, server=config.label, transport="tcp", server_address=parts.hostname,
                         server_port=parts.port or (443 if parts.scheme == "https" else 80))


def log_stderr(server: ServerLink) -> None:
    """The server's stderr, at debug level, once it has closed: never on the user's terminal."""
    stream, server.stderr = server.stderr, None
    if stream is None:
        return
    try:
        stream.seek(0)
        lines = stream.read().splitlines()[-STDERR_LINES_LOGGED:]
        server.last_stderr = next((line.strip() for line in reversed(lines) if line.strip()), "")
        for line in lines:
            log.debug("mcp_server_stderr", server=server.label, line=line)
    except Exception:
        pass
    finally:
        stream.close()


def quiet_package_logs() -> None:
    """The mcp package logs what looptrace already says in its own warnings (a line that is not MCP, with a
    traceback): with no handler configured for it anywhere, Python's last-resort handler would print those to the
    terminal. A NullHandler on the package's logger keeps them off; an application's own logging set-up still gets
    them (NullHandler only stands in for the missing handler)."""
    package = logging.getLogger("mcp")
    if not any(isinstance(h, logging.NullHandler) for h in package.handlers):
        package.addHandler(logging.NullHandler())


@contextlib.asynccontextmanager
async def requesting(server: ServerLink, wire: Wire, method: str, *, tool: str | None = None,
                     arguments: object = None) -> AsyncIterator[Pending]:
    """One request: its span current while it is sent, its id and answer watched on the wire; a failure raised
    as ``RequestFailed`` with what the model is told (scrubbed of the call's redacted arguments)."""
    with server.telemetry.request(method, tool=tool, arguments=arguments) as request:
        pending = Pending(method, request.scrub)
        try:
            with wire.sending(pending):
                yield pending
            if pending.tool_error:
                request.failed(TOOL_ERROR)
        except (asyncio.CancelledError, RequestFailed):
            raise
        except Exception as exc:
            failure = failure_of(server.label, tool or method, exc, pending)
            failure = failure._replace(text=request.scrub(failure.text))
            if failure.code is not None:
                request.answered_error(failure.code, failure.message,
                                       capture_content=server.telemetry.capture_content)
            else:
                request.failed(failure.error_type)
            raise RequestFailed(failure, pending) from None
        finally:
            request.sent(pending.request_id)


def settle_ready(ready: asyncio.Future, exc: BaseException) -> None:
    """A connection's start failed (or was cut short): its waiter hears of it, once."""
    if ready.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        exc = MCPServerUnavailable("the connection was closed before it was up")
    ready.set_exception(exc if isinstance(exc, Exception) else MCPServerUnavailable(describe(exc)))


def settle_future(task: asyncio.Task, outcome: concurrent.futures.Future) -> None:
    """A call's task on the connections' loop is done: its caller's future gets the same outcome."""
    if outcome.done():
        return
    if task.cancelled():
        outcome.cancel()
    elif task.exception() is not None:
        outcome.set_exception(task.exception())
    else:
        outcome.set_result(task.result())
