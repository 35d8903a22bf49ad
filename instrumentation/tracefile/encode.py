"""OTLP/JSON text straight from finished SDK spans: the file exporter's format without its object layer.

The OpenTelemetry JSON encoder builds a tree of message objects, turns it into dicts, and only then into text. For a
local file that is most of the cost of telemetry. Here each span becomes its JSON text in one pass over its fields,
with the standard library's C string escaper doing the heavy part, and what is the same for every span of a process
(the resource, the instrumentation scope, each attribute key) is encoded once and reused.

The output is exactly what ``encode_spans(spans).to_dict()`` serialises to (same fields, same omissions of defaults,
hex ids, integer enums, 64-bit integers as strings), so the Collector's ``otlpjsonfile`` receiver and the official
decoders read it; tests compare the two field by field.

A value that cannot travel as valid UTF-8 JSON (a lone surrogate from a badly decoded tool result, a float that is
not a number, an integer beyond 64 bits, an object the SDK let through) costs that value only: it is replaced
(U+FFFD for the bad code points, the proto3 JSON spelling for NaN and infinities, a string for the rest), and the
span says which keys were repaired in ``looptrace.repaired_attributes``. The span itself is never lost to it.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, StatusCode

from ..semconv import REPAIRED_ATTRIBUTES

__all__ = ["REPAIRED_ATTRIBUTES", "Repairs", "RepeatedTexts", "clean_text", "encode_line", "encode_span",
           "encode_traces_data"]

_string = json.encoder.encode_basestring  # the C escaper: '"' + escaped text + '"', non-ASCII kept as is
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLAGS_HAS_IS_REMOTE, _FLAGS_IS_REMOTE = 0x100, 0x200


class Repairs:
    """Collects the keys whose values had to be replaced while encoding one span (here and in ``otlp_wire``)."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: list[str] = []


def clean_text(text: str) -> str:
    # Lone surrogates cannot be encoded as UTF-8; round-tripping through UTF-16 turns each into U+FFFD.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _valid_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- values ------------------------------------------------------------------------------------------------------


def _value(value: Any) -> str:
    """One attribute value as an OTLP AnyValue; raises ValueError/TypeError for what needs repairing."""
    kind = type(value)
    if kind is str:
        return '{"stringValue":' + _string(value) + "}"
    if kind is bool:
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if kind is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return '{"intValue":"' + str(value) + '"}'
        raise ValueError("integer beyond 64 bits")
    if kind is float:
        if math.isfinite(value):
            return '{"doubleValue":' + repr(value) + "}"
        raise ValueError("not a finite number")
    if kind is tuple or kind is list:
        if not value:
            return '{"arrayValue":{}}'
        return '{"arrayValue":{"values":[' + ",".join([_value(item) for item in value]) + "]}}"
    return _unusual_value(value)


def _unusual_value(value: Any) -> str:
    if value is None:
        return "{}"
    if isinstance(value, bool):
        return _value(bool(value))
    if isinstance(value, str):
        return _value(str(value))
    if isinstance(value, int):
        return _value(int(value))
    if isinstance(value, float):
        return _value(float(value))
    if isinstance(value, (bytes, bytearray)):
        return '{"bytesValue":"' + base64.b64encode(value).decode("ascii") + '"}'
    if isinstance(value, Sequence):
        return _value(list(value))
    if isinstance(value, Mapping):
        if not value:
            return '{"kvlistValue":{}}'
        return '{"kvlistValue":{"values":[' + ",".join(_key_value(str(k), v) for k, v in value.items()) + "]}}"
    raise TypeError(f"cannot encode a {type(value).__name__}")


