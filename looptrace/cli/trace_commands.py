"""`looptrace detect`, `looptrace traces show | list | push` and `looptrace report`: reading stored traces, fast and
safely.

These commands import only the standard library and looptrace's own readers (no OpenTelemetry SDK, no HTTP client,
no anthropic), so that `detect` on a small file costs about what starting Python costs; `push` loads the exporters
when it runs. Each reads the file once, line by line, in memory bounded by the longest line (``trace_reading``).
``main`` runs them without loading the agent runtime; the full CLI (``app``) offers the same commands.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

from looptrace.cli.common import Parser, UsageError, positive_count, silence_stdout, since_time, tolerate_any_terminal
from looptrace.cli.exit_codes import EXIT_CLOSED_PIPE, EXIT_USAGE
from looptrace.cli.langfuse_detect import add_langfuse_arguments
from looptrace.cli.report_command import add_report_command


def _handler(module: str, name: str) -> Any:
    """The command ``name`` of ``module``, imported when it runs: each command loads only its own readers (`traces
    show` never loads what `detect` or `push` need)."""
    def run(args: argparse.Namespace) -> Any:
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{module}"), name)(args)
    run.__name__ = run.__qualname__ = name
    return run


detect_command = _handler("detect_command", "detect_command")
show_command = _handler("show_command", "show_command")
list_command = _handler("list_command", "list_command")
push_command = _handler("push_command", "push_command")


def add_trace_commands(commands: Any) -> None:
    """Add `detect`, `traces` and `report` to a subparsers object (the full CLI's, or the light one of ``main``)."""
    detect = commands.add_parser(
        "detect", help="find loop anomalies in stored traces (exit 1 when there are any)",
        description="Rebuilds each run in an OTLP-JSON trace file (looptrace's, or any agent's whose spans follow "
                    "the OpenTelemetry GenAI conventions, OpenLLMetry's or OpenInference's) and reports repeated "
                    "calls, cycles, tools that keep failing and errors the final answer ignored.",
        epilog="exit codes:\n  0   no anomaly\n  1   anomalies found\n  2   unreadable file, a file holding no "
               "OTLP/JSON span, a bad flag; with --langfuse: keys refused, Langfuse unreachable, a malformed page "
               "(with --cursor, the same command resumes)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    detect.add_argument("file", nargs="?", type=Path,
                        help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    detect.add_argument("--json", action="store_true",
                        help="one JSON object per line for each run shown: those with anomalies or with tool errors "
                             "left unresolved (every run with --all)")
    detect.add_argument("--all", action="store_true",
                        help="also list the runs with neither anomalies nor unresolved tool errors")
    add_langfuse_arguments(detect)
    detect.set_defaults(command_parser=detect, handler=detect_command)

    traces = commands.add_parser(
        "traces", help="show and list the runs in the local trace file; push what a backend could not take",
        description="Read the local trace file (OTLP/JSON lines, as the file exporter writes them) or send on what a "
                    "backend could not take.",
        epilog="exit codes: see each subcommand's --help (looptrace traces show --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    traces_commands = traces.add_subparsers(dest="traces_command", required=True, metavar="SUBCOMMAND")
    show = traces_commands.add_parser(
        "show", help="show a run as a tree (the latest by default)",
        description="Draw one run of a trace file as a tree: the run, its turns, each model call with its tokens and "
                    "each tool call with its arguments and result (when content was captured). Without --trace-id, "
                    "the run that ended last. Malformed lines are named on stderr and skipped.",
        epilog="exit codes:\n  0   the run was shown\n"
               "  2   unreadable or missing file, a file holding no OTLP/JSON span (empty, a log, a binary file),\n"
               "      a trace id prefix that matches more than one trace (or is empty), or a bad flag\n"
               "  3   no such trace\n"
               "  141 stdout closed early (e.g. `| head`)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("--file", type=Path,
                      help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    show.add_argument("--trace-id", help="the trace to show; a unique prefix is enough")
    show.set_defaults(command_parser=show, handler=show_command)
    listing = traces_commands.add_parser(
        "list", help="one line per run in the file: when, status, turns, tokens, cost, anomalies",
        description="One line per run in a trace file, in file order: trace id, when it started, agent name, status, "
                    "turns, tokens, cost, anomalies and duration. Malformed lines are named on stderr and skipped.",
        epilog="exit codes:\n  0   the runs were listed (none, for a file whose spans belong to no finished run)\n"
               "  2   unreadable file, a file holding no OTLP/JSON span (empty, a log, a binary file),\n"
               "      or a bad flag\n"
               "  141 stdout closed early (e.g. `| head`)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    listing.add_argument("--file", type=Path,
                         help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    listing.add_argument("--last", type=positive_count, metavar="N", help="only the last N runs of the file")
    listing.add_argument("--since", type=since_time, metavar="TIME",
                         help="only runs started since TIME: an ISO time (2026-12-01T09:30, local unless it names "
                              "its zone) or a time ago (90s, 15m, 2h, 1d, 2h30m)")
    listing.set_defaults(command_parser=listing, handler=list_command)
    push = traces_commands.add_parser(
        "push", help="send the spans and scores a backend could not take earlier (read back from the trace file), "
                     "never twice",
        description="Send again what a backend (Langfuse, an OTLP endpoint) could not take when the run ended: the "
                    "undelivered list names the spans by id and keeps the Langfuse scores; the spans themselves are "
                    "read back from the trace files it names. Each is sent to the backend that missed it (or only "
                    "to --to), at most once: what was delivered leaves the list.",
        epilog="exit codes:\n  0   nothing failed (spans for a backend not chosen with --to, or not configured, stay "
               "pending and are listed)\n  1   some spans are still pending because their backend failed again, "
               "were held back (a request may have delivered them: --resend-interrupted), or are lost (no trace file "
               "holds them any more)\n"
               "  2   bad flag or configuration, or an undelivered list that is not a regular file",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    push.add_argument("--to", choices=("langfuse", "otlp"),
                      help="only this backend (default: every backend the environment configures)")
    push.add_argument("--file", type=Path, help="the undelivered list (default: LOOPTRACE_UNDELIVERED_FILE or "
                                                ".looptrace/undelivered.jsonl); the spans are read from the trace "
                                                "files it names")
    push.add_argument("--resend-interrupted", action="store_true",
                      help="also send spans to an OTLP backend that a request without an answer (a timeout, an "
                           "interrupted push) may have delivered already (a second copy may reach it); Langfuse "
                           "keeps one copy per span id, so they are always resent there")
    push.set_defaults(command_parser=push, handler=push_command)
    add_report_command(commands)


def quiet_garbage_collector() -> None:
    """Fewer cyclic collections while a file is read: a short-lived command that makes millions of short-lived,
    acyclic objects (parsed lines, freed by reference counting) gains nothing from them, and each full collection
    would walk every module loaded at start-up. Memory stays flat: nothing read is kept in a cycle."""
    gc.freeze()  # what start-up loaded is never collected anyway; keep collections from walking it
    gc.set_threshold(50_000, 50, 100)


def main(argv: list[str] | None = None) -> int:
    """The trace commands alone: what `looptrace detect | traces ...` runs, without loading the agent runtime.

    Same parser class, error lines and exit codes as the full CLI (``app.main``), which offers the same commands.
    """
    parser = Parser(prog="looptrace")
    add_trace_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
        tolerate_any_terminal()
        quiet_garbage_collector()
        try:
            code = args.handler(args)
        except UsageError as exc:
            print(f"looptrace: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        sys.stdout.flush()  # here, so that a closed pipe is noticed where it can be handled
        return code
    except BrokenPipeError:  # `looptrace traces show | head`: the reader has seen enough
        silence_stdout()
        return EXIT_CLOSED_PIPE
