"""The trace file's lines: finished spans in OTLP/JSON, by OpenTelemetry's own encoder.

Each line is one ``TracesData`` object (``{"resourceSpans": [...]}``), exactly what
``opentelemetry.exporter.otlp.json.common``'s ``encode_spans`` builds, written compactly on one line, so the
Collector's ``otlpjsonfile`` receiver and every OTLP/JSON reader read it. What no OTLP reader could take (a lone
surrogate, an integer beyond 64 bits, a key that is not text) is replaced by the one repair step (``encodable``):
that value only, never the span, and the span says which keys in ``looptrace.repaired_attributes``.

The resource (the process's service name, the SDK's attributes, whatever ``OTEL_RESOURCE_ATTRIBUTES`` adds) is the
same on every span a process writes, so a line carries it whole once per writer and file, with
``looptrace.resource.id`` (a digest of it) beside; the writer's later lines in that file carry the service name and
the id alone (``encode_line(span, resource_known=True)``), which the readers resolve (``read.ResourceTable``). Every
line stays a valid ``TracesData``: a reader that knows nothing of the id still gets each span and its service name.

The repair step is not run on every span: nearly every span needs nothing, and the encoded line itself shows the
ones that might. A lone surrogate cannot become UTF-8 (the ``encode`` of the line raises), an integer beyond 64 bits
is an ``intValue`` of 19 digits or more, a key that is not text a ``"key":`` not followed by a string; those patterns
can only be the document's own structure, since every quote inside an encoded string is escaped. A line that shows
one of them, or whose encoding fails, is encoded again after the repair step. The encoder runs once per span, and
the check is one scan of the finished text instead of a pass over every attribute.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan

from ..recording.semconv import REPAIRED_ATTRIBUTES, RESOURCE_ID
from .encodable import encodable_spans

__all__ = ["REPAIRED_ATTRIBUTES", "encode_line", "encode_traces_data", "resource_key"]

# Not ASCII-escaped: the file stays readable with grep and less; the repair step leaves only valid Unicode. Made once:
# json.dumps with options builds an encoder on every call.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# What may need the repair step, seen in an encoded line (see the module's note): at least 19 digits may be beyond
# 64 bits (the repair step decides), and a key whose value does not open with a quote is not text.
_MAY_NEED_REPAIR = re.compile(r'"intValue":"-?\d{19}|"key":[^"]')


def encode_traces_data(spans: Sequence[ReadableSpan], extra: str = "") -> str:
    """``spans`` as one OTLP/JSON ``TracesData`` object, on one line (no newline at the end), repaired first.
    ``extra``, a JSON member (``'"looptrace":{...}'``), goes first in the object."""
    text = _JSON.encode(encode_spans(encodable_spans(spans)).to_dict())
    return "{" + extra + ("," + text[1:] if len(text) > 2 else "}") if extra else text


def encode_line(span: ReadableSpan, *, resource_known: bool = False) -> bytes:
    """One finished span as a line of the trace file, newline included: its resource whole, with its id, or, when the
    file already holds it (``resource_known``), its service name and id alone."""
    try:
        text = _JSON.encode(_with_resource_id(encode_spans((span,)).to_dict(), span.resource, resource_known))
        if not _MAY_NEED_REPAIR.search(text):
            return (text + "\n").encode("utf-8")  # raises on a lone surrogate
    except (UnicodeEncodeError, ValueError):  # a surrogate; an integer with more digits than Python writes out
        pass
    repaired = encode_spans(encodable_spans((span,))).to_dict()
    return (_JSON.encode(_with_resource_id(repaired, span.resource, resource_known)) + "\n").encode("utf-8")


def _with_resource_id(data: dict[str, Any], resource: Resource | None, known: bool) -> dict[str, Any]:
    """The encoded line with its resource's id added (``known``: the rest of the resource left out, but its name)."""
    for resource_spans in data.get("resourceSpans") or ():
        encoded = resource_spans.get("resource")
        if encoded is None or resource is None:
            continue
        identity = {"key": RESOURCE_ID, "value": {"stringValue": resource_key(resource)}}
        items = encoded.get("attributes") or []
        if known:
            kept = [item for item in items if item.get("key") == SERVICE_NAME]
            resource_spans["resource"] = {"attributes": [*kept, identity]}
        else:
            encoded["attributes"] = [*items, identity]
    return data


_keys: dict[int, tuple[Resource, str]] = {}  # id(resource) -> (the resource, its key): one entry per provider
_keys_lock = threading.Lock()


def resource_key(resource: Resource) -> str:
    """A short digest of a resource's attributes: the same for the same resource, in any process."""
    known = _keys.get(id(resource))
    if known is not None and known[0] is resource:
        return known[1]
    items = sorted((str(k), repr(v)) for k, v in resource.attributes.items())
    key = hashlib.sha256(repr(items).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    with _keys_lock:
        if len(_keys) > 256:  # providers come and go in tests; a process has a handful
            _keys.clear()
        _keys[id(resource)] = (resource, key)
    return key
