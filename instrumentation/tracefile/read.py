"""The local trace file: OTLP/JSON lines, written as spans finish and read back by `looptrace traces` and `detect`.

The format is the OpenTelemetry file exporter's (one `TracesData` JSON object per line, hex ids, integer enums), so the
Collector's `otlpjsonfile` receiver can ingest the file as it is. Writing lives in ``write`` (and the encoding in
``encode``); this module reads, with the standard library only, so that `looptrace detect` and `traces` start fast.

Reading streams the file line by line, so a file of any size is read in memory bounded by its longest line, and lines
longer than ``max_line_bytes`` (the caller's ``Settings.max_line_bytes``: ``LOOPTRACE_MAX_LINE_BYTES``, default 64 MiB)
are skipped without being held. A malformed line (torn by
a crash, not JSON, JSON that is not trace data, nested beyond reason) is reported by number and skipped; the read
goes on with the next line.

A line whose resource is written once per writer and file (``encode``: the service name and ``looptrace.resource.id``
alone) gets the whole resource back from the line that holds it (``ResourceTable``); lines of files written before
that carry their resource whole, and read as they always did.

A rotated trace file (``write.Rotation``) is read whole: ``read_lines(".looptrace/traces.jsonl")`` reads
``traces.jsonl.<n>`` .. ``traces.jsonl.1`` and then ``traces.jsonl``, oldest first, as one stream (line numbers count
across them). Every file is opened before the first is read, so a rotation meanwhile neither hides nor repeats lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..recording.semconv import RESOURCE_ID
from ..settings import DEFAULT_MAX_LINE_BYTES, MAX_LINE_BYTES_VARIABLE

# --- reading ------------------------------------------------------------------------------------------------------

SPAN_KIND_NAMES = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2


@dataclass(slots=True)
class SpanRecord:
    """One span as read back from OTLP/JSON (a trace file, a request `watch` received) or from Langfuse's API, or
    made by a reader for a span it took apart (another producer's): attributes decoded to plain Python values. The
    one record every offline reader reads (`detect`, `traces`, `replay`, `watch`)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int = 0
    start_ns: int = 0
    end_ns: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
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


SKIP = object()  # what a ``read_lines`` parser returns for a line not worth parsing

# What a line can be wrong with: each becomes a BadLine, never a traceback.
_LINE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)


