"""`looptrace mcp list --mcp "COMMAND ARGS" --mcp-url URL`: what MCP servers offer, before anything runs; and the
`--mcp` / `--mcp-url` flags `looptrace run` shares with it."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from looptrace.cli.common import UsageError
from looptrace.cli.exit_codes import exit_code_help

if TYPE_CHECKING:
    from looptrace.runtime.mcp_servers import MCPServer


def add_mcp_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mcp", action="append", default=[], metavar="'COMMAND ARGS'",
                        help="an MCP server to start over stdio, as one quoted command line; repeat for more")
    parser.add_argument("--mcp-url", action="append", default=[], metavar="URL",
                        help="an MCP server already running, over streamable HTTP; repeat for more")


def servers_from(args: argparse.Namespace) -> list[MCPServer]:
    """The servers the flags name, each required: one that cannot start is a usage error, said in one line."""
    if not (args.mcp or args.mcp_url):
        return []
    try:
        from looptrace.runtime.mcp_servers import MCPServerHTTP, MCPServerStdio, check_installed

        check_installed()
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    servers: list[MCPServer] = []
    for line in args.mcp:
        try:
            servers.append(MCPServerStdio.parse(line, required=True))
        except ValueError as exc:
            raise UsageError(f"--mcp {line!r}: {exc}") from None
    for url in args.mcp_url:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--mcp-url {url!r}: give an http:// or https:// URL")
        servers.append(MCPServerHTTP(url, required=True))
    return servers


def add_mcp_command(commands: Any) -> None:
    mcp = commands.add_parser("mcp", help="what MCP servers offer (looptrace mcp list --mcp 'COMMAND ARGS')",
                              epilog=exit_code_help("mcp list"), formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = mcp.add_subparsers(dest="mcp_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="start or reach the servers and list their tools, then stop them",
        description="Start (--mcp) or reach (--mcp-url) MCP servers, list each tool with its description, its "
                    "arguments and the name the model would see, then stop them. A server that cannot start is "
                    "one line and exit code 2.",
        epilog=exit_code_help("mcp list"), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_mcp_flags(listing)
    listing.set_defaults(command_parser=listing, handler=list_command)


def list_command(args: argparse.Namespace) -> int:
    from looptrace.runtime.mcp_servers import MCPConnections, MCPServerUnavailable

    servers = servers_from(args)
    if not servers:
        raise UsageError("name a server: --mcp 'COMMAND ARGS' or --mcp-url URL")
    connections = MCPConnections(servers)
    try:
        connections.wait_ready()
        # The names the model would see: the server's own, unless the Messages API's rules or a clash change them.
        offered = {(t.server, t.remote_name): name for name, t in connections.tools().items()}
        for server, listed in connections.listing():
            shown = offered.get((server, listed.name))
            renamed = (f"  (offered to the model as {shown})" if shown and shown != listed.name
                       else "  (not offered: its name is taken)" if shown is None else "")
            print(f"{server}  {listed.name}{renamed}")
            description = " ".join((listed.description or "").split())
            if description:
                print(textwrap.indent(textwrap.fill(description, 100), "    "))
            parameters = (listed.input_schema or {}).get("properties") or {}
            required = set((listed.input_schema or {}).get("required") or ())
            if parameters:
                print("    arguments: " + ", ".join(f"{name}{'' if name in required else '?'}: {_type_of(schema)}"
                                                 for name, schema in parameters.items()))
    except MCPServerUnavailable as exc:
        raise UsageError(str(exc)) from None
    finally:
        connections.close()
    sys.stdout.flush()
    return 0


def _type_of(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    return str(kind or "any")
