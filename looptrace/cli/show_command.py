"""`looptrace traces show [--file F] [--trace-id ID]`: one run as a tree, the latest by default.

One pass over the file; a line holding one span is judged from its bytes (trace id, end time, root or not), so only
the lines of the trace shown are parsed and decoded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

from looptrace.instrumentation.tracefile.read import (
    SKIP,
    BadLine,
    SpanRecord,
    decode_attributes,
    raw_spans,
    read_lines,
    span_record,
)

from .common import UsageError
from .exit_codes import EXIT_NOT_FOUND, EXIT_OK
from .trace_reading import NOT_TRACE_DATA, LineReporter, is_root, not_trace_data, trace_file_of

MAX_OPEN_TRACES = 10_000  # traces whose root has not come yet; beyond this the oldest is forgotten
MAX_ROOTED_TRACES = 64  # traces whose root had a parent (a sub-agent's, perhaps), kept for their outer run's spans


def show_command(args: argparse.Namespace) -> int:
    from .views import render_trace

    path, max_line_bytes = trace_file_of(args)
    wanted = (args.trace_id or "").lower() or None
    with LineReporter(path, max_line_bytes) as report:
        chosen = _find_trace(path, wanted, report)
        report.finish(spans_required=False)
    if chosen is None:
        what = f"no trace {wanted!r}" if wanted else "no traces"
        print(f"looptrace: {what} in {path}", file=sys.stderr)
        return EXIT_NOT_FOUND
    print(render_trace(chosen))
    return EXIT_OK


_Held = list[Any]  # a trace's spans, undecoded: raw lines (bytes), or (span object, resource attributes, scope)


def _peek(raw: bytes) -> tuple[str, int, bool, bool] | None:
    """(trace id, end time, is a root, has no parent) of a line holding exactly one span, read from its bytes without
    parsing it; None for any other line (several spans, links, an unusual spelling), which is then parsed.

    looptrace writes one span per line: `traces show` parses only the lines of the trace it shows.
    """
    if raw.count(b'"spanId"') != 1:
        return None
    start = raw.find(b'"traceId":"')
    if start < 0:
        return None
    start += 11
    trace_id = raw[start:start + 32]
    if len(trace_id) != 32 or raw[start + 32:start + 33] != b'"' or trace_id.strip(b"0123456789abcdefABCDEF"):
        return None
    end = 0
    at = raw.find(b'"endTimeUnixNano":"')
    if at >= 0:
        at += 19
        digits = raw[at:raw.find(b'"', at)]
        end = int(digits) if digits.isdigit() else 0
    parentless = b'"parentSpanId"' not in raw or b'"parentSpanId":""' in raw
    return trace_id.decode("ascii").lower(), end, parentless or b'"name":"invoke_agent' in raw, parentless


def _find_trace(path: Path, prefix: str | None, report: LineReporter) -> list[SpanRecord] | None:
    """The spans of the trace asked for (or of the latest run), in one pass, decoding only that trace's spans.

    The latest run is the one whose root ended last; a file without any root (every run crashed) falls back to the
    trace with the latest span. Memory holds the best trace so far and the traces whose root has not come yet.

    An `invoke_agent` root with a parent may be a run inside another run's tool (a sub-agent): its trace goes on, and
    the spans that come after it (the outer run's, and its root) join the same trace rather than starting another.
    """
    open_traces: OrderedDict[str, tuple[int, _Held]] = OrderedDict()  # trace id -> (latest end, spans)
    rooted: OrderedDict[str, tuple[int, _Held]] = OrderedDict()  # traces whose latest root had a parent
    best: tuple[int, _Held] | None = None
    matches: set[str] = set()

    def keep(trace_id: str, end: int, root: bool, parentless: bool, item: Any) -> None:
        nonlocal best
        report.saw_span()
        if trace_id not in open_traces and trace_id in rooted:
            open_traces[trace_id] = rooted.pop(trace_id)  # the same list: a best pointing at it sees the rest
        if prefix is not None:
            if not trace_id.startswith(prefix):
                return
            matches.add(trace_id)
            if len(matches) > 1:
                raise UsageError(f"trace id prefix {prefix!r} matches more than one trace; give more digits")
        held = open_traces.get(trace_id)
        if held is None:
            held = open_traces[trace_id] = (end, [])
            if len(open_traces) > MAX_OPEN_TRACES:
                open_traces.popitem(last=False)
        elif end > held[0]:
            held = open_traces[trace_id] = (end, held[1])
        held[1].append(item)
        if prefix is None and root:
            if best is None or end >= best[0]:
                best = (end, held[1])
            del open_traces[trace_id]
            if not parentless:  # perhaps nested: kept a while, for the outer run's spans to come
                rooted[trace_id] = held
                if len(rooted) > MAX_ROOTED_TRACES:
                    rooted.popitem(last=False)

    def parse(raw: bytes) -> Any:
        peeked = _peek(raw)
        if peeked is None:
            return json.loads(raw)
        keep(*peeked, raw)
        return SKIP

    for number, data in read_lines(path, report, report.progress, parse, max_line_bytes=report.max_line_bytes):
        try:
            for span, resource, scope in raw_spans(data):
                trace_id = span["traceId"]
                if type(trace_id) is not str:
                    raise ValueError("traceId is not a string")
                keep(trace_id.lower(), _end(span), is_root(span), not span.get("parentSpanId"), (span, resource, scope))
        except NOT_TRACE_DATA as exc:
            report(BadLine(number, not_trace_data(exc)))
    if prefix is not None:
        chosen = open_traces.get(next(iter(matches))) if matches else None
        return _decode(chosen[1], report) if chosen else None
    if best is None and open_traces:
        best = max(open_traces.values(), key=lambda item: item[0])
    return _decode(best[1], report) if best else None


def _end(span: dict[str, Any]) -> int:
    try:
        return int(span.get("endTimeUnixNano") or 0)
    except (TypeError, ValueError):
        return 0


def _decode(held: _Held, report: LineReporter) -> list[SpanRecord]:
    records = []
    for item in held:
        try:
            items = list(raw_spans(json.loads(item))) if isinstance(item, bytes) else [item]
            for span, resource, scope in items:
                records.append(span_record(span, decode_attributes(resource), scope))
        except NOT_TRACE_DATA as exc:
            # A span that cannot be shown costs itself; the rest of its trace still is.
            report(BadLine(0, f"a span of this trace is unreadable ({not_trace_data(exc)})"))
    return records
