"""OTLP protobuf bytes straight from finished spans: what the OTLP exporters send, without the message objects.

The OpenTelemetry encoder (``opentelemetry.exporter.otlp.proto.common``) builds a protobuf object for every span,
attribute and value, through a chain of ``isinstance`` checks, then serialises the tree. For an agent's spans, dozens
of attributes each and kilobytes of message text, that was most of what the OTLP path cost over its floor (issue 23).
Here a span becomes its ``Span`` message bytes in one pass over its fields, and what repeats (the resource and scope,
each attribute key, a run's constant values) is encoded once and reused. A batch is those bytes glued into one
``ExportTraceServiceRequest``: protobuf's length-delimited fields concatenate, so nothing is encoded twice.

The bytes parse to exactly what the official encoder builds from the same spans (tests compare the two message by
message), with two differences, both the trace file's (``tracefile.encode``) rules:

* a value the official encoder drops with a logged traceback (a lone surrogate, which cannot be UTF-8; an integer
  beyond 64 bits; an object of no OTLP type) is repaired instead: U+FFFD for the bad code points, the value's text
  for the rest, and the span names the repaired keys in ``looptrace.repaired_attributes``;
* a link carries its trace state, which the official encoder leaves out.

A span is encoded once however many pipelines want it: the bytes are kept on the span (``span_message``), so the
export queue's journal and every network exporter share them.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .semconv import REPAIRED_ATTRIBUTES
from .tracefile.encode import Repairs, RepeatedTexts, clean_text

__all__ = ["export_request", "request_of_one", "resource_spans_json", "span_message"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64 = 1 << 64
_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_SMALL = tuple(bytes((n,)) for n in range(128))


def _varint(number: int) -> bytes:
    if number < 128:
        return _SMALL[number]
    if number < 16384:  # most lengths: two bytes
        return bytes(((number & 0x7F) | 0x80, number >> 7))
    out = bytearray()
    while number > 127:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + _varint(len(payload)) + payload


def _delimited(payload: bytes) -> bytes:
    return _varint(len(payload)) + payload


def _utf8(text: str, repairs: Repairs | None, where: str) -> bytes:
    """``text`` as UTF-8; with ``repairs``, a lone surrogate becomes U+FFFD and ``where`` is named."""
    if repairs is None:
        return text.encode("utf-8")  # a lone surrogate raises: the span is encoded again, repaired
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        repairs.keys.append(where)
        return clean_text(text).encode("utf-8")


# --- values: AnyValue message bodies ----------------------------------------------------------------------------------


def _value(value: Any) -> bytes:
    """One attribute value's ``AnyValue``; raises (ValueError, TypeError, UnicodeEncodeError) for what needs repair."""
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", value.encode("utf-8"))
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        if 0 <= value <= _INT64_MAX:
            return b"\x18" + _varint(value)
        if _INT64_MIN <= value < 0:
            return b"\x18" + _varint(value + _UINT64)  # int64: two's complement, ten bytes
        raise ValueError("integer beyond 64 bits")
    if kind is float:
        return b"\x21" + _double(value)
    if kind is tuple or kind is list:
        return _field(b"\x2a", b"".join([_field(b"\x0a", _value(item)) for item in value]))
    return _unusual_value(value)


def _unusual_value(value: Any) -> bytes:
    if value is None:
        return b""
    for plain in (bool, str, int, float):  # subclasses (an IntEnum, a str enum) travel as their plain value
        if isinstance(value, plain):
            return _value(plain(value))
    if isinstance(value, (bytes, bytearray)):
        return _field(b"\x3a", bytes(value))
    if isinstance(value, Sequence):
        return _value(list(value))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join([_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]))
    raise TypeError(f"cannot encode a {type(value).__name__}")


_REPAIRED_DEPTH = 16  # arrays nested deeper become text: decoders refuse messages nested past 100 levels


def _repaired_value(value: Any, depth: int = 0) -> bytes:
    """The closest valid encoding of a value ``_value`` refused: clean text, or the value's text."""
    if isinstance(value, str):
        return _value(clean_text(str(value)))
    if isinstance(value, int) and not isinstance(value, bool):
        return _value(str(value) if abs(value) < 10**4000 else "<integer>")
    if isinstance(value, (list, tuple)):
        if depth >= _REPAIRED_DEPTH:
            return _value("<nested too deeply>")  # a sequence that holds itself ends here
        return _field(b"\x2a", b"".join([_field(b"\x0a", _safe_value(item, depth + 1)) for item in value]))
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - an object whose __str__ raises still costs only itself
        text = f"<{type(value).__name__}>"
    return _value(clean_text(text))


