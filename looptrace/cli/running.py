"""What `run` and `demo` share: their export and anomaly flags, running the agent under Ctrl-C and SIGTERM, the Agent
arguments that route its telemetry, delivering everything before the exit, and the RunResult as JSON.

One rule for demo and run alike: the live view is progress, so it goes to stderr (and is left out by --json); stdout
holds only the outcome, which a pipe or a script can take as it is.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from looptrace.cli.common import silence_stdout
from looptrace.cli.exit_codes import EXIT_AWAITING_APPROVAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED
from looptrace.runtime import RunResult, RunStatus

# Only what the parser needs is imported here: `looptrace --help` and `--version` must not pay for the OpenTelemetry
# SDK, the exporters or the anthropic client. Each command imports what it uses.
if TYPE_CHECKING:
    from looptrace.instrumentation import Alerts
    from looptrace.instrumentation.export import Telemetry
    from looptrace.runtime import Agent

EXIT_CODES: dict[RunStatus, int] = {
    RunStatus.DONE: EXIT_OK,
    RunStatus.ERROR: 1,
    RunStatus.MAX_TURNS: 10,
    RunStatus.TOKEN_BUDGET: 11,
    RunStatus.COST_BUDGET: 12,
    RunStatus.TIMEOUT: 13,
    RunStatus.MAX_TOKENS: 20,
    RunStatus.STOP_SEQUENCE: 21,
    RunStatus.REFUSAL: 22,
    RunStatus.CONTEXT_WINDOW: 23,
    RunStatus.STOPPED_BY_DETECTOR: 30,
    RunStatus.LOOP_BUDGET: 14,
    RunStatus.INTERRUPTED: EXIT_INTERRUPTED,
    RunStatus.AWAITING_APPROVAL: EXIT_AWAITING_APPROVAL,
}


def add_anomaly_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--on-anomaly", choices=("warn", "nudge", "ask", "stop"),
                        help="what a loop anomaly does (default: nudge repeated calls and cycles once, stop them if "
                             "they go on; warn about ignored errors); ask: a person says go on or stop")


def add_export_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exporter", metavar="LIST",
                        help="comma list of file, console, otlp, langfuse, none, taken exactly (default: "
                             "LOOPTRACE_EXPORTER; else file, plus langfuse when LANGFUSE_* keys are set and otlp when "
                             "OTEL_EXPORTER_OTLP_ENDPOINT is)")
    parser.add_argument("--trace-file", type=Path,
                        help="where the file exporter writes "
                             "(default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")


def export_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings fields the export flags set (None where a flag was not given: the environment's value stays).

    Flags that cannot work are refused here, before anything runs: an empty --exporter (it would quietly mean the
    default), a --trace-file that is a directory or lies under a file (the run would go ahead and lose its trace).
    """
    from looptrace.cli.common import UsageError

    if args.exporter is not None and not args.exporter.replace(",", "").strip():
        raise UsageError("--exporter needs at least one of file, console, otlp, langfuse, none")
    if args.trace_file is not None:
        reason = _why_not_a_file(Path(args.trace_file))
        if reason:
            raise UsageError(f"--trace-file {args.trace_file} {reason}")
    return {"exporters": args.exporter, "trace_file": args.trace_file}


def _why_not_a_file(path: Path) -> str | None:
    """Why ``path`` can never be written as a file (it is a directory; a folder on its way is a file), else None."""
    if path.is_dir():
        return "is a directory, not a file"
    for ancestor in path.parents:
        if ancestor.exists():
            return None if ancestor.is_dir() else f"cannot be created: {ancestor} is not a directory"
    return None


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered the way Ctrl-C is, so the run ends its spans and they are flushed before the exit."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def execute(agent: Agent, task: str | None, telemetry: Telemetry,
            labels: dict[str, Any] | None = None, *, resume: tuple[Any, dict[str, Any]] | None = None) -> RunResult:
    """Run the agent (or resume a paused run: ``resume`` is its state and decisions); Ctrl-C or SIGTERM end the
    run, deliver its spans and exit with 130 or 143."""
    from looptrace.runtime import RunInterrupted

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if resume is not None:
            return agent.resume(resume[0], **resume[1])
        assert task is not None
        return agent.run(task, **(labels or {}))
    except RunInterrupted as interrupted:
        close(telemetry)
        terminated = isinstance(interrupted.__cause__, Terminated)
        # No count of turns here: the run counts the turns it completed, the live view (and `traces show`) the one
        # it was in too; a second number would only contradict the first.
        print(f"\nlooptrace: {'terminated' if terminated else 'interrupted'}; the trace was saved (see it with: "
              f"looptrace traces show --trace-id {interrupted.result.trace_id[:12]})", file=sys.stderr)
        raise SystemExit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        # The way out starts here: this flush and the shutdown in close() share one deadline, so the exit waits
        # for the backends at most that long in all, whatever they do.
        telemetry.leaving()
        telemetry.flush()


def telemetry_options(telemetry: Telemetry, *, live_view: bool = False) -> dict[str, Any]:
    """The Agent arguments that put its runs on what configure() set up: the telemetry itself, and with it its
    providers, its settings, the anomaly sinks it built (log line, webhook, Langfuse score) and its trace links.

    With the live view on, it prints each anomaly (its ⚠ line); the structured warning would say it a second time,
    so the Agent gets the same alerts without the log line.
    """
    from looptrace.instrumentation import Alerts

    assert telemetry.sinks is not None, "configure() builds the sinks"
    alerts = Alerts.from_settings(telemetry.settings, log_warnings=False) if live_view else telemetry.sinks.alerts
    _ALERTS.append(alerts)
    return {"telemetry": telemetry, "alerts": alerts}


_ALERTS: list[Alerts] = []  # the process's alert sinks, whose webhook posts close() waits for
WEBHOOK_WAIT_S = 5.0


def close(telemetry: Telemetry) -> None:
    """Deliver everything or list it as undelivered, within the exit's one deadline; say what was not delivered."""
    deadline = telemetry.leaving()
    for alerts in _ALERTS:
        # posts run on daemon threads: without this an exit would cut them off
        alerts.wait(min(WEBHOOK_WAIT_S, deadline.remaining_s()))
    _ALERTS.clear()
    telemetry.shutdown()
    notice = telemetry.undelivered_notice()
    if notice:
        print(notice, file=sys.stderr)


def deliver_outcome(write: Callable[[], object]) -> None:
    """Write a run's outcome to stdout with ``write``. A reader that went away (`looptrace demo | head -3`) ends the
    writing quietly, and only the writing: the run is over and its trace saved, so its status stays the exit code,
    whether the reader left before or after the last line (which a pipe decides by timing, not the run)."""
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()


def print_json(result: RunResult, out: TextIO) -> None:
    """The RunResult as one JSON object on one line, as the spans hold it: tool arguments redacted, and what they hid
    scrubbed from the results that quote it."""
    from looptrace.instrumentation.recording import redacted_history

    shown = result.to_dict()
    # Output is a place secrets must not reach, like a span; the RunResult itself keeps the history the model saw.
    shown["messages"] = redacted_history(shown["messages"])
    out.write(json.dumps(shown, ensure_ascii=False, default=str) + "\n")