def trace_files(path: str | os.PathLike[str]) -> list[str]:
    """``path`` and the files it was rotated into, oldest first: ``path.<n>`` .. ``path.1``, ``path``. Only the
    rotated files that exist are listed; ``path`` always is (it may not exist yet)."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    numbers = []
    try:
        entries = os.listdir(directory or ".")
    except OSError:
        entries = []
    for entry in entries:
        head, dot, number = entry.rpartition(".")
        if dot and head == name and number.isdigit():
            numbers.append(int(number))
    return [f"{path}.{number}" for number in sorted(numbers, reverse=True)] + [path]


@dataclass(frozen=True, slots=True)
class RotatedAway:
    """Runs a trace file's rotation deleted: those written before ``before`` (seconds since the epoch), when it kept
    ``backups`` older files of ``max_bytes`` each."""

    before: float
    backups: int
    max_bytes: int


def rotated_away(path: str | os.PathLike[str]) -> RotatedAway | None:
    """What rotation has deleted of the trace file at ``path`` (its note beside it, ``write.note_rotated_away``), or
    None when it never deleted anything (or the note cannot be read)."""
    try:
        with open(os.fspath(path) + ".rotated", encoding="utf-8") as handle:
            note = json.load(handle)
        return RotatedAway(float(note["before"]), int(note.get("backups", 0)), int(note.get("max_bytes", 0)))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def total_size(path: str | os.PathLike[str]) -> int:
    """The bytes ``read_lines(path)`` reads: the file and its rotated predecessors."""
    size = 0
    for name in trace_files(path):
        with contextlib.suppress(OSError):
            size += os.path.getsize(name)
    return size


def _open_all(path: str | os.PathLike[str], *, rotated: bool = True, regular_only: bool = False) -> list[BinaryIO]:
    """Every file of the trace file's rotation (just ``path`` without ``rotated``), opened, oldest first. ``path``
    itself must open unless a rotated one did (just rotated, nothing written since). ``regular_only`` refuses a FIFO,
    a device or a directory (TraceFileError) without waiting on it: such files are opened non-blocking first."""
    handles = []
    *older, _ = trace_files(path) if rotated else [os.fspath(path)]
    current = path
    try:
        for name in older:
            try:
                handles.append(_open(name, regular_only))
            except FileNotFoundError:
                continue  # rotated away between listing and opening: read in its new name
            except OSError as exc:
                raise TraceFileError(f"cannot read trace file {name}: {exc.strerror or exc}") from None
        try:
            handles.append(_open(current, regular_only))
        except OSError as exc:
            if not (handles and isinstance(exc, FileNotFoundError)):
                raise TraceFileError(f"cannot read trace file {os.fspath(path)}: {exc.strerror or exc}") from None
    except BaseException:
        for handle in handles:
            handle.close()
        raise
    return handles


def _open(name: str | os.PathLike[str], regular_only: bool) -> BinaryIO:
    if not regular_only:
        return open(name, "rb")
    descriptor = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise TraceFileError(f"{os.fspath(name)} is {what}, not a trace file")
    os.set_blocking(descriptor, True)  # a regular file never blocks; reads go on as usual
    return os.fdopen(descriptor, "rb")


def read_lines(path: str | os.PathLike[str], on_bad_line: Callable[[BadLine], None] | None = None,
               on_progress: Callable[[int], None] | None = None,
               parse: Callable[[bytes], Any] | None = None, *,
               max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, rotated: bool = True,
               regular_only: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) for every non-blank line that parses, across the rotated files (oldest first; only
    ``path`` itself without ``rotated``); the others go to ``on_bad_line``.

    Memory is bounded by the longest line kept: a line longer than ``max_line_bytes`` is read past in chunks and
    reported, never held. ``parse`` replaces ``json.loads``: it may return ``SKIP`` for a line its caller can tell it
    has no use for without parsing it, or anything else it makes of the bytes (raising ValueError for a bad line).
    ``regular_only`` refuses (TraceFileError) a file that is not a regular file, without blocking on a FIFO.
    """
    handles = _open_all(path, rotated=rotated, regular_only=regular_only)
    try:
        yield from _lines_of(handles, on_bad_line, on_progress, parse, max_line_bytes)
    finally:
        for handle in handles:
            handle.close()


def _raw_lines(handles: list[BinaryIO], limit: int) -> Iterator[tuple[Callable[[int], bytes], bool, bytes]]:
    """(readline, endless, raw) for each line of each file in turn."""
    for handle in handles:
        readline = handle.readline
        # A regular file ends, so an over-long line in it is read past to the next one. A stream (a device, a pipe)
        # may never end its line (/dev/zero): there, reading stops at the limit instead of skipping forever.
        endless = not stat.S_ISREG(os.fstat(handle.fileno()).st_mode)
        while True:
            raw = readline(limit + 1)
            if not raw:
                break
            yield readline, endless, raw


