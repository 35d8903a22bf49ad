"""What the receivers share: the intake they hand decoded spans to, and the error for a port they cannot have."""

from __future__ import annotations

import os
import socket
from typing import Protocol

from ..tracefile.read import SpanRecord
from .metrics import WatchMetrics
from .settings import WatchSettings

HTTP, GRPC = "OTLP/HTTP", "OTLP/gRPC"


class Intake(Protocol):
    """The receivers' side of `WatchServer`: its settings, its counters, and a queue that answers at once."""

    settings: WatchSettings
    metrics: WatchMetrics

    def submit(self, spans: list[SpanRecord]) -> tuple[int, str]: ...


class ListenError(OSError):
    """A receiver could not listen where it was told: the port is taken, not ours to take, or the host unknown."""

    def __init__(self, transport: str, host: str, port: int, cause: OSError | None) -> None:
        self.transport = transport
        self.host = host
        self.port = port
        self.unknown_host = isinstance(cause, socket.gaierror)
        self.reason = _reason(cause) if cause is not None else "the gRPC server could not bind it"
        message = f"cannot listen for {transport} on {host}:{port}: {self.reason}"
        super().__init__(cause.errno if cause is not None else None, message)

    def __str__(self) -> str:
        return str(self.strerror)


def _reason(cause: OSError) -> str:
    # The system's words for the errno ("Address already in use"), without what Python appends to them.
    if cause.errno and not isinstance(cause, socket.gaierror):
        return os.strerror(cause.errno)
    return cause.strerror or str(cause)


def why_unavailable(host: str, port: int) -> OSError | None:
    """What the operating system says when (host, port) is listened on, found by trying it (without SO_REUSEPORT, so
    a port another process holds is never "available"). None when the address can be had."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.create_server((host, port), family=family):
            return None
    except OSError as exc:
        return exc
