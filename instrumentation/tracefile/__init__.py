"""The local trace file's format in one place: OTLP/JSON lines, one ``TracesData`` object per line.

* ``encode``: finished spans to their OTLP/JSON text by OpenTelemetry's encoder (``encode_line``,
  ``encode_traces_data``).
* ``read``: the file back, line by line, as ``SpanRecord`` values (``read_spans``, ``read_lines``); standard library
  only, so that `looptrace detect` and `traces` start fast.
* ``write``: appending lines safely (``TraceFileWriter``), and the SDK's way in (``TraceFileProcessor``,
  ``OTLPJsonFileExporter``).
* ``spill``: the same lines for spans a backend could not take, kept until ``push`` delivers them, never twice.
* ``journal``: the network pipelines' export queue on disk, so that spans a killed process had queued reach the
  spill file at the next push.

The names below load on first use: reading a file must not pay for the OpenTelemetry SDK the writers import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .encode import encode_line, encode_traces_data
    from .read import BadLine, SpanRecord, TraceFileError, read_lines, read_spans
    from .spill import PushInProgress, PushReport, SpillFile, push
    from .write import OTLPJsonFileExporter, TraceFileProcessor, TraceFileWriter

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
    "PushInProgress": "spill",
    "PushReport": "spill",
    "SpillFile": "spill",
    "push": "spill",
}

__all__ = [
    "BadLine",
    "OTLPJsonFileExporter",
    "PushInProgress",
    "PushReport",
    "SpanRecord",
    "SpillFile",
    "TraceFileError",
    "TraceFileProcessor",
    "TraceFileWriter",
    "encode_line",
    "encode_traces_data",
    "push",
    "read_lines",
    "read_spans",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
