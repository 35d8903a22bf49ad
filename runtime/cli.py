"""`looptrace`: run an agent, watch it, read its traces.

Exit codes are part of the interface (scripts branch on them); they are listed in EXIT_CODES and in `--help`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from looptrace import __version__
from looptrace.instrumentation.logs import install_cli_rendering
from looptrace.instrumentation.settings import DEFAULT_MODEL, ConfigurationError, Settings

from .result import RunResult, RunStatus

# The parser class and the closed-pipe handling live with the trace commands, which start without this module
# (`looptrace detect` must not pay for the settings, logging and result modules imported here).
from .trace_commands import EXIT_CLOSED_PIPE, UsageError, add_trace_commands, tolerate_any_terminal
from .trace_commands import Parser as _Parser
from .trace_commands import silence_stdout as _silence_stdout

# Only what the parser needs is imported here: `looptrace --help` and `--version` must not pay for the OpenTelemetry
# SDK, the exporters or the anthropic client. Each command imports what it uses.
if TYPE_CHECKING:
    from looptrace.instrumentation.alerts import Alerts
    from looptrace.instrumentation.setup import Telemetry

    from .agent import Agent
    from .tools import Tool

DEMO_STORIES = ("equipment", "ignored-error", "runaway")  # demo.STORIES' names (a test keeps the two equal)
EXIT_OK = 0
EXIT_USAGE = 2  # bad flags, a tools file that does not import, a missing key, an unreadable trace file
EXIT_NOT_FOUND = 3  # traces show: no such trace
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as shells report it
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
    RunStatus.INTERRUPTED: EXIT_INTERRUPTED,
}

EXIT_CODE_HELP = """exit codes:
  0   done (the model ended its turn)       1   error (the API call failed, see the message)
  2   usage: bad flag, tools file, missing key or unreadable file
  3   traces show: no such trace
  10  max_turns    11 token_budget    12 cost_budget    13 timeout
  20  max_tokens   21 stop_sequence   22 refusal        23 context_window
  30  stopped_by_detector             130 interrupted (Ctrl-C)   143 terminated (SIGTERM)
  141 stdout closed early (e.g. `| head`): the run finished and its trace was saved"""


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit, so a closed pipe is noticed where it can be handled
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_CLOSED_PIPE


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser, so the hint points at its --help
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    tolerate_any_terminal()
    _configure_logging()
    try:
        return args.handler(args)
    except BrokenPipeError:
        raise  # stdout's reader went away: main() ends quietly, this is no usage error
    except UsageError as exc:
        print(f"looptrace: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigurationError as exc:
        print(f"looptrace: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # e.g. LOOPTRACE_PROMETHEUS_PORT already taken: the environment, not the model
        print(f"looptrace: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""),
              file=sys.stderr)
        return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="looptrace",
        description="An observability-first agent runtime: every run a trace, every loop caught.",
        epilog=EXIT_CODE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"looptrace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="run an offline demo (no key, no network)",
                               epilog=EXIT_CODE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("story", nargs="?", default="equipment", choices=DEMO_STORIES,
                      help="equipment (default): a failed reservation the model recovers from; runaway: a model "
                           "repeating itself, nudged then stopped; ignored-error: a failure the answer glosses over")
    _add_anomaly_flag(demo)
    _add_export_flags(demo)
    demo.add_argument("--json", action="store_true", help="print the RunResult as one JSON object, nothing else")
    demo.set_defaults(command_parser=demo, handler=_demo)

    run = commands.add_parser("run", help="run an agent on a task with the tools in a Python file",
                              epilog=EXIT_CODE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("task", help="what the agent should do")
    run.add_argument("--tools", metavar="FILE.py", help="a Python file; every @tool function in it is offered")
    run.add_argument("--model", help=f"model id (default: LOOPTRACE_MODEL, else {DEFAULT_MODEL})")
    run.add_argument("--system", help="system prompt")
    run.add_argument("--name", default="agent", help="agent name on spans and metrics (default: %(default)s)")
    run.add_argument("--max-tokens", type=_positive_int, default=4096, help="max_tokens per model call")
    run.add_argument("--max-turns", type=_positive_int, default=10, help="model calls at most (default: %(default)s)")
    run.add_argument("--max-total-tokens", type=_positive_int, help="token budget, cache tokens included")
    run.add_argument("--max-cost-usd", type=_positive_float, help="cost budget in USD")
    run.add_argument("--timeout", type=_positive_float, help="wall-clock limit for the run, seconds")
    run.add_argument("--tool-timeout", type=_positive_float, default=60.0,
                     help="per tool call, seconds (default: %(default)s)")
    run.add_argument("--stream", action="store_true", help="use server-sent events for model calls")
    run.add_argument("--json", action="store_true", help="print the RunResult as one JSON object, nothing else")
    run.add_argument("--session-id", help="Langfuse session (and gen_ai.conversation.id) of the run's trace")
    run.add_argument("--user-id", help="Langfuse user of the run's trace")
    run.add_argument("--tag", action="append", default=[], metavar="TAG", help="a trace tag; repeat for more")
    run.add_argument("--traceparent",
                     help="W3C traceparent of a trace to join (default: TRACEPARENT), e.g. from a job scheduler")
    _add_anomaly_flag(run)
    _add_export_flags(run)
    run.set_defaults(command_parser=run, handler=_run)

    _add_watch_command(commands)

    add_trace_commands(commands)  # detect, traces show | list | push
    return parser


def _add_anomaly_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--on-anomaly", choices=("warn", "nudge", "stop"),
                        help="what a loop anomaly does (default: nudge repeated calls and cycles once, stop them if "
                             "they go on; warn about ignored errors)")


def _add_export_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exporter", metavar="LIST",
                        help="comma list of file, console, otlp, langfuse, none, taken exactly (default: "
                             "LOOPTRACE_EXPORTER; else file, plus langfuse when LANGFUSE_* keys are set and otlp when "
                             "OTEL_EXPORTER_OTLP_ENDPOINT is)")
    parser.add_argument("--trace-file", type=Path,
                        help="where the file exporter writes "
                             "(default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")


# --- commands -----------------------------------------------------------------------------------------------------


# One rule for demo and run alike: the live view is progress, so it goes to stderr (and is left out by --json); stdout
# holds only the outcome, which a pipe or a script can take as it is.


def _demo(args: argparse.Namespace) -> int:
    from looptrace.instrumentation import setup as telemetry_setup

    from . import demo as demo_story
    from .agent import Agent
    from .limits import Limits
    from .models import ScriptedModel
    from .views import LiveView

    out = sys.stdout
    task, script, blurb = demo_story.STORIES[args.story]
    settings = _settings(args)
    telemetry = telemetry_setup.configure(settings)
    live = None if args.json else LiveView(sys.stderr)
    agent = Agent(
        demo_story.DEMO_MODEL, tools=demo_story.Inventory().tools(), system=demo_story.DEMO_SYSTEM, name="booking",
        client=ScriptedModel(script()), limits=Limits(max_turns=10, tool_timeout_s=5), on_anomaly=args.on_anomaly,
        on_event=live, **_telemetry_options(telemetry, live_view=not args.json),
    )
    if live is not None:
        live.note(f"task: {task}\n(offline: {blurb})\n")
    result = _execute(agent, task, telemetry)
    try:
        if args.json:
            _print_json(result, out)
        else:
            out.write(f"final answer: {result.final_text or '(none)'}\n")
            for anomaly in result.anomalies:
                first = anomaly.first_turn if anomaly.first_turn is not None else anomaly.turn
                turns = f"turn {first}" if first == anomaly.turn else f"turns {first}-{anomaly.turn}"
                out.write(f"flagged: {anomaly.type} x{anomaly.count} ({turns})\n")  # the live view has the message
            out.write("\n")
            _show_written_trace(telemetry, result, out)
    finally:
        _close(telemetry)  # whatever happens to stdout, the spans are delivered or spilled
    return EXIT_CODES[result.status]


def _run(args: argparse.Namespace) -> int:
    from opentelemetry import context as otel_context

    from looptrace.instrumentation import setup as telemetry_setup
    from looptrace.instrumentation.langfuse import trace_attributes

    from .agent import Agent
    from .limits import Limits
    from .models import AnthropicModel
    from .views import LiveView

    if not args.task.strip():
        raise UsageError("the task is empty: say what the agent should do, e.g. looptrace run \"Summarise README.md\"")
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        raise UsageError("ANTHROPIC_API_KEY is not set; export it "
                         "(and ANTHROPIC_BASE_URL for a proxy or a local server)")
    tools = load_tools(Path(args.tools)) if args.tools else []
    if not tools:
        print("looptrace: no --tools FILE.py given: the model runs with no tools", file=sys.stderr)
    settings = _settings(args)
    traceparent = args.traceparent or settings.traceparent
    try:
        parent = telemetry_setup.context_from_traceparent(traceparent, settings.tracestate) if traceparent else None
    except ValueError as exc:
        raise UsageError(f"--traceparent: {exc}") from None
    telemetry = telemetry_setup.configure(settings)
    try:
        agent = Agent(
            args.model or settings.model, tools=tools, system=args.system, name=args.name, max_tokens=args.max_tokens,
            client=AnthropicModel(stream=args.stream), on_anomaly=args.on_anomaly,
            limits=Limits(max_turns=args.max_turns, max_total_tokens=args.max_total_tokens,
                          max_cost_usd=args.max_cost_usd, timeout_s=args.timeout, tool_timeout_s=args.tool_timeout),
            on_event=None if args.json else LiveView(sys.stderr),
            **_telemetry_options(telemetry, live_view=not args.json),
        )
        labels = {"session_id": args.session_id, "user_id": args.user_id, "tags": args.tag}
        trace_attributes(args.name, **labels)  # a label Langfuse would drop is a usage error, said before the run
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    token = otel_context.attach(parent) if parent is not None else None
    try:
        result = _execute(agent, args.task, telemetry, labels)
    finally:
        if token is not None:
            otel_context.detach(token)
    try:
        if args.json:
            _print_json(result, sys.stdout)
        else:
            if result.final_text:
                print(result.final_text)
            if result.error:
                print(f"looptrace: {result.status.value}: {result.error}", file=sys.stderr)
            _point_at_trace(telemetry, result, sys.stderr)
    finally:
        _close(telemetry)  # whatever happens to stdout, the spans are delivered or spilled
    return EXIT_CODES[result.status]


def _add_watch_command(commands: Any) -> None:
    watch = commands.add_parser(
        "watch", help="receive any agent's traces over OTLP and alert on loops as they happen",
        description="An OTLP receiver (HTTP /v1/traces, protobuf or JSON, and gRPC) for any app or collector. It "
                    "rebuilds runs from looptrace's, OpenTelemetry GenAI, OpenLLMetry and OpenInference spans, runs "
                    "the loop detector live and alerts: log line, LOOPTRACE_ALERT_WEBHOOK, Langfuse score (with "
                    "LANGFUSE_* keys), looptrace_anomalies_total on GET /metrics. Senders must authenticate when "
                    "LOOPTRACE_WATCH_TOKEN (bearer) or LOOPTRACE_WATCH_USERNAME/PASSWORD (basic) is set.",
        epilog="exit codes:\n  0   stopped by SIGTERM or Ctrl-C after judging every open run\n"
               "  2   bad flag, or a port already taken",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    watch.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)")
    watch.add_argument("--port", type=int, default=4318, help="OTLP/HTTP and /metrics port (default 4318)")
    watch.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (default 4317; -1: no gRPC)")
    watch.add_argument("--idle-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="judge a run this long after its last span (default 300)")
    watch.add_argument("--max-open-runs", type=int, default=10_000,
                       help="runs assembled at once; the oldest is judged early beyond it (default 10000)")
    watch.add_argument("--max-request-bytes", type=int, default=8 << 20, help="413 above this (default 8 MiB)")
    watch.add_argument("--max-decompressed-bytes", type=int, default=64 << 20,
                       help="413 when a body inflates beyond this (default 64 MiB)")
    watch.set_defaults(handler=_watch)


def _watch(args: argparse.Namespace) -> int:
    from looptrace.instrumentation.watch import WatchSettings, serve

    settings = WatchSettings.from_env(
        host=args.host, port=args.port, grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        idle_timeout_s=args.idle_timeout, max_open_runs=args.max_open_runs,
        max_request_bytes=args.max_request_bytes, max_decompressed_bytes=args.max_decompressed_bytes)
    return serve(settings)


# --- shared pieces ------------------------------------------------------------------------------------------------


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered the way Ctrl-C is, so the run ends its spans and they are flushed before the exit."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _execute(agent: Agent, task: str, telemetry: Telemetry,
             labels: dict[str, Any] | None = None) -> RunResult:
    from .agent import RunInterrupted

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return agent.run(task, **(labels or {}))
    except RunInterrupted as interrupted:
        _close(telemetry)
        terminated = isinstance(interrupted.__cause__, Terminated)
        print(f"\nlooptrace: {'terminated' if terminated else 'interrupted'} after {interrupted.result.turns} turns; "
              f"the trace was saved", file=sys.stderr)
        raise SystemExit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        telemetry.flush()


def _telemetry_options(telemetry: Telemetry, *, live_view: bool = False) -> dict[str, Any]:
    """The Agent arguments that route its spans, metrics and anomaly scores to what configure() set up.

    With the live view on, it prints each anomaly (its ⚠ line); the structured warning would say it a second time.
    """
    from looptrace.instrumentation.alerts import Alerts

    callback = telemetry.scores.alert_callback if telemetry.scores is not None else None
    try:
        alerts = Alerts(callback=callback, webhook_url=telemetry.settings.alert_webhook or "",
                        log_warnings=not live_view)
    except ValueError as exc:
        raise UsageError(f"LOOPTRACE_ALERT_WEBHOOK: {exc}") from None
    _ALERTS.append(alerts)
    return {"tracer_provider": telemetry.tracer_provider, "meter_provider": telemetry.meter_provider,
            "alerts": alerts, "settings": telemetry.settings}


def _settings(args: argparse.Namespace) -> Settings:
    """The environment's settings, with the command's flags over them."""
    return Settings.from_env().with_overrides(exporters=args.exporter, trace_file=args.trace_file)


_ALERTS: list[Alerts] = []  # the process's alert sinks, whose webhook posts _close waits for
WEBHOOK_WAIT_S = 5.0


def _close(telemetry: Telemetry) -> None:
    """Deliver or spill everything, within a bound, and say where undelivered spans went."""
    for alerts in _ALERTS:
        alerts.wait(WEBHOOK_WAIT_S)  # posts run on daemon threads: without this an exit would cut them off
    _ALERTS.clear()
    telemetry.shutdown()
    notice = telemetry.spill_notice()
    if notice:
        print(notice, file=sys.stderr)


def load_tools(path: Path) -> list[Tool]:
    """Every @tool in a Python file, in the order the file defines them."""
    from .tools import Tool

    if path.is_dir():
        raise UsageError(f"--tools {path} is a directory; give the Python file that defines the @tool functions")
    if not path.is_file():
        raise UsageError(f"tools file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"looptrace_tools_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # whatever the file does wrong, the user gets one line naming it
        line = _line_in(path, exc)
        where = f" (line {line})" if line else ""
        raise UsageError(f"cannot import tools file {path}{where}: {type(exc).__name__}: {exc}") from None
    found = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not found:
        raise UsageError(f"{path} defines no @tool functions")
    return found


def _line_in(path: Path, exc: BaseException) -> int | None:
    """The line of the tools file where importing it failed: the syntax error's, or the deepest frame in that file."""
    if isinstance(exc, SyntaxError) and exc.lineno and Path(exc.filename or "").resolve() == path.resolve():
        return exc.lineno
    line = None
    target = str(path.resolve())
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if str(Path(frame.f_code.co_filename).resolve()) == target:
            line = lineno
    if line is None and isinstance(exc, SyntaxError):
        return exc.lineno
    return line