def _repaired_value(value: Any) -> str:
    """The closest valid encoding of a value ``_value`` refused, or of one carrying invalid text."""
    if isinstance(value, float):
        if math.isnan(value):
            return '{"doubleValue":"NaN"}'
        if math.isinf(value):
            return '{"doubleValue":"Infinity"}' if value > 0 else '{"doubleValue":"-Infinity"}'
    if isinstance(value, str):
        return '{"stringValue":' + _string(clean_text(value)) + "}"
    if isinstance(value, int) and not isinstance(value, bool):
        return '{"stringValue":"' + str(value) + '"}' if abs(value) < 10**4000 else '{"stringValue":"<integer>"}'
    if isinstance(value, (list, tuple)):
        return '{"arrayValue":{"values":[' + ",".join(_safe_value(item) for item in value) + "]}}"
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - an object whose __str__ raises still costs only itself
        text = f"<{type(value).__name__}>"
    return '{"stringValue":' + _string(clean_text(text)) + "}"


def _safe_value(value: Any) -> str:
    try:
        encoded = _value(value)
    except (ValueError, TypeError, RecursionError):
        return _repaired_value(value)
    return encoded if _valid_utf8(encoded) else _repaired_value(value)


_KEY_PREFIXES: dict[str, str] = {}


def _key_prefix(key: str) -> str:
    prefix = _KEY_PREFIXES.get(key)
    if prefix is None:
        prefix = '{"key":' + _string(key) + ',"value":'
        if len(_KEY_PREFIXES) < 4096 and _valid_utf8(prefix):  # attribute names repeat; values do not
            _KEY_PREFIXES[key] = prefix
    return prefix


class RepeatedTexts:
    """The encoded forms of (key, text value) pairs that repeat, in ``encoded``, for an encoder to look up.

    A pair is kept once its value repeats what the same key held last time: a run's constants (agent, model,
    operation, tool definitions) do, ids and messages do not, so one-off values never crowd the constants out.
    Bounded: at most ``entries`` pairs (then it starts again), and the last value of at most 4,096 keys.
    """

    __slots__ = ("_entries", "_last", "encoded")

    def __init__(self, entries: int = 2048) -> None:
        self.encoded: dict[tuple[str, str], Any] = {}
        self._last: dict[str, str] = {}  # each key's latest text value
        self._entries = entries

    def remember(self, item: tuple[str, str], encoded: Any) -> None:
        key, value = item
        last = self._last
        if last.get(key) == value:
            if len(self.encoded) >= self._entries:
                self.encoded.clear()
            self.encoded[item] = encoded
        elif len(last) < 4096 or key in last:
            last[key] = value


# (key, text value) -> its encoded key-value pair. Only text values: a cache keyed by value equality must not hand
# 1's encoding to True or 1.0. Only values of at most _PAIR_VALUE_CHARS characters.
_TEXT_PAIRS = RepeatedTexts()
_PAIR_VALUE_CHARS = 1024


_GROWING: dict[str, tuple[str, str]] = {}  # key -> its latest long text value and that value's JSON string


def _grown_string(key: str, value: str) -> str:
    """``_string(value)`` for a long text that usually extends the key's previous one by a little.

    A chat span's input messages are the conversation so far, as a JSON array: each call's is the previous call's
    without its closing ``]``, then the newer messages. Escaping is character by character, so only the new tail
    needs escaping; the rest is the previous escaped text, copied. Anything else is escaped whole.
    """
    last = _GROWING.get(key)
    if last is not None:
        previous, escaped = last
        kept = len(previous) - 1
        if kept > 0 and len(value) > kept and value.startswith(previous[:kept]):
            dropped = len(_string(previous[kept])) - 2  # the escaped length of the previous text's last character
            text = escaped[: len(escaped) - 1 - dropped] + _string(value[kept:])[1:]
            _GROWING[key] = (value, text)
            return text
    text = _string(value)
    if len(_GROWING) < 64 or key in _GROWING:
        _GROWING[key] = (value, text)
    return text


def _key_value(key: str, value: Any) -> str:
    return _key_prefix(key) + _value(value) + "}"


