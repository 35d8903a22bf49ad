"""`looptrace detect` and `looptrace traces show | list | push`: reading stored traces, fast and safely.

These commands import only the standard library and looptrace's own readers (no OpenTelemetry SDK, no HTTP client,
no anthropic), so that `detect` on a small file costs about what starting Python costs; `push` loads the exporters
when it runs. Each reads the file once, line by line, in memory bounded by the longest line.

A file that is not a trace file (a log, a JSON document) is a usage error said in one line, not a stream of
"skipped" messages and a success: a CI gate pointed at the wrong file must not go green. In a real trace file, the
first few malformed lines are named and the rest counted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from looptrace.instrumentation.tracefile.read import (
    SKIP,
    BadLine,
    SpanRecord,
    TraceFileError,
    decode_attributes,
    decode_status_code,
    decode_value,
    nanoseconds,
    raw_spans,
    read_lines,
    span_identity,
    span_record,
)

if TYPE_CHECKING:
    from looptrace.instrumentation.settings import Settings

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for any program whose reader went away (`| head`)
BAD_LINES_SHOWN = 5
MAX_OPEN_TRACES = 10_000  # `show`: traces whose root has not come yet; beyond this the oldest is forgotten


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line, as every other usage error is: the full usage is one --help away."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def silence_stdout() -> None:
    """The reader of stdout is gone (`looptrace demo | head -3`): nothing more can be shown, and Python's own flush at
    exit must not complain about it either. The command itself was not cut short."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor (a test harness)
        pass


