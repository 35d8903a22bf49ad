"""`looptrace mcp list --mcp "COMMAND ARGS" --mcp-url URL`: what MCP servers offer, before anything runs; and the
`--mcp` / `--mcp-url` / `--mcp-connect-timeout` flags `looptrace run` shares with it.

What a server says of its tools (names, descriptions, argument names) is shown with every character a terminal would
act on (control characters, escape sequences, line breaks in a name) written as an escape: a server cannot move the
cursor, ring the bell or forge lines of the listing."""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from looptrace.cli.common import UsageError
from looptrace.cli.exit_codes import exit_code_help

if TYPE_CHECKING:
    from looptrace.runtime import MCPServer


def add_mcp_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mcp", action="append", default=[], metavar="'COMMAND ARGS'",
                        help="an MCP server to start over stdio, as one quoted command line; repeat for more")
    parser.add_argument("--mcp-url", action="append", default=[], metavar="URL",
                        help="an MCP server already running, over streamable HTTP; repeat for more")
    parser.add_argument("--mcp-connect-timeout", type=_seconds, default=CONNECT_TIMEOUT_S, metavar="S",
                        help="how long each MCP server may take to start and answer (default: %(default)s); a run's "
                             "--timeout bounds it too")


CONNECT_TIMEOUT_S = 30.0  # MCPServerStdio's and MCPServerHTTP's default


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value < math.inf:  # refuses nan too
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def servers_from(args: argparse.Namespace) -> list[MCPServer]:
    """The servers the flags name, each required: one that cannot start is a usage error, said in one line."""
    if not (args.mcp or args.mcp_url):
        return []
    try:
        from looptrace.runtime import MCPServerHTTP, MCPServerStdio, check_installed

        check_installed()
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    timeout = getattr(args, "mcp_connect_timeout", None) or CONNECT_TIMEOUT_S
    servers: list[MCPServer] = []
    for line in args.mcp:
        try:
            servers.append(MCPServerStdio.parse(line, required=True, connect_timeout_s=timeout))
        except ValueError as exc:
            raise UsageError(f"--mcp {line!r}: {exc}") from None
    for url in args.mcp_url:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--mcp-url {url!r}: give an http:// or https:// URL")
        try:
            servers.append(MCPServerHTTP(url, required=True, connect_timeout_s=timeout))
        except ValueError as exc:
            raise UsageError(f"--mcp-url {url!r}: {exc}") from None
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
    from looptrace.runtime import MCPConnections, MCPServerUnavailable

    servers = servers_from(args)
    if not servers:
        raise UsageError("name a server: --mcp 'COMMAND ARGS' or --mcp-url URL")
    connections = MCPConnections(servers)
    try:
        connections.wait_ready()
        for server, listed, offered in connections.listing():
            _print_tool(server, listed, offered)
        for server, name, why in connections.left_out():
            print(f"{shown(server)}  {shown(name)}  (not offered: {shown(why)})")
    except MCPServerUnavailable as exc:
        raise UsageError(str(exc)) from None
    finally:
        connections.close()
    sys.stdout.flush()
    return 0


def _print_tool(server: str, listed: Any, offered: str | None) -> None:
    """One tool: the name the model would see (the server's own, unless the Messages API's rules or a clash change
    it), its description and its arguments."""
    renamed = (f"  (offered to the model as {offered})" if offered and offered != listed.name
               else "  (not offered: its name is taken)" if offered is None else "")
    print(f"{shown(server)}  {shown(listed.name)}{renamed}")
    description = shown(" ".join((listed.description or "").split()))
    if description:
        print(textwrap.indent(textwrap.fill(description, 100), "    "))
    schema = listed.input_schema if isinstance(listed.input_schema, dict) else {}
    parameters = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema["required"] if isinstance(schema.get("required"), list) else []
    if parameters:
        print("    arguments: " + ", ".join(f"{shown(str(name))}{'' if name in required else '?'}: "
                                         f"{shown(_type_of(value))}" for name, value in parameters.items()))


def shown(text: str) -> str:
    """``text`` with every character that is not printable (control characters, escape sequences, line breaks)
    written as its Python escape, so that what a server sent cannot act on the terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _type_of(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    return str(kind or "any")
