"""What a failed MCP request or connection means: for the model (the text of its is_error result), for the span
(``error.type``) and for the log, said without what a server's answer may quote of the call's arguments."""

from __future__ import annotations

from typing import NamedTuple

from looptrace.runtime import tools as toolkit
from looptrace.runtime.mcp_servers import MCPServer, MCPServerHTTP, MCPServerStdio
from looptrace.runtime.mcp_wire import Pending, validation_summary


class Failure(NamedTuple):
    text: str  # what the model reads, and the warning says
    error_type: str  # the span's error.type
    code: int | None = None  # the server's own JSON-RPC error code, when it answered one
    message: str = ""  # its message (already scrubbed)


class SessionGone(Exception):
    """A request reached no session: an HTTP server answered 404 (it no longer knows the session)."""


class RequestFailed(Exception):
    def __init__(self, failure: Failure, pending: Pending) -> None:
        super().__init__(failure.text)
        self.failure, self.pending = failure, pending


def failure_of(label: str, what: str, exc: BaseException, pending: Pending) -> Failure:
    """What a failed request means, for the model and the span: the server's own error (whatever its code), a
    closed connection, a timeout, an answer that is not MCP."""
    from mcp import types
    from mcp.shared.exceptions import MCPError
    from pydantic import ValidationError

    if isinstance(exc, MCPError):
        if pending.unreadable is not None:
            return Failure(f"MCP server {label!r} answered {what} with something that is not MCP "
                           f"({pending.unreadable})", "invalid_response")
        if pending.answered_code is not None:  # the server's own error, -32000 and -32001 included
            return Failure(f"MCP server {label!r} answered {what} with error {exc.code}: {exc.error.message}",
                           str(exc.code), exc.code, exc.error.message)
        if exc.code == types.CONNECTION_CLOSED:
            return Failure(f"MCP server {label!r} closed the connection during {what} (it may have crashed); "
                           "its tools are unavailable for the rest of this run", "connection_closed")
        if exc.code == types.REQUEST_TIMEOUT:
            return Failure(f"MCP server {label!r} did not answer {what} in time", "timeout")
        return Failure(f"MCP server {label!r} failed during {what}: {exc.error.message}", str(exc.code))
    if isinstance(exc, ValidationError):
        return Failure(f"MCP server {label!r} answered {what} with something that is not a valid MCP result: "
                       f"{validation_summary(exc)}", "invalid_response")
    return Failure(f"MCP server {label!r} failed during {what}: {describe(exc)}", type(exc).__qualname__)


def cannot(config: MCPServer) -> str:
    return "cannot start" if isinstance(config, MCPServerStdio) else "cannot be reached"


def startup_failure(exc: BaseException, config: MCPServer) -> str:
    from mcp import types
    from mcp.shared.exceptions import MCPError

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, RequestFailed):
        exc = exc.__context__ or exc
    if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
        return "it exited (or closed the connection) before it answered"
    if isinstance(config, MCPServerHTTP) and isinstance(exc, MCPError) and exc.code == types.METHOD_NOT_FOUND:
        return f"{config.url} answered 404 Not Found: is it the server's MCP endpoint (often ending in /mcp)?"
    if isinstance(config, MCPServerHTTP) and type(exc).__name__ in ("ConnectError", "ConnectTimeout"):
        return f"nothing answers at {config.url} ({describe(exc)})"
    return describe(exc)


def describe(exc: BaseException) -> str:
    """The innermost meaningful error of an exception group (the mcp package's task groups wrap them), said without
    the input a parsing error quotes (a server's answer may echo the arguments)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if callable(getattr(exc, "errors", None)) and type(exc).__name__ == "ValidationError":
        return f"{type(exc).__name__}: {validation_summary(exc)}"
    return toolkit.error_text(exc)


__all__ = ["Failure", "RequestFailed", "SessionGone", "cannot", "describe", "failure_of", "startup_failure"]
