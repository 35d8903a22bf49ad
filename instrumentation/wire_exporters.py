"""The OpenTelemetry OTLP span exporters, sending each span's one encoding (``otlp_wire``) instead of their own.

Everything but the encoding stays the SDK's: the endpoint, headers and ``OTEL_EXPORTER_OTLP_*`` settings, the
session (looptrace's probing one), compression, TLS, retries and backoff, and for gRPC the channel and its metadata.
The bytes sent parse to what the SDK's encoder would have built from the same spans (``otlp_wire`` says where they
differ: values it would drop are repaired), so collectors and Langfuse see the same spans, made for about 0.4x the
SDK encoder's CPU (benchmark 11), and only once however many backends and the journal share them.

The HTTP exporter hands the bytes to the transport client the SDK's exporter sends its own through; an SDK release
whose exporter has no such client (before 1.45) encodes with its own encoder, text repaired first
(``encodable.encodable_spans``), as looptrace did before. Either way the repair is the exporter's, so the delivery
guard in front of it (``delivery.GuardedExporter``) only delivers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from .encodable import encodable_spans
from .logs import log
from .otlp_wire import export_request

__all__ = ["WireHttpSpanExporter", "wire_grpc_span_exporter"]


class WireHttpSpanExporter(HttpSpanExporter):
    """OTLP/HTTP protobuf: the SDK's exporter, sending ``otlp_wire.export_request(spans)``."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        client: Any = getattr(self, "_client", None)
        if getattr(self, "_shutdown", False) or not callable(getattr(client, "export", None)):
            return super().export(encodable_spans(spans))  # the SDK's own way, warnings and all
        try:
            body = export_request(spans)
        except Exception:  # noqa: BLE001 - a fault of looptrace's encoder must not cost the batch: the SDK's sends it
            return super().export(encodable_spans(spans))
        limit = getattr(self, "_max_request_size", 0) or 0
        if limit > 0 and len(body) > limit:
            # As the SDK's exporter: a request the backend would refuse for its size is not sent.
            log.warning("export_request_too_large", size=len(body), max_request_size=limit, spans=len(spans),
                        hint="lower OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if client.export(body).success else SpanExportResult.FAILURE


def wire_grpc_span_exporter(**arguments: Any) -> Any:
    """The SDK's OTLP/gRPC exporter (made with ``arguments``), its request parsed from ``otlp_wire``'s bytes (in C,
    a small share of building it field by field in Python) for the stub to send."""
    return _wire_grpc_class()(**arguments)


@functools.cache
def _wire_grpc_class() -> type:
    # Made on first use: gRPC costs a process a tenth of a second to import, and only gRPC users should pay it.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    class WireGrpcSpanExporter(GrpcSpanExporter):
        def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
            try:
                return ExportTraceServiceRequest.FromString(export_request(data))
            except Exception:  # noqa: BLE001 - as for HTTP: the SDK's own encoder, text repaired first
                return super()._translate_data(encodable_spans(data))

    return WireGrpcSpanExporter
