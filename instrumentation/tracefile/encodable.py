"""Spans the OpenTelemetry encoders can take whole: the one repair step before the SDK's OTLP encoders, for the trace
file (OTLP/JSON) and the network exporters (OTLP protobuf) alike.

What the encoders cannot carry, measured on opentelemetry-sdk 1.45 (``tests/test_encodable.py`` checks it stays so):

* a lone surrogate (``"\\ud800"``: a tool result decoded badly, a JSON escape in a model's answer): the protobuf
  encoder logs a traceback and drops the attribute (a span's name or status with one fails the whole batch); the JSON
  encoder writes an escape that is not Unicode, which strict OTLP readers refuse. It becomes U+FFFD, wherever the
  text is (attribute values at any depth, keys, names, the status, events, links, the resource);
* an integer beyond 64 bits: the protobuf encoder drops the attribute; the JSON encoder writes an ``intValue`` no
  OTLP reader accepts. It becomes its decimal text (``"<integer>"`` past Python's digit limit);
* an attribute key that is not text (a hand-edited line of the undelivered list, another producer's file): kept as its
  text (``5`` -> ``"5"``), with one warning per process.

A repaired span says which keys were repaired in ``looptrace.repaired_attributes``. NaN and the infinities need
nothing (both encoders write them as OTLP defines), and an object of another type never reaches a span: the SDK
replaces it (by its text, or None) when it is set. A span that needs nothing is passed on as it is, after one pass
over it (``_span_fine``); ASCII text, nearly all of it, is checked in constant time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link, Status

from ..logs import log
from ..recording.semconv import REPAIRED_ATTRIBUTES

__all__ = ["clean_text", "encodable_spans", "with_attributes"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_warned_keys = False


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a round trip through UTF-16 does exactly that)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encodable_spans(spans: Sequence[ReadableSpan]) -> Sequence[ReadableSpan]:
    """``spans``, each one the OTLP encoders would refuse part of replaced by a repaired copy."""
    repaired: list[ReadableSpan] | None = None
    for position, span in enumerate(spans):
        if _span_fine(span):  # nearly every span: one pass, no copies
            continue
        fixed = _repaired_span(span)
        if fixed is not span:
            if repaired is None:
                repaired = list(spans)
            repaired[position] = fixed
    return spans if repaired is None else repaired


def with_attributes(span: ReadableSpan, attributes: Mapping[str, Any]) -> ReadableSpan:
    """A copy of a finished span with other attributes, everything else its own (the SDK's public constructor): how
    an exporter sends a span with attributes of its own added (a backend's mapping), and how the trace file writes one
    with less (``history``)."""
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource, attributes=attributes,
        events=span.events, links=span.links, kind=span.kind, status=span.status, start_time=span.start_time,
        end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)


# --- the fast check: one pass over a span, no function call per attribute -----------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")
_fine_resources: dict[int, Resource] = {}  # id -> a resource found fine (one per provider)


def _items_fine(items: Iterable[tuple[Any, Any]]) -> bool:
    for key, value in items:
        if type(key) is not str or (not key.isascii() and _SURROGATE.search(key)):
            return False
        kind = type(value)
        if kind is str:
            if not value.isascii() and _SURROGATE.search(value):
                return False
        elif kind is int:
            if not _INT64_MIN <= value <= _INT64_MAX:
                return False
        elif kind is tuple or kind is list:
            if not _items_fine(("", item) for item in value):
                return False
        elif kind is not bool and kind is not float and kind is not bytes:
            return False  # anything else: the careful path decides
    return True


def _span_fine(span: ReadableSpan) -> bool:
    """Whether every text, key and integer of ``span`` encodes as it is (False: look closer, maybe repair)."""
    resource = span.resource
    if _fine_resources.get(id(resource)) is not resource:
        if not _items_fine(resource.attributes.items()):
            return False
        if len(_fine_resources) > 64:
            _fine_resources.clear()
        _fine_resources[id(resource)] = resource
    description = span.status.description
    texts = [("", span.name), ("", description or "")]
    return (_items_fine(texts) and (not span.attributes or _items_fine(span.attributes.items()))
            and all(_items_fine([("", event.name)]) and (not event.attributes or _items_fine(event.attributes.items()))
                    for event in span.events)
            and all(not link.attributes or _items_fine(link.attributes.items()) for link in span.links))


# --- the careful path: a repaired copy ------------------------------------------------------------------------------


def _text_ok(text: str) -> bool:
    if text.isascii():  # known to CPython without looking at the characters
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean_value(value: Any) -> Any:
    """``value`` itself when it encodes, else a repaired copy (text, sequences and mappings at any depth)."""
    kind = type(value)
    if kind is str:
        return value if value.isascii() or _text_ok(value) else clean_text(value)
    if kind is bool or kind is float:
        return value
    if kind is int:
        return value if _INT64_MIN <= value <= _INT64_MAX else _integer_text(value)
    if isinstance(value, str):
        return value if _text_ok(value) else clean_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _INT64_MIN <= value <= _INT64_MAX else _integer_text(value)
    if isinstance(value, (list, tuple)):
        items = [_clean_value(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else tuple(items)
    if isinstance(value, Mapping):
        cleaned = _clean_attributes(value, [])
        return value if cleaned is None else cleaned
    return value


def _integer_text(value: int) -> str:
    try:
        return str(value)
    except ValueError:  # more digits than Python writes out (sys.get_int_max_str_digits)
        return "<integer>"


def _clean_attributes(attributes: Mapping[Any, Any] | None, repaired_keys: list[str]) -> dict[str, Any] | None:
    """A repaired copy of ``attributes``, or None when every key and value encodes as it is. The keys that needed
    repair are added to ``repaired_keys``."""
    if not attributes:
        return None
    copy: dict[str, Any] | None = None
    for position, (key, value) in enumerate(attributes.items()):
        clean_key = _clean_key(key)
        clean_value = _clean_value(value)
        if copy is None and (clean_key is not key or clean_value is not value):
            copy = dict(list(attributes.items())[:position])
        if copy is not None:
            copy[clean_key] = clean_value
            if clean_key is not key or clean_value is not value:
                repaired_keys.append(clean_key)
    return copy


def _clean_key(key: object) -> str:
    global _warned_keys
    if isinstance(key, str):
        return key if _text_ok(key) else clean_text(key)
    text = clean_text(str(key))
    if not _warned_keys:
        _warned_keys = True
        log.warning("attribute_key_not_text", key=text[:60],
                    problem="an attribute key is not text; OTLP keys are strings",
                    hint="the attribute is sent under the key's text form")
    return text


def _repaired_span(span: ReadableSpan) -> ReadableSpan:
    repaired_keys: list[str] = []
    attributes = _clean_attributes(span.attributes, repaired_keys)
    name = _clean_value(span.name)
    description = span.status.description
    clean_description = _clean_value(description) if description else description
    events = [_repaired_event(event, repaired_keys) for event in span.events]
    links = [_repaired_link(link, repaired_keys) for link in span.links]
    resource = _repaired_resource(span.resource)
    changed = (attributes is not None or name is not span.name or clean_description is not description
               or any(new is not old for new, old in zip(events, span.events, strict=True))
               or any(new is not old for new, old in zip(links, span.links, strict=True))
               or resource is not span.resource)
    if not changed:
        return span
    if name is not span.name:
        repaired_keys.append("span.name")
    if clean_description is not description:
        repaired_keys.append("status.message")
    kept = dict(span.attributes or {}) if attributes is None else attributes
    earlier = kept.get(REPAIRED_ATTRIBUTES)
    before = list(earlier) if isinstance(earlier, (list, tuple)) else []
    kept[REPAIRED_ATTRIBUTES] = tuple(dict.fromkeys([*before, *repaired_keys]))
    return ReadableSpan(
        name=name, context=span.context, parent=span.parent, resource=resource, attributes=kept, events=events,
        links=links, kind=span.kind, status=Status(span.status.status_code, clean_description),
        start_time=span.start_time, end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)


def _repaired_event(event: Event, repaired_keys: list[str]) -> Event:
    attributes = _clean_attributes(event.attributes, repaired_keys)
    name = _clean_value(event.name)
    if attributes is None and name is event.name:
        return event
    if name is not event.name:
        repaired_keys.append("event.name")
    return Event(name, event.attributes if attributes is None else attributes, event.timestamp)


def _repaired_link(link: Link, repaired_keys: list[str]) -> Link:
    attributes = _clean_attributes(link.attributes, repaired_keys)
    return link if attributes is None else Link(link.context, attributes)


_resources: dict[int, tuple[Resource, Resource]] = {}  # id -> (the resource, its repaired form): one per provider


def _repaired_resource(resource: Resource) -> Resource:
    known = _resources.get(id(resource))
    if known is not None and known[0] is resource:
        return known[1]
    attributes = _clean_attributes(resource.attributes, [])
    repaired = resource if attributes is None else Resource(attributes, resource.schema_url)
    if len(_resources) > 64:  # a process has a handful of resources; a push may bring one per batch
        _resources.clear()
    _resources[id(resource)] = (resource, repaired)
    return repaired
