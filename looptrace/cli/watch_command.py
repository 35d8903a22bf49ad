"""`looptrace watch`: an OTLP receiver that rebuilds any agent's runs from their spans and alerts on loops, live.

The command's parser and handler; the service itself (flag checks, settings, servers, its exit codes) is the watch
package's (``instrumentation.watch.command``).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_watch_command(commands: Any) -> None:
    watch = commands.add_parser(
        "watch", help="receive any agent's traces over OTLP and alert on loops as they happen",
        description="An OTLP receiver (HTTP /v1/traces, protobuf or JSON, and gRPC) for any app or collector. It "
                    "rebuilds runs from looptrace's, OpenTelemetry GenAI, OpenLLMetry and OpenInference spans, runs "
                    "the loop detector live and alerts: log line, LOOPTRACE_ALERT_WEBHOOK, Langfuse score (with "
                    "LANGFUSE_* keys), looptrace_anomalies_total on GET /metrics. Senders must authenticate when "
                    "LOOPTRACE_WATCH_TOKEN (bearer) or LOOPTRACE_WATCH_USERNAME/PASSWORD (basic) is set.",
        epilog="exit codes:\n  0   stopped by SIGTERM or Ctrl-C after judging every open run\n"
               "  2   bad flag, or a port already taken",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    watch.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)")
    watch.add_argument("--port", type=int, default=4318, help="OTLP/HTTP and /metrics port (default 4318)")
    watch.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (default 4317; -1: no gRPC)")
    watch.add_argument("--idle-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="judge a run this long after its last span (default 300)")
    watch.add_argument("--max-open-runs", type=int, default=10_000,
                       help="runs assembled at once; the oldest is judged early beyond it (default 10000)")
    watch.add_argument("--max-request-bytes", type=int, default=8 << 20, help="413 above this (default 8 MiB)")
    watch.add_argument("--max-decompressed-bytes", type=int, default=64 << 20,
                       help="413 when a body inflates beyond this (default 64 MiB)")
    watch.set_defaults(handler=_watch)


def _watch(args: argparse.Namespace) -> int:
    from looptrace.cli.environment import read_settings
    from looptrace.instrumentation import configure_service_logging
    from looptrace.instrumentation.watch import watch_command

    settings = read_settings()  # the one read of the environment; the flags override fields of it
    configure_service_logging()
    return watch_command(settings, host=args.host, port=args.port, grpc_port=args.grpc_port,
                         idle_timeout_s=args.idle_timeout, max_open_runs=args.max_open_runs,
                         max_request_bytes=args.max_request_bytes, max_decompressed_bytes=args.max_decompressed_bytes)
