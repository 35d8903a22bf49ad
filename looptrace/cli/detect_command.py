"""`looptrace detect [FILE]`: the loop anomalies in a stored trace file, one run at a time; exit 1 when there are any.

It imports only the standard library and looptrace's readers and detector (no OpenTelemetry SDK, no HTTP client, no
anthropic), so that `detect` on a small file costs about what starting Python costs. Spans go from the parsed line
straight to the run rebuilder's shape, and lines that cannot matter to detection are not parsed at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from looptrace.cli.common import left_unresolved, plural, unresolved_lines
from looptrace.cli.exit_codes import EXIT_OK
from looptrace.cli.trace_reading import LineReporter, spans_by_line, trace_file_of
from looptrace.instrumentation.tracefile import (
    SKIP,
    decode_status_code,
    decode_value,
    nanoseconds,
    raw_spans,
    span_identity,
)


def detect_command(args: argparse.Namespace) -> int:
    """Print each run with anomalies (every run with --all; JSON lines with --json) and the count on stderr."""
    if getattr(args, "langfuse", False):
        from looptrace.cli.langfuse_detect import langfuse_detect_command

        return langfuse_detect_command(args, print_verdict)
    from looptrace.instrumentation.offline import detect_spans

    path, max_line_bytes = trace_file_of(args)
    found = unresolved = runs_unresolved = reported = runs = 0
    with LineReporter(path, max_line_bytes) as report:
        for verdict in detect_spans(detection_spans(path, report)):
            runs += 1
            found += len(verdict.anomalies)
            unaddressed = left_unresolved(verdict.unresolved_errors)
            reported += len(verdict.unresolved_errors) - unaddressed
            if unaddressed:
                unresolved += unaddressed
                runs_unresolved += 1
            # A run is shown for its anomalies, or for the tool errors it left unresolved (a fact, not a finding).
            if not verdict.anomalies and not verdict.unresolved_errors and not args.all:
                continue
            report.clear_progress()
            print_verdict(verdict, args)
        report.finish(spans_required=True, runs=runs)
    if not args.json:
        left = (f"; {plural(unresolved, 'tool error')} left unresolved in {plural(runs_unresolved, 'run')}"
                if unresolved else "")
        told = f"; {plural(reported, 'tool error')} reported by the model" if reported else ""
        print(f"{plural(found, 'anomaly')} found in {path}{left}{told}", file=sys.stderr)
    return 1 if found else EXIT_OK


def print_verdict(verdict: Any, args: argparse.Namespace) -> None:
    """One run's verdict on stdout: a JSON line with --json, else its header line and one line per anomaly."""
    write = sys.stdout.write
    if args.json:
        write(json.dumps(verdict.to_dict(), ensure_ascii=False) + "\n")
        return
    errors = getattr(verdict, "unresolved_errors", None) or []
    unaddressed = left_unresolved(errors)
    left = f", {plural(unaddressed, 'unresolved tool error')}" if unaddressed else ""
    if len(errors) > unaddressed:
        left += f", {plural(len(errors) - unaddressed, 'reported tool error')}"
    loop_cost = getattr(verdict, "loop_cost", None)
    spent = f" (loops cost {loop_cost.summary()})" if loop_cost is not None else ""
    write(f"{verdict.trace_id}  {verdict.name}  [{verdict.status or '?'}]  {plural(verdict.turns, 'turn')}, "
          f"{plural(verdict.tool_calls, 'tool call')}, {plural(len(verdict.anomalies), 'anomaly')}{spent}{left}\n")
    for anomaly in verdict.anomalies:
        tool = f" {anomaly.tool}" if anomaly.tool else ""
        cost = f" ({anomaly.cost.summary()})" if anomaly.cost is not None else ""
        write(f"  turn {anomaly.turn:>3}  {anomaly.type}{tool} x{anomaly.count}{cost}: {anomaly.message}\n")
    for line in unresolved_lines(errors):
        write(f"  {line}\n")
    for rule, why in verdict.rules_not_run.items():  # what the producer did not record is not guessed
        write(f"  not checked: {rule}: {why}\n")


