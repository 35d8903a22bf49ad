"""The trace file's lines: finished spans in OTLP/JSON, by OpenTelemetry's own encoder.

Each line is one ``TracesData`` object (``{"resourceSpans": [...]}``), exactly what
``opentelemetry.exporter.otlp.json.common``'s ``encode_spans`` builds, written compactly on one line, so the
Collector's ``otlpjsonfile`` receiver and every OTLP/JSON reader read it. What no OTLP reader could take (a lone
surrogate, an integer beyond 64 bits, a key that is not text) is replaced by the one repair step (``encodable``):
that value only, never the span, and the span says which keys in ``looptrace.repaired_attributes``.

The repair step is not run on every span: nearly every span needs nothing, and the encoded line itself shows the
ones that might. A lone surrogate cannot become UTF-8 (the ``encode`` of the line raises), an integer beyond 64 bits
is an ``intValue`` of 19 digits or more, a key that is not text a ``"key":`` not followed by a string; those patterns
can only be the document's own structure, since every quote inside an encoded string is escaped. A line that shows
one of them, or whose encoding fails, is encoded again after the repair step. The encoder runs once per span, and
the check is one scan of the finished text instead of a pass over every attribute.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan

from ..recording.semconv import REPAIRED_ATTRIBUTES
from .encodable import encodable_spans

__all__ = ["REPAIRED_ATTRIBUTES", "encode_line", "encode_traces_data"]

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


def encode_line(span: ReadableSpan) -> bytes:
    """One finished span as a line of the trace file, newline included."""
    try:
        text = _JSON.encode(encode_spans((span,)).to_dict())
        if not _MAY_NEED_REPAIR.search(text):
            return (text + "\n").encode("utf-8")  # raises on a lone surrogate
    except (UnicodeEncodeError, ValueError):  # a surrogate; an integer with more digits than Python writes out
        pass
    return (encode_traces_data((span,)) + "\n").encode("utf-8")
