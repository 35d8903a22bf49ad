"""`looptrace watch`: an OTLP receiver that runs the loop detector over any agent's traces as they arrive.

Any app or collector sends it traces (OTLP/HTTP at /v1/traces, protobuf or JSON, gzip or deflate; OTLP/gRPC). The
package is a transport in front of a run watcher you can drive in process:

- ``watcher``: `RunWatcher`, spans in, runs assembled and judged, anomalies out to the sink it is given; no sockets.
- ``server``: `WatchServer`, the receivers and the worker thread that feeds the watcher from a bounded queue;
  ``http_receiver`` and ``grpc_receiver`` are the two listeners, ``auth`` checks senders, ``decoding`` turns bodies
  into span records within size caps, ``intake`` is what the listeners share (and `ListenError`).
- ``metrics``: `WatchMetrics`, watch's own series on GET /metrics.
- ``sinks``: the anomaly fan-out, as for the agent's own anomalies (alerts.py): a structured log line, the webhook
  (LOOPTRACE_ALERT_WEBHOOK), a Langfuse score on the trace when LANGFUSE_* keys are set.
- ``settings``: `WatchSettings`, built from the one `Settings` object and the flags; nothing here reads the
  environment. ``service`` (`serve`) runs the server until SIGTERM; ``command`` is the CLI command's logic
  (`watch_command`).

Safety: binds 127.0.0.1 unless told otherwise; LOOPTRACE_WATCH_TOKEN (bearer) or LOOPTRACE_WATCH_USERNAME and
LOOPTRACE_WATCH_PASSWORD (basic) make every export authenticate, compared in constant time and never logged; bodies
above `max_request_bytes` get 413 before they are read, and decompression stops at `max_decompressed_bytes` (a gzip
bomb gets 413 too); a port already held by another process is refused, never shared. With content capture off
(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=NO_CONTENT or LOOPTRACE_CAPTURE_CONTENT=false) no argument or
message text reaches watch's log or webhook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy_face import lazy_face

if TYPE_CHECKING:  # the same names, for type checkers
    from ..logs import configure_service_logging
    from .auth import authorized
    from .command import watch_command
    from .decoding import BadRequest, RequestTooLarge, decompress, export_response, parse_request, spans_of_request
    from .intake import ListenError
    from .metrics import WatchMetrics
    from .server import WatchServer
    from .service import serve
    from .settings import WatchSettingError, WatchSettings
    from .sinks import langfuse_scores, watch_sinks
    from .watcher import AnomalySink, RunWatcher

# public name -> the module that defines it, relative to this package. Each loads on first use: a process that only
# drives a RunWatcher in process loads neither the listeners nor gRPC.
_EXPORTS: dict[str, str] = {
    "configure_service_logging": "..logs",
    "authorized": ".auth",
    "watch_command": ".command",
    "BadRequest": ".decoding",
    "RequestTooLarge": ".decoding",
    "decompress": ".decoding",
    "export_response": ".decoding",
    "parse_request": ".decoding",
    "spans_of_request": ".decoding",
    "ListenError": ".intake",
    "WatchMetrics": ".metrics",
    "WatchServer": ".server",
    "serve": ".service",
    "WatchSettingError": ".settings",
    "WatchSettings": ".settings",
    "langfuse_scores": ".sinks",
    "watch_sinks": ".sinks",
    "AnomalySink": ".watcher",
    "RunWatcher": ".watcher",
}

__all__ = [
    "AnomalySink",
    "BadRequest",
    "ListenError",
    "RequestTooLarge",
    "RunWatcher",
    "WatchMetrics",
    "WatchServer",
    "WatchSettingError",
    "WatchSettings",
    "authorized",
    "configure_service_logging",
    "decompress",
    "export_response",
    "langfuse_scores",
    "parse_request",
    "serve",
    "spans_of_request",
    "watch_command",
    "watch_sinks",
]


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
