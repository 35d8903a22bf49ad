"""`looptrace demo [STORY]`: an offline run (scripted model, real tools, no key, no network) and its trace as a tree."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any, TextIO

from looptrace.cli.common import UsageError, is_terminal
from looptrace.cli.environment import no_trace_file_reason, read_settings
from looptrace.cli.exit_codes import exit_code_help
from looptrace.cli.running import (
    EXIT_CODES,
    add_anomaly_flag,
    add_export_flags,
    close,
    deliver_outcome,
    execute,
    export_overrides,
    print_json,
    telemetry_options,
)

if TYPE_CHECKING:
    from looptrace.cli.approval_prompt import TerminalApprover
    from looptrace.instrumentation.export import Telemetry
    from looptrace.runtime import RunResult

# demo.STORIES' names (a test keeps the two equal), spelled out so that `--help` does not import the demo's tools
DEMO_STORIES = ("equipment", "ignored-error", "runaway")


def add_demo_command(commands: Any) -> None:
    """Add `demo` to a subparsers object."""
    demo = commands.add_parser("demo", help="run an offline demo (no key, no network)",
                               epilog=exit_code_help("demo"), formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("story", nargs="?", default="equipment", choices=DEMO_STORIES,
                      help="equipment (default): a failed reservation the model recovers from; runaway: a model "
                           "repeating itself, nudged then stopped; ignored-error: a failure the answer glosses over")
    add_anomaly_flag(demo)
    add_export_flags(demo)
    demo.add_argument("--json", action="store_true", help="print the RunResult as one JSON object, nothing else")
    demo.set_defaults(command_parser=demo, handler=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    """Run the story; the live view on stderr, the final answer, what was flagged and the trace tree on stdout."""
    from looptrace.cli import demo as demo_story
    from looptrace.cli.views import LiveView
    from looptrace.instrumentation.export import configure
    from looptrace.runtime import Agent, Limits, ScriptedModel

    out = sys.stdout
    task, script, blurb = demo_story.STORIES[args.story]
    approver = _terminal_for_asking(args)
    # Offline: a judge (LOOPTRACE_JUDGE) would be asked through the scripted model, which has no answer for it.
    settings = dataclasses.replace(read_settings(**export_overrides(args)), judge=None)
    telemetry = configure(settings)
    live = None if args.json else LiveView(sys.stderr, capture_content=settings.capture_content,
                                           no_judge_hint="the demo runs offline")
    agent = Agent(
        demo_story.DEMO_MODEL, tools=demo_story.Inventory().tools(), system=demo_story.DEMO_SYSTEM, name="booking",
        client=ScriptedModel(script()), limits=Limits(max_turns=10, tool_timeout_s=5), on_anomaly=args.on_anomaly,
        on_event=live, **telemetry_options(telemetry, live_view=not args.json),
    )
    if live is not None:
        live.note(f"task: {task}\n(offline: {blurb})\n")
    result = execute(agent, task, telemetry)
    if approver is not None:  # --on-anomaly ask: the person at the terminal answers, and the run goes on in process
        from looptrace.cli.run_command import settle_asked

        approver.view = live
        result = settle_asked(agent, result, approver, telemetry)
    try:
        deliver_outcome(lambda: _write_outcome(args, telemetry, result, out))
    finally:
        close(telemetry)  # whatever happens to stdout, the spans are delivered or listed as undelivered
    return EXIT_CODES[result.status]


def _write_outcome(args: argparse.Namespace, telemetry: Telemetry, result: RunResult, out: TextIO) -> None:
    """The final answer, what was flagged and the trace tree (or the RunResult as JSON)."""
    if args.json:
        print_json(result, out)
        return
    out.write(f"final answer: {result.final_text or '(none)'}\n")
    for anomaly in result.anomalies:
        first = anomaly.first_turn if anomaly.first_turn is not None else anomaly.turn
        turns = f"turn {first}" if first == anomaly.turn else f"turns {first}-{anomaly.turn}"
        out.write(f"flagged: {anomaly.type} x{anomaly.count} ({turns})\n")  # the live view has the message
    out.write("\n")
    _show_written_trace(telemetry, result, out, "--exporter" if args.exporter else None)


def _terminal_for_asking(args: argparse.Namespace) -> TerminalApprover | None:
    """With --on-anomaly ask, who is asked: the person at the terminal. A demo's run cannot pause and be resumed
    later (its scripted model lives in this process), so without a terminal to ask at, ask is refused up front."""
    if args.on_anomaly != "ask":
        return None
    from looptrace.cli.approval_prompt import TerminalApprover

    if not is_terminal(sys.stdin):
        raise UsageError("demo --on-anomaly ask asks at the terminal, and stdin is not one; a demo cannot pause and "
                         "be resumed later (its scripted model lives in this process): run it at a terminal, or "
                         "choose warn, nudge or stop (`looptrace run --on-anomaly ask` pauses and resumes)")
    return TerminalApprover(sys.stdin, sys.stderr)


def _show_written_trace(telemetry: Telemetry, result: RunResult, out: TextIO, chosen_by: str | None) -> None:
    """The run read back from the trace file, as `looptrace traces show` draws it. ``chosen_by`` is the flag that
    chose the exporters, if one did."""
    from looptrace.cli.views import render_trace
    from looptrace.instrumentation.tracefile import TraceFileError, read_spans

    if telemetry.trace_file is None:
        out.write(f"(no trace file: {no_trace_file_reason(telemetry, chosen_by)})\n")
        return
    try:
        spans = [s for s in read_spans(telemetry.trace_file, max_line_bytes=telemetry.settings.max_line_bytes)
                 if s.trace_id == result.trace_id]
    except TraceFileError as exc:
        out.write(f"(the trace could not be read back: {exc})\n")
        return
    if not spans:  # a full disk, or a device such as /dev/full: the warning on stderr said why
        out.write(f"(the run's spans are not in {telemetry.trace_file}: they could not be written there)\n")
        return
    out.write(render_trace(spans) + "\n\n")
    out.write(f"trace file: {telemetry.trace_file}  (looptrace traces show --trace-id {result.trace_id[:12]})\n")
    if result.trace_url:
        out.write(f"trace in Langfuse: {result.trace_url}\n")