def _print_json(result: RunResult, out: TextIO) -> None:
    shown = result.to_dict()
    # Output is a place secrets must not reach, like a span: tool arguments are printed as the spans hold them.
    shown["messages"] = [_with_redacted_arguments(message) for message in shown["messages"]]
    out.write(json.dumps(shown, ensure_ascii=False, default=str) + "\n")


def _with_redacted_arguments(message: Any) -> Any:
    from looptrace.instrumentation.content import redact

    blocks = message.get("content") if isinstance(message, dict) else None
    if not isinstance(blocks, list):
        return message
    return {**message, "content": [
        {**block, "input": redact(block.get("input"))}
        if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use") else block
        for block in blocks]}


def _point_at_trace(telemetry: Telemetry, result: RunResult, out: TextIO) -> None:
    """The end of every run: its trace id, where to look at it locally, and its link in Langfuse when there is one."""
    where = (f" written to {telemetry.trace_file}; see it with: looptrace traces show --trace-id {result.trace_id[:12]}"
             if telemetry.trace_file is not None else "")
    out.write(f"trace {result.trace_id}{where}\n")
    if result.trace_url:
        out.write(f"trace in Langfuse: {result.trace_url}\n")


def _show_written_trace(telemetry: Telemetry, result: RunResult, out: TextIO) -> None:
    from looptrace.instrumentation.tracefile.read import TraceFileError, read_spans

    from .views import render_trace

    if telemetry.trace_file is None:
        out.write("(no trace file: the file exporter is not among --exporter)\n")
        return
    try:
        spans = [s for s in read_spans(telemetry.trace_file, max_line_bytes=telemetry.settings.max_line_bytes)
                 if s.trace_id == result.trace_id]
    except TraceFileError as exc:
        out.write(f"(the trace could not be read back: {exc})\n")
        return
    out.write(render_trace(spans) + "\n\n")
    out.write(f"trace file: {telemetry.trace_file}  (looptrace traces show --trace-id {result.trace_id[:12]})\n")
    if result.trace_url:
        out.write(f"trace in Langfuse: {result.trace_url}\n")


def _configure_logging() -> None:
    # The CLI owns its process, so it may configure structlog: warnings to stderr, keeping stdout for results. The
    # library's records (the stdlib logger "looptrace") are rendered through it.
    import structlog

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=use_color(sys.stderr)),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(30),  # WARNING and above
        # Looked up at each use, not bound once: whoever swaps sys.stderr later (a test harness) is still followed.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
    )
    install_cli_rendering()


def use_color(stream: TextIO) -> bool:
    """Colour only for a person at a terminal, and never when NO_COLOR is set to anything (no-color.org)."""
    return not os.environ.get("NO_COLOR") and stream.isatty()


# argparse words a failed conversion after the function's name ("invalid _positive_int value"): these say it in
# the user's terms instead.


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