def _lines_of(handles: list[BinaryIO], on_bad_line: Callable[[BadLine], None] | None,
              on_progress: Callable[[int], None] | None, parse: Callable[[bytes], Any] | None,
              limit: int) -> Iterator[tuple[int, Any]]:
    loads = parse or json.loads
    number = read = 0
    for readline, endless, raw in _raw_lines(handles, limit):
        number += 1
        read += len(raw)
        if on_progress is not None and number % 4096 == 0:
            on_progress(read)
        if len(raw) > limit:
            if endless:
                if on_bad_line is not None:
                    on_bad_line(BadLine(number, f"longer than {limit:,} bytes in a stream that is not a regular "
                                                f"file; reading stopped there (raise {MAX_LINE_BYTES_VARIABLE} to "
                                                "read it)"))
                break
            read += _skip_rest_of_line(readline, raw)
            if on_bad_line is not None:
                on_bad_line(BadLine(number, f"longer than {limit:,} bytes; skipped without reading it "
                                            f"(raise {MAX_LINE_BYTES_VARIABLE} to read it)"))
            continue
        try:
            data = loads(raw)
        except _LINE_ERRORS as exc:
            if raw.strip() and on_bad_line is not None:
                on_bad_line(BadLine(number, _describe(exc, raw)))
            continue
        if data is not SKIP:
            yield number, data
    if on_progress is not None:
        on_progress(read)


def _skip_rest_of_line(readline: Callable[[int], bytes], start: bytes) -> int:
    skipped = 0
    chunk = start
    while chunk and not chunk.endswith(b"\n"):
        chunk = readline(1 << 20)
        skipped += len(chunk)
    return skipped


