"""An Agent's MCP servers: connected for each run, or held by the application across runs.

Per run (the default): each ``run``/``arun``/``resume`` connects to every server before its first turn and closes them
all when it ends, however it ends (a result, an exception, Ctrl-C, a cancelled ``arun``): a stdio server's process
never outlives its run.

Held: between ``with agent:`` (or ``async with agent:``) and its end, or ``agent.close()``, the servers are connected
once and every run and resume of the agent uses the same connections, as the OpenAI Agents SDK does with ``async with
MCPServerStdio(...)``. A server that died is started again by the next run: a stdio server's exit is seen at once (its
output ends), and each run also pings each held stdio server (one round trip, in the background: the run does not wait
for it, a call to that server does); an HTTP server that lost the session (it restarted) answers the next request 404,
and that request is sent again on a new session, as the MCP spec says. A server that could not start before is tried
again before the run begins. A server's tool list is read once and kept until it says
``notifications/tools/list_changed``. Held servers are closed when the application says so, and at interpreter exit if
it never did.

Either way, connecting counts on the run's clock: it is bounded by what is left of ``Limits.timeout_s`` (as well as
by each server's ``connect_timeout_s``), and the time it took is part of the run's time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from looptrace.runtime import tools as toolkit
from looptrace.runtime.mcp_connections import MCPConnections
from looptrace.runtime.mcp_servers import MCPServer


class RunServers:
    """One run's use of its agent's MCP connections: its tools, and how long it waited for them."""

    __slots__ = ("connections", "owned", "waited_s")

    def __init__(self, connections: MCPConnections, *, owned: bool, waited_s: float) -> None:
        self.connections = connections
        self.owned = owned  # connected for this run alone: closed when it ends
        self.waited_s = waited_s

    @property
    def version(self) -> int:
        """Grows each time a server's tool list is read: a run whose version is behind builds its tools again."""
        return self.connections.version

    def tools_with(self, own: Mapping[str, toolkit.Tool]) -> tuple[dict[str, toolkit.Tool], list[dict[str, Any]]]:
        """The run's tools (``own`` first, then the servers', which yield on a clash) and their definitions."""
        return self.connections.offered_with(own)

    def done(self) -> None:
        """The run ended: connections made for it alone are closed (their processes stopped); held ones stay."""
        if self.owned:
            self.connections.close()

    async def adone(self) -> None:
        if self.owned:
            await self.connections.aclose()


class MCPSessions:
    """The MCP servers of one Agent, connected per run unless held (``hold`` ... ``release`` or ``close``)."""

    def __init__(self, servers: Sequence[MCPServer], telemetry: Any, *, call_timeout_s: float | None) -> None:
        self._servers = tuple(servers)
        self._telemetry = telemetry
        self._call_timeout_s = call_timeout_s
        self._held: MCPConnections | None = None
        self._holders = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        return self._held is not None and not self._held.closed

    def hold(self) -> None:
        """Connect every server now, and keep the connections for every run until ``release``/``close``. Raises
        MCPServerUnavailable (holding nothing) when a required server cannot be connected."""
        connections = self._take_hold()
        if connections is not None:
            try:
                connections.wait_ready()
            except BaseException:
                self.close()
                raise

    async def ahold(self) -> None:
        connections = self._take_hold()
        if connections is not None:
            try:
                await connections.await_ready()
            except BaseException:
                await self.aclose()
                raise

    def _take_hold(self) -> MCPConnections | None:
        """One more holder; the connections to wait for when this is the first."""
        with self._lock:
            self._holders += 1
            if self.held:
                return None
            self._held = MCPConnections(self._servers, self._telemetry, call_timeout_s=self._call_timeout_s)
            return self._held

    def release(self) -> None:
        """One holder less; the last one closes the connections."""
        with self._lock:
            self._holders = max(self._holders - 1, 0)
            last = self._holders == 0
        if last:
            self.close()

    async def arelease(self) -> None:
        with self._lock:
            self._holders = max(self._holders - 1, 0)
            last = self._holders == 0
        if last:
            await self.aclose()

    def close(self) -> None:
        """Close the held connections (stopping every server process they started), whoever else holds them."""
        connections = self._let_go()
        if connections is not None:
            connections.close()

    async def aclose(self) -> None:
        connections = self._let_go()
        if connections is not None:
            await connections.aclose()

    def _let_go(self) -> MCPConnections | None:
        with self._lock:
            connections, self._held, self._holders = self._held, None, 0
            return connections

    # --- per run --------------------------------------------------------------------------------------------------

    def for_run(self, timeout_s: float | None) -> RunServers:
        """The connections a run uses, up (or failed, said) within ``timeout_s``: the held ones, checked, or new ones
        of its own. Raises MCPServerUnavailable when a required server is down."""
        connections, owned = self._connections_for_run()
        started = time.monotonic()
        try:
            connections.wait(connections.connect(timeout_s, check=not owned))
        except BaseException:
            if owned:
                connections.close()
            raise
        return RunServers(connections, owned=owned, waited_s=time.monotonic() - started)

    async def afor_run(self, timeout_s: float | None) -> RunServers:
        connections, owned = self._connections_for_run()
        started = time.monotonic()
        try:
            await connections.await_(connections.connect(timeout_s, check=not owned))
        except BaseException:
            if owned:
                await connections.aclose()
            raise
        return RunServers(connections, owned=owned, waited_s=time.monotonic() - started)

    def _connections_for_run(self) -> tuple[MCPConnections, bool]:
        held = self._held
        if held is not None and not held.closed:
            return held, False
        return MCPConnections(self._servers, self._telemetry, call_timeout_s=self._call_timeout_s,
                              connect=False), True


__all__ = ["MCPSessions", "RunServers"]
