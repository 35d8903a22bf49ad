"""Connections to MCP servers, through the official ``mcp`` package: started, listed, called, watched and closed.

Each connection is owned from start to close by one task (the ``mcp`` package's task groups must be entered and left
in the task that owns them) on an event loop in a thread of its own, so ``run`` and ``arun`` use them the same way.

A connection is opened by ``connect`` (at creation, and again for one that was lost or never came up). A held stdio
connection is checked with a ``ping`` when it serves another run (``connect(check=True)``; the run does not wait for
the ping, its calls to that server do), and one that does not answer is replaced; an HTTP server that answers 404 to
the session (it restarted) gets a new session, and the request that met the 404 is sent again, once. A server's
output ending (its process exited) is noticed at once by the wire (``mcp_wire``): its later calls fail without being
sent, and the next ``connect`` starts it again.

Failures never end a run: an ``isError`` result, a server that crashed, closed the connection, answered an error of
its own or something that is not MCP becomes an ``is_error`` tool result the model reads, with one warning in the
log; a server that cannot start is left out of the run with one warning. A stdio server's stderr goes to a temporary
file, logged at debug level when the server closes: it never reaches the user's terminal, and neither do the
``mcp`` package's own log records when the application has configured no logging (``_quiet_package_logs``).

Every request looptrace makes is recorded where the run records (``agent_telemetry.mcp_telemetry``); connecting
(``initialize``, ``tools/list``) in a trace of its own.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from looptrace.instrumentation.interface import log
from looptrace.runtime import tools as toolkit
from looptrace.runtime.mcp_failures import RequestFailed, SessionGone, cannot, describe, startup_failure
from looptrace.runtime.mcp_link import (
    ServerLink,
    build_tools,
    log_stderr,
    not_connected,
    open_transport,
    quiet_package_logs,
    requesting,
    settle_future,
    settle_ready,
    telemetry_for,
)
from looptrace.runtime.mcp_results import tool_result
from looptrace.runtime.mcp_servers import MCPServer, MCPServerUnavailable, MCPTool, check_installed, compiled_checker
from looptrace.runtime.mcp_wire import Wire

if TYPE_CHECKING:
    from mcp import ClientSession


REQUEST_GRACE_S = 1.0
CLOSE_TIMEOUT_S = 15.0  # the mcp package stops a stdio server within ~4 s (stdin closed, SIGTERM, SIGKILL)
PING_TIMEOUT_S = 5.0  # a held server that does not answer a ping in this time is busy, not gone: it is kept
STDERR_LINES_LOGGED = 50


class MCPConnections:
    """Connections to ``servers``, connecting on creation (``connect=False``: on the first ``connect``), closed by
    ``close``/``aclose`` (and at interpreter exit, if nobody did). ``version`` grows each time a server's tool list
    is read; ``tools`` builds the MCP tools the model sees."""

    def __init__(self, servers: Iterable[MCPServer], telemetry: Any = None, *,
                 call_timeout_s: float | None = None, connect: bool = True) -> None:
        check_installed()
        quiet_package_logs()
        # The run's per-tool timeout decides what the model is told; the request itself gets a moment longer, then
        # the mcp package gives up on it too and tells the server to stop (a call from run() is not cancellable).
        self._request_timeout_s = None if call_timeout_s is None else call_timeout_s + REQUEST_GRACE_S
        self._servers = [ServerLink(config, config.label, telemetry_for(telemetry, config)) for config in servers]
        self.version = 0
        self._built: tuple[int, frozenset[str], dict[str, MCPTool]] | None = None
        self._offered: tuple[tuple[int, int], Any, dict[str, toolkit.Tool], list[dict[str, Any]]] | None = None
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="looptrace-mcp", daemon=True)
        self._thread.start()
        _open_connections.add(self)
        self._ready = self.connect() if connect else None

    # --- the caller's side --------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def connect(self, timeout_s: float | None = None, *, check: bool = False) -> concurrent.futures.Future[None]:
        """Connect every server that is not connected (one lost is started again), each within its
        ``connect_timeout_s`` and ``timeout_s``; with ``check``, ping each connected one first. Every failure is
        warned about (but a required server's, which ``wait`` raises)."""
        if self.closed:
            raise RuntimeError("these MCP connections are closed")
        return asyncio.run_coroutine_threadsafe(self._connect_all(timeout_s, check), self._loop)

    def wait_ready(self) -> None:
        """Block until the connections made on creation are up or have failed. Raises MCPServerUnavailable for a
        ``required`` server that failed."""
        assert self._ready is not None, "created with connect=False: use connect()"
        self.wait(self._ready)

    async def await_ready(self) -> None:
        assert self._ready is not None, "created with connect=False: use connect()"
        await self.await_(self._ready)

    def wait(self, connecting: concurrent.futures.Future[None]) -> None:
        """Block until ``connecting`` (from ``connect``) is done; MCPServerUnavailable for a required server down."""
        connecting.result()
        self._check_required()

    async def await_(self, connecting: concurrent.futures.Future[None]) -> None:
        await asyncio.wrap_future(connecting)
        self._check_required()

    def _check_required(self) -> None:
        for server in self._servers:
            if server.config.required and server.session is None:
                raise MCPServerUnavailable(f"MCP server {server.label!r} {cannot(server.config)}: {server.failure}")

    def listing(self) -> list[tuple[str, Any, str | None]]:
        """(server name, mcp Tool, the name the model is offered it by, or None) for every tool the connected servers
        list, in their order; then (server name, the tool's name, why it was left out) for those that were not."""
        built = build_tools(self._servers, frozenset(), self.call, warn=False)
        offered = {id(t.listed): name for name, t in built.items()}
        return [(server.label, listed, offered.get(id(listed))) for server in self._servers for listed in server.tools]

    def left_out(self) -> list[tuple[str, str, str]]:
        """(server name, tool name, why) for each tool a server listed that could not be offered at all."""
        return [(server.label, name, why) for server in self._servers for name, why in server.left_out]

    def tools(self, taken: Collection[str] = ()) -> dict[str, MCPTool]:
        """The servers' tools by the names the model sees (see ``mcp_servers`` on clashes), built once per tool list;
        a server whose list changed is asked for it again first (a local round trip, waited for here)."""
        if any(server.stale for server in self._servers) and not self.closed:
            relisting = asyncio.run_coroutine_threadsafe(self._relist_stale(), self._loop)
            try:
                relisting.result(max(s.config.connect_timeout_s for s in self._servers))
            except Exception as exc:
                log.warning("mcp_tool_list_failed", error=describe(exc), hint="the run keeps the tools it had")
        key = frozenset(taken)
        built = self._built
        if built is None or built[0] != self.version or built[1] != key:
            tools = {name: offered.tool for name, offered in build_tools(self._servers, key, self.call).items()}
            built = self._built = (self.version, key, tools)
        return built[2]

    def offered_with(self, own: Mapping[str, toolkit.Tool]) -> tuple[dict[str, toolkit.Tool], list[dict[str, Any]]]:
        """``own`` tools, then the servers' (which yield on a clash), and their definitions: the same two objects run
        after run while the tool lists stay the same (so a span encodes the definitions once, not per run)."""
        servers_tools = self.tools(taken=own)
        key = (self.version, id(own))
        offered = self._offered
        if offered is None or offered[0] != key or offered[1] is not own:
            tools: dict[str, toolkit.Tool] = {**own, **servers_tools}
            offered = self._offered = (key, own, tools, [t.definition() for t in tools.values()])
        return offered[2], offered[3]

    async def call(self, server: ServerLink, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool from any event loop; the call runs on the connections' loop, in the caller's context (so its
        span opens under the caller's execute_tool span)."""
        if self.closed:
            raise toolkit.ToolError(f"{name} was not run: the MCP servers of this run are closed")
        context = contextvars.copy_context()
        outcome: concurrent.futures.Future = concurrent.futures.Future()

        def start() -> None:
            task = self._loop.create_task(self._call(server, name, arguments), context=context)
            task.add_done_callback(lambda done: settle_future(done, outcome))
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
            if self.closed:
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
        the cancellation through: a server must not outlive what holds it."""
        closing = asyncio.ensure_future(asyncio.to_thread(self.close))
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            self.close()
            raise

    # --- connecting, on the connections' loop ---------------------------------------------------------------------

    async def _connect_all(self, timeout_s: float | None, check: bool) -> None:
        await asyncio.gather(*(self._ensure(server, timeout_s, check) for server in self._servers))

    async def _ensure(self, server: ServerLink, timeout_s: float | None, check: bool) -> None:
        """``server`` connected, or failed (said). A held stdio one is checked in the background: the run does not
        wait for the ping (its first model call hides it), its calls to that server do (``_call``). A held HTTP one
        needs no ping: a server that lost the session says so (404) to the next request, which opens a new one."""
        if server.session is not None and not server.lost:
            if check and server.is_stdio and (server.checking is None or server.checking.done()):
                server.checking = asyncio.ensure_future(self._check(server, timeout_s))
            return
        await self._connecting(server, timeout_s)

    async def _connecting(self, server: ServerLink, timeout_s: float | None) -> None:
        if server.connecting is None or server.connecting.done():
            server.connecting = asyncio.ensure_future(self._connect(server, timeout_s))
        await asyncio.shield(server.connecting)

    async def _check(self, server: ServerLink, timeout_s: float | None) -> None:
        """A held connection that no longer answers a ping is replaced by a new one."""
        if not await self._answers(server):
            await self._drop(server)
            await self._connecting(server, timeout_s)

    async def _answers(self, server: ServerLink) -> bool:
        """Whether a held connection still answers (one ``ping``): an error means it is gone; a slow answer, busy."""
        session = server.session
        if session is None:
            return False
        try:
            await asyncio.wait_for(session.send_ping(), PING_TIMEOUT_S)
        except TimeoutError:
            log.debug("mcp_ping_slow", server=server.label, timeout_s=PING_TIMEOUT_S)
            return True
        except Exception as exc:
            log.warning("mcp_server_lost", server=server.label, error=describe(exc),
                        hint="it is connected again for this run")
            return False
        return True

    async def _drop(self, server: ServerLink) -> None:
        """Stop a connection that no longer answers (said already), and wait (bounded) for its task to end."""
        server.closing = True
        if server.stop is not None:
            server.stop.set()
        if server.keeper is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(server.keeper), CLOSE_TIMEOUT_S)

    async def _connect(self, server: ServerLink, timeout_s: float | None) -> None:
        """Start ``server``'s connection and wait until it is up or has failed (said in one warning)."""
        limit = server.config.connect_timeout_s
        if timeout_s is not None and timeout_s < limit:
            limit = max(timeout_s, 0.0)
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        # A start cut short by the close is not an error anyone must hear about: read it, so it is never reported
        # as "never retrieved" when the loop shuts down first.
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        server.failure, server.lost, server.closing, server.garbled, server.session_gone = None, False, False, 0, False
        server.stop = stop = asyncio.Event()
        server.keeper = asyncio.create_task(self._keep(server, stop, ready, limit))
        try:
            await asyncio.shield(ready)
        except TimeoutError:
            server.failure = f"it did not answer within {limit:g} s" + (
                "" if limit == server.config.connect_timeout_s else " (what was left of the run's timeout_s)")
        except Exception as exc:
            server.failure = startup_failure(exc, server.config) + (
                f" (its stderr: {server.last_stderr[:300]})" if server.last_stderr else "")
        # A required one is raised, not warned; one cut short by the close is nobody's concern.
        if server.failure is not None and not server.config.required and not self.closed:
            log.warning("mcp_server_unavailable", server=server.label, error=server.failure,
                        hint="the run goes on without its tools")

    async def _keep(self, server: ServerLink, stop: asyncio.Event, ready: asyncio.Future, limit: float) -> None:
        """Own one connection from start to close, in this one task (the mcp package's task groups require it);
        ``stop`` set ends it."""
        opened_at: float | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                server.starting = True
                try:
                    with server.telemetry.connecting():
                        async with asyncio.timeout(limit):
                            await self._open(stack, server, stop)
                except BaseException as exc:  # the waiting run hears of it now; stopping the process comes after
                    settle_ready(ready, exc)
                    raise
                finally:
                    # From here the task must not be cancelled again: a second cancellation would cut short the
                    # package's stop of the server process (stdin closed, SIGTERM, SIGKILL), and leave it running.
                    server.starting = False
                opened_at = time.monotonic()
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:
            settle_ready(ready, exc)
            if opened_at is not None and not isinstance(exc, asyncio.CancelledError) and not server.closing:
                server.lost, server.failure = True, describe(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if server.keeper is asyncio.current_task():  # not a connection replaced since (see _drop)
                self._ended(server, opened_at)

    async def _open(self, stack: contextlib.AsyncExitStack, server: ServerLink, stop: asyncio.Event) -> None:
        from mcp import ClientSession

        read, write = await stack.enter_async_context(open_transport(server))
        wire = Wire(read, write, on_closed=lambda: self._on_closed(server, stop))
        session = await stack.enter_async_context(ClientSession(
            wire.incoming, wire.outgoing, message_handler=lambda message: self._on_message(server, message)))
        async with requesting(server, wire, "initialize"):
            initialized = await session.initialize()
        server.protocol_version = wire.protocol_version = initialized.protocol_version
        server.telemetry.session(session_id=server.session_id, protocol_version=server.protocol_version)
        server.wire = wire
        await self._list(server, session)
        server.session = session

    def _on_closed(self, server: ServerLink, stop: asyncio.Event) -> None:
        """The server's output ended (its process exited): the connection is over, whatever was under way."""
        if stop is not server.stop:  # an earlier connection's, already replaced
            return
        if not server.closing:
            server.lost = True
            if server.failure is None:
                server.failure = "it exited, or closed the connection"
        stop.set()

    def _ended(self, server: ServerLink, opened_at: float | None) -> None:
        lost = server.lost and not server.closing
        server.session = server.wire = None
        if opened_at is not None:
            server.telemetry.session_ended(time.monotonic() - opened_at, "connection_closed" if lost else None)
        log_stderr(server)
        if lost and opened_at is not None:
            # Its stderr is not quoted here, as it is for a server that cannot start: after calls, it may quote their
            # arguments (it is logged at debug level, above).
            log.warning("mcp_server_lost", server=server.label, error=server.failure or "it went away",
                        hint="its calls fail for the rest of this run; the next run connects to it again")

    async def _on_message(self, server: ServerLink, message: Any) -> None:
        from mcp import types

        if isinstance(message, types.ToolListChangedNotification):
            # Noted at once, listed when the run next builds its tools: the notification may be handled just after
            # the call that caused it returned, but never after the next turn begins.
            server.stale = True
            self.version += 1
        elif isinstance(message, Exception):  # a line from the server that is not MCP: said once a connection
            server.garbled += 1
            (log.warning if server.garbled == 1 else log.debug)(
                "mcp_server_garbled", server=server.label, error=describe(message),
                hint="it wrote something that is not MCP; later such lines are logged at debug level")

    async def _list(self, server: ServerLink, session: ClientSession) -> None:
        """Read the server's tool list (every page), note the tools left out of it, compile each input schema's
        validator (here, off the run's clock), and bump ``version``."""
        from mcp import types

        assert server.wire is not None
        listed: list[Any] = []
        left_out: list[tuple[str, str]] = []
        cursor: str | None = None
        while True:
            async with requesting(server, server.wire, "tools/list") as pending:
                page = await session.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            listed.extend(page.tools)
            left_out.extend(pending.left_out)
            cursor = page.next_cursor
            if not cursor:
                break
        for name, why in left_out:
            log.warning("mcp_tool_skipped", server=server.label, tool=name, reason=why)
        server.checkers = {t.name: compiled_checker(t.input_schema) for t in listed
                           if isinstance(t.input_schema, dict)}
        server.tools, server.left_out = listed, left_out
        self.version += 1

    async def _relist_stale(self) -> None:
        for server in self._servers:
            if server.stale and server.session is not None:
                server.stale = False
                try:
                    await self._list(server, server.session)
                except Exception as exc:
                    log.warning("mcp_tool_list_failed", server=server.label, error=describe(exc))

    # --- requests ---------------------------------------------------------------------------------------------------

    async def _call(self, server: ServerLink, name: str, arguments: dict[str, Any]) -> Any:
        checking = server.checking
        if checking is not None and not checking.done():  # a held connection is being checked: it may be replaced
            await asyncio.shield(checking)
        try:
            return await self._call_once(server, name, arguments)
        except SessionGone:
            # The request reached no session: the HTTP server answered 404 to it. As the spec says, a new session is
            # opened, and the request sent on it, once.
            log.info("mcp_session_renewed", server=server.label, tool=name)
            await self._drop(server)
            await self._connecting(server, None)
            return await self._call_once(server, name, arguments, renewed=True)

    async def _call_once(self, server: ServerLink, name: str, arguments: dict[str, Any], *,
                         renewed: bool = False) -> Any:
        session, wire = server.session, server.wire
        if session is None or wire is None:
            problem = not_connected(server)
            log.warning("mcp_call_failed", server=server.label, tool=name, error=problem)
            raise toolkit.ToolError(problem)
        try:
            async with requesting(server, wire, "tools/call", tool=name, arguments=arguments) as sent:
                result = await session.call_tool(name, arguments, read_timeout_seconds=self._request_timeout_s)
                sent.tool_error = bool(result.is_error)
        except asyncio.CancelledError:
            log.warning("mcp_call_abandoned", server=server.label, tool=name,
                        reason="the call was cancelled (its time ran out, or the run ended)")
            raise
        except RequestFailed as failed:
            if server.session_gone and not renewed and not self.closed:
                raise SessionGone from None
            problem = failed.failure.text
            if not failed.pending.written and failed.failure.error_type == "connection_closed":
                # The connection was over before the request could go (its end not yet handled): not sent, said as
                # for a server known to be gone, whichever came first.
                problem = not_connected(server)
            if self.closed:  # run() gave up on it (its time ran out) and the run has ended since
                log.warning("mcp_call_abandoned", server=server.label, tool=name,
                            reason="the run ended before the server answered (the call's time had run out)")
            else:
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
            server.closing = True
            if server.stop is not None:
                server.stop.set()
            if server.starting and server.keeper is not None:  # still starting: stop it starting
                server.keeper.cancel()
        pending: list[asyncio.Future[Any]] = [s.keeper for s in self._servers if s.keeper is not None]
        pending += [s.connecting for s in self._servers if s.connecting is not None]
        pending += [s.checking for s in self._servers if s.checking is not None]
        await asyncio.gather(*pending, return_exceptions=True)


# --- safety net ---------------------------------------------------------------------------------------------------

_open_connections: set[MCPConnections] = set()


def _close_left_open() -> None:
    """At interpreter exit, servers nobody closed (a held agent never closed, a process exiting mid-run) are
    stopped."""
    for connections in list(_open_connections):
        connections.close()


atexit.register(_close_left_open)

__all__ = ["MCPConnections"]
