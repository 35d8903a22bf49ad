"""The trace file's lines: finished spans in OTLP/JSON, by OpenTelemetry's own encoder.

Each line is one ``TracesData`` object (``{"resourceSpans": [...]}``), exactly what
``opentelemetry.exporter.otlp.json.common``'s ``encode_spans`` builds, written compactly on one line, so the
Collector's ``otlpjsonfile`` receiver and every OTLP/JSON reader read it. Before the encoder, the one repair step
(``encodable``) replaces what no OTLP reader could take (a lone surrogate, an integer beyond 64 bits): that value
only, never the span, and the span says which keys in ``looptrace.repaired_attributes``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan

from ..recording.semconv import REPAIRED_ATTRIBUTES
from .encodable import encodable_spans

__all__ = ["REPAIRED_ATTRIBUTES", "encode_line", "encode_traces_data"]


def encode_traces_data(spans: Sequence[ReadableSpan], extra: str = "") -> str:
    """``spans`` as one OTLP/JSON ``TracesData`` object, on one line (no newline at the end). ``extra``, a JSON
    member (``'"looptrace":{...}'``, the spill file's tag), goes first in the object."""
    document = encode_spans(encodable_spans(spans)).to_dict()
    # Not ASCII-escaped: the file stays readable with grep and less; the repair step left only valid Unicode.
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return "{" + extra + ("," + text[1:] if len(text) > 2 else "}") if extra else text


def encode_line(span: ReadableSpan) -> bytes:
    """One finished span as a line of the trace file, newline included."""
    return (encode_traces_data((span,)) + "\n").encode("utf-8")
