"""The local trace file's format in one place: OTLP/JSON lines, one ``TracesData`` object per line.

* ``encode``: finished spans to their OTLP/JSON text by OpenTelemetry's encoder (``encode_line``,
  ``encode_traces_data``), after ``encodable``'s repair of the few values no encoder takes (the network exporters use
  the same repair).
* ``read``: the file back, line by line, as ``SpanRecord`` values (``read_spans``, ``read_lines``), or as the raw
  OTLP/JSON a fast reader decodes itself (``raw_spans``, ``span_record`` and the ``decode_*`` helpers); standard
  library only, so that `looptrace detect` and `traces` start fast.
* ``write``: appending lines safely (``TraceFileWriter``), and the SDK's way in (``TraceFileProcessor``,
  ``OTLPJsonFileExporter``).
* ``write`` also rotates the file by size (``Rotation``), and ``read`` reads the rotated files with it, oldest first
  (``trace_files``; ``rotated_away`` says what rotation dropped).
* ``history``: each message of a run once in the file (a model call's input continues an earlier span's);
  ``StoredHistories`` restores a call's whole input, ``tool_descriptions`` a run's tools'.
* ``undelivered``: which spans (by id) and scores a backend could not take, for ``export.push`` to send from the
  trace file later, never twice.

The names below load on first use: reading a file must not pay for the OpenTelemetry SDK the writers import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy_face import lazy_face

if TYPE_CHECKING:  # the same names, for type checkers
    from .encodable import encodable_spans, with_attributes
    from .encode import encode_line, encode_traces_data
    from .history import StoredHistories, tool_descriptions
    from .read import (
        BAD_ATTRIBUTE_KEY,
        SKIP,
        BadLine,
        NotTraceData,
        ResourceTable,
        SpanRecord,
        TraceFileError,
        decode_attributes,
        decode_span_kind,
        decode_status_code,
        decode_value,
        describe_unreadable,
        nanoseconds,
        raw_spans,
        read_lines,
        read_spans,
        rotated_away,
        span_identity,
        span_record,
        spans_of_traces_data,
        total_size,
        trace_files,
    )
    from .undelivered import Pending, PushInProgress, UndeliveredList, span_key
    from .write import OTLPJsonFileExporter, Rotation, TraceFileProcessor, TraceFileWriter

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "encodable_spans": ".encodable",
    "with_attributes": ".encodable",
    "encode_line": ".encode",
    "encode_traces_data": ".encode",
    "StoredHistories": ".history",
    "tool_descriptions": ".history",
    "BAD_ATTRIBUTE_KEY": ".read",
    "SKIP": ".read",
    "BadLine": ".read",
    "NotTraceData": ".read",
    "ResourceTable": ".read",
    "SpanRecord": ".read",
    "TraceFileError": ".read",
    "decode_attributes": ".read",
    "decode_span_kind": ".read",
    "decode_status_code": ".read",
    "decode_value": ".read",
    "describe_unreadable": ".read",
    "nanoseconds": ".read",
    "raw_spans": ".read",
    "read_lines": ".read",
    "read_spans": ".read",
    "rotated_away": ".read",
    "span_identity": ".read",
    "span_record": ".read",
    "spans_of_traces_data": ".read",
    "total_size": ".read",
    "trace_files": ".read",
    "Pending": ".undelivered",
    "PushInProgress": ".undelivered",
    "UndeliveredList": ".undelivered",
    "span_key": ".undelivered",
    "OTLPJsonFileExporter": ".write",
    "Rotation": ".write",
    "TraceFileProcessor": ".write",
    "TraceFileWriter": ".write",
}

__all__ = [
    "BAD_ATTRIBUTE_KEY",
    "SKIP",
    "BadLine",
    "NotTraceData",
    "OTLPJsonFileExporter",
    "Pending",
    "PushInProgress",
    "ResourceTable",
    "Rotation",
    "SpanRecord",
    "StoredHistories",
    "TraceFileError",
    "TraceFileProcessor",
    "TraceFileWriter",
    "UndeliveredList",
    "decode_attributes",
    "decode_span_kind",
    "decode_status_code",
    "decode_value",
    "describe_unreadable",
    "encodable_spans",
    "encode_line",
    "encode_traces_data",
    "nanoseconds",
    "raw_spans",
    "read_lines",
    "read_spans",
    "rotated_away",
    "span_identity",
    "span_key",
    "span_record",
    "spans_of_traces_data",
    "tool_descriptions",
    "total_size",
    "trace_files",
    "with_attributes",
]


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
