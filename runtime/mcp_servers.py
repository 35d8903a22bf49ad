"""Tools from Model Context Protocol servers, through the official ``mcp`` package (``pip install 'looptrace[mcp]'``).

A server is described by ``MCPServerStdio`` (a command the run starts) or ``MCPServerHTTP`` (a streamable-HTTP URL);
``Agent(mcp_servers=[...])`` offers their tools beside the ``@tool`` functions, as ``MCPTool`` objects, so everything
a Python tool gets applies: validation (here against the server's input schema), the per-tool timeout, content
capture and redaction on the spans, the loop detector, approval.

Lifecycle: per run, unless the application holds the servers (``with agent:`` / ``async with agent:``, see
``mcp_sessions``). The connections themselves are ``mcp_connections``; what passes on the wire, ``mcp_wire``.

Names: ``@tool`` functions first, then each server's tools in the order the servers are given. A tool keeps its own
name (characters the Messages API does not allow become ``_``); a name already taken is offered as
``<server>_<tool>``, and one still taken after that is left out with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from looptrace.runtime import tools as toolkit

# Whether a server's tools wait for approval: all or none, the names of those that do, or a predicate over the tool's
# name (as the server spells it) and the call's arguments.
Approval = bool | Collection[str] | Callable[[str, dict[str, Any]], bool | Awaitable[bool]]

CONNECT_TIMEOUT_S = 30.0
_INVALID_NAME_CHARACTERS = re.compile(r"[^a-zA-Z0-9_-]")
# Commands that run a server named by an argument: the server is named after that argument, not the launcher.
_LAUNCHERS = frozenset({"python", "node", "npx", "uvx", "uv", "deno", "bun", "bunx", "pipx", "docker"})
_LAUNCHER_WORDS = frozenset({"run", "tool", "exec", "-m"})
# Options after which a launcher runs code given inline (`python -c CODE`, `node -e CODE`): nothing to name it after.
_INLINE_CODE = frozenset({"-c", "-e", "--eval", "-p", "--print"})


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

    def __post_init__(self) -> None:
        _check_timeout(self.connect_timeout_s)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        command = Path(self.command).name
        launcher = command.split(".")[0].rstrip("0123456789.")
        if launcher in _LAUNCHERS:  # `npx -y @org/server-x`: server-x
            after_m = False
            for arg in self.args:
                if arg in _INLINE_CODE:  # `python -c "import ..."`: the code is no name
                    return launcher
                if after_m:  # `python -m package.server_x`: a module, named by its last part
                    return arg.rsplit(".", 1)[-1] or command
                after_m = arg == "-m"
                if not arg.startswith("-") and arg not in _LAUNCHER_WORDS:
                    return Path(arg.split("@", 2)[-1] if arg.startswith("@") else arg).stem or command
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

    def __post_init__(self) -> None:
        _check_timeout(self.connect_timeout_s)

    @property
    def label(self) -> str:
        return self.name or urlsplit(self.url).hostname or "mcp"


def _check_timeout(seconds: float) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise ValueError(f"connect_timeout_s must be a positive number of seconds, got {seconds!r}")


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
    # The schema's validator, compiled when the server's list was read (off the run's clock); False when the server
    # sent a schema jsonschema cannot use (the server then validates what it gets); None: compiled on first use.
    checker: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def _validator(self) -> Any:
        if self.checker is None:
            object.__setattr__(self, "checker", compiled_checker(self.input_schema))
        return self.checker

    def validate(self, arguments: Any) -> dict[str, Any]:
        kwargs = super().validate(arguments)  # a JSON object at all
        validator = self._validator
        if validator:
            problems = [_schema_problem(error) for error in
                        sorted(validator.iter_errors(kwargs), key=lambda e: [str(p) for p in e.absolute_path])]
            if problems:
                raise toolkit.InvalidArguments(f"invalid arguments for {self.name}: " + "; ".join(problems))
        return kwargs


def compiled_checker(schema: dict[str, Any]) -> Any:
    """A jsonschema validator for ``schema``, or False when the schema is not one jsonschema can use."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)
    except Exception:  # a schema the server sent malformed: the server still validates what it gets
        return False


def _schema_problem(error: Any) -> str:
    """One schema violation, said without quoting the value the model sent (it may be a secret the spans redact)."""
    where = ".".join(str(part) for part in error.absolute_path) or "arguments"
    kind, expected = error.validator, error.validator_value
    if kind in ("required", "additionalProperties", "dependentRequired"):
        return f"{where}: {error.message}"  # names properties, never values
    if kind == "type":
        return f"{where}: must be of type {expected if isinstance(expected, str) else ' or '.join(expected)}"
    return f"{where}: does not satisfy {kind} {json.dumps(expected, default=str)[:200]}"


def approval_for(config: MCPServer, remote_name: str) -> bool | Callable[[dict[str, Any]], Any]:
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


__all__ = ["MCPServer", "MCPServerHTTP", "MCPServerStdio", "MCPServerUnavailable", "MCPTool", "check_installed",
           "compiled_checker", "tool_name"]
