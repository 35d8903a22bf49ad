"""The local trace file: OTLP/JSON lines, written as spans finish and read back by `looptrace traces` and `detect`.

The format is the OpenTelemetry file exporter's (one `TracesData` JSON object per line, hex ids, integer enums), so the
Collector's `otlpjsonfile` receiver can ingest the file as it is. Encoding uses the OpenTelemetry project's own
OTLP/JSON encoder; writing is ours, because a trace file is a convenience that must never take an agent down: a full
disk or a read-only directory costs one warning and the spans of that batch, nothing more.

Reading streams the file line by line, so a file of any size is read in constant memory, and a malformed line is
reported (by number) and skipped rather than ending the read.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .logs import log


def default_trace_file() -> Path:
    """``LOOPTRACE_TRACE_FILE``, else ``.looptrace/traces.jsonl``."""
    from .settings import Settings

    return Settings.from_env().trace_file


class OTLPJsonFileExporter(SpanExporter):
    """Appends each exported batch to ``path`` as one line of OTLP/JSON."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._warned = False
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown or not spans:
            return SpanExportResult.SUCCESS if not spans else SpanExportResult.FAILURE
        try:
            line = json.dumps(encode_spans(spans).to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n"
        except Exception as exc:  # an attribute the encoder cannot take: say so once, keep the agent running
            self._warn_once("encode", exc)
            return SpanExportResult.FAILURE
        try:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # One write of one line in append mode: concurrent writers interleave whole lines, not halves.
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line)
        except OSError as exc:
            self._warn_once("write", exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _warn_once(self, what: str, exc: BaseException) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning(
            "trace_file_unwritable",
            path=str(self.path),
            action=what,
            error=f"{type(exc).__name__}: {exc}",
            hint="the agent keeps running; spans of this batch are lost. Set LOOPTRACE_TRACE_FILE or --trace-file "
            "to a writable path",
        )

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every export is written and closed before it returns


# --- reading ------------------------------------------------------------------------------------------------------

SPAN_KIND_NAMES = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2


@dataclass(slots=True)
class SpanRecord:
    """One span as read back from OTLP/JSON, attributes decoded to plain Python values."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    status_code: int = STATUS_UNSET
    status_message: str = ""
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""

    @property
    def duration_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9

    @property
    def is_error(self) -> bool:
        return self.status_code == STATUS_ERROR


@dataclass(frozen=True, slots=True)
class BadLine:
    line: int
    reason: str


class TraceFileError(Exception):
    """The trace file cannot be read at all (missing, a directory, no permission)."""


def read_spans(path: str | os.PathLike[str], on_bad_line: Callable[[BadLine], None] | None = None,
               on_progress: Callable[[int], None] | None = None,
               keys: frozenset[str] | None = None) -> Iterator[SpanRecord]:
    """Every span in the file, in file order. Bad lines go to ``on_bad_line`` and are skipped.

    ``on_progress`` receives the number of bytes read so far, every few thousand lines, for a progress display.
    ``keys`` limits the span attributes decoded to those (decoding is most of the cost of reading, after parsing).
    """
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below; only opening is an error of ours
    except OSError as exc:
        raise TraceFileError(f"cannot read trace file {os.fspath(path)}: {exc.strerror or exc}") from None
    with handle:
        read = 0
        for number, raw in enumerate(handle, start=1):
            read += len(raw)
            if on_progress is not None and number % 4096 == 0:
                on_progress(read)
            if not raw.strip():
                continue
            try:
                spans = list(_spans_of_line(json.loads(raw), keys))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                if on_bad_line is not None:
                    on_bad_line(BadLine(number, _describe(exc, raw)))
                continue
            yield from spans
        if on_progress is not None:
            on_progress(read)


def _describe(exc: Exception, raw: bytes) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg} at column {exc.colno})" + (" — truncated?" if not raw.endswith(b"\n") else "")
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return f"not OTLP/JSON trace data ({type(exc).__name__}: {exc})"


def spans_of_traces_data(data: Any, keys: frozenset[str] | None = None) -> Iterator[SpanRecord]:
    """The spans of one decoded OTLP/JSON TracesData (or ExportTraceServiceRequest) document."""
    return _spans_of_line(data, keys)


def _spans_of_line(data: Any, keys: frozenset[str] | None) -> Iterator[SpanRecord]:
    if not isinstance(data, dict) or "resourceSpans" not in data:
        raise ValueError("no resourceSpans")
    for resource_spans in data["resourceSpans"]:
        resource = decode_attributes((resource_spans.get("resource") or {}).get("attributes"))
        for scope_spans in resource_spans.get("scopeSpans") or ():
            scope = (scope_spans.get("scope") or {}).get("name", "")
            for span in scope_spans.get("spans") or ():
                yield _span(span, resource, scope, keys)


def _span(span: dict[str, Any], resource: dict[str, Any], scope: str, keys: frozenset[str] | None) -> SpanRecord:
    status = span.get("status") or {}
    trace_id, span_id = span["traceId"], span["spanId"]
    if not isinstance(trace_id, str) or not isinstance(span_id, str):
        raise ValueError("traceId and spanId must be hex strings")
    return SpanRecord(
        trace_id=trace_id.lower(),
        span_id=span_id.lower(),
        parent_span_id=(span.get("parentSpanId") or "").lower() or None,
        name=span.get("name", ""),
        kind=decode_span_kind(span.get("kind", 0)),
        start_ns=int(span.get("startTimeUnixNano") or 0),
        end_ns=int(span.get("endTimeUnixNano") or 0),
        attributes=decode_attributes(span.get("attributes"), keys),
        events=[(e.get("name", ""), int(e.get("timeUnixNano") or 0), decode_attributes(e.get("attributes"), keys))
                for e in span.get("events") or ()],
        status_code=decode_status_code(status.get("code", 0)),
        status_message=status.get("message", ""),
        resource=resource,
        scope=scope,
    )


_ENUM_NAMES = {
    "SPAN_KIND_": {name: number for number, name in SPAN_KIND_NAMES.items()},
    "STATUS_CODE_": {"UNSET": 0, "OK": 1, "ERROR": 2},
}


def _enum(value: Any, prefix: str) -> int:
    # The file exporter writes integers; hand-written OTLP/JSON often uses the enum names.
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return _ENUM_NAMES[prefix].get(value.removeprefix(prefix), 0)
    return 0


def decode_span_kind(value: Any) -> int:
    """An OTLP/JSON span kind, written as its number or its enum name."""
    return _enum(value, "SPAN_KIND_")


def decode_status_code(value: Any) -> int:
    """An OTLP/JSON status code, written as its number or its enum name."""
    return _enum(value, "STATUS_CODE_")


def decode_attributes(items: Any, keys: frozenset[str] | None = None) -> dict[str, Any]:
    if keys is None:
        return {item["key"]: decode_value(item.get("value") or {}) for item in items or ()}
    return {item["key"]: decode_value(item.get("value") or {}) for item in items or () if item["key"] in keys}


def decode_value(value: dict[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])  # int64 travels as a JSON string in OTLP/JSON
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [decode_value(v) for v in (value["arrayValue"] or {}).get("values") or ()]
    if "kvlistValue" in value:
        return decode_attributes((value["kvlistValue"] or {}).get("values"))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None
