"""A real MCP server for the tests, written with the mcp package's own server API (MCPServer, formerly FastMCP).

    python mcp_test_server.py stdio [--pid-file PATH]
    python mcp_test_server.py http PORT_FILE [PORT]  # streamable HTTP on 127.0.0.1, port 0 (or PORT, to come back
                                                     # where a killed one was); the port goes to PORT_FILE

Environment: MCP_TEST_PID_FILE gets the process id at start; MCP_TEST_MARKS (a directory) gets a file per tool call
started ("<tool>.started"), so a test knows a call is under way, and a line per ``initialize`` request the process
answered ("initialize.log": its process id); MCP_TEST_OTLP (an OTLP/HTTP traces URL) turns on
OpenTelemetry in this process, exporting the server's own spans there.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import sys
import zlib
from pathlib import Path
from typing import Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def _setup_tracing() -> None:
    endpoint = os.environ.get("MCP_TEST_OTLP")
    if not endpoint:
        return
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "mcp-test-server"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)


class _CountInitialize:
    """Notes each initialize request this process answers (the server-side proof that a session was reused)."""

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        marks = os.environ.get("MCP_TEST_MARKS")
        if ctx.method == "initialize" and marks:
            with open(Path(marks, "initialize.log"), "a", encoding="utf-8") as log:
                log.write(f"{os.getpid()}\n")
        return await call_next(ctx)


_setup_tracing()
server = MCPServer("looptrace-test", middleware=[_CountInitialize()])


def _mark(tool: str) -> None:
    marks = os.environ.get("MCP_TEST_MARKS")
    if marks:
        Path(marks, f"{tool}.started").write_text(str(os.getpid()))


def _png(width: int = 2, height: int = 2) -> bytes:
    """A tiny valid PNG (red pixels), built by hand so the server needs no imaging library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    _mark("add")
    return str(a + b)


@server.tool()
def pid() -> str:
    """The server's process id."""
    _mark("pid")
    return str(os.getpid())


@server.tool()
def lookup(city: str) -> str:
    """Look up a city (always answers the same: the loop tests call it over and over)."""
    _mark("lookup")
    return f"no data for {city}"


@server.tool()
def fail(reason: str) -> str:
    """Always fails, as a tool error (isError)."""
    _mark("fail")
    raise ToolError(f"cannot do that: {reason}")


@server.tool()
def crash() -> str:
    """Ends the server process in the middle of the call."""
    _mark("crash")
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answers."""
    _mark("hang")
    await asyncio.sleep(3600)
    return "unreachable"


@server.tool()
async def garble() -> str:
    """Writes a line that is not JSON-RPC where the answer should go, then never answers."""
    _mark("garble")
    os.write(_wire_fd(), b"this is not json-rpc\n")
    await asyncio.sleep(3600)
    return "unreachable"


_WIRE: tuple[int, int] | None = None  # (device, inode) of the pipe stdout was at start


def _wire_fd() -> int:
    """The descriptor the server writes its protocol to: the mcp package moves it off fd 1 (so a stray print cannot
    corrupt the stream), and a server that is to misbehave on purpose has to find it again."""
    for fd in range(3, 256):
        try:
            stat = os.fstat(fd)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) == _WIRE:
            return fd
    return 1


@server.tool()
def picture() -> list[types.ContentBlock]:
    """A small PNG image and a caption."""
    _mark("picture")
    data = base64.b64encode(_png()).decode()
    return [types.TextContent(text="a red square"), types.ImageContent(data=data, mime_type="image/png")]


@server.tool()
def document() -> list[types.ContentBlock]:
    """An embedded text resource."""
    _mark("document")
    return [types.EmbeddedResource(resource=types.TextResourceContents(
        uri="file:///notes/today.md", mime_type="text/markdown", text="# Today\nship it"))]


@server.tool(structured_output=True)
def forecast(city: str) -> dict[str, object]:
    """Structured weather data."""
    _mark("forecast")
    return {"city": city, "celsius": 21}


@server.tool()
async def unlock(ctx: Context) -> str:
    """Adds the tool `secret_door` and tells the client its tool list changed."""
    _mark("unlock")

    def secret_door() -> str:
        """Behind the door."""
        return "treasure"

    server.add_tool(secret_door)
    await ctx.session.send_tool_list_changed()
    return "a new tool is available"


@server.tool()
async def authorized(ctx: Context) -> str:
    """Whether the request carried the tests' bearer token (streamable HTTP only)."""
    _mark("authorized")
    headers = ctx.headers or {}
    return "yes" if headers.get("authorization") == "Bearer test-token" else "no"


@server.tool(name="notes.search")
def notes_search(query: str) -> str:
    """A dotted name, as MCP allows and the Messages API does not."""
    _mark("notes.search")
    return f"found 1 note for {query}"


def main() -> None:
    pid_file = os.environ.get("MCP_TEST_PID_FILE")
    if "--pid-file" in sys.argv:  # for a command line, where the client passes no environment of the caller's
        pid_file = sys.argv[sys.argv.index("--pid-file") + 1]
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    global _WIRE
    stdout = os.fstat(1)
    _WIRE = (stdout.st_dev, stdout.st_ino)
    print("test server starting", file=sys.stderr)  # stderr chatter the client must keep off the terminal
    if sys.argv[1:2] == ["http"]:
        asyncio.run(_serve_http(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0))
    else:
        server.run("stdio")


async def _serve_http(port_file: Path, port: int) -> None:
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    port_file.write_text(str(sock.getsockname()[1]))
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    main()
