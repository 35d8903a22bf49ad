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
from typing import Any, NamedTuple

from looptrace.cli.common import UsageError, plural
from looptrace.cli.exit_codes import EXIT_NOT_FOUND, EXIT_OK
from looptrace.cli.trace_reading import (
    NOT_TRACE_DATA,
    LineReporter,
    bad_line_reason,
    is_root,
    not_trace_data,
    trace_file_of,
    trace_id_prefix,
)
from looptrace.instrumentation.tracefile import (
    BadLine,
    SpanRecord,
    decode_attributes,
    raw_spans,
    read_lines,
    span_record,
)

MAX_OPEN_TRACES = 10_000  # traces whose root has not come yet; beyond this the oldest is forgotten
MAX_ROOTED_TRACES = 64  # traces whose root had a parent (a sub-agent's, perhaps), kept for their outer run's spans


def show_command(args: argparse.Namespace) -> int:
    from looptrace.cli.views import render_trace

    wanted = trace_id_prefix(args.trace_id)
    path, max_line_bytes = trace_file_of(args)
    with LineReporter(path, max_line_bytes) as report:
        chosen = _find_trace(path, wanted, report)
        # A file holding no span (empty, a log, a binary file) is a usage error, as for `detect`, `list` and `replay`.
        report.finish(spans_required=True)
    if chosen is None:
        what = f"no trace {wanted!r}" if wanted else "no traces"
        print(f"looptrace: {what} in {path}", file=sys.stderr)
        return EXIT_NOT_FOUND
    orphans = _without_their_parent(chosen)
    if orphans:  # said, so that a tree drawn without its root is not taken for the whole run
        print(f"looptrace: {path}: {plural(orphans, 'span')} of this trace {'has' if orphans == 1 else 'have'} "
              "no parent in the file (a run that never finished writing, or a line skipped above); shown at the top",
              file=sys.stderr)
    print(render_trace(chosen))
    for line in _unresolved_lines(chosen):
        print(line)
    return EXIT_OK


def _unresolved_lines(spans: list[SpanRecord]) -> list[str]:
    """The tool errors each run of the trace left unresolved: as its root recorded them (looptrace's runs), else
    rebuilt from its tool spans as `detect` rebuilds them (another producer's trace); nothing for a run without."""
    from looptrace.cli.common import unresolved_lines
    from looptrace.cli.views import IGNORED_ERROR, WARN_MARK
    from looptrace.instrumentation.offline import recorded_unresolved_errors
    from looptrace.instrumentation.recording import semconv as sc

    roots = [s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT]
    recorded = [(root.name, recorded_unresolved_errors(root)) for root in roots]
    runs: list[tuple[str, int, list[Any]]] = [(name, r[0], r[1]) for name, r in recorded if r is not None]
    if not runs:  # no root of looptrace's: what the tool spans say
        from looptrace.instrumentation.offline import detect_spans

        runs = [(v.name, len(v.unresolved_errors), v.unresolved_errors) for v in detect_spans(spans)]
    # A warning only when the detector found the final answer ignoring an error; otherwise a fact, said quietly.
    ignored = any(event[2].get(sc.ANOMALY_TYPE) == IGNORED_ERROR for span in spans for event in span.events)
    mark = f"{WARN_MARK} " if ignored else ""
    lines = []
    for name, total, errors in runs:
        for line in unresolved_lines(errors, total=total):
            warn = mark if "left unresolved" in line else ""
            lines.append(f"{warn}{name + ': ' if len(runs) > 1 else ''}{line}")
    return lines


def _without_their_parent(spans: list[SpanRecord]) -> int:
    """The spans naming a parent that is not in the file, a run's root joined to an outside trace aside."""
    ids = {s.span_id for s in spans}
    return sum(1 for s in spans
               if s.parent_span_id and s.parent_span_id not in ids and not s.name.startswith("invoke_agent"))


