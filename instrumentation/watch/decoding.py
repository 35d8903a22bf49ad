"""An export request's body to span records: decompression within a cap, then OTLP protobuf or OTLP/JSON.

Transport-free: the HTTP receiver hands it bodies and headers, the gRPC receiver already-parsed requests. The span
records are those of `tracefile.read.SpanRecord`, with only the attributes detection reads (`DETECTION_KEYS`).
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ..offline.trace_detect import DETECTION_KEYS
from ..tracefile.read import SpanRecord, spans_of_traces_data

SERVICE_NAME = "service.name"
_RESOURCE_KEYS = frozenset({SERVICE_NAME})


class RequestTooLarge(Exception):
    """The body (or what it decompresses to) is above the configured cap."""


class BadRequest(Exception):
    """The body is not OTLP trace data in a form watch reads."""


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """The body decompressed, never more than ``limit`` bytes of it (a gzip bomb stops there)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity", "none"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadRequest(f"unsupported Content-Encoding {encoding!r}")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    try:
        return _inflate(body, wbits, limit)
    except zlib.error:
        if encoding == "deflate":  # raw deflate, without the zlib wrapper, is sent too
            try:
                return _inflate(body, -zlib.MAX_WBITS, limit)
            except zlib.error as exc:
                raise BadRequest(f"cannot decompress deflate body: {exc}") from None
        raise BadRequest("cannot decompress gzip body") from None


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise RequestTooLarge(f"the body decompresses to more than {limit} bytes")
    return out


def parse_request(body: bytes, content_type: str) -> list[SpanRecord]:
    """Spans of an ExportTraceServiceRequest, protobuf or OTLP/JSON, with the attributes detection reads."""
    content_type = content_type.lower()
    if "json" in content_type:
        try:
            document = json.loads(body or b"{}")
            if document == {}:  # proto3 JSON leaves an empty field out: `{}` is a request with no spans
                return []
            return list(spans_of_traces_data(document, DETECTION_KEYS))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise BadRequest(f"not OTLP/JSON trace data ({type(exc).__name__})") from None
    if "protobuf" in content_type or not content_type:
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError:
            raise BadRequest("not an OTLP protobuf ExportTraceServiceRequest") from None
        return spans_of_request(request)
    raise BadRequest(f"unsupported Content-Type {content_type!r}")


def spans_of_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
    """The span records of a parsed protobuf request, read as the OTLP/JSON reader reads the same spans."""
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes, _RESOURCE_KEYS)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                spans.append(SpanRecord(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None, name=span.name, kind=span.kind,
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    attributes=_attributes(span.attributes, DETECTION_KEYS), status_code=span.status.code,
                    resource=resource, scope=scope))
    return spans


def _attributes(key_values: Iterable[Any], keys: frozenset[str]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in key_values if kv.key in keys}


def _any_value(value: Any) -> Any:
    """An AnyValue as the OTLP/JSON reader gives it (tracefile.read.decode_value), so both encodings read the same."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")  # as OTLP/JSON carries bytes
    return getattr(value, which)


def export_response(rejected: int, reason: str, as_json: bool) -> bytes:
    """The ExportTraceServiceResponse body: empty, or a partial success naming how many spans were refused and why."""
    response = partial_success(rejected, reason)
    if as_json:
        return json_format.MessageToJson(response).encode()
    return response.SerializeToString()


def partial_success(rejected: int, reason: str) -> trace_service_pb2.ExportTraceServiceResponse:
    """The response message itself, as the gRPC receiver returns it."""
    response = trace_service_pb2.ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = reason
    return response
