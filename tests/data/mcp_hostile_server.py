"""A misbehaving MCP server for the hostile tests, written with the mcp package's low-level ``Server``.

    python mcp_hostile_server.py stdio [--list bad|names] [--garbage-first]
    python mcp_hostile_server.py http PORT_FILE     # streamable HTTP on 127.0.0.1, port 0; the port goes to PORT_FILE

Its tools misbehave on request: quoting their arguments back in a JSON-RPC error, an isError result or an answer
that is not a valid MCP result; answering JSON-RPC errors of the server-error range themselves (-32000, -32001);
writing bytes that are not UTF-8, or lines that are not MCP. The package's server checks what it sends, so what no
honest server built on it could send (a tool list with input schemas MCP does not allow, a result of the wrong
shape) is written over the wire by a shim between the server and its stdout (``_Rewriting``), stdio only.

Environment: HOSTILE_LIST=bad adds tools with input schemas MCP does not allow (a root that is not an object,
``properties`` that is not an object, a schema nested 200 levels); HOSTILE_LIST=names adds tools named with control
characters and escape sequences, and a second tool named ``echo``; HOSTILE_GARBAGE_FIRST=1 writes a line that is not
UTF-8 and one that is not MCP before it answers anything (the flags ``--list`` and ``--garbage-first`` say the same,
for a command line, where the client passes on no environment); MCP_TEST_PID_FILE gets the process id.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ObjectSendStream
from mcp import types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

MALFORMED = "__malformed__"  # a result carrying this is rewritten into one that is not MCP, quoting the arguments
OBJECT = {"type": "object", "properties": {"password": {"type": "string"}, "note": {"type": "string"}}}


def _listed() -> list[types.Tool]:
    tools = [types.Tool(name=name, description=description, input_schema=OBJECT) for name, description in (
        ("echo", "Says back what it got."),
        ("quote_error", "Answers a JSON-RPC error (-32602) that quotes its arguments."),
        ("quote_tool_error", "Answers isError with a text that quotes its arguments."),
        ("malformed", "Answers something that is not a valid MCP result, quoting its arguments."),
        ("bad_byte", "Writes a line that is not UTF-8, then answers."),
        ("noise", "Writes three lines that are not MCP, then answers."),
    )]
    tools.append(types.Tool(name="own_error", description="Answers the JSON-RPC error `code` itself.",
                            input_schema={"type": "object", "properties": {"code": {"type": "integer"}}}))
    if os.environ.get("HOSTILE_LIST") == "names":
        tools.append(types.Tool(name="evil\x1b[31mred\x07\nforged  line", description="Bell\x07 and\x1b[2J clear.",
                                input_schema={"type": "object", "properties": {"a\x1b[1mb": {"type": "string"}}}))
        tools.append(types.Tool(name="echo", description="A second tool named echo.", input_schema=OBJECT))
    return tools


def _bad_tools() -> list[dict[str, Any]]:
    deep: dict[str, Any] = {"type": "object"}
    inner = deep
    for _ in range(200):
        inner["properties"] = {"x": {"type": "object"}}
        inner = inner["properties"]["x"]
    return [{"name": "root_string", "inputSchema": {"type": "string"}},
            {"name": "properties_number", "inputSchema": {"type": "object", "properties": 5}},
            {"name": "deep", "inputSchema": deep}]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=_listed())


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    quoted = json.dumps(arguments)
    name = params.name
    if name == "quote_error":
        raise MCPError(code=-32602, message=f"cannot handle {quoted}")
    if name == "own_error":
        code = int(arguments.get("code", -32000))
        raise MCPError(code=code, message=f"the server's own error {code}: the backend is busy")
    if name == "quote_tool_error":
        return types.CallToolResult(content=[types.TextContent(text=f"refused {quoted}")], is_error=True)
    if name == "malformed":
        return types.CallToolResult(content=[types.TextContent(text=MALFORMED + quoted)])
    if name == "bad_byte":
        _write_raw(b"\xff\xfe\xfd not utf-8\n")
        return types.CallToolResult(content=[types.TextContent(text="still here")])
    if name == "noise":
        for line in (b"starting up...\n", b"DEBUG: something\n", b"{not json\n"):
            _write_raw(line)
        return types.CallToolResult(content=[types.TextContent(text="after the noise")])
    return types.CallToolResult(content=[types.TextContent(text=f"got {quoted}")])


server = Server("looptrace-hostile", on_list_tools=list_tools, on_call_tool=call_tool)

# --- stdio, with the shim that writes what the package's server would refuse to ---------------------------------

_WIRE: tuple[int, int] | None = None  # (device, inode) of the pipe stdout was at start


def _wire_fd() -> int:
    """The descriptor the protocol goes out on (the package moves it off fd 1)."""
    for fd in range(3, 256):
        try:
            stat = os.fstat(fd)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) == _WIRE:
            return fd
    return 1


def _write_raw(data: bytes) -> None:
    os.write(_wire_fd(), data)


class _Rewriting(ObjectSendStream[SessionMessage]):
    """The server's write stream: a tool list gets the bad tools (HOSTILE_LIST=bad), a result marked MALFORMED is
    replaced by one that is not MCP. Both are written as raw lines (the package would check them)."""

    def __init__(self, inner: ObjectSendStream[SessionMessage]) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        result = getattr(message, "result", None)
        if isinstance(message, types.JSONRPCResponse) and isinstance(result, dict):
            raw = self._rewritten(message.id, result)
            if raw is not None:
                _write_raw(raw)
                return
        await self._inner.send(item)

    @staticmethod
    def _rewritten(request_id: Any, result: dict[str, Any]) -> bytes | None:
        if "tools" in result and os.environ.get("HOSTILE_LIST") == "bad":
            result = {**result, "tools": [*result["tools"], *_bad_tools()]}
        else:
            content = result.get("content") or [{}]
            text = content[0].get("text", "") if isinstance(content[0], dict) else ""
            if not text.startswith(MALFORMED):
                return None
            result = {"content": [{"type": "text", "text": json.loads(text[len(MALFORMED):])}]}
        return (json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n").encode()

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _serve_stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        if os.environ.get("HOSTILE_GARBAGE_FIRST"):
            _write_raw(b"\xff\xfe not utf-8 before anything\n")
            _write_raw(b"Welcome! (not MCP either)\n")
        await server.run(read, _Rewriting(write), server.create_initialization_options())


async def _serve_http(port_file: Path) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    port_file.write_text(str(sock.getsockname()[1]))
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    global _WIRE
    if "--list" in sys.argv:
        os.environ["HOSTILE_LIST"] = sys.argv[sys.argv.index("--list") + 1]
    if "--garbage-first" in sys.argv:
        os.environ["HOSTILE_GARBAGE_FIRST"] = "1"
    pid_file = os.environ.get("MCP_TEST_PID_FILE")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    stdout = os.fstat(1)
    _WIRE = (stdout.st_dev, stdout.st_ino)
    if sys.argv[1:2] == ["http"]:
        asyncio.run(_serve_http(Path(sys.argv[2])))
    else:
        anyio.run(_serve_stdio)


if __name__ == "__main__":
    main()
