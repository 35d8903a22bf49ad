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
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from looptrace import __version__
from looptrace.instrumentation.logs import install_cli_rendering
from looptrace.instrumentation.settings import DEFAULT_MODEL, ConfigurationError, Settings

from .result import RunResult, RunStatus

# Only what the parser needs is imported here: `looptrace --help` and `--version` must not pay for the OpenTelemetry
# SDK, the exporters or the anthropic client. Each command imports what it uses.
if TYPE_CHECKING:
    from looptrace.instrumentation.alerts import Alerts
    from looptrace.instrumentation.otlp_file import BadLine
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
  30  stopped_by_detector             130 interrupted (Ctrl-C)   143 terminated (SIGTERM)"""


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _configure_logging()
    try:
        return args.handler(args)
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
    parser = argparse.ArgumentParser(
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
    demo.set_defaults(handler=_demo)

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
    run.set_defaults(handler=_run)

    detect = commands.add_parser(
        "detect", help="find loop anomalies in stored traces (exit 1 when there are any)",
        description="Rebuilds each run in an OTLP-JSON trace file (looptrace's, or any agent's whose tool calls are "
                    "execute_tool spans with gen_ai.tool.* attributes) and reports repeated calls, cycles, tools "
                    "that keep failing and errors the final answer ignored.",
        epilog="exit codes:\n  0   no anomaly\n  1   anomalies found\n  2   unreadable file or bad flag",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    detect.add_argument("file", nargs="?", type=Path,
                        help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    detect.add_argument("--json", action="store_true", help="one JSON object per trace with anomalies, per line")
    detect.add_argument("--all", action="store_true", help="also list the traces without anomalies")
    detect.set_defaults(handler=_detect)

    _add_watch_command(commands)

    traces = commands.add_parser("traces", help="read the local trace file")
    traces_commands = traces.add_subparsers(dest="traces_command", required=True, metavar="SUBCOMMAND")
    show = traces_commands.add_parser("show", help="show a run as a tree (the latest by default)")
    show.add_argument("--file", type=Path, help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    show.add_argument("--trace-id", help="the trace to show; a unique prefix is enough")
    show.set_defaults(handler=_traces_show)
    listing = traces_commands.add_parser("list", help="one line per run in the file")
    listing.add_argument("--file", type=Path,
                         help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    listing.set_defaults(handler=_traces_list)
    push = traces_commands.add_parser(
        "push", help="send spans a backend could not take earlier (from the spill file), exactly once",
        epilog="exit codes:\n  0   nothing failed (spans for a backend not chosen with --to, or not configured, stay "
               "pending and are listed)\n  1   some spans are still pending because their backend failed again\n"
               "  2   bad flag or configuration",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    push.add_argument("--to", choices=("langfuse", "otlp"),
                      help="only this backend (default: every backend the environment configures)")
    push.add_argument("--file", type=Path, help="spill file (default: LOOPTRACE_SPILL_FILE or .looptrace/spill.jsonl)")
    push.set_defaults(handler=_traces_push)
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
    agent = Agent(
        demo_story.DEMO_MODEL, tools=demo_story.Inventory().tools(), system=demo_story.DEMO_SYSTEM, name="booking",
        client=ScriptedModel(script()), limits=Limits(max_turns=10, tool_timeout_s=5), on_anomaly=args.on_anomaly,
        on_event=None if args.json else LiveView(out), **_telemetry_options(telemetry, live_view=not args.json),
    )
    if not args.json:
        out.write(f"task: {task}\n(offline: {blurb})\n\n")
    result = _execute(agent, task, telemetry)
    if args.json:
        _print_json(result, out)
    else:
        out.write(f"\nfinal answer: {result.final_text or '(none)'}\n")
        for anomaly in result.anomalies:
            first = anomaly.first_turn if anomaly.first_turn is not None else anomaly.turn
            turns = f"turn {first}" if first == anomaly.turn else f"turns {first}-{anomaly.turn}"
            out.write(f"flagged: {anomaly.type} x{anomaly.count} ({turns})\n")  # the ⚠ line above has the message
        out.write("\n")
        _show_written_trace(telemetry, result, out)
    _close(telemetry)
    return EXIT_CODES[result.status]


def _run(args: argparse.Namespace) -> int:
    from opentelemetry import context as otel_context

    from looptrace.instrumentation import setup as telemetry_setup
    from looptrace.instrumentation.langfuse import trace_attributes

    from .agent import Agent
    from .limits import Limits
    from .models import AnthropicModel
    from .views import LiveView

    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        raise UsageError("ANTHROPIC_API_KEY is not set; export it "
                         "(and ANTHROPIC_BASE_URL for a proxy or a local server)")
    tools = load_tools(Path(args.tools)) if args.tools else []
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
    if args.json:
        _print_json(result, sys.stdout)
    else:
        if result.final_text:
            print(result.final_text)
        if result.error:
            print(f"looptrace: {result.status.value}: {result.error}", file=sys.stderr)
        _point_at_trace(telemetry, result, sys.stderr)
    _close(telemetry)
    return EXIT_CODES[result.status]


def _traces_show(args: argparse.Namespace) -> int:
    from looptrace.instrumentation.otlp_file import read_spans

    from .views import render_trace

    path = args.file or Settings.from_env().trace_file
    wanted = (args.trace_id or "").lower() or None
    with _BadLineReporter(path) as report:
        trace_id = wanted and _resolve_trace_id(path, wanted, report)
        if trace_id is None and wanted is None:
            trace_id = _latest_trace_id(path, report)
        if trace_id is None:
            what = f"no trace {wanted!r}" if wanted else "no traces"
            print(f"looptrace: {what} in {path}", file=sys.stderr)
            return EXIT_NOT_FOUND
        spans = [s for s in read_spans(path) if s.trace_id == trace_id]
    print(render_trace(spans))
    return EXIT_OK


def _detect(args: argparse.Namespace) -> int:
    from looptrace.instrumentation.otlp_file import read_spans
    from looptrace.instrumentation.trace_detect import DETECTION_KEYS, detect_spans

    path = args.file or Settings.from_env().trace_file
    found = 0
    with _BadLineReporter(path) as report:
        for verdict in detect_spans(read_spans(path, report, report.progress, keys=DETECTION_KEYS)):
            report.clear_progress()
            found += len(verdict.anomalies)
            if not verdict.anomalies and not args.all:
                continue
            if args.json:
                print(json.dumps(verdict.to_dict(), ensure_ascii=False))
                continue
            print(f"{verdict.trace_id}  {verdict.name}  [{verdict.status or '?'}]  {verdict.turns} turns, "
                  f"{verdict.tool_calls} tool calls, {len(verdict.anomalies)} anomalies")
            for anomaly in verdict.anomalies:
                tool = f" {anomaly.tool}" if anomaly.tool else ""
                print(f"  turn {anomaly.turn:>3}  {anomaly.type}{tool} x{anomaly.count}: {anomaly.message}")
    if not args.json:
        print(f"{found} anomal{'y' if found == 1 else 'ies'} found in {path}", file=sys.stderr)
    return 1 if found else EXIT_OK


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


def _traces_list(args: argparse.Namespace) -> int:
    from looptrace.instrumentation import semconv as sc
    from looptrace.instrumentation.otlp_file import read_spans

    path = args.file or Settings.from_env().trace_file
    with _BadLineReporter(path) as report:
        for span in read_spans(path, report):
            a = span.attributes
            if a.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
                print(f"{span.trace_id}  {span.name:<30} {a.get(sc.RUN_STATUS, '?'):<20} "
                      f"{a.get(sc.RUN_TURNS, '?')} turns")
    return EXIT_OK


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


def _traces_push(args: argparse.Namespace) -> int:
    from looptrace.instrumentation.spill import PushInProgress, push

    try:
        report = push(args.file, to=[args.to] if args.to else None, settings=Settings.from_env())
    except PushInProgress as exc:
        raise UsageError(str(exc)) from None
    print(report.summary())
    return EXIT_OK if report.ok else 1


def load_tools(path: Path) -> list[Tool]:
    """Every @tool in a Python file, in the order the file defines them."""
    from .tools import Tool

    if not path.is_file():
        raise UsageError(f"tools file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"looptrace_tools_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # whatever the file does wrong, the user gets one line naming it
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise UsageError(f"cannot import tools file {path}{where}: {type(exc).__name__}: {exc}") from None
    found = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not found:
        raise UsageError(f"{path} defines no @tool functions")
    return found


def _print_json(result: RunResult, out: TextIO) -> None:
    out.write(json.dumps(result.to_dict(), ensure_ascii=False, default=str) + "\n")


def _point_at_trace(telemetry: Telemetry, result: RunResult, out: TextIO) -> None:
    """The end of every run: its trace id, where to look at it locally, and its link in Langfuse when there is one."""
    where = (f" written to {telemetry.trace_file}; see it with: looptrace traces show --trace-id {result.trace_id[:12]}"
             if telemetry.trace_file is not None else "")
    out.write(f"trace {result.trace_id}{where}\n")
    if result.trace_url:
        out.write(f"trace in Langfuse: {result.trace_url}\n")


def _show_written_trace(telemetry: Telemetry, result: RunResult, out: TextIO) -> None:
    from looptrace.instrumentation.otlp_file import TraceFileError, read_spans

    from .views import render_trace

    if telemetry.trace_file is None:
        out.write("(no trace file: the file exporter is not among --exporter)\n")
        return
    try:
        spans = [s for s in read_spans(telemetry.trace_file) if s.trace_id == result.trace_id]
    except TraceFileError as exc:
        out.write(f"(the trace could not be read back: {exc})\n")
        return
    out.write(render_trace(spans) + "\n\n")
    out.write(f"trace file: {telemetry.trace_file}  (looptrace traces show --trace-id {result.trace_id[:12]})\n")
    if result.trace_url:
        out.write(f"trace in Langfuse: {result.trace_url}\n")


def _latest_trace_id(path: Path, report) -> str | None:
    from looptrace.instrumentation import semconv as sc
    from looptrace.instrumentation.otlp_file import read_spans

    latest = None
    latest_end = -1
    for span in read_spans(path, report, report.progress):
        if span.parent_span_id is None or span.attributes.get(sc.GEN_AI_OPERATION_NAME) == sc.OPERATION_INVOKE_AGENT:
            if span.end_ns >= latest_end:
                latest, latest_end = span.trace_id, span.end_ns
    return latest


def _resolve_trace_id(path: Path, prefix: str, report) -> str | None:
    from looptrace.instrumentation.otlp_file import read_spans

    matches = {s.trace_id for s in read_spans(path, report, report.progress) if s.trace_id.startswith(prefix)}
    if len(matches) > 1:
        raise UsageError(f"trace id prefix {prefix!r} matches {len(matches)} traces; give more digits")
    return next(iter(matches), None)


class _BadLineReporter:
    """Reports malformed lines once each (files are read more than once) and shows progress on big files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: set[int] = set()
        self.size = 0
        self.interactive = sys.stderr.isatty()

    @property
    def shows_progress(self) -> bool:
        """Only a person watching a big file wants a progress line."""
        return self.interactive and self.size > 50_000_000

    def __enter__(self) -> _BadLineReporter:
        try:
            self.size = os.path.getsize(self.path)
        except OSError as exc:
            raise UsageError(f"cannot read trace file {self.path}: {exc.strerror or exc}") from None
        if os.path.isdir(self.path):
            raise UsageError(f"{self.path} is a directory, not a trace file")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.shows_progress:
            sys.stderr.write("\r" + " " * 60 + "\r")
        from looptrace.instrumentation.otlp_file import TraceFileError

        if isinstance(exc, TraceFileError):
            raise UsageError(str(exc)) from None

    def __call__(self, bad: BadLine) -> None:
        if bad.line not in self.seen:
            self.seen.add(bad.line)
            print(f"looptrace: {self.path}:{bad.line}: skipped: {bad.reason}", file=sys.stderr)

    def clear_progress(self) -> None:
        if self.shows_progress:
            sys.stderr.write("\r" + " " * 60 + "\r")

    def progress(self, done: int) -> None:
        if self.shows_progress:
            sys.stderr.write(f"\rreading {self.path.name}: {done * 100 // max(self.size, 1)}% "
                             f"({done / 1e6:,.0f} of {self.size / 1e6:,.0f} MB)")
            sys.stderr.flush()


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


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
