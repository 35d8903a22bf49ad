"""`looptrace report [--trace-file F] [--since 7d] [--output report.html]`: one HTML page of the runs in a trace file,
where they looped and what it cost.

The file is read as `looptrace detect` reads it (the same lines parsed, the same spans, the same verdicts), with a
few more attributes decoded for the page; `looptrace.report` does the rest. Like `detect`, it starts without the
agent runtime or the OpenTelemetry SDK.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from looptrace.cli.common import UsageError, plural, positive_count, since_time
from looptrace.cli.exit_codes import EXIT_OK

DEFAULT_OUTPUT = "report.html"
DEFAULT_MAX_RUNS = 100  # report.DEFAULT_MAX_RUNS, said here so that `--help` loads nothing


def add_report_command(commands: Any) -> None:
    report = commands.add_parser(
        "report", help="write one HTML page of the runs in a trace file: where they looped and what it cost",
        description="Reads a trace file (and the files it was rotated into) as `detect` does and writes one\n"
                    "self-contained HTML page: runs over time by how they ended; the share of runs that looped and\n"
                    "the tokens and USD spent in loops, per day, agent and tool; the costliest loops; and, for each\n"
                    "run drawn, its timeline with its loops marked and the content its spans hold. The page fetches\n"
                    "nothing when opened (a file or a CI artifact). What each chart means: docs/report.md.",
        epilog="exit codes:\n  0   the page was written\n"
               "  2   unreadable file, a file holding no OTLP/JSON span (empty, a log, a binary file),\n"
               "      an output that cannot be written, or a bad flag",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_argument("--trace-file", "--file", dest="file", type=Path, metavar="FILE",
                        help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    report.add_argument("--since", type=since_time, metavar="TIME",
                        help="only runs started since TIME: an ISO time (2026-12-01T09:30, local unless it names its "
                             "zone) or a time ago (90s, 15m, 2h, 7d, 2h30m)")
    report.add_argument("--output", "-o", type=Path, default=Path(DEFAULT_OUTPUT), metavar="PATH",
                        help=f"the page to write (default: {DEFAULT_OUTPUT}); replaced whole")
    report.add_argument("--max-runs", type=positive_count, default=DEFAULT_MAX_RUNS, metavar="N",
                        help=f"draw at most N runs in full (default: {DEFAULT_MAX_RUNS}): the looping runs first, "
                             "costliest first, then those that ended in trouble, then the latest; every run is "
                             "counted in the overview")
    report.set_defaults(command_parser=report, handler=report_command)


def report_command(args: argparse.Namespace) -> int:
    from looptrace.cli.detect_command import detection_spans
    from looptrace.cli.trace_reading import LineReporter, trace_file_of
    from looptrace.instrumentation.tracefile import trace_files
    from looptrace.report import RunCollector, read_keys, render, write_page

    path, max_line_bytes = trace_file_of(args)
    output = _writable(args.output)
    collector = RunCollector(since_ns=args.since, max_runs=args.max_runs)
    with LineReporter(path, max_line_bytes) as reader:
        for span in detection_spans(path, reader, keys=read_keys()):
            collector.add(span)
        reader.finish(spans_required=True)
    report = collector.finish()
    rotated = len(trace_files(path)) - 1
    source = f"{path}" + (f" (and {plural(rotated, 'file')} it was rotated into)" if rotated > 0 else "")
    notes = [f"{plural(reader.bad, 'malformed line')} of the file skipped"] if reader.bad else []
    if report.before_since:
        notes.append(f"{plural(report.before_since, 'run')} that started before --since left out")
    try:
        write_page(render(report, source=source, notes=notes), output)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
    looped = report.overview.total.looped
    print(f"looptrace: {plural(report.run_count, 'run')} ({looped:,} looped, {len(report.runs):,} drawn in full) "
          f"from {path} written to {output}", file=sys.stderr)
    print(output)
    return EXIT_OK


def _writable(output: Path) -> Path:
    """The output path, refused early (before a long read) when it cannot be written."""
    if output.is_dir():
        raise UsageError(f"{output} is a directory; give the page's file name (--output {output / DEFAULT_OUTPUT})")
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"cannot write {output}: no folder {folder}")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write {output}: the folder {folder} is not writable")
    return output
