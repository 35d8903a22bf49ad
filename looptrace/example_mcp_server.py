"""A small MCP server to try MCP tools with: notes kept in memory while it runs.

    python -m looptrace.example_mcp_server                  # over stdio, as a run starts it
    python -m looptrace.example_mcp_server --http 8000      # streamable HTTP on http://127.0.0.1:8000/mcp

Written with the mcp package's own server API (``pip install 'looptrace[mcp]'``); it is an example, not a store.
Without the package, run as a program it says what to install in one line (exit code 2).
"""

from __future__ import annotations

import sys

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError as missing:
    if __name__ == "__main__":
        sys.stderr.write("looptrace.example_mcp_server needs the mcp package: pip install 'looptrace[mcp]'\n")
        sys.exit(2)
    raise ImportError("looptrace.example_mcp_server needs the mcp package: pip install 'looptrace[mcp]'") from missing

server = MCPServer("looptrace-notes")
_notes: dict[str, str] = {}


@server.tool()
def add_note(title: str, text: str) -> str:
    """Save a note under a title (replacing a note of the same title)."""
    if not title.strip():
        raise ToolError("a note needs a title")
    _notes[title] = text
    return f"saved {title!r}"


@server.tool()
def search_notes(query: str) -> str:
    """Notes whose title or text contains the query, one per line as 'title: text'."""
    found = [f"{title}: {text}" for title, text in _notes.items() if query.lower() in f"{title} {text}".lower()]
    return "\n".join(found) or f"no note mentions {query!r}"


def main(argv: list[str]) -> None:
    if argv[:1] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