def _plain(attributes: Any) -> Mapping[str, Any]:
    """The dict behind the SDK's attribute mappings, when it is there.

    ``ReadableSpan.attributes`` is a read-only proxy over a ``BoundedAttributes``, a Python-level Mapping whose
    iteration (with its lock) costs more than encoding the values. A finished span's attributes no longer change, so
    the plain dict inside is read directly; anything else is iterated as the Mapping it is.
    """
    return getattr(attributes, "_dict", attributes)


def _attributes(attributes: Mapping[str, Any] | None, repairs: Repairs | None) -> str:
    """The inside of an attributes list: ``{"key":..,"value":..},...``."""
    if not attributes:
        return ""
    plain = _plain(attributes)
    if repairs is None:
        prefixes, pairs, most = _KEY_PREFIXES, _TEXT_PAIRS.encoded, _PAIR_VALUE_CHARS
        parts: list[str] = []
        add = parts.append
        # A text set under two keys side by side (gen_ai.*'s messages and input.value/output.value, for Phoenix) is
        # the same object: its escaped form is made once.
        last_text: str | None = None
        last_escaped = ""
        for item in plain.items():
            key, value = item
            if type(value) is str:
                # Most text values repeat on every span of a run (agent, model, operation, tool definitions...):
                # their whole key-value text is looked up rather than escaped again.
                # (Only short values are kept, so a long one, a new text each time, is not hashed for a lookup.)
                short = len(value) <= most
                text = pairs.get(item) if short else None
                if text is None:
                    prefix = prefixes.get(key) or _key_prefix(key)
                    if value is last_text:
                        text = prefix + last_escaped
                    elif short:
                        last_text, last_escaped = value, '{"stringValue":' + _string(value) + "}}"
                        text = prefix + last_escaped
                        _TEXT_PAIRS.remember(item, text)
                    else:
                        last_text, last_escaped = value, '{"stringValue":' + _grown_string(key, value) + "}}"
                        text = prefix + last_escaped
                add(text)
            else:
                add((prefixes.get(key) or _key_prefix(key)) + _value(value) + "}")
        return ",".join(parts)
    parts = []
    for key, value in plain.items():
        clean_key = key if _valid_utf8(key) else clean_text(key)
        encoded = _safe_value(value)
        if clean_key is not key or encoded != _try_value(value):
            repairs.keys.append(clean_key)
        parts.append('{"key":' + _string(clean_key) + ',"value":' + encoded + "}")
    return ",".join(parts)


def _try_value(value: Any) -> str | None:
    try:
        encoded = _value(value)
    except (ValueError, TypeError, RecursionError):
        return None
    return encoded if _valid_utf8(encoded) else None


# --- spans -------------------------------------------------------------------------------------------------------


def _text(text: str, repairs: Repairs | None, where: str) -> str:
    if repairs is not None and not _valid_utf8(text):
        repairs.keys.append(where)
        return _string(clean_text(text))
    return _string(text)


_KINDS = {kind: str(kind.value + 1) for kind in SpanKind}  # OTLP's enum counts from UNSPECIFIED = 0
_last_trace: tuple[int, str] = (0, "0" * 32)  # the spans of a trace arrive together: its id is formatted once


def _trace_hex(trace_id: int) -> str:
    global _last_trace
    last = _last_trace  # one tuple, replaced whole: threads never see an id beside another id's text
    if last[0] == trace_id:
        return last[1]
    text = format(trace_id, "032x")
    _last_trace = (trace_id, text)
    return text