def detection_spans(path: Path, report: LineReporter, keys: Any = None) -> Iterator[Any]:
    """Every span of the file as the run rebuilder reads it (``tracefile.read.SpanRecord``), each line parsed once.

    The spans go straight from the parsed line to the rebuilder's shape, decoding only the attributes detection
    reads (``trace_detect.DETECTION_KEYS``, or ``keys``: a ``KeySelection`` holding them and more, for `report`); the
    resource, the span kind and the other attributes are never decoded. A line is checked as
    ``trace_reading.spans_of`` checks it, so the same lines are reported malformed.
    """
    from looptrace.instrumentation.offline import DETECTION_KEYS
    from looptrace.instrumentation.tracefile import SpanRecord

    verdicts = (keys if keys is not None else DETECTION_KEYS).verdicts

    def attributes_of(items: Any) -> dict[str, Any]:
        if not items:
            return {}
        return {key: value["stringValue"] if "stringValue" in value else decode_value(value)
                for item in items if verdicts[key := item["key"]] for value in (item.get("value") or {},)}

    def neutral_spans(data: Any) -> list[SpanRecord]:
        spans = []
        for span, _, _ in raw_spans(data):
            get = span.get
            trace_id, span_id, parent, name = span_identity(span)
            status = get("status") or {}
            status.get("message", "")  # read for its check: a status must be an object
            events = get("events")
            if events:  # not read by detection, but a line whose events are not trace data is reported
                for event in events:
                    event.get("name")
                    attributes_of(event.get("attributes"))
            spans.append(SpanRecord(
                trace_id, span_id, parent, name, start_ns=nanoseconds(get("startTimeUnixNano")),
                attributes=attributes_of(get("attributes")), status_code=decode_status_code(status.get("code", 0)),
                end_ns=nanoseconds(get("endTimeUnixNano"))))
        return spans

    return spans_by_line(path, report, detection_parser(), neutral_spans)


def detection_parser() -> Any:
    """json.loads, except for a line of looptrace's own that cannot matter to detection, told from its bytes alone.

    Detection reads model calls, tool calls, roots and conversation ids. A line from looptrace's scope that names
    neither an operation, a tool nor a conversation, and whose every span has a parent (as many ``"parentSpanId"`` as
    ``"spanId"`` keys, none empty), holds none of them: looptrace's turn spans. Other producers' lines are always
    parsed (their readers look at other keys). Inside a JSON string a quote is escaped, so these keys with their
    quotes can only be keys; the test errs only towards parsing.
    """
    from looptrace.instrumentation.recording import semconv as sc

    wanted = [name.encode() for name in (sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_TOOL_NAME, sc.GEN_AI_CONVERSATION_ID)]
    ours = b'"scope":{"name":"' + sc.SCOPE_NAME.encode() + b'"'
    loads = fast_json_loads()

    def parse(raw: bytes) -> Any:
        if (ours not in raw or any(name in raw for name in wanted) or b'"parentSpanId":""' in raw
                or raw.count(b'"parentSpanId"') != raw.count(b'"spanId"') or b'"resourceSpans"' not in raw):
            return loads(raw)  # (not trace data at all: parsed so that it is reported as such)
        return SKIP

    return parse


def fast_json_loads() -> Any:
    """json.loads, through msgspec's JSON decoder when msgspec is installed: it parses trace lines two to three times
    faster. msgspec is stricter than json (no NaN, no lone surrogate, no byte order mark): a line it refuses goes to
    json.loads, whose value or error is then the one used, so what is read and what is reported stay json's."""
    try:
        from msgspec import DecodeError
        from msgspec.json import Decoder
    except ImportError:
        return json.loads
    decode = Decoder().decode

    def loads(raw: bytes) -> Any:
        try:
            return decode(raw)
        except DecodeError:
            return json.loads(raw)

    return loads
