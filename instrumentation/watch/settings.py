"""What `looptrace watch` runs with: `WatchSettings`, built from the one `Settings` object plus the command's flags.

Nothing here reads the environment. The entry point reads it once, into a `Settings`, and hands that to
`WatchSettings.from_settings`, which takes auth, content capture and the alert webhook from it; every other field is
a flag's value or its default. An override is always a value: ``grpc_port=None`` means "no gRPC listener", never
"keep the default".

A value that cannot work raises `WatchSettingError`, whose message names settings as placeholders so that the CLI
can say ``--grpc-port`` where a library caller reads ``grpc_port``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..settings import Settings

MAX_PORT = 65_535


class WatchSettingError(ValueError):
    """A `WatchSettings` value that cannot work.

    ``template`` names each setting as ``{field_name}`` (and "no gRPC" as ``{no_grpc}``): ``describe`` fills them in
    with whatever names the reader knows, field names by default (``str(error)``), flag names in the CLI.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.describe(FIELD_NAMES))

    def describe(self, names: Mapping[str, str]) -> str:
        return self.template.format_map(names)


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """The receivers' addresses and limits, the run watcher's bounds, and what senders must present."""

    host: str = "127.0.0.1"
    port: int = 4318  # OTLP/HTTP's standard port: pointing an exporter at watch is changing only the host
    grpc_port: int | None = 4317  # None: no gRPC listener; 0 (like port=0): any free port
    idle_timeout_s: float = 300.0
    max_open_runs: int = 10_000
    max_request_bytes: int = 8 * 1024 * 1024  # as sent (compressed)
    max_decompressed_bytes: int = 64 * 1024 * 1024
    queue_batches: int = 1024  # export requests waiting for the detector; beyond it spans are rejected
    capture_content: bool = True
    bearer_token: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    alert_webhook: str | None = field(default=None, repr=False)  # the URL is the credential

    def __post_init__(self) -> None:
        _check_port(self.port, "{port}", "")
        if self.grpc_port is not None:
            _check_port(self.grpc_port, "{grpc_port}", " or {no_grpc} for no gRPC")
            if self.grpc_port == self.port != 0:
                raise WatchSettingError(f"{{port}} and {{grpc_port}} are both {self.port}: OTLP/HTTP and OTLP/gRPC "
                                        "need a port each")
        if not (math.isfinite(self.idle_timeout_s) and self.idle_timeout_s >= 0):
            raise WatchSettingError(f"{{idle_timeout_s}} {self.idle_timeout_s} is not a number of seconds (0 or more)")
        for name in ("max_open_runs", "max_request_bytes", "max_decompressed_bytes", "queue_batches"):
            value = getattr(self, name)
            if value < 1:
                raise WatchSettingError(f"{{{name}}} {value} is not a positive whole number")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> WatchSettings:
        """Auth, content capture and the alert webhook from ``settings``; any field, those included, from
        ``overrides``, taken as given (``grpc_port=None`` turns gRPC off)."""
        values: dict[str, Any] = {"bearer_token": settings.watch_token, "basic_auth": settings.watch_basic_auth,
                                  "capture_content": settings.capture_content, "alert_webhook": settings.alert_webhook}
        return cls(**{**values, **overrides})

    @property
    def requires_auth(self) -> bool:
        return self.bearer_token is not None or self.basic_auth is not None


def _check_port(value: int, name: str, alternative: str) -> None:
    if not 0 <= value <= MAX_PORT:
        raise WatchSettingError(f"{name} {value} is not a port number (0-{MAX_PORT}, 0 for any free one"
                                f"{',' if alternative else ''}{alternative})")


FIELD_NAMES: dict[str, str] = {f.name: f.name for f in fields(WatchSettings)} | {"no_grpc": "None"}
