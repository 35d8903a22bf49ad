"""`looptrace traces list [--file F]`: one line per run in the file: when, status, turns, tokens, cost, anomalies."""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict, deque
from typing import Any

from looptrace.cli.common import plural
from looptrace.cli.exit_codes import EXIT_OK
from looptrace.cli.trace_reading import NOT_TRACE_DATA, LineReporter, is_root, not_trace_data, trace_file_of
from looptrace.instrumentation.tracefile import BadLine, SpanRecord, raw_spans, read_lines, span_record

MAX_OPEN_RUNS = 10_000  # runs whose root has not come yet, for their turn counts; beyond this the oldest is forgotten
TURN_SPAN_NAME = "turn"  # semconv.TURN_SPAN_NAME (semconv is imported only once the command runs)
# The status column fits the longest RunStatus ("stopped_by_detector"; a test holds it to the runtime's statuses),
# so that the columns after it line up whatever each run ended with. Spelled out: the list starts without the runtime.
STATUS_WIDTH = 19
NAME_WIDTH = 24


def list_command(args: argparse.Namespace) -> int:
    from looptrace.instrumentation.recording import semconv as sc

    path, max_line_bytes = trace_file_of(args)
    keys = frozenset({sc.GEN_AI_OPERATION_NAME, sc.RUN_STATUS, sc.RUN_TURNS, sc.RUN_USAGE_TOTAL_TOKENS,
                      sc.RUN_COST_USD, sc.RUN_ANOMALY_COUNT, sc.RUN_LOOP_COST_USD, sc.RUN_LOOP_TOTAL_TOKENS,
                      sc.RUN_LOOP_TURNS})
    # Turn spans per parent, so that a run that failed mid-turn is said to have the turn `traces show` draws; a
    # run's entry goes when its root comes, and runs that never wrote a root are forgotten oldest first.
    turns_under: OrderedDict[Any, int] = OrderedDict()
    since = getattr(args, "since", None)
    last: int | None = getattr(args, "last", None)
    held: deque[str] = deque(maxlen=last)  # with --last, the latest lines wait for the end of the file
    runs = 0  # runs found, shown or not (--since, --last)
    with LineReporter(path, max_line_bytes) as report:
        for number, data in read_lines(path, report, report.progress, max_line_bytes=report.max_line_bytes):
            roots = []
            try:
                for span, _, scope in raw_spans(data):
                    if is_root(span):
                        roots.append(span_record(span, {}, scope, keys))
                    elif _is_turn(span):
                        parent = span.get("parentSpanId")
                        turns_under[parent] = turns_under.pop(parent, 0) + 1
                        if len(turns_under) > MAX_OPEN_RUNS:
                            turns_under.popitem(last=False)
            except NOT_TRACE_DATA as exc:
                report(BadLine(number, not_trace_data(exc)))
                continue
            report.saw_span()  # once the line's spans are read: a line refused whole is no sign of trace data
            for root in roots:
                turns_drawn = turns_under.pop(root.span_id, 0)
                if root.attributes.get(sc.GEN_AI_OPERATION_NAME) != sc.OPERATION_INVOKE_AGENT:
                    continue
                runs += 1
                if since is not None and root.start_ns < since:
                    continue
                if last is not None:
                    held.append(run_line(root, turns_drawn))
                    continue
                report.clear_progress()
                print(run_line(root, turns_drawn))
        # A file with no span at all (a log, a binary), or none of whose runs could be read, is a usage error.
        report.finish(spans_required=True, runs=runs)
    for line in held:
        print(line)
    _say_what_rotated_away(path)
    return EXIT_OK


def _say_what_rotated_away(path: Any) -> None:
    """A line on stderr when the trace file's rotation deleted older runs: the list starts after them."""
    import sys

    from looptrace.instrumentation.tracefile import rotated_away

    gone = rotated_away(path)
    if gone is None:
        return
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(gone.before))
    size = f"{gone.max_bytes / 2**20:,.0f} MiB" if gone.max_bytes >= 2**20 else f"{gone.max_bytes / 2**10:,.0f} KiB"
    kept = f"{plural(gone.backups, 'older file')} of {size}" if gone.backups > 0 else "no older file"
    print(f"looptrace: runs written before {when} rotated away (the trace file keeps {kept}; raise "
          "LOOPTRACE_TRACE_FILE_BACKUPS or LOOPTRACE_TRACE_FILE_MAX_BYTES to keep more)", file=sys.stderr)


def _is_turn(span: dict[str, Any]) -> bool:
    name = span.get("name")
    return type(name) is str and (name == TURN_SPAN_NAME or name.startswith(TURN_SPAN_NAME + " "))  # or "turn 3"


def run_line(root: SpanRecord, turns_drawn: int = 0) -> str:
    """One run at a glance: id, when, name, status, turns, tokens, cost, anomalies, duration.

    ``turns_drawn``: the turn spans found under the root. The run counts the turns it completed; one it failed in is
    still a turn of the run (`traces show` draws it), so the larger of the two is said.
    """
    from looptrace.instrumentation.recording import semconv as sc

    a = root.attributes
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.start_ns / 1e9)) if root.start_ns else "?"
    turns = a.get(sc.RUN_TURNS)
    if turns_drawn and (not isinstance(turns, int) or isinstance(turns, bool) or turns_drawn > turns):
        turns = turns_drawn
    tokens = a.get(sc.RUN_USAGE_TOTAL_TOKENS)
    cost = a.get(sc.RUN_COST_USD)
    anomalies = a.get(sc.RUN_ANOMALY_COUNT) or 0
    parts = [
        plural(turns, "turn") if isinstance(turns, int) else "? turns",
        plural(tokens, "token") if isinstance(tokens, int) else "? tokens",
        f"${cost:.4f}" if isinstance(cost, (int, float)) and not isinstance(cost, bool) else "$?",
        plural(anomalies, "anomaly") if isinstance(anomalies, int) else f"{anomalies} anomalies",
    ]
    loop_cost = a.get(sc.RUN_LOOP_COST_USD)
    if isinstance(loop_cost, (int, float)) and not isinstance(loop_cost, bool):
        parts.append(f"loops ${loop_cost:.4f}")
    elif isinstance(a.get(sc.RUN_LOOP_TOTAL_TOKENS), int):  # a loop with a model the price table does not know
        parts.append(f"loops {plural(a[sc.RUN_LOOP_TOTAL_TOKENS], 'token')}")
    status = str(a.get(sc.RUN_STATUS, "?"))
    return (f"{root.trace_id}  {when}  {root.name:<{NAME_WIDTH}} {status:<{STATUS_WIDTH}} {', '.join(parts)}  "
            f"{_duration(root.duration_s)}")


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
