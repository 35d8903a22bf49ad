"""`looptrace traces list [--file F]`: one line per run in the file: when, status, turns, tokens, cost, anomalies."""

from __future__ import annotations

import argparse
import time

from looptrace.instrumentation.tracefile.read import BadLine, SpanRecord, raw_spans, read_lines, span_record

from .common import plural
from .exit_codes import EXIT_OK
from .trace_reading import NOT_TRACE_DATA, LineReporter, is_root, not_trace_data, trace_file_of


def list_command(args: argparse.Namespace) -> int:
    from looptrace.instrumentation import semconv as sc

    path, max_line_bytes = trace_file_of(args)
    keys = frozenset({sc.GEN_AI_OPERATION_NAME, sc.RUN_STATUS, sc.RUN_TURNS, sc.RUN_USAGE_TOTAL_TOKENS,
                      sc.RUN_COST_USD, sc.RUN_ANOMALY_COUNT})
    with LineReporter(path, max_line_bytes) as report:
        for number, data in read_lines(path, report, report.progress, max_line_bytes=report.max_line_bytes):
            roots = []
            try:
                for span, _, scope in raw_spans(data):
                    report.saw_span()
                    if is_root(span):
                        roots.append(span_record(span, {}, scope, keys))
            except NOT_TRACE_DATA as exc:
                report(BadLine(number, not_trace_data(exc)))
                continue
            for root in roots:
                if root.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
                    report.clear_progress()
                    print(run_line(root))
        report.finish(spans_required=False)
    return EXIT_OK


def run_line(root: SpanRecord) -> str:
    """One run at a glance: id, when, name, status, turns, tokens, cost, anomalies, duration."""
    from looptrace.instrumentation import semconv as sc

    a = root.attributes
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.start_ns / 1e9)) if root.start_ns else "?"
    turns = a.get(sc.RUN_TURNS)
    tokens = a.get(sc.RUN_USAGE_TOTAL_TOKENS)
    cost = a.get(sc.RUN_COST_USD)
    anomalies = a.get(sc.RUN_ANOMALY_COUNT) or 0
    parts = [
        plural(turns, "turn") if isinstance(turns, int) else "? turns",
        plural(tokens, "token") if isinstance(tokens, int) else "? tokens",
        f"${cost:.4f}" if isinstance(cost, (int, float)) and not isinstance(cost, bool) else "$?",
        plural(anomalies, "anomaly") if isinstance(anomalies, int) else f"{anomalies} anomalies",
    ]
    status = str(a.get(sc.RUN_STATUS, "?"))
    return f"{root.trace_id}  {when}  {root.name:<24} {status:<16} {', '.join(parts)}  {_duration(root.duration_s)}"


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
