"""The `looptrace watch` command, apart from its parser: flags checked, settings built, the service run.

The CLI reads the environment once, into a `Settings`, sets up service logging, and calls `watch_command` with
the settings and the parsed flags. Every flag, port or address that cannot work ends here as one line on
stderr naming the flag, and exit code 2; no traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from .intake import GRPC, ListenError
from .service import serve
from .settings import FIELD_NAMES, WatchSettingError, WatchSettings
from .sinks import langfuse_scores

if TYPE_CHECKING:
    from ..settings import Settings

EXIT_OK = 0
EXIT_USAGE = 2  # as every looptrace command: a bad flag, or (here) a port already taken
NO_GRPC = -1  # --grpc-port -1: no gRPC listener
PROGRAM = "looptrace watch"

# The flag that sets each field, for messages: the CLI's names, not the library's.
FLAGS: dict[str, str] = {**FIELD_NAMES, "host": "--host", "port": "--port", "grpc_port": "--grpc-port",
                         "idle_timeout_s": "--idle-timeout", "max_open_runs": "--max-open-runs",
                         "max_request_bytes": "--max-request-bytes",
                         "max_decompressed_bytes": "--max-decompressed-bytes", "no_grpc": str(NO_GRPC)}


def watch_command(settings: Settings, *, host: str, port: int, grpc_port: int, idle_timeout_s: float,
                  max_open_runs: int, max_request_bytes: int, max_decompressed_bytes: int,
                  stderr: TextIO | None = None) -> int:
    """Serve until SIGTERM or SIGINT (exit 0), or say in one line which flag cannot work (exit 2).

    ``settings`` is the environment as the entry point read it; the flags override the fields they name, and
    ``grpc_port=-1`` means no gRPC listener.
    """
    try:
        watch_settings = WatchSettings.from_settings(
            settings, host=host, port=port, grpc_port=None if grpc_port == NO_GRPC else grpc_port,
            idle_timeout_s=idle_timeout_s, max_open_runs=max_open_runs, max_request_bytes=max_request_bytes,
            max_decompressed_bytes=max_decompressed_bytes)
    except WatchSettingError as exc:
        return _usage_error(exc.describe(FLAGS), stderr)
    try:
        return serve(watch_settings, scores=langfuse_scores(settings))
    except ListenError as exc:
        return _usage_error(listen_error_line(exc), stderr)


def listen_error_line(error: ListenError) -> str:
    """A port that cannot be had, said by the flag that chose it: ``--grpc-port 4317: Address already in use``."""
    if error.unknown_host:
        return f"--host {error.host}: {error.reason}"
    flag = FLAGS["grpc_port"] if error.transport == GRPC else FLAGS["port"]
    return f"{flag} {error.port}: {error.reason} ({error.transport} on {error.host}:{error.port})"


def _usage_error(message: str, stderr: TextIO | None) -> int:
    print(f"{PROGRAM}: error: {message}", file=stderr if stderr is not None else sys.stderr)
    return EXIT_USAGE
