"""Tools from Model Context Protocol servers, through the official ``mcp`` package (``pip install 'looptrace[mcp]'``).

A server is described by ``MCPServerStdio`` (a command the run starts) or ``MCPServerHTTP`` (a streamable-HTTP URL);
``Agent(mcp_servers=[...])`` offers their tools beside the ``@tool`` functions, as ``Tool`` objects, so everything a
Python tool gets applies: validation (here against the server's input schema), the per-tool timeout, content capture
and redaction on the spans, the loop detector, approval.

Lifecycle: per run. A run connects to every server before its first turn and closes them all when it ends, however
it ends (a result, an exception, Ctrl-C, a cancelled ``arun``): a stdio server's process never outlives its run. The
connections live on one event loop in a thread of their own, so ``run`` and ``arun`` share them the same way and the
``mcp`` package's task groups are entered and left in the one task that owns them.

Names: ``@tool`` functions first, then each server's tools in the order the servers are given. A tool keeps its own
name (characters the Messages API does not allow become ``_``); a name already taken is offered as
``<server>_<tool>``, and one still taken after that is left out with a warning.

Failures never end a run: an ``isError`` result, a server that crashed, closed the connection or answered something
that is not MCP becomes an ``is_error`` tool result the model reads, with one warning in the log; a server that cannot
start is left out of the run with one warning. A stdio server's stderr goes to a temporary file, logged at debug level
when the server closes: it never reaches the user's terminal.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import json
import re
import shlex
import threading
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

from looptrace.instrumentation.agent_telemetry import mcp_call_scope
from looptrace.instrumentation.interface import log
from looptrace.runtime import tools as toolkit
from looptrace.runtime.mcp_results import tool_result

if TYPE_CHECKING:
    from mcp import ClientSession

# Whether a server's tools wait for approval: all or none, the names of those that do, or a predicate over the tool's
# name (as the server spells it) and the call's arguments.
Approval = bool | Collection[str] | Callable[[str, dict[str, Any]], bool | Awaitable[bool]]

CONNECT_TIMEOUT_S = 30.0
REQUEST_GRACE_S = 1.0
CLOSE_TIMEOUT_S = 15.0  # the mcp package stops a stdio server within ~4 s (stdin closed, SIGTERM, SIGKILL)
STDERR_LINES_LOGGED = 50
_INVALID_NAME_CHARACTERS = re.compile(r"[^a-zA-Z0-9_-]")
# Commands that run a server named by an argument: the server is named after that argument, not the launcher.
_LAUNCHERS = frozenset({"python", "node", "npx", "uvx", "uv", "deno", "bun", "bunx", "pipx", "docker"})
_LAUNCHER_WORDS = frozenset({"run", "tool", "exec", "-m"})


@dataclasses.dataclass(frozen=True)
class MCPServerStdio:
    """A server the run starts as a subprocess and speaks to over its stdin and stdout.

    ``env`` is added to the few variables the mcp package passes on (PATH, HOME, ...): a server sees no API keys of
    yours unless you give them. ``name`` (default: the command's file name) names the server in warnings, on spans
    and in renamed tools.
    """

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = dataclasses.field(default=None, repr=False)
    cwd: str | None = None
    name: str | None = None
    needs_approval: Approval = False
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    required: bool = False  # True: a run does not begin without this server (MCPServerUnavailable is raised)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        command = Path(self.command).name
        if command.split(".")[0].rstrip("0123456789.") in _LAUNCHERS:  # `npx -y @org/server-x`: server-x
            script = next((arg for arg in self.args if not arg.startswith("-") and arg not in _LAUNCHER_WORDS), None)
            if script:
                return Path(script.split("@", 2)[-1] if script.startswith("@") else script).stem or command
        return command or "mcp"

    @classmethod
    def parse(cls, command_line: str, **options: Any) -> MCPServerStdio:
        """From one shell-quoted line, as ``looptrace run --mcp "npx -y @scope/server /tmp"`` takes it."""
        words = shlex.split(command_line)
        if not words:
            raise ValueError("an MCP server command is empty")
        return cls(command=words[0], args=tuple(words[1:]), **options)


@dataclasses.dataclass(frozen=True)
class MCPServerHTTP:
    """A server already running, reached over streamable HTTP at ``url``. ``headers`` (an Authorization header, say)
    go with every request and appear nowhere else."""

    url: str
    headers: Mapping[str, str] | None = dataclasses.field(default=None, repr=False)
    name: str | None = None
    needs_approval: Approval = False
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    required: bool = False  # True: a run does not begin without this server (MCPServerUnavailable is raised)

    @property
    def label(self) -> str:
        return self.name or urlsplit(self.url).hostname or "mcp"


MCPServer = MCPServerStdio | MCPServerHTTP


class MCPServerUnavailable(Exception):
    """A server could not be started or connected to."""


def check_installed() -> None:
    """A clear error, at Agent construction, when the mcp package is missing."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ImportError("MCP servers need the mcp package: pip install 'looptrace[mcp]'") from None


# --- tools --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MCPTool(toolkit.Tool):
    """A server's tool: arguments are checked against the server's input schema (JSON Schema) before the call."""

    server: str = ""
    remote_name: str = ""  # the name the server knows it by

    @property
    def _validator(self) -> Any:
        cached = self.__dict__.get("_schema_validator")
        if cached is None:
            import jsonschema

            try:
                cls = jsonschema.validators.validator_for(self.input_schema)
                cls.check_schema(self.input_schema)
                cached = cls(self.input_schema)
            except Exception:  # a schema the server sent malformed: the server still validates what it gets
                cached = False
            object.__setattr__(self, "_schema_validator", cached)
        return cached

    def validate(self, arguments: Any) -> dict[str, Any]:
        kwargs = super().validate(arguments)  # a JSON object at all
        validator = self._validator
        if validator:
            problems = [_schema_problem(error) for error in
                        sorted(validator.iter_errors(kwargs), key=lambda e: [str(p) for p in e.absolute_path])]
            if problems:
                raise toolkit.InvalidArguments(f"invalid arguments for {self.name}: " + "; ".join(problems))
        return kwargs


def _schema_problem(error: Any) -> str:
    """One schema violation, said without quoting the value the model sent (it may be a secret the spans redact)."""
    where = ".".join(str(part) for part in error.absolute_path) or "arguments"
    kind, expected = error.validator, error.validator_value
    if kind in ("required", "additionalProperties", "dependentRequired"):
        return f"{where}: {error.message}"  # names properties, never values
    if kind == "type":
        return f"{where}: must be of type {expected if isinstance(expected, str) else ' or '.join(expected)}"
    return f"{where}: does not satisfy {kind} {json.dumps(expected, default=str)[:200]}"


def _approval_for(config: MCPServer, remote_name: str) -> bool | Callable[[dict[str, Any]], Any]:
    rule = config.needs_approval
    if isinstance(rule, bool):
        return rule
    if callable(rule):
        predicate = rule

        def needs_approval(arguments: dict[str, Any]) -> bool | Awaitable[bool]:
            return predicate(remote_name, arguments)
        return needs_approval
    return remote_name in rule


def tool_name(name: str) -> str:
    """A name the Messages API accepts (``^[a-zA-Z0-9_-]{1,64}$``); MCP allows dots and slashes and longer names."""
    return _INVALID_NAME_CHARACTERS.sub("_", name)[:64] or "_"


# --- connections --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Server:
    config: MCPServer
    label: str
    transport: str  # network.transport: "pipe" for stdio, "tcp" for HTTP
    session: ClientSession | None = None
    tools: list[Any] = dataclasses.field(default_factory=list)
    failure: str | None = None
    protocol_version: str | None = None
    session_id: str | None = None
    stderr: TextIO | None = None
    stale: bool = False  # the server said its tool list changed; not listed again yet
    last_stderr: str = ""  # the last line the server wrote to stderr, for the reason it could not start
    stop: asyncio.Event | None = None
    keeper: asyncio.Task | None = None


class MCPConnections:
    """The servers of one run: connected on creation (in a thread of their own), closed by ``close``/``aclose``.

    ``version`` grows each time a server's tool list changes; ``tools`` builds the run's MCP tools.
    """

    def __init__(self, servers: Iterable[MCPServer], telemetry: Any = None, *,
                 call_timeout_s: float | None = None) -> None:
        check_installed()
        self._telemetry = telemetry
        # The run's per-tool timeout decides what the model is told; the request itself gets a moment longer, then
        # the mcp package gives up on it too and tells the server to stop (a call from run() is not cancellable).
        self._request_timeout_s = None if call_timeout_s is None else call_timeout_s + REQUEST_GRACE_S
        self._servers = [_Server(config, config.label, "pipe" if isinstance(config, MCPServerStdio) else "tcp")
                         for config in servers]
        self.version = 0
        self._connecting: list[asyncio.Future] = []
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="looptrace-mcp", daemon=True)
        self._thread.start()
        self._ready = asyncio.run_coroutine_threadsafe(self._connect_all(), self._loop)
        _open_connections.add(self)

    # --- the caller's side --------------------------------------------------------------------------------------

    def wait_ready(self) -> None:
        """Block until every server is connected or has failed (each failure already warned about). Raises
        MCPServerUnavailable for a ``required`` server that failed."""
        self._ready.result()
        self._check_required()

    async def await_ready(self) -> None:
        await asyncio.wrap_future(self._ready)
        self._check_required()

    def _check_required(self) -> None:
        for server in self._servers:
            if server.config.required and server.session is None:
                raise MCPServerUnavailable(f"MCP server {server.label!r} cannot start: {server.failure}")

    def listing(self) -> list[tuple[str, Any]]:
        """(server name, mcp Tool) for every tool the connected servers offer, as they list them."""
        return [(server.label, t) for server in self._servers for t in server.tools]

    def tools(self, taken: Collection[str] = ()) -> dict[str, MCPTool]:
        """The servers' tools by the names the model sees (see the module's note on clashes); a server whose list
        changed is asked for it again first (a local round trip, waited for here)."""
        if any(server.stale for server in self._servers) and not self._closed.is_set():
            relisting = asyncio.run_coroutine_threadsafe(self._relist_stale(), self._loop)
            try:
                relisting.result(max(s.config.connect_timeout_s for s in self._servers))
            except Exception as exc:
                log.warning("mcp_tool_list_failed", error=_describe(exc), hint="the run keeps the tools it had")
        used = set(taken)
        built: dict[str, MCPTool] = {}
        for server in self._servers:
            for listed in server.tools:
                name = tool_name(listed.name)
                if name in used:
                    name = tool_name(f"{server.label}_{listed.name}")
                if name in used:
                    log.warning("mcp_tool_skipped", server=server.label, tool=listed.name,
                                reason=f"the name {name!r} is already taken")
                    continue
                schema = listed.input_schema if isinstance(listed.input_schema, dict) else {}
                if schema.get("type", "object") != "object":
                    log.warning("mcp_tool_skipped", server=server.label, tool=listed.name,
                                reason="its input schema is not an object, which the Messages API requires")
                    continue
                used.add(name)
                built[name] = self._tool(server, listed, name, {"type": "object", **schema})
        return built

    def _tool(self, server: _Server, listed: Any, name: str, schema: dict[str, Any]) -> MCPTool:
        remote = listed.name

        async def call_mcp_tool(**arguments: Any) -> Any:
            return await self.call(server, remote, arguments)

        return MCPTool(name=name, description=listed.description or listed.title or remote, input_schema=schema,
                       fn=call_mcp_tool, needs_approval=_approval_for(server.config, remote), server=server.label,
                       remote_name=remote)

    async def call(self, server: _Server, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool from any event loop; the call runs on the connections' loop, in the caller's context (so the
        mcp package's client span opens under the caller's execute_tool span)."""
        if self._closed.is_set():
            raise toolkit.ToolError(f"{name} was not run: the MCP servers of this run are closed")
        context = contextvars.copy_context()
        outcome: concurrent.futures.Future = concurrent.futures.Future()

        def start() -> None:
            task = self._loop.create_task(self._call(server, name, arguments), context=context)
            task.add_done_callback(lambda done: _settle_future(done, outcome))
            # The caller gave up (its timeout, a cancelled arun): cancel the request on its own loop's thread.
            outcome.add_done_callback(lambda f: self._loop.call_soon_threadsafe(task.cancel) if f.cancelled() else None)

        try:
            self._loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop closed in between
            raise toolkit.ToolError(f"{name} was not run: the MCP servers of this run are closed") from None
        return await asyncio.wrap_future(outcome)

    def close(self) -> None:
        """Close every connection and stop every server process. Idempotent; bounded; safe from any thread."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            _open_connections.discard(self)
            try:
                stopping = asyncio.run_coroutine_threadsafe(self._close_all(), self._loop)
                stopping.result(CLOSE_TIMEOUT_S)
            except Exception as exc:
                log.warning("mcp_close_failed", error=toolkit.error_text(exc))
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(CLOSE_TIMEOUT_S)
                if not self._thread.is_alive():
                    self._loop.close()

    async def aclose(self) -> None:
        """``close`` from a coroutine, on a thread. Cancelled while closing, it finishes the close before it lets
        the cancellation through: a server must not outlive the run."""
        closing = asyncio.ensure_future(asyncio.to_thread(self.close))
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            self.close()
            raise

    # --- the connections' loop ----------------------------------------------------------------------------------

    async def _connect_all(self) -> None:
        self._connecting = [asyncio.ensure_future(self._connect(server)) for server in self._servers]
        await asyncio.gather(*self._connecting)

    async def _connect(self, server: _Server) -> None:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        # A start cut short by the close is not an error anyone must hear about: read it, so it is never reported
        # as "never retrieved" when the loop shuts down first.
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        server.stop = asyncio.Event()
        server.keeper = asyncio.create_task(self._keep(server, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), server.config.connect_timeout_s)
        except TimeoutError:
            server.failure = f"it did not answer within {server.config.connect_timeout_s:g} s"
            server.keeper.cancel()
            await asyncio.gather(server.keeper, return_exceptions=True)
        except Exception as exc:
            server.failure = _startup_failure(exc) + (f" (its stderr: {server.last_stderr[:300]})"
                                               if server.last_stderr else "")
        if server.failure is not None and not server.config.required:  # a required one is raised, not warned
            log.warning("mcp_server_unavailable", server=server.label, error=server.failure,
                        hint="the run goes on without its tools")

    async def _keep(self, server: _Server, ready: asyncio.Future) -> None:
        """Own one connection from start to close, in this one task (the mcp package's task groups require it)."""
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(server))
                session = await stack.enter_async_context(ClientSession(
                    read, write, message_handler=lambda message: self._on_message(server, message)))
                initialized = await session.initialize()
                server.protocol_version = initialized.protocol_version
                server.tools = await _list_tools(session)
                server.session = session
                ready.set_result(None)
                assert server.stop is not None
                await server.stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else MCPServerUnavailable(_describe(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                server.failure = _describe(exc)
                log.warning("mcp_server_lost", server=server.label, error=server.failure)
            if not isinstance(exc, Exception):
                raise
        finally:
            server.session = None
            _log_stderr(server)

    def _transport(self, server: _Server) -> contextlib.AbstractAsyncContextManager[Any]:
        config = server.config
        if isinstance(config, MCPServerStdio):
            import tempfile

            from mcp.client.stdio import StdioServerParameters, stdio_client

            # Closed by _log_stderr once the server has stopped: it must outlive this function.
            server.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
            parameters = StdioServerParameters(command=config.command, args=list(config.args),
                                               env=dict(config.env) if config.env else None, cwd=config.cwd)
            return stdio_client(parameters, errlog=server.stderr)
        return self._http_transport(server, config)

    @contextlib.asynccontextmanager
    async def _http_transport(self, server: _Server, config: MCPServerHTTP) -> Any:
        import httpx2  # the HTTP client the mcp package is built on
        from mcp.client.streamable_http import streamable_http_client

        async def remember_session(response: Any) -> None:  # mcp.session.id, from the header the server assigns
            session_id = response.headers.get("mcp-session-id")
            if session_id:
                server.session_id = session_id

        # The package's own defaults: 30 s to connect or write, 300 s to read (a server may hold a stream open).
        client = httpx2.AsyncClient(headers=dict(config.headers or {}), timeout=httpx2.Timeout(30.0, read=300.0),
                                    event_hooks={"response": [remember_session]})
        async with client, streamable_http_client(config.url, http_client=client) as streams:
            yield streams

    async def _on_message(self, server: _Server, message: Any) -> None:
        from mcp import types

        if isinstance(message, types.ToolListChangedNotification):
            # Noted at once, listed when the run next builds its tools: the notification may be handled just after
            # the call that caused it returned, but never after the next turn begins.
            server.stale = True
            self.version += 1
        elif isinstance(message, Exception):  # a line from the server that is not MCP
            log.warning("mcp_server_garbled", server=server.label, error=_describe(message))

    async def _relist_stale(self) -> None:
        for server in self._servers:
            if server.stale and server.session is not None:
                server.stale = False
                try:
                    server.tools = await _list_tools(server.session)
                except Exception as exc:
                    log.warning("mcp_tool_list_failed", server=server.label, error=_describe(exc))

    async def _call(self, server: _Server, name: str, arguments: dict[str, Any]) -> Any:
        from mcp.shared.exceptions import MCPError

        session = server.session
        if session is None:
            problem = f"MCP server {server.label!r} is not connected" + (
                f" ({server.failure})" if server.failure else "")
            log.warning("mcp_call_failed", server=server.label, tool=name, error=problem)
            raise toolkit.ToolError(problem)
        address, port = _address_of(server.config)
        try:
            with mcp_call_scope(self._telemetry, transport=server.transport, session_id=server.session_id,
                                protocol_version=server.protocol_version, tool=name, server_address=address,
                                server_port=port):
                result = await session.call_tool(name, arguments, read_timeout_seconds=self._request_timeout_s)
        except asyncio.CancelledError:
            log.warning("mcp_call_abandoned", server=server.label, tool=name,
                        reason="the call was cancelled (its time ran out, or the run ended)")
            raise
        except MCPError as exc:
            problem = _mcp_error_text(server, name, exc)
            # A call still waiting when the run closes its servers was abandoned already (and said so): no warning.
            (log.debug if self._closed.is_set() else log.warning)("mcp_call_failed", server=server.label, tool=name,
                                                                 error=problem)
            raise toolkit.ToolError(problem) from None
        except Exception as exc:  # an answer that is not a valid MCP result, a transport failure
            problem = f"MCP server {server.label!r} failed during {name}: {_describe(exc)}"
            log.warning("mcp_call_failed", server=server.label, tool=name, error=problem)
            raise toolkit.ToolError(problem) from None
        converted = tool_result(result)
        if result.is_error:
            # The tool's own words may quote what it was sent (a token in a URL): they go to the model and, with
            # content capture, to the tool span, where redaction applies; the log line says only that it happened.
            log.warning("mcp_tool_error", server=server.label, tool=name,
                        error_chars=len(toolkit.result_text(converted)),
                        hint="the model got the tool's error as an is_error result; its text is on the tool span")
            raise toolkit.ToolError(toolkit.result_text(converted) if converted else
                                    f"{name} reported an error without a message")
        return converted

    async def _close_all(self) -> None:
        for server in self._servers:
            if server.stop is not None:
                server.stop.set()
            if server.session is None and server.keeper is not None:  # still starting: stop it starting
                server.keeper.cancel()
        keepers = [s.keeper for s in self._servers if s.keeper is not None]
        await asyncio.gather(*keepers, *self._connecting, return_exceptions=True)


async def _list_tools(session: ClientSession) -> list[Any]:
    from mcp import types

    listed: list[Any] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return listed


def _settle_future(task: asyncio.Task, outcome: concurrent.futures.Future) -> None:
    if outcome.done():
        return
    if task.cancelled():
        outcome.cancel()
    elif task.exception() is not None:
        outcome.set_exception(task.exception())
    else:
        outcome.set_result(task.result())


def _startup_failure(exc: BaseException) -> str:
    from mcp import types
    from mcp.shared.exceptions import MCPError

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
        return "it exited (or closed the connection) before it answered"
    return _describe(exc)


def _mcp_error_text(server: _Server, name: str, exc: Any) -> str:
    from mcp import types

    if exc.code == types.CONNECTION_CLOSED:
        return (f"MCP server {server.label!r} closed the connection during {name} (it may have crashed); "
                "its tools are unavailable for the rest of this run")
    if exc.code == types.REQUEST_TIMEOUT:
        return f"MCP server {server.label!r} did not answer {name} in time"
    return f"MCP server {server.label!r} answered {name} with error {exc.code}: {exc.error.message}"


def _address_of(config: MCPServer) -> tuple[str | None, int | None]:
    if isinstance(config, MCPServerStdio):
        return None, None
    parts = urlsplit(config.url)
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _describe(exc: BaseException) -> str:
    """The innermost meaningful error of an exception group (the mcp package's task groups wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return toolkit.error_text(exc)


def _log_stderr(server: _Server) -> None:
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


# --- safety net ---------------------------------------------------------------------------------------------------

_open_connections: set[MCPConnections] = set()


def _close_left_open() -> None:
    """At interpreter exit, servers a run could not close (the process is going down mid-run) are stopped."""
    for connections in list(_open_connections):
        connections.close()


atexit.register(_close_left_open)

__all__ = ["MCPConnections", "MCPServer", "MCPServerHTTP", "MCPServerStdio", "MCPServerUnavailable", "MCPTool",
           "check_installed", "tool_name"]