def _safe_value(value: Any, depth: int = 0) -> bytes:
    try:
        return _value(value)
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return _repaired_value(value, depth)


# --- attributes: repeated KeyValue fields -----------------------------------------------------------------------------

_KEY_HEADS: dict[str, bytes] = {}  # key -> KeyValue's key field and the value field's tag


def _key_head(key: str) -> bytes:
    head = _KEY_HEADS.get(key)
    if head is None:
        head = _field(b"\x0a", key.encode("utf-8")) + b"\x12"
        if len(_KEY_HEADS) < 4096:  # attribute names repeat; a stray generator of names must not grow this
            _KEY_HEADS[key] = head
    return head


def _key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message body."""
    return _key_head(key) + _delimited(_value(value))


# field tag -> the whole attribute fields of the (key, short text) pairs a run repeats on every span (agent and model
# names, operation, tool definitions). Only text: a cache keyed by equality must not hand 1's bytes to True or 1.0.
_TEXT_FIELDS: dict[bytes, RepeatedTexts] = {}
_FIELD_VALUE_CHARS = 1024


def _attributes(tag: bytes, attributes: Mapping[str, Any], parts: list[bytes]) -> None:
    """Append each attribute as a ``tag`` field to ``parts``; raises for anything that needs repair."""
    repeated = _TEXT_FIELDS.get(tag) or _TEXT_FIELDS.setdefault(tag, RepeatedTexts())  # a span's is not an event's
    fields = repeated.encoded
    most = _FIELD_VALUE_CHARS
    heads = _KEY_HEADS
    add = parts.append
    # A text set under two keys side by side (gen_ai.*'s messages and input.value/output.value, for Phoenix) is the
    # same object: it is encoded once.
    last_text: str | None = None
    text = text_head = b""
    for item in getattr(attributes, "_dict", attributes).items():  # the plain dict behind the SDK's mapping
        key, value = item
        if type(value) is str:
            short = len(value) <= most
            encoded = fields.get(item) if short else None
            if encoded is None:
                if value is not last_text:
                    last_text, text = value, value.encode("utf-8")
                    text_head = b"\x0a" + _varint(len(text))  # AnyValue's string_value field, up to the text
                # tag, length, KeyValue (key field, value tag, length, AnyValue): everything but the text, which a
                # long value (a conversation's messages) would otherwise be copied for at every level.
                key_value_head = (heads.get(key) or _key_head(key)) + _varint(len(text_head) + len(text)) + text_head
                prefix = tag + _varint(len(key_value_head) + len(text)) + key_value_head
                if not short:
                    parts += (prefix, text)
                    continue
                encoded = prefix + text
                repeated.remember(item, encoded)
            add(encoded)
        else:
            add(_field(tag, (heads.get(key) or _key_head(key)) + _delimited(_value(value))))


def _repaired_attributes(tag: bytes, attributes: Mapping[Any, Any], parts: list[bytes], repairs: Repairs) -> None:
    for key, value in getattr(attributes, "_dict", attributes).items():
        if key == REPAIRED_ATTRIBUTES and isinstance(value, (list, tuple)):
            repairs.keys[:0] = [str(k) for k in value]  # an earlier repair's list is merged into this one's
            continue
        text_key = key if isinstance(key, str) else str(key)
        clean_key = clean_text(text_key)
        try:
            encoded = _value(value)
            repaired = clean_key != key
        except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
            encoded, repaired = _repaired_value(value), True
        if repaired:
            repairs.keys.append(clean_key)
        parts.append(_field(tag, _field(b"\x0a", clean_key.encode("utf-8")) + b"\x12" + _delimited(encoded)))


def _add_attributes(tag: bytes, attributes: Mapping[Any, Any] | None, parts: list[bytes],
                    repairs: Repairs | None) -> None:
    if not attributes:
        return
    if repairs is None:
        _attributes(tag, attributes, parts)
    else:
        _repaired_attributes(tag, attributes, parts, repairs)


# --- spans: Span message bodies ---------------------------------------------------------------------------------------

_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)  # field 16, fixed32: HAS_IS_REMOTE
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)  # HAS_IS_REMOTE | IS_REMOTE
_LINK_FLAGS_LOCAL = b"\x35" + struct.pack("<I", 0x100)  # Span.Link's flags are field 6
_LINK_FLAGS_REMOTE = b"\x35" + struct.pack("<I", 0x300)
_last_trace: tuple[int, bytes] = (0, b"")  # the spans of a trace end together: its id field is made once


def _trace_id_field(trace_id: int) -> bytes:
    global _last_trace
    last = _last_trace  # one tuple, replaced whole: a thread never sees one id beside another's bytes
    if last[0] == trace_id:
        return last[1]
    encoded = b"\x0a\x10" + trace_id.to_bytes(16, "big")
    _last_trace = (trace_id, encoded)
    return encoded


def _trace_state(trace_state: Any) -> str:
    return ",".join([f"{key}={value}" for key, value in trace_state.items()]) if trace_state else ""


def _span(span: Any, repairs: Repairs | None) -> bytes:
    context = span.context
    parent = span.parent
    parts = [_trace_id_field(context.trace_id), b"\x12\x08" + context.span_id.to_bytes(8, "big")]
    trace_state = _trace_state(context.trace_state)
    if trace_state:
        parts.append(_field(b"\x1a", _utf8(trace_state, repairs, "span.trace_state")))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_field(b"\x2a", _utf8(span.name, repairs, "span.name")))
    parts.append(b"\x30" + _SMALL[span.kind.value + 1])  # OTLP's SpanKind counts from UNSPECIFIED = 0
    if span.start_time:
        parts.append(b"\x39" + _fixed64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _fixed64(span.end_time))
    attributes = getattr(span, "_attributes", None)  # the dict (or BoundedAttributes) behind span.attributes
    if attributes is None:
        attributes = span.attributes
    _add_attributes(b"\x4a", attributes, parts, repairs)
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    for event in span.events:
        parts.append(_field(b"\x5a", _event(event, repairs)))
    if span.dropped_events:
        parts.append(b"\x60" + _varint(span.dropped_events))
    for link in span.links:
        parts.append(_field(b"\x6a", _link(link, repairs)))
    if span.dropped_links:
        parts.append(b"\x70" + _varint(span.dropped_links))
    parts.append(_field(b"\x7a", _status(span.status, repairs)))
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    if repairs is not None and repairs.keys:
        # Last, once the events, links and status have said what they repaired too: a repeated field's entries may
        # come anywhere in a message, and a parser appends this one to the span's other attributes.
        named = _safe_value(tuple(dict.fromkeys(repairs.keys)))  # an earlier repair's list may be hostile too
        parts.append(_field(b"\x4a", _key_head(REPAIRED_ATTRIBUTES) + _delimited(named)))
    return b"".join(parts)


def _event(event: Any, repairs: Repairs | None) -> bytes:
    parts = [b"\x09" + _fixed64(event.timestamp)] if event.timestamp else []
    if event.name:
        parts.append(_field(b"\x12", _utf8(event.name, repairs, "event.name")))
    _add_attributes(b"\x1a", event.attributes, parts, repairs)
    if event.dropped_attributes:
        parts.append(b"\x20" + _varint(event.dropped_attributes))
    return b"".join(parts)


def _link(link: Any, repairs: Repairs | None) -> bytes:
    context = link.context
    parts = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"), b"\x12\x08" + context.span_id.to_bytes(8, "big")]
    trace_state = _trace_state(context.trace_state)
    if trace_state:
        parts.append(_field(b"\x1a", _utf8(trace_state, repairs, "link.trace_state")))
    _add_attributes(b"\x22", link.attributes, parts, repairs)
    if link.dropped_attributes:
        parts.append(b"\x28" + _varint(link.dropped_attributes))
    parts.append(_LINK_FLAGS_REMOTE if context.is_remote else _LINK_FLAGS_LOCAL)
    return b"".join(parts)


def _status(status: Any, repairs: Repairs | None) -> bytes:
    message = status.description
    code = status.status_code.value
    encoded = _field(b"\x12", _utf8(message, repairs, "status.message")) if message else b""
    return encoded + b"\x18" + _SMALL[code] if code else encoded


def _encode_span(span: Any) -> bytes:
    try:
        return _span(span, None)
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return _span(span, Repairs())


def span_message(span: Any) -> bytes:
    """The span's ``Span`` message bytes, encoded on the first call and kept on the span for every later one (the
    journal and each network exporter ask for the same ended span)."""
    encoded = getattr(span, "wire_message", None)
    if encoded is None:
        encoded = _encode_span(span)
        try:
            span.wire_message = encoded
        except AttributeError:  # a span type that takes no new attributes is simply encoded again next time
            pass
    return encoded


# --- envelopes and requests -------------------------------------------------------------------------------------------

_ENVELOPES: dict[tuple[int, int], tuple[Any, Any, bytes, bytes, bytes, bytes]] = {}


def _envelope(resource: Any, scope: Any) -> tuple[bytes, bytes, bytes, bytes]:
    """(the ResourceSpans' resource field, its schema_url field, the ScopeSpans' scope field, its schema_url field):
    made once per resource and scope, not per span."""
    key = (id(resource), id(scope))
    cached = _ENVELOPES.get(key)
    if cached is not None and cached[0] is resource and cached[1] is scope:
        return cached[2:]
    repairs = Repairs()
    resource_parts: list[bytes] = []
    _add_attributes(b"\x0a", getattr(resource, "attributes", None), resource_parts, repairs)
    resource_field = _field(b"\x0a", b"".join(resource_parts))
    scope_parts: list[bytes] = []
    if scope is not None:
        if scope.name:
            scope_parts.append(_field(b"\x0a", _utf8(scope.name, repairs, "scope.name")))
        if scope.version:
            scope_parts.append(_field(b"\x12", _utf8(scope.version, repairs, "scope.version")))
        _add_attributes(b"\x1a", scope.attributes, scope_parts, repairs)
    scope_field = _field(b"\x0a", b"".join(scope_parts))
    resource_schema = getattr(resource, "schema_url", None)
    scope_schema = getattr(scope, "schema_url", None) if scope is not None else None
    schema_fields = tuple(_field(b"\x1a", _utf8(url, repairs, "schema_url")) if url else b""
                          for url in (resource_schema, scope_schema))
    if len(_ENVELOPES) > 256:  # a process makes few resources and scopes; a push may bring one per batch
        _ENVELOPES.clear()
    # Holding the objects keeps their ids from being reused by others while the entry lives.
    _ENVELOPES[key] = (resource, scope, resource_field, schema_fields[0], scope_field, schema_fields[1])
    return resource_field, schema_fields[0], scope_field, schema_fields[1]


def export_request(spans: Iterable[Any]) -> bytes:
    """One ``ExportTraceServiceRequest`` holding ``spans``, grouped by resource, then by scope, in first-seen order,
    as the official encoder groups them."""
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(_field(b"\x12", span_message(span)))
    request = []
    for resource, scopes in groups.values():
        resource_parts: list[bytes] = []
        for scope, encoded in scopes.values():
            resource_field, resource_schema, scope_field, scope_schema = _envelope(resource, scope)
            if not resource_parts:
                resource_parts.append(resource_field)
            resource_parts.append(_field(b"\x12", b"".join([scope_field, *encoded, scope_schema])))
        resource_parts.append(resource_schema)
        request.append(_field(b"\x0a", b"".join(resource_parts)))
    return b"".join(request)


def request_of_one(span: Any) -> bytes:
    """``export_request([span])``, the form the export queue's journal keeps each span in."""
    resource_field, resource_schema, scope_field, scope_schema = _envelope(span.resource, span.instrumentation_scope)
    scope_spans = _field(b"\x12", b"".join((scope_field, _field(b"\x12", span_message(span)), scope_schema)))
    return _field(b"\x0a", b"".join((resource_field, scope_spans, resource_schema)))


# --- back to OTLP/JSON ------------------------------------------------------------------------------------------------

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def resource_spans_json(request: bytes) -> list[dict[str, Any]]:
    """The ``resourceSpans`` of an encoded ``ExportTraceServiceRequest`` in OTLP/JSON (the trace file's and the spill
    file's form: hex ids, integer enums, 64-bit integers as strings). For the rare way back, a journal recovered."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    document = json_format.MessageToDict(ExportTraceServiceRequest.FromString(request), use_integers_for_enums=True)
    resource_spans: list[dict[str, Any]] = document.get("resourceSpans", [])
    for entry in resource_spans:
        for scope_spans in entry.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return resource_spans


def _hex_ids(item: dict[str, Any]) -> None:
    # Protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes trace and span ids as hex.
    for name in _ID_FIELDS:
        if name in item:
            item[name] = base64.b64decode(item[name]).hex()