def _span(span: Any, repairs: Repairs | None) -> str:
    context = span.context
    parent = span.parent
    head = f'{{"traceId":"{_trace_hex(context.trace_id)}","spanId":"{context.span_id:016x}"'
    trace_state = context.trace_state
    if trace_state:
        head += ',"traceState":' + _string(",".join(f"{k}={v}" for k, v in trace_state.items()))
    if parent is not None:
        head += f',"parentSpanId":"{parent.span_id:016x}","flags":{768 if parent.is_remote else 256}'
    else:
        head += ',"flags":256'
    kind = span.kind
    head += f',"name":{_text(span.name, repairs, "span.name")},"kind":{_KINDS.get(kind) or kind.value + 1}'
    start, end = span.start_time, span.end_time
    if start:
        head += f',"startTimeUnixNano":"{start}"'
    if end:
        head += f',"endTimeUnixNano":"{end}"'
    parts = [head]
    attributes = getattr(span, "_attributes", None)  # the BoundedAttributes behind span.attributes' proxy
    if attributes is None:
        attributes = span.attributes
    if attributes:
        parts += [',"attributes":[', _attributes(attributes, repairs)]
        if repairs is not None and repairs.keys:
            parts += [",", _key_value(REPAIRED_ATTRIBUTES, list(dict.fromkeys(repairs.keys)))]
        parts.append("]")
    elif repairs is not None and repairs.keys:
        parts += [',"attributes":[', _key_value(REPAIRED_ATTRIBUTES, list(dict.fromkeys(repairs.keys))), "]"]
    dropped = span.dropped_attributes
    if dropped:
        parts += [',"droppedAttributesCount":', str(dropped)]
    events = span.events
    if events:
        parts += [',"events":[', ",".join([_event(event, repairs) for event in events]), "]"]
    if span.dropped_events:
        parts += [',"droppedEventsCount":', str(span.dropped_events)]
    links = span.links
    if links:
        parts += [',"links":[', ",".join([_link(link, repairs) for link in links]), "]"]
    if span.dropped_links:
        parts += [',"droppedLinksCount":', str(span.dropped_links)]
    parts.append(_status(span.status, repairs))
    parts.append("}")
    return "".join(parts)


def _event(event: Any, repairs: Repairs | None) -> str:
    text = '{"timeUnixNano":"' + str(event.timestamp) + '","name":' + _text(event.name, repairs, "event.name")
    if event.attributes:
        text += ',"attributes":[' + _attributes(event.attributes, repairs) + "]"
    if event.dropped_attributes:
        text += ',"droppedAttributesCount":' + str(event.dropped_attributes)
    return text + "}"


def _link(link: Any, repairs: Repairs | None) -> str:
    context = link.context
    text = '{"traceId":"' + format(context.trace_id, "032x") + '","spanId":"' + format(context.span_id, "016x") + '"'
    if context.trace_state:
        text += ',"traceState":' + _string(",".join(f"{k}={v}" for k, v in context.trace_state.items()))
    if link.attributes:
        text += ',"attributes":[' + _attributes(link.attributes, repairs) + "]"
    if link.dropped_attributes:
        text += ',"droppedAttributesCount":' + str(link.dropped_attributes)
    return text + ',"flags":' + ("768" if context.is_remote else "256") + "}"


def _status(status: Any, repairs: Repairs | None) -> str:
    message = status.description
    if status.status_code is StatusCode.UNSET and not message:
        return ',"status":{}'
    code = status.status_code.value
    if not code and not message:
        return ',"status":{}'
    inside = []
    if message:
        inside.append('"message":' + _text(message, repairs, "status.message"))
    if code:
        inside.append('"code":' + str(code))
    return ',"status":{' + ",".join(inside) + "}"


def encode_span(span: Any) -> str:
    """One span's OTLP/JSON object as text: valid UTF-8 whatever its values (bad ones replaced and marked)."""
    try:
        text = _span(span, None)
        text.encode("utf-8")  # lone surrogates surface here, not in the escaper
        return text
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return _span(span, Repairs())


# --- envelopes: what is the same for every span of a process -----------------------------------------------------

_ENVELOPES: dict[tuple[int, int], tuple[Any, Any, str, str, str, str]] = {}