_Held = list[Any]  # a trace's spans, undecoded: each a _Line (read, not parsed) or a _Parsed span


class _Line(NamedTuple):
    """A line judged from its bytes, kept with its number so that a fault found when it is parsed names its line."""

    number: int
    raw: bytes


class _Parsed(NamedTuple):
    """One span of a line that was parsed (a line of several spans, say), with what it needs to be decoded."""

    number: int
    span: dict[str, Any]
    resource: Any
    scope: Any


def _peek(raw: bytes) -> tuple[str, int, bool, bool] | None:
    """(trace id, end time, is a root, has no parent) of a line holding exactly one span, read from its bytes without
    parsing it; None for any other line (several spans, links, an unusual spelling), which is then parsed.

    looptrace writes one span per line: `traces show` parses only the lines of the trace it shows.
    """
    if (raw.count(b'"spanId":"') != 1 or raw.count(b'"spanId"') != 1 or not raw.rstrip().endswith(b"}")
            or raw.count(b'"key":') != raw.count(b'"key":"')):
        # (a torn line, or one whose ids or attribute keys are not strings, is parsed, so that it is checked and
        # reported as `detect` and `list` report it)
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

    kept: set[str] = set()  # up to two trace ids: whether any span, and a second trace, was kept

    def keep(trace_id: str, end: int, root: bool, parentless: bool, item: Any) -> None:
        nonlocal best
        if len(kept) < 2:
            kept.add(trace_id)
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
        return _Peeked(*peeked, raw)  # kept below, where its line number is known

    for number, data in read_lines(path, report, report.progress, parse, max_line_bytes=report.max_line_bytes):
        if type(data) is _Peeked:
            keep(data.trace_id, data.end, data.root, data.parentless, _Line(number, data.raw))
            continue
        try:
            for span, resource, scope in raw_spans(data):
                # (the trace id is a string: raw_spans checked it)
                keep(span["traceId"].lower(), _end(span), is_root(span), not span.get("parentSpanId"),
                     _Parsed(number, span, resource, scope))
        except NOT_TRACE_DATA as exc:
            report(BadLine(number, not_trace_data(exc)))
    if prefix is not None:
        chosen = open_traces.get(next(iter(matches))) if matches else None
    else:
        if best is None and open_traces:
            best = max(open_traces.values(), key=lambda item: item[0])
        chosen = best
    records = _decode(chosen[1], report) if chosen else None
    # Spans were read unless every line of the trace chosen was refused once parsed (the only trace of a file whose
    # attribute keys are numbers, say): then the file is said to hold none, as `detect` and `list` say it.
    if records or (kept and records is None) or len(kept) > 1:
        report.saw_span()
    return records


def _end(span: dict[str, Any]) -> int:
    try:
        return int(span.get("endTimeUnixNano") or 0)
    except (TypeError, ValueError):
        return 0


class _Peeked(NamedTuple):
    trace_id: str
    end: int
    root: bool
    parentless: bool
    raw: bytes


def _decode(held: _Held, report: LineReporter) -> list[SpanRecord]:
    """The spans of the trace shown, each held line parsed now. A line that fails costs its own spans, reported with
    its number and in the words `detect` and `list` use for it; the rest of the trace is still shown."""
    records: list[SpanRecord] = []
    for item in held:
        try:
            if type(item) is _Line:
                try:
                    data = json.loads(item.raw)
                except NOT_TRACE_DATA as exc:  # a torn line, say: described as read_lines describes it
                    report(BadLine(item.number, bad_line_reason(exc, item.raw)))
                    continue
                records.extend(span_record(span, decode_attributes(resource), scope)
                               for span, resource, scope in list(raw_spans(data)))
            else:
                records.append(span_record(item.span, decode_attributes(item.resource), item.scope))
        except NOT_TRACE_DATA as exc:
            report(BadLine(item.number, not_trace_data(exc)))
    return records
