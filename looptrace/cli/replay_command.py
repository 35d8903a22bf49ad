"""`looptrace replay`: a stored run re-run offline through the current loop, detector, policy and limits.

One run (the latest by default, or ``--trace-id``): its anomalies now and at which turns, how it ends now, where
``--on-anomaly stop`` would have stopped it, and what differs from what the live run reported; ``--pytest FILE``
also writes a regression test of it. ``--all``: every run of the file, before and after, as a table
(``replay_table``): a what-if for the detector's thresholds.

Exit codes: the replayed run's status as `looptrace run` maps it (0 done, 30 stopped_by_detector, ...), 2 for a run
that cannot be replayed (recorded without content, spans missing) or a bad file or flag, 3 when the trace is not in
the file. ``--all`` exits 0 once the table is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from looptrace.cli.common import UsageError, plural
from looptrace.cli.exit_codes import EXIT_NOT_FOUND, EXIT_USAGE
from looptrace.cli.replay_options import (
    DETECTOR_FLAGS,
    detector_changes,
    detector_config,
    positive_float,
    positive_int,
    run_replay,
    tools_of,
    whole_number,
)

if TYPE_CHECKING:
    from looptrace.replay import Replay

REPLAY_EPILOG = """exit codes:
  0   the replayed run ended done           1   error (among them: the replay went past the recording)
  2   the run cannot be replayed (recorded without content, a span missing), a bad file or flag
  3   no such trace in the file
  10-13, 20-23, 30   as `looptrace run`: how the replayed run ended (30 stopped_by_detector)
  with --all: 0 once the table is printed"""


def add_replay_command(commands: Any) -> None:
    """Add `replay` to a subparsers object."""
    replay = commands.add_parser(
        "replay", help="re-run a stored run offline through the current loop, detector and policy",
        description="Rebuilds a run from the trace file (its task, system prompt, tools, every model response and\n"
                    "tool result: it needs content capture on) and runs it again offline: the recorded responses as a\n"
                    "scripted model, the recorded results (or your tools) for its calls, today's detector, policy and\n"
                    "limits. Says which anomalies it finds and at which turns, how it ends, where --on-anomaly stop\n"
                    "would have stopped it, and what differs from what the live run reported.",
        epilog=REPLAY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    replay.add_argument("--file", type=Path,
                        help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    replay.add_argument("--trace-id", help="the run to replay; a unique prefix is enough (default: the latest run)")
    replay.add_argument("--all", action="store_true",
                        help="every run in the file: a table of the findings recorded and found now (a what-if for "
                             "detector settings such as --repeat-threshold)")
    replay.add_argument("--tools", metavar="FILE.py",
                        help="answer the run's calls with the @tool functions of this file (called with the recorded "
                             "arguments) instead of the recorded results")
    replay.add_argument("--on-anomaly", choices=("warn", "nudge", "stop"),
                        help="what a loop anomaly does (default: the Agent's: nudge repeated calls and cycles once, "
                             "stop them if they go on; warn about ignored errors)")
    replay.add_argument("--max-turns", type=positive_int, metavar="N",
                        help="default: the recorded run's turns when it ended on max_turns, else none")
    replay.add_argument("--max-total-tokens", type=positive_int, metavar="N",
                        help="default: the recorded run's total when it ended on its token budget, else none")
    replay.add_argument("--max-cost-usd", type=positive_float, metavar="USD",
                        help="default: the recorded run's cost when it ended on its cost budget, else none")
    for flag, _, what in DETECTOR_FLAGS:
        replay.add_argument(flag, type=whole_number, metavar="N", help=f"{what} (default: the detector's)")
    replay.add_argument("--pytest", type=Path, metavar="FILE",
                        help="also write a regression test of the run: it fails while the run loops, and passes "
                             "once the agent's fix stops the loop")
    replay.add_argument("--json", action="store_true", help="the outcome as JSON (one object per run with --all)")
    replay.set_defaults(command_parser=replay, handler=replay_command)


def replay_command(args: argparse.Namespace) -> int:
    from looptrace.cli.trace_reading import trace_file_of, trace_id_prefix
    from looptrace.replay import NotReplayable, rebuild_run

    if args.all and (args.trace_id is not None or args.pytest):
        raise UsageError("--all replays every run; --trace-id and --pytest are for one run")
    trace_id = trace_id_prefix(args.trace_id)
    detector = detector_config(args)
    tools = tools_of(args)
    path, max_line_bytes = trace_file_of(args)
    if args.all:
        from looptrace.cli.replay_table import replay_all

        return replay_all(path, args, tools=tools, detector=detector, max_line_bytes=max_line_bytes)
    spans = _one_trace(path, trace_id, max_line_bytes)
    if spans is None:
        what = f"no trace {trace_id!r}" if trace_id else "no traces"
        print(f"looptrace: {what} in {path}", file=sys.stderr)
        return EXIT_NOT_FOUND
    try:
        recorded = rebuild_run(spans)
        replayed = run_replay(recorded, args, tools=tools, detector=detector)
    except NotReplayable as exc:
        print(f"looptrace: cannot replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from looptrace.cli.running import EXIT_CODES, deliver_outcome

    if args.json:
        deliver_outcome(lambda: sys.stdout.write(json.dumps(replayed.to_dict(), ensure_ascii=False, default=str)
                                                 + "\n"))
    else:
        deliver_outcome(lambda: show(replayed, args, sys.stdout))
    if args.pytest is not None:
        from looptrace.cli.replay_pytest import write_regression_test

        write_regression_test(args.pytest, replayed.recorded, tools_file=Path(args.tools) if args.tools else None)
        print(f"looptrace: wrote {args.pytest}: a regression test of run {recorded.trace_id[:12]} "
              f"(run it with: pytest {args.pytest})", file=sys.stderr)
    return EXIT_CODES[replayed.result.status]


def show(replayed: Replay, args: argparse.Namespace, out: TextIO) -> None:
    """The replay of one run, for a person."""
    recorded, result = replayed.recorded, replayed.result
    out.write(f"replay of {recorded.trace_id}  {recorded.agent}  ({recorded.model or '?'}): "
              f"{plural(recorded.turns, 'turn')} recorded, ended {recorded.status or '?'}\n")
    tools = f"yours ({args.tools})" if replayed.own_tools else "the recorded results"
    out.write(f"  tools: {tools}; policy: {args.on_anomaly or 'default'}; detector: {detector_changes(args)}\n")
    matched = {id(now): then for then, now in replayed.diff.same}
    for anomaly in replayed.anomalies:
        then = matched.get(id(anomaly))
        mark = "+ new" if then is None else "= as recorded" + (
            f" (then: {then.action})" if then.action and then.action != anomaly.action else "")
        tool = f" {anomaly.tool}" if anomaly.tool else ""
        out.write(f"  turn {anomaly.turn:>3}  {anomaly.type}{tool} x{anomaly.count}  {anomaly.action:<5}  {mark}\n")
    for gone in replayed.diff.gone:
        tool = f" {gone.tool}" if gone.tool else ""
        out.write(f"  turn {gone.turn:>3}  {gone.type}{tool} x{gone.count}  {gone.action or '?':<5}  "
                  f"- recorded, not found now\n")
    out.write(f"replayed: {result.status.value} after {plural(result.turns, 'turn')}\n")
    if replayed.past_recording_turn is not None:
        out.write(f"  the replay went past the recording at turn {replayed.past_recording_turn}: what the model "
                  f"would have said next was never recorded\n")
    elif result.error:
        out.write(f"  {result.error}\n")
    stop = replayed.stop_turn
    out.write(f"--on-anomaly stop would have stopped it at turn {stop}\n" if stop is not None
              else "--on-anomaly stop would not have stopped it: no anomaly\n")
    diff = replayed.diff
    verdict = ("the same as recorded" if not diff.changed
               else f"{len(diff.same)} as recorded, {len(diff.gone)} gone, {len(diff.new)} new")
    out.write(f"anomalies: {len(recorded.anomalies)} recorded, {len(replayed.anomalies)} replayed: {verdict}\n")
    for note in replayed.notes:
        out.write(f"note: {note}\n")


def _one_trace(path: Path, trace_id: str | None, max_line_bytes: int) -> list[Any] | None:
    """The spans of the trace asked for, or of the latest run, read as `traces show` reads them."""
    from looptrace.cli.show_command import _find_trace
    from looptrace.cli.trace_reading import LineReporter

    with LineReporter(path, max_line_bytes) as report:
        spans = _find_trace(path, trace_id, report)
        report.finish(spans_required=True)  # an empty file, a log or a binary file is refused as `traces show` does
    return spans
