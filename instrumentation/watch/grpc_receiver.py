"""OTLP/gRPC: the TraceService Export method, on a small thread pool, with the same auth and caps as HTTP.

The port is never shared: gRPC's SO_REUSEPORT is off, so a second receiver (another watch, another collector) on a
port already held is refused instead of silently taking part of the exports.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

from .auth import authorized
from .decoding import partial_success, spans_of_request
from .intake import GRPC, Intake, ListenError, why_unavailable


def grpc_server(intake: Intake) -> tuple[Any, int]:
    """A gRPC server bound to the intake's host and gRPC port, not yet started, and the port it got.
    Raises `ListenError` when the port cannot be had."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    settings = intake.settings
    assert settings.grpc_port is not None  # the server builds this only when a gRPC port is set

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            metadata = {key.lower(): value for key, value in context.invocation_metadata()
                        if isinstance(value, str)}
            if not authorized(metadata.get("authorization"), settings):
                intake.metrics.requests.labels(transport="grpc", outcome="unauthorized").inc()
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "authentication required")
            rejected, reason = intake.submit(spans_of_request(request))
            intake.metrics.requests.labels(transport="grpc", outcome="partial" if rejected else "ok").inc()
            return partial_success(rejected, reason)

    # Tried first with a plain socket: gRPC reports only that binding failed (and logs it in its own format on
    # stderr), while the system says why.
    taken = why_unavailable(settings.host, settings.grpc_port) if settings.grpc_port else None
    if taken is not None:
        raise ListenError(GRPC, settings.host, settings.grpc_port, taken)
    executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="looptrace-watch-grpc")
    # gRPC enforces the message cap on the decompressed message, so one setting bounds both.
    server = grpc.server(executor, options=[("grpc.max_receive_message_length", settings.max_decompressed_bytes),
                                            ("grpc.so_reuseport", 0)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    try:
        port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    except RuntimeError:  # what recent grpcio raises for a port it cannot bind (taken since the try); older return 0
        port = 0
    if port == 0:
        server.stop(None)
        executor.shutdown(wait=False)
        raise ListenError(GRPC, settings.host, settings.grpc_port, why_unavailable(settings.host, settings.grpc_port))
    return server, port