def _envelope(resource: Any, scope: Any) -> tuple[str, str, str, str]:
    """(resource head, scope head, scope tail, resource tail): encoded once per resource and scope, not per span."""
    key = (id(resource), id(scope))
    cached = _ENVELOPES.get(key)
    if cached is not None and cached[0] is resource and cached[1] is scope:
        return cached[2:]
    resource_head = '{"resource":{' + _resource_body(resource) + '},"scopeSpans":['
    scope_head = '{"scope":{' + _scope_body(scope) + '},"spans":['
    scope_schema = getattr(scope, "schema_url", None) if scope is not None else None
    scope_tail = "]" + (',"schemaUrl":' + _string(clean_text(scope_schema)) if scope_schema else "") + "}"
    resource_schema = getattr(resource, "schema_url", None)
    resource_tail = "]" + (',"schemaUrl":' + _string(clean_text(resource_schema)) if resource_schema else "") + "}"
    if len(_ENVELOPES) > 256:  # a process makes few resources and scopes; keep a stray generator from growing this
        _ENVELOPES.clear()
    # Holding the objects keeps their ids from being reused by others while the entry lives.
    _ENVELOPES[key] = (resource, scope, resource_head, scope_head, scope_tail, resource_tail)
    return resource_head, scope_head, scope_tail, resource_tail


def _resource_body(resource: Any) -> str:
    attributes = getattr(resource, "attributes", None)
    return '"attributes":[' + _attributes(attributes, Repairs()) + "]" if attributes else ""


def _scope_body(scope: Any) -> str:
    if scope is None:
        return ""
    inside = ['"name":' + _string(clean_text(scope.name))] if scope.name else []
    if scope.version:
        inside.append('"version":' + _string(clean_text(scope.version)))
    if scope.attributes:
        inside.append('"attributes":[' + _attributes(scope.attributes, Repairs()) + "]")
    return ",".join(inside)


def encode_traces_data(spans: Iterable[Any], extra: str = "") -> str:
    """One ``TracesData`` JSON object (a line of the trace file, without its newline) holding ``spans``.

    Spans are grouped by resource, then by scope, in first-seen order, as the official encoder groups them.
    ``extra`` is inserted as further top-level members (``"key":value`` text), for the spill file's own tag.
    """
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[str]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(encode_span(span))
    resource_parts = []
    for resource, scopes in groups.values():
        blocks = []
        resource_head = resource_tail = ""
        for scope, encoded in scopes.values():
            resource_head, scope_head, scope_tail, resource_tail = _envelope(resource, scope)
            blocks.append(scope_head + ",".join(encoded) + scope_tail)
        resource_parts.append(resource_head + ",".join(blocks) + resource_tail)
    members = [extra] if extra else []
    if resource_parts:  # the official encoder leaves an empty list out
        members.append('"resourceSpans":[' + ",".join(resource_parts) + "]")
    return "{" + ",".join(members) + "}"


_LINES: dict[tuple[int, int], tuple[Any, Any, str, str]] = {}


def encode_line(span: Any) -> bytes:
    """A whole trace-file line (newline included) for one span: envelope cached, span encoded once, the line
    encoded to UTF-8 once (a lone surrogate surfaces there, and only then is the span encoded again, repaired)."""
    resource, scope = span.resource, span.instrumentation_scope
    cached = _LINES.get((id(resource), id(scope)))
    if cached is None or cached[0] is not resource or cached[1] is not scope:
        resource_head, scope_head, scope_tail, resource_tail = _envelope(resource, scope)
        if len(_LINES) > 256:
            _LINES.clear()
        cached = _LINES[(id(resource), id(scope))] = (
            resource, scope, '{"resourceSpans":[' + resource_head + scope_head, scope_tail + resource_tail + "]}\n")
    head, tail = cached[2], cached[3]
    try:
        return "".join((head, _span(span, None), tail)).encode("utf-8")
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return "".join((head, _span(span, Repairs()), tail)).encode("utf-8")