def read_spans(path: str | os.PathLike[str], on_bad_line: Callable[[BadLine], None] | None = None,
               on_progress: Callable[[int], None] | None = None,
               keys: frozenset[str] | None = None, *,
               max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[SpanRecord]:
    """Every span in the file, in file order. Bad lines (and lines longer than ``max_line_bytes``) go to
    ``on_bad_line`` and are skipped.

    ``on_progress`` receives the number of bytes read so far, every few thousand lines, for a progress display.
    ``keys`` limits the span attributes decoded to those (decoding is most of the cost of reading, after parsing);
    with ``keys`` the resource is not decoded either.
    """
    resources = ResourceTable()
    for number, data in read_lines(path, on_bad_line, on_progress, max_line_bytes=max_line_bytes):
        try:
            spans = list(_spans_of_line(data, keys, resources))
        except _LINE_ERRORS as exc:
            if on_bad_line is not None:
                on_bad_line(BadLine(number, _describe(exc, b"")))
            continue
        yield from spans


def _describe(exc: BaseException, raw: bytes) -> str:
    return describe_unreadable(exc, raw)


class NotTraceData(ValueError):
    """A line that is JSON but not OTLP/JSON trace data; its message is the reason, said the same by every reader."""


_OTHER_BYTE_ORDER_MARKS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")  # UTF-16 and UTF-32 (LE's starts as 16's)


def describe_unreadable(exc: BaseException, raw: bytes = b"") -> str:
    """Why a line of a trace file cannot be read, in one phrase: the words every command that reads trace files
    (`detect`, `traces show | list`, `replay`) uses for the same line, so that they never disagree about it.

    ``exc`` is what parsing the line (``raw``, its bytes; empty when the line parsed) or reading its spans raised.
    """
    if raw.startswith(_OTHER_BYTE_ORDER_MARKS):
        return "not UTF-8 text"  # json would guess UTF-16 from the mark and then call the garbage "not JSON"
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    if isinstance(exc, json.JSONDecodeError):
        if exc.doc.lstrip().startswith(("{", "[")):  # JSON begun; was it cut short?
            if raw and not raw.endswith(b"\n"):
                return "truncated/incomplete JSON (torn: the line was never finished)"
            if not exc.doc[exc.pos:].strip() or exc.msg.startswith("Unterminated"):
                return "truncated/incomplete JSON (the line ends before its JSON does)"
        return f"not JSON ({exc.msg} at column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, NotTraceData):
        return f"not OTLP/JSON trace data ({exc})"
    return f"not OTLP/JSON trace data ({type(exc).__name__}: {exc})"


def check_span(span: object) -> None:
    """Raise NotTraceData unless ``span`` holds what every reader relies on: a traceId and a spanId that are strings.
    Called on every span ``raw_spans`` yields, so that no command accepts a line another refuses. (Attribute keys are
    checked where they are decoded, ``decode_span_attributes`` and detection's key selection, at no extra pass.)"""
    if not isinstance(span, dict):
        raise NotTraceData("a span is not an object")
    if type(span.get("traceId")) is not str:
        raise NotTraceData("a span's traceId is missing or not a string")
    if type(span.get("spanId")) is not str:
        raise NotTraceData("a span's spanId is missing or not a string")


BAD_ATTRIBUTE_KEY = "an attribute key is not a string"


def spans_of_traces_data(data: object, keys: frozenset[str] | None = None,
                         resources: ResourceTable | None = None) -> Iterator[SpanRecord]:
    """The spans of one decoded OTLP/JSON TracesData (or ExportTraceServiceRequest) document, resource decoded
    (and resolved, given the ``resources`` the lines before it defined)."""
    decoded_resource: dict[str, Any] = {}
    last_resource: Any = None
    for span, resource, scope in raw_spans(data):
        if resource is not last_resource:
            last_resource = resource
            decoded_resource = decode_attributes(resource)
            if resources is not None:
                decoded_resource = resources.resolved(decoded_resource)
        yield span_record(span, decoded_resource, scope, keys)


class ResourceTable:
    """The resources a trace file holds whole once per writer (with ``looptrace.resource.id``), to give each line
    that names one by its id alone (and its service name) the whole resource back. One per reading of a file."""

    def __init__(self) -> None:
        self._known: dict[str, dict[str, Any]] = {}

    def resolved(self, attributes: dict[str, Any]) -> dict[str, Any]:
        """A line's decoded resource attributes, whole: the id's resource when the line names it alone."""
        key = attributes.get(RESOURCE_ID)
        if not isinstance(key, str):
            return attributes  # a line of an older file, or another producer's: its resource as it is
        rest = {k: v for k, v in attributes.items() if k != RESOURCE_ID}
        if len(rest) > 1 or key not in self._known:  # the line that holds it whole (more than its name)
            if len(self._known) < _MAX_RESOURCES:
                self._known[key] = rest
            return rest
        return self._known[key]


_MAX_RESOURCES = 10_000  # a file's writers have one or two each; a hostile file cannot make the table grow forever


def raw_spans(data: object) -> Iterator[tuple[dict[str, Any], Any, str]]:
    """(span object, resource attributes (undecoded), scope name) for each span of a parsed line."""
    if not isinstance(data, dict) or "resourceSpans" not in data:
        raise ValueError("no resourceSpans")
    resource_spans_list = data["resourceSpans"]
    if not isinstance(resource_spans_list, list):
        raise ValueError("resourceSpans is not a list")
    for resource_spans in resource_spans_list:
        resource = (resource_spans.get("resource") or {}).get("attributes")
        for scope_spans in resource_spans.get("scopeSpans") or ():
            scope = (scope_spans.get("scope") or {}).get("name", "")
            for span in scope_spans.get("spans") or ():
                check_span(span)
                yield span, resource, scope


def _spans_of_line(data: object, keys: frozenset[str] | None, resources: ResourceTable) -> Iterator[SpanRecord]:
    decoded_resource: dict[str, Any] = {}
    last_resource: Any = None
    for span, resource, scope in raw_spans(data):
        if keys is None and resource is not last_resource:
            last_resource = resource
            decoded_resource = resources.resolved(decode_attributes(resource))
        yield span_record(span, decoded_resource, scope, keys)


def span_record(span: dict[str, Any], resource: dict[str, Any], scope: object,
                keys: frozenset[str] | None = None) -> SpanRecord:
    """One OTLP/JSON span object as a SpanRecord; raises ValueError (or kin) when it is not one."""
    get = span.get
    trace_id, span_id, parent, name = span_identity(span)
    status = get("status") or {}
    events = get("events")
    message = status.get("message", "")
    return SpanRecord(
        trace_id,
        span_id,
        parent,
        name,
        decode_span_kind(get("kind", 0)),
        nanoseconds(get("startTimeUnixNano")),
        nanoseconds(get("endTimeUnixNano")),
        decode_span_attributes(get("attributes"), keys),
        [(str(e.get("name", "")), nanoseconds(e.get("timeUnixNano")),
          decode_span_attributes(e.get("attributes"), keys))
         for e in events] if events else [],
        decode_status_code(status.get("code", 0)),
        message if type(message) is str else str(message),
        resource,
        scope if type(scope) is str else str(scope),
    )


def span_identity(span: dict[str, Any]) -> tuple[str, str, str | None, str]:
    """A span object's trace id, span id, parent span id (None for a root) and name, normalised; raises ValueError
    (or kin) when they are not what OTLP/JSON says they are."""
    trace_id, span_id = span["traceId"], span["spanId"]
    if type(trace_id) is not str or type(span_id) is not str:
        raise ValueError("traceId and spanId must be hex strings")
    parent = span.get("parentSpanId")
    name = span.get("name", "")
    return (trace_id.lower(), span_id.lower(), parent.lower() if parent and type(parent) is str else None,
            name if type(name) is str else json.dumps(name))


def nanoseconds(value: object) -> int:
    """An OTLP/JSON time (a string of digits, or a number); 0 for anything else."""
    if not isinstance(value, (str, int, float)):
        return 0
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


_ENUM_NAMES = {
    "SPAN_KIND_": {name: number for number, name in SPAN_KIND_NAMES.items()},
    "STATUS_CODE_": {"UNSET": 0, "OK": 1, "ERROR": 2},
}


def _enum(value: object, prefix: str) -> int:
    # The file exporter writes integers; hand-written OTLP/JSON often uses the enum names.
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return _ENUM_NAMES[prefix].get(value.removeprefix(prefix), 0)
    return 0


def decode_span_kind(value: object) -> int:
    """An OTLP/JSON span kind, written as its number or its enum name."""
    return _enum(value, "SPAN_KIND_")


def decode_status_code(value: object) -> int:
    """An OTLP/JSON status code, written as its number or its enum name."""
    return _enum(value, "STATUS_CODE_")


def decode_attributes(items: Any, keys: frozenset[str] | None = None) -> dict[str, Any]:
    """OTLP/JSON key-value pairs as a dict, keys as they are (the undelivered list keeps what the SDK was given)."""
    if not items:
        return {}
    if keys is None:
        return {item["key"]: decode_value(item.get("value") or {}) for item in items}
    return {key: decode_value(item.get("value") or {}) for item in items if (key := item["key"]) in keys}


def decode_span_attributes(items: Any, keys: frozenset[str] | None = None) -> dict[str, Any]:
    """A span's attributes as the trace-file readers take them: as ``decode_attributes``, but a key that is not a
    string makes the line no trace data (NotTraceData), said alike by every command that reads trace files."""
    if not items:
        return {}
    if keys is None:
        decoded = {item["key"]: decode_value(item.get("value") or {}) for item in items}
        if len(set(map(type, decoded))) > 1 or type(next(iter(decoded), "")) is not str:
            raise NotTraceData(BAD_ATTRIBUTE_KEY)
        return decoded
    selected = {}
    for item in items:
        key = item["key"]
        if type(key) is not str:
            raise NotTraceData(BAD_ATTRIBUTE_KEY)
        if key in keys:
            selected[key] = decode_value(item.get("value") or {})
    return selected


def decode_value(value: dict[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])  # int64 travels as a JSON string in OTLP/JSON
    if "doubleValue" in value:
        return float(value["doubleValue"])  # "NaN" and "Infinity" included
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [decode_value(v) for v in (value["arrayValue"] or {}).get("values") or ()]
    if "kvlistValue" in value:
        return decode_attributes((value["kvlistValue"] or {}).get("values"))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None