def tolerate_any_terminal() -> None:
    """Characters the terminal cannot show (✓ on cp1252, say) become '?' instead of a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):  # a stream that cannot be reconfigured (already closed, a test's)
                pass


# --- the parsers, shared with the full CLI --------------------------------------------------------------------------


def add_trace_commands(commands: Any) -> None:
    """Add `detect` and `traces` to a subparsers object (the full CLI's, or the light one of ``main``)."""
    detect = commands.add_parser(
        "detect", help="find loop anomalies in stored traces (exit 1 when there are any)",
        description="Rebuilds each run in an OTLP-JSON trace file (looptrace's, or any agent's whose tool calls are "
                    "execute_tool spans with gen_ai.tool.* attributes) and reports repeated calls, cycles, tools "
                    "that keep failing and errors the final answer ignored.",
        epilog="exit codes:\n  0   no anomaly\n  1   anomalies found\n  2   unreadable file, a file holding no "
               "OTLP/JSON span, or a bad flag",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    detect.add_argument("file", nargs="?", type=Path,
                        help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    detect.add_argument("--json", action="store_true", help="one JSON object per trace with anomalies, per line")
    detect.add_argument("--all", action="store_true", help="also list the traces without anomalies")
    detect.set_defaults(command_parser=detect, handler=detect_command)

    traces = commands.add_parser("traces", help="read the local trace file")
    traces_commands = traces.add_subparsers(dest="traces_command", required=True, metavar="SUBCOMMAND")
    show = traces_commands.add_parser("show", help="show a run as a tree (the latest by default)")
    show.add_argument("--file", type=Path,
                      help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    show.add_argument("--trace-id", help="the trace to show; a unique prefix is enough")
    show.set_defaults(command_parser=show, handler=show_command)
    listing = traces_commands.add_parser("list", help="one line per run in the file: when, status, turns, tokens, "
                                                      "cost, anomalies")
    listing.add_argument("--file", type=Path,
                         help="trace file (default: LOOPTRACE_TRACE_FILE or .looptrace/traces.jsonl)")
    listing.set_defaults(command_parser=listing, handler=list_command)
    push = traces_commands.add_parser(
        "push", help="send spans a backend could not take earlier (from the spill file), never twice",
        epilog="exit codes:\n  0   nothing failed (spans for a backend not chosen with --to, or not configured, stay "
               "pending and are listed)\n  1   some spans are still pending because their backend failed again, "
               "were held back after an interrupted push, or unreadable lines were set aside\n"
               "  2   bad flag or configuration",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    push.add_argument("--to", choices=("langfuse", "otlp"),
                      help="only this backend (default: every backend the environment configures)")
    push.add_argument("--file", type=Path, help="spill file (default: LOOPTRACE_SPILL_FILE or .looptrace/spill.jsonl)")
    push.add_argument("--resend-interrupted", action="store_true",
                      help="also send batches an interrupted push may or may not have delivered (a second copy "
                           "may reach the backend)")
    push.set_defaults(command_parser=push, handler=push_command)


def quiet_garbage_collector() -> None:
    """Fewer cyclic collections while a file is read: a short-lived command that makes millions of short-lived,
    acyclic objects (parsed lines, freed by reference counting) gains nothing from them, and each full collection
    would walk every module loaded at start-up. Memory stays flat: nothing read is kept in a cycle."""
    gc.freeze()  # what start-up loaded is never collected anyway; keep collections from walking it
    gc.set_threshold(50_000, 50, 100)


def main(argv: list[str] | None = None) -> int:
    """The trace commands alone: what `looptrace detect | traces ...` runs, without loading the agent runtime.

    Same parser class, error lines and exit codes as the full CLI (``cli.main``), which offers the same commands.
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


# --- reading, with bad lines reported and progress shown --------------------------------------------------------------


class LineReporter:
    """Names the first malformed lines, counts the rest, and shows progress on a big file at a terminal.

    Until the first span is read, messages wait: a file with no span at all is reported as one usage error instead.
    """

    def __init__(self, path: Path, max_line_bytes: int) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes  # longer lines are reported and skipped
        self.bad = 0
        self.first_reason = ""
        self.spans_seen = False
        self._waiting: list[str] = []
        self.size = 0
        self.interactive = sys.stderr.isatty()

    def __enter__(self) -> LineReporter:
        if os.path.isdir(self.path):
            raise UsageError(f"{self.path} is a directory, not a trace file")
        try:
            self.size = os.path.getsize(self.path)
        except OSError as exc:
            raise UsageError(f"cannot read trace file {self.path}: {exc.strerror or exc}") from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.clear_progress()
        if isinstance(exc, TraceFileError):
            raise UsageError(str(exc)) from None

    def __call__(self, bad: BadLine) -> None:
        self.bad += 1
        if self.bad == 1:
            self.first_reason = f"line {bad.line}: {bad.reason}"
        if self.bad > BAD_LINES_SHOWN:
            return
        message = f"looptrace: {self.path}:{bad.line}: skipped: {bad.reason}"
        if self.spans_seen:
            self.clear_progress()
            print(message, file=sys.stderr)
        else:
            self._waiting.append(message)

    def saw_span(self) -> None:
        if not self.spans_seen:
            self.spans_seen = True
            for message in self._waiting:
                print(message, file=sys.stderr)
            self._waiting.clear()

    def finish(self, *, spans_required: bool) -> None:
        """After the read: the count of lines not named, or the usage error for a file without any span."""
        if not self.spans_seen and spans_required:
            what = f"{self.bad:,} line{'s' if self.bad != 1 else ''} read, none of them trace data; first: " \
                   f"{self.first_reason}" if self.bad else "it is empty"
            raise UsageError(f"{self.path} holds no OTLP/JSON spans ({what}); is it a trace file?")
        self.saw_span()
        if self.bad > BAD_LINES_SHOWN:
            print(f"looptrace: {self.path}: {self.bad - BAD_LINES_SHOWN:,} more malformed lines skipped "
                  f"({self.bad:,} in all)", file=sys.stderr)

    @property
    def shows_progress(self) -> bool:
        """Only a person watching a big file wants a progress line."""
        return self.interactive and self.size > 50_000_000

    def clear_progress(self) -> None:
        if self.shows_progress:
            sys.stderr.write("\r" + " " * 60 + "\r")

    def progress(self, done: int) -> None:
        if self.shows_progress:
            sys.stderr.write(f"\rreading {self.path.name}: {done * 100 // max(self.size, 1)}% "
                             f"({done / 1e6:,.0f} of {self.size / 1e6:,.0f} MB)")
            sys.stderr.flush()


def spans_of(path: Path, report: LineReporter, keys: frozenset[str] | None,
             parse: Any = None) -> Iterator[SpanRecord]:
    """Every span of the file, each line decoded once; a line that is JSON but not trace data is reported."""

    def records(data: Any) -> list[SpanRecord]:
        decoded_resource: dict[str, Any] = {}
        last_resource: Any = None
        spans = []
        for span, resource, scope in raw_spans(data):
            if keys is None and resource is not last_resource:
                decoded_resource, last_resource = decode_attributes(resource), resource
            spans.append(span_record(span, decoded_resource, scope, keys))
        return spans

    return _spans_by_line(path, report, parse, records)


def _spans_by_line(path: Path, report: LineReporter, parse: Any, spans_in: Any) -> Iterator[Any]:
    """The spans ``spans_in`` makes of each parsed line, in file order; a line it refuses (it raises: JSON, but not
    trace data) is reported and skipped whole, so one bad span never leaves half a line read."""
    for number, data in read_lines(path, report, report.progress, parse, max_line_bytes=report.max_line_bytes):
        try:
            spans = spans_in(data)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            report(BadLine(number, _not_trace_data(exc)))
            continue
        if spans:
            report.saw_span()
            yield from spans


def detection_spans(path: Path, report: LineReporter) -> Iterator[Any]:
    """Every span of the file as the run rebuilder reads it (``readers.NeutralSpan``), each line parsed once.

    The spans go straight from the parsed line to the rebuilder's shape, decoding only the attributes detection
    reads (``trace_detect.DETECTION_KEYS``); the resource, the span kind and the other attributes are never decoded.
    A line is checked as ``spans_of`` checks it, so the same lines are reported malformed.
    """
    from looptrace.instrumentation.readers import NeutralSpan
    from looptrace.instrumentation.trace_detect import DETECTION_KEYS

    verdicts = DETECTION_KEYS.verdicts

    def attributes_of(items: Any) -> dict[str, Any]:
        if not items:
            return {}
        return {key: value["stringValue"] if "stringValue" in value else decode_value(value)
                for item in items if verdicts[key := item["key"]] for value in (item.get("value") or {},)}

    def neutral_spans(data: Any) -> list[NeutralSpan]:
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
            spans.append(NeutralSpan(
                trace_id, span_id, parent, name, nanoseconds(get("startTimeUnixNano")),
                attributes_of(get("attributes")), decode_status_code(status.get("code", 0)),
                nanoseconds(get("endTimeUnixNano"))))
        return spans

    return _spans_by_line(path, report, detection_parser(), neutral_spans)


def _not_trace_data(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    return f"not OTLP/JSON trace data ({type(exc).__name__}: {exc})"


def _settings() -> Settings:
    """The environment's settings, read once per command: the trace file to read by default, the longest line read."""
    from looptrace.instrumentation.settings import ConfigurationError, Settings

    try:
        return Settings.from_env()
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None


def _path(args: argparse.Namespace, settings: Settings) -> Path:
    return getattr(args, "file", None) or settings.trace_file


# --- detect ---------------------------------------------------------------------------------------------------------


def detect_command(args: argparse.Namespace) -> int:
    from looptrace.instrumentation.trace_detect import detect_spans

    settings = _settings()
    path = _path(args, settings)
    found = 0
    write = sys.stdout.write
    with LineReporter(path, settings.max_line_bytes) as report:
        for verdict in detect_spans(detection_spans(path, report)):
            found += len(verdict.anomalies)
            if not verdict.anomalies and not args.all:
                continue
            report.clear_progress()
            if args.json:
                write(json.dumps(verdict.to_dict(), ensure_ascii=False) + "\n")
                continue
            write(f"{verdict.trace_id}  {verdict.name}  [{verdict.status or '?'}]  {plural(verdict.turns, 'turn')}, "
                  f"{plural(verdict.tool_calls, 'tool call')}, {plural(len(verdict.anomalies), 'anomaly')}\n")
            for anomaly in verdict.anomalies:
                tool = f" {anomaly.tool}" if anomaly.tool else ""
                write(f"  turn {anomaly.turn:>3}  {anomaly.type}{tool} x{anomaly.count}: {anomaly.message}\n")
            for rule, why in verdict.rules_not_run.items():  # what the producer did not record is not guessed
                write(f"  not checked: {rule}: {why}\n")
        report.finish(spans_required=True)
    if not args.json:
        print(f"{plural(found, 'anomaly')} found in {path}", file=sys.stderr)
    return 1 if found else EXIT_OK


def detection_parser() -> Any:
    """json.loads, except for a line of looptrace's own that cannot matter to detection, told from its bytes alone.

    Detection reads model calls, tool calls, roots and conversation ids. A line from looptrace's scope that names
    neither an operation, a tool nor a conversation, and whose every span has a parent (as many ``"parentSpanId"`` as
    ``"spanId"`` keys, none empty), holds none of them: looptrace's turn spans. Other producers' lines are always
    parsed (their readers look at other keys). Inside a JSON string a quote is escaped, so these keys with their
    quotes can only be keys; the test errs only towards parsing.
    """
    from looptrace.instrumentation import semconv as sc

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


def plural(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {noun[:-1] + 'ies' if noun.endswith('y') and noun[-2:-1] not in 'aeiou' else noun + 's'}"


# --- show -------------------------------------------------------------------------------------------------------------


def _is_root(span: dict[str, Any]) -> bool:
    # Ours and other GenAI agents' roots are `invoke_agent {name}`, even when they join an outer trace.
    if not span.get("parentSpanId"):
        return True
    name = span.get("name")
    return type(name) is str and name.startswith("invoke_agent")


def show_command(args: argparse.Namespace) -> int:
    from .views import render_trace

    settings = _settings()
    path = _path(args, settings)
    wanted = (args.trace_id or "").lower() or None
    with LineReporter(path, settings.max_line_bytes) as report:
        chosen = _find_trace(path, wanted, report)
        report.finish(spans_required=False)
    if chosen is None:
        what = f"no trace {wanted!r}" if wanted else "no traces"
        print(f"looptrace: {what} in {path}", file=sys.stderr)
        return EXIT_NOT_FOUND
    print(render_trace(chosen))
    return EXIT_OK


_Held = list[Any]  # a trace's spans, undecoded: raw lines (bytes), or (span object, resource attributes, scope)


def _peek(raw: bytes) -> tuple[str, int, bool] | None:
    """(trace id, end time, is a root) of a line holding exactly one span, read from its bytes without parsing it;
    None for any other line (several spans, links, an unusual spelling), which is then parsed.

    looptrace writes one span per line: `traces show` parses only the lines of the trace it shows.
    """
    if raw.count(b'"spanId"') != 1:
        return None
    start = raw.find(b'"traceId":"')
    if start < 0:
        return None
    start += 11
    trace_id = raw[start:start + 32]
    if len(trace_id) != 32 or raw[start + 32:start + 33] != b'"' or trace_id.strip(b"0123456789abcdefABCDEF"):
        return None
    end = 0
    at = raw.find(b'"endTimeUnixNano":"')
    if at >= 0:
        at += 19
        digits = raw[at:raw.find(b'"', at)]
        end = int(digits) if digits.isdigit() else 0
    root = (b'"parentSpanId"' not in raw or b'"parentSpanId":""' in raw or b'"name":"invoke_agent' in raw)
    return trace_id.decode("ascii").lower(), end, root


def _find_trace(path: Path, prefix: str | None, report: LineReporter) -> list[SpanRecord] | None:
    """The spans of the trace asked for (or of the latest run), in one pass, decoding only that trace's spans.

    The latest run is the one whose root ended last; a file without any root (every run crashed) falls back to the
    trace with the latest span. Memory holds the best trace so far and the traces whose root has not come yet.
    """
    open_traces: OrderedDict[str, tuple[int, _Held]] = OrderedDict()  # trace id -> (latest end, spans)
    best: tuple[int, _Held] | None = None
    matches: set[str] = set()

    def keep(trace_id: str, end: int, root: bool, item: Any) -> None:
        nonlocal best
        report.saw_span()
        if prefix is not None:
            if not trace_id.startswith(prefix):
                return
            matches.add(trace_id)
            if len(matches) > 1:
                raise UsageError(f"trace id prefix {prefix!r} matches more than one trace; give more digits")
        held = open_traces.get(trace_id)
        if held is None:
            held = open_traces[trace_id] = (end, [])
            if len(open_traces) > MAX_OPEN_TRACES:
                open_traces.popitem(last=False)
        elif end > held[0]:
            held = open_traces[trace_id] = (end, held[1])
        held[1].append(item)
        if prefix is None and root:
            if best is None or end >= best[0]:
                best = (end, held[1])
            del open_traces[trace_id]  # judged: a later span of it (an outer span) is not worth a new one

    def parse(raw: bytes) -> Any:
        peeked = _peek(raw)
        if peeked is None:
            return json.loads(raw)
        keep(*peeked, raw)
        return SKIP

    for number, data in read_lines(path, report, report.progress, parse, max_line_bytes=report.max_line_bytes):
        try:
            for span, resource, scope in raw_spans(data):
                trace_id = span["traceId"]
                if type(trace_id) is not str:
                    raise ValueError("traceId is not a string")
                keep(trace_id.lower(), _end(span), _is_root(span), (span, resource, scope))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            report(BadLine(number, _not_trace_data(exc)))
    if prefix is not None:
        chosen = open_traces.get(next(iter(matches))) if matches else None
        return _decode(chosen[1], report) if chosen else None
    if best is None and open_traces:
        best = max(open_traces.values(), key=lambda item: item[0])
    return _decode(best[1], report) if best else None


def _end(span: dict[str, Any]) -> int:
    try:
        return int(span.get("endTimeUnixNano") or 0)
    except (TypeError, ValueError):
        return 0


def _decode(held: _Held, report: LineReporter) -> list[SpanRecord]:
    records = []
    for item in held:
        try:
            items = list(raw_spans(json.loads(item))) if isinstance(item, bytes) else [item]
            for span, resource, scope in items:
                records.append(span_record(span, decode_attributes(resource), scope))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            # A span that cannot be shown costs itself; the rest of its trace still is.
            report(BadLine(0, f"a span of this trace is unreadable ({_not_trace_data(exc)})"))
    return records


# --- list -------------------------------------------------------------------------------------------------------------


def list_command(args: argparse.Namespace) -> int:
    from looptrace.instrumentation import semconv as sc

    settings = _settings()
    path = _path(args, settings)
    keys = frozenset({sc.GEN_AI_OPERATION_NAME, sc.RUN_STATUS, sc.RUN_TURNS, sc.RUN_USAGE_TOTAL_TOKENS,
                      sc.RUN_COST_USD, sc.RUN_ANOMALY_COUNT})
    with LineReporter(path, settings.max_line_bytes) as report:
        for number, data in read_lines(path, report, report.progress, max_line_bytes=report.max_line_bytes):
            roots = []
            try:
                for span, _, scope in raw_spans(data):
                    report.saw_span()
                    if _is_root(span):
                        roots.append(span_record(span, {}, scope, keys))
            except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
                report(BadLine(number, _not_trace_data(exc)))
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


# --- push -------------------------------------------------------------------------------------------------------------


def push_command(args: argparse.Namespace) -> int:
    from looptrace.instrumentation.settings import ConfigurationError, Settings
    from looptrace.instrumentation.tracefile.spill import PushInProgress, push

    from .cli import _configure_logging

    _configure_logging()  # the exporters' warnings, rendered as the rest of the CLI renders them
    try:
        report = push(args.file, to=[args.to] if args.to else None, resend_interrupted=args.resend_interrupted,
                      settings=Settings.from_env())
    except (PushInProgress, ConfigurationError) as exc:
        raise UsageError(str(exc)) from None
    print(report.summary())
    return EXIT_OK if report.ok else 1

