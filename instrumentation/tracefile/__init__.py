"""The local trace file's format in one place: OTLP/JSON lines, one ``TracesData`` object per line.

* ``encode``: finished spans to their OTLP/JSON text by OpenTelemetry's encoder (``encode_line``,
  ``encode_traces_data``), after ``encodable``'s repair of the few values no encoder takes (the network exporters use
  the same repair).
* ``read``: the file back, line by line, as ``SpanRecord`` values (``read_spans``, ``read_lines``); standard library
  only, so that `looptrace detect` and `traces` start fast.
* ``write``: appending lines safely (``TraceFileWriter``), and the SDK's way in (``TraceFileProcessor``,
  ``OTLPJsonFileExporter``).
* ``write`` also rotates the file by size (``Rotation``), and ``read`` reads the rotated files with it, oldest first.
* ``undelivered``: which spans (by id) and scores a backend could not take, for ``export.push`` to send from the
  trace file later, never twice.

The names below load on first use: reading a file must not pay for the OpenTelemetry SDK the writers import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .encode import encode_line, encode_traces_data
    from .read import BadLine, SpanRecord, TraceFileError, read_lines, read_spans, trace_files
    from .undelivered import PushInProgress, UndeliveredList
    from .write import OTLPJsonFileExporter, Rotation, TraceFileProcessor, TraceFileWriter

# public name -> the module of this package that defines it
_EXPORTS: dict[str, str] = {
    "encode_line": "encode",
    "encode_traces_data": "encode",
    "BadLine": "read",
    "SpanRecord": "read",
    "TraceFileError": "read",
    "read_lines": "read",
    "read_spans": "read",
    "OTLPJsonFileExporter": "write",
    "TraceFileProcessor": "write",
    "TraceFileWriter": "write",
    "trace_files": "read",
    "Rotation": "write",
    "PushInProgress": "undelivered",
    "UndeliveredList": "undelivered",
}

__all__ = [
    "BadLine",
    "OTLPJsonFileExporter",
    "PushInProgress",
    "Rotation",
    "SpanRecord",
    "TraceFileError",
    "TraceFileProcessor",
    "TraceFileWriter",
    "UndeliveredList",
    "encode_line",
    "encode_traces_data",
    "read_lines",
    "read_spans",
    "trace_files",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
