"""What the CLI shows a person: turns as they happen, and a stored trace as a tree."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from looptrace.cli.common import is_terminal, plural, plural_of, unresolved_lines
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.tracefile import SpanRecord

if TYPE_CHECKING:  # the live view's types: the reading commands (render_trace) never import the runtime
    from looptrace.runtime import Event, RunResult, TextStreamed, ToolFinished

ERROR_MARK = "✗"
OK_MARK = "✓"
WARN_MARK = "⚠"
IGNORED_ERROR = "ignored_error"  # the detector's anomaly type for an error the final answer ignored
MAX_INDENT = 3 * 40
SAYS = "  says    "  # the model's text, as the view prints it
NO_JUDGE_HINT = "set LOOPTRACE_JUDGE or pass --judge MODEL"  # `looptrace run`'s way to a judge


def short(value: Any, limit: int = 80) -> str:
    """One line of at most ``limit`` characters: JSON for structures, the text itself for strings."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


class LiveView:
    """Prints each turn of a run as it happens; pass an instance as ``Agent(on_event=...)``.

    At a terminal, a slow model call or tool round also gets a live line with the time it has taken so far, rewritten
    in place and erased when the call ends; written to a file or a pipe, the view is the plain lines only. A reader
    that goes away (a closed pipe) ends the view quietly; the run goes on.

    With ``capture_content=False`` (content capture off, as the settings say) the view keeps content off stderr as
    the spans keep it off the trace: a tool call shows its name, outcome, result size and digest, never its arguments
    or result, and the model's text shows only its length.

    A model that streams (``TextStreamed`` events) has its text printed as it arrives. While a person is asked
    something (``paused()``), the live line is taken off the screen and stays off until the answer.
    """

    def __init__(self, out: TextIO, *, tick_s: float = 0.25, capture_content: bool = True,
                 no_judge_hint: str = NO_JUDGE_HINT) -> None:
        self.out: TextIO | None = out
        self.tick_s = tick_s
        self.capture_content = capture_content
        self.no_judge_hint = no_judge_hint  # what the unjudged-errors line says to do when no judge is set
        self._turns_started = 0  # the turn a run failed in is shown; the result counts only completed turns
        self.interactive = is_terminal(out)
        self._lock = threading.Lock()  # the ticker thread and the run's thread share the line
        self._waiting: tuple[str, float] | None = None  # what the run is waiting for, since when
        self._line_shown = False
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._held = False  # a person is being asked something: the ticker draws nothing
        self._streamed_turn = 0  # the turn whose text was streamed (its ModelResponded prints no "says" line)
        self._stream_open = False  # streamed text is on the current line, unfinished

    def note(self, text: str) -> None:
        """A line of the caller's own, e.g. what the run is about, written the same way as the view's."""
        self._write(text + "\n")

    def __call__(self, event: Event) -> None:
        # Imported here, not with the module: `traces show` renders with this module and would otherwise load the
        # runtime, its interface and the whole detector at start-up for nothing (a run has them loaded already).
        from looptrace.runtime import (
            AnomalyDetected,
            ModelResponded,
            RunFinished,
            TextStreamed,
            ToolFinished,
            TurnStarted,
        )

        if isinstance(event, TextStreamed):
            self._streamed(event)
        elif isinstance(event, TurnStarted):
            self._turns_started = max(self._turns_started, event.turn)
            self._write(f"turn {event.turn}\n", waiting_for="waiting for the model")
        elif isinstance(event, ModelResponded):
            u = event.usage
            lines = (f"  model   stop_reason={event.stop_reason}  in={u.input_tokens} out={u.output_tokens}"
                     f" cache_read={u.cache_read_input_tokens} cache_write={u.cache_creation_input_tokens}"
                     f"  {duration(event.duration_s)}\n")
            streamed = self._streamed_turn == event.turn and self.capture_content  # its text is on screen already
            if event.text and event.stop_reason != "tool_use" and not streamed:
                said = short(event.text, 100) if self.capture_content else f"({plural(len(event.text), 'character')})"
                lines += f"{SAYS}{said}\n"
            names = [name for name, _ in event.tool_calls]
            running = f"running {', '.join(names[:3])}{' …' if len(names) > 3 else ''}" if names else None
            self._write(lines, waiting_for=running if event.stop_reason == "tool_use" else None)
        elif isinstance(event, ToolFinished):
            mark = ERROR_MARK if event.is_error else OK_MARK
            self._write(f"  {mark} tool  {self._tool_call(event)}  {duration(event.duration_s)}\n")
        elif isinstance(event, AnomalyDetected):
            a = event.anomaly
            spent = f"  (looping for {a.cost.summary()} so far)" if a.cost is not None else ""
            self._write(f"  {WARN_MARK} {a.type} [{event.action}]{spent}  {a.message}\n")
        elif isinstance(event, RunFinished):
            r = event.result
            cost = "" if r.cost_usd is None else f"  ${r.cost_usd:.4f}"
            turns = max(r.turns, self._turns_started)  # a run failing in turn 1 showed "turn 1": it had one turn
            summary = [f"{r.status.value}: {plural(turns, 'turn')}, {plural(r.usage.total_tokens, 'token')}{cost}",
                       *loop_cost_lines(r), *judge_lines(r, self.no_judge_hint)]
            self._write("".join(line + "\n" for line in summary))
            # The fact a user reviews whatever the detector said: the errors the run ended with unresolved. Without
            # content capture, named by tool and turn only, as the tool lines above are.
            errors = r.unresolved_errors if self.capture_content else [
                dataclasses.replace(e, target=None, error=None) for e in r.unresolved_errors]
            # A warning only when the detector found the final answer ignoring an error; an error the model reported
            # (and worked around, perhaps) is a fact, said quietly, and not called unresolved.
            ignored = any(a.type == IGNORED_ERROR for a in r.anomalies)
            for line in unresolved_lines(errors):
                mark = WARN_MARK + " " if ignored and "left unresolved" in line else ""
                self._write(f"{mark}{line}\n")
            self._stop.set()

    def _tool_call(self, event: ToolFinished) -> str:
        """``name(arguments) -> result``, or with content capture off what can be said without them."""
        from looptrace.instrumentation.detector import result_digest

        if self.capture_content:
            return f"{event.name}({short(event.arguments, 60)}) -> {short(event.result, 70)}"
        count = len(event.arguments) if isinstance(event.arguments, dict) else None
        arguments = "…" if count is None else plural(count, "argument")
        return (f"{event.name}({arguments}) -> {event.outcome}, {plural(len(event.result), 'character')}, "
                f"digest {result_digest(event.result)}")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """While a person is asked something at the terminal (an approval, whether to go on): the live line is
        erased and not drawn again until the block ends; then it counts again from the answer (waiting for a person
        is not the call's time)."""
        with self._lock:
            waiting = self._waiting
            self._held = True
            if self._line_shown:
                self._emit("\r\x1b[K")
                self._line_shown = False
        try:
            yield
        finally:
            with self._lock:
                self._held = False
                if waiting is not None and self._waiting is waiting:  # nothing new was shown meanwhile
                    self._waiting = (waiting[0], time.monotonic())

    def _streamed(self, event: TextStreamed) -> None:
        """A piece of the model's text, printed as it arrives (with content capture off, only its length is shown,
        with the response)."""
        if not self.capture_content:
            return
        with self._lock:
            self._waiting = None  # the text itself shows the call is alive
            start = ""
            if self._streamed_turn != event.turn:
                self._streamed_turn = event.turn
                start = ("\r\x1b[K" if self._line_shown else "") + SAYS
                self._line_shown = False
            self._emit(start + event.text.replace("\n", "\n" + " " * len(SAYS)))
            self._stream_open = True

    # --- writing ------------------------------------------------------------------------------------------------

    def _write(self, text: str, *, waiting_for: str | None = None) -> None:
        """Permanent lines (erasing the live line first), then what the run now waits for, if anything."""
        with self._lock:
            self._waiting = (waiting_for, time.monotonic()) if waiting_for and self.interactive else None
            if self._stream_open:  # the streamed text's line ends before the next line begins
                text = "\n" + text
                self._stream_open = False
            self._emit(("\r\x1b[K" if self._line_shown else "") + text)
            self._line_shown = False
            start_ticker = self._waiting is not None and (self._ticker is None or not self._ticker.is_alive())
            if start_ticker:  # one per run: it ends with the run (RunFinished) or with the reader
                self._stop.clear()
                self._ticker = threading.Thread(target=self._tick, name="looptrace-live-line", daemon=True)
                self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                if self._waiting is None or self.out is None or self._held:
                    continue
                label, since = self._waiting
                self._emit(f"\r\x1b[K  … {label}  {time.monotonic() - since:.1f} s")
                self._line_shown = True

    def _emit(self, text: str) -> None:
        if self.out is None:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, ValueError):  # the reader went away, or the stream was closed: stop showing
            self.out = None
            self._stop.set()


def loop_cost_lines(result: RunResult) -> list[str]:
    """What the run's loops cost (each turn counted once), and its session's so far when it has one and they differ."""
    if result.loop_cost is None:
        return []
    lines = [f"loops: {result.loop_cost.summary()}"]
    session = result.session_loop_cost
    if session is not None and session != result.loop_cost:
        lines.append(f"loops in this session so far: {session.summary()}")
    return lines


def judge_lines(result: RunResult, no_judge_hint: str = NO_JUDGE_HINT) -> list[str]:
    """The end-of-run summary's judge lines: what the judge's calls cost (shown apart: never the run's), and how many
    errors were left unjudged and why (no judge, or the run's cap on judge calls reached). None of either: no line."""
    judge = result.judge
    lines = []
    if judge.calls:
        cost = "" if judge.cost_usd is None else f"  ${judge.cost_usd:.4f}"
        failed = f", {judge.failures} failed" if judge.failures else ""
        lines.append(f"judge: {plural(judge.calls, 'call')}{failed}, "
                     f"{plural(judge.input_tokens + judge.output_tokens, 'token')}{cost} (not charged to the run)")
    if judge.unjudged_over_cap:
        lines.append(f"{plural(judge.unjudged_over_cap, 'tool error')} left unjudged "
                     f"(judge cap of {plural(judge.max_calls, 'call')} reached; LOOPTRACE_JUDGE_MAX_CALLS raises it)")
    if judge.unjudged_no_judge:
        lines.append(f"{plural(judge.unjudged_no_judge, 'tool error')} left unjudged (no judge: {no_judge_hint})")
    return lines


# --- trace trees ----------------------------------------------------------------------------------------------------


def render_trace(spans: Iterable[SpanRecord]) -> str:
    """A run as an indented tree: turns, model calls with tokens, tool calls with arguments and results."""
    spans = list(spans)
    by_parent: dict[str | None, list[SpanRecord]] = defaultdict(list)
    ids = {s.span_id for s in spans}
    for s in spans:
        # A span whose parent is not in the file (a run joined from an outside trace) is shown as a root.
        by_parent[s.parent_span_id if s.parent_span_id in ids else None].append(s)
    for children in by_parent.values():
        children.sort(key=lambda s: s.start_ns)
    lines: list[str] = []
    shown: set[int] = set()  # a span claiming itself (or a descendant) as parent is shown once, not forever
    # Iterative, not recursive: a hostile file can chain spans deeper than Python's stack.
    stack: list[tuple[SpanRecord, str, str]] = [(root, "", "") for root in reversed(by_parent[None])]
    while stack:
        span, prefix, branch = stack.pop()
        if id(span) in shown:
            continue
        shown.add(id(span))
        children = by_parent.get(span.span_id, [])
        lines.append(f"{prefix}{branch}{_describe(span, children)}")
        child_prefix = prefix + ("" if not branch else "   " if branch == "└─ " else "│  ")
        if len(child_prefix) > MAX_INDENT:  # a chain thousands deep still prints in linear space
            child_prefix = child_prefix[:MAX_INDENT]
        for name, _, attributes in span.events if branch else ():
            if name.startswith(sc.LEGACY_ANOMALY_EVENT) or name == sc.GEN_AI_EVALUATION_RESULT_EVENT:
                message = attributes.get(sc.ANOMALY_MESSAGE) or attributes.get(sc.EVENT_MESSAGE) or ""
                lines.append(f"{child_prefix}{WARN_MARK} {name}: {short(message, 100)}")
        for position in range(len(children) - 1, -1, -1):
            stack.append((children[position], child_prefix, "└─ " if position == len(children) - 1 else "├─ "))
    return "\n".join(lines)


def _describe(span: SpanRecord, children: list[SpanRecord]) -> str:
    """One line of the tree for a span (``children``: those drawn under it)."""
    a = span.attributes
    operation = a.get(sc.GEN_AI_OPERATION_NAME)
    mark = f"{ERROR_MARK} " if span.is_error else ""
    took = duration(span.duration_s)
    if operation == sc.OPERATION_INVOKE_AGENT:
        cost = a.get(sc.RUN_COST_USD)
        cost_text = "" if cost is None else f"  ${_number(cost, '.4f')}"
        anomalies = a.get(sc.RUN_ANOMALY_COUNT) or 0
        flagged = f"  {WARN_MARK} {_count(anomalies, 'anomaly')}{_loop_cost(a)}" if anomalies else ""
        turns = a.get(sc.RUN_TURNS, "?")
        # The run counts the turns it completed; one that failed mid-turn is still drawn below, so it is counted.
        drawn = sum(1 for child in children if sc.TURN_INDEX in child.attributes)
        if drawn and (not _is_count(turns) or drawn > turns):
            turns = drawn
        resumes = a.get(sc.RUN_RESUMES_TRACE_ID)
        resumed = f"  resumes trace {resumes}" if isinstance(resumes, str) and resumes else ""
        return (f"{mark}{span.name}  [{a.get(sc.RUN_STATUS, '?')}]  {_count(turns, 'turn')}  "
                f"{_count(a.get(sc.RUN_USAGE_TOTAL_TOKENS, 0), 'token')}{cost_text}  {took}{flagged}  "
                f"trace {span.trace_id}{resumed}")
    if operation == sc.OPERATION_CHAT:
        cache = (f" (cache read {_number(a.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, 0))},"
                 f" write {_number(a.get(sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, 0))})")
        failure = f"  {_failure(a.get(sc.ERROR_TYPE), span.status_message)}" if span.is_error else ""
        return (f"{mark}{span.name}  in {_number(a.get(sc.GEN_AI_USAGE_INPUT_TOKENS, 0))}{cache} out "
                f"{_number(a.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, 0))}  {took}{failure}")
    if operation == sc.OPERATION_EXECUTE_TOOL:
        arguments = a.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS)
        result = a.get(sc.GEN_AI_TOOL_CALL_RESULT)
        call = f"({short(arguments, 60)})" if arguments is not None else "(…)"
        outcome = f" -> {short(result, 70)}" if result is not None else ""
        error = f"  ERROR {a.get(sc.ERROR_TYPE, '')}".rstrip() if span.is_error else ""
        return f"{mark}{span.name}{call}{outcome}  {took}{error}{_approval(a)}"
    if sc.TURN_INDEX in a:
        # Turn spans share one name; the index is an attribute (traces written before that name it "turn 3").
        name = f"{span.name} {a[sc.TURN_INDEX]}" if span.name == sc.TURN_SPAN_NAME else span.name
        return f"{mark}{name}  stop_reason={a.get(sc.STOP_REASON, '?')}  {took}"
    return f"{mark}{span.name}  {took}"


def _loop_cost(a: Any) -> str:
    """What the run's loops cost, as its root span recorded it (and its session's, when that is more)."""
    usd, tokens = a.get(sc.RUN_LOOP_COST_USD), a.get(sc.RUN_LOOP_TOTAL_TOKENS)
    if _is_count(a.get(sc.RUN_LOOP_TURNS)):
        spent = f"${_number(usd, '.4f')}" if isinstance(usd, (int, float)) else f"{_number(tokens)} tokens"
        text = f", loops {_count(a[sc.RUN_LOOP_TURNS], 'turn')} {spent}"
        session = a.get(sc.SESSION_LOOP_COST_USD)
        if isinstance(session, (int, float)) and isinstance(usd, (int, float)) and session > usd:
            text += f" (session ${_number(session, '.4f')})"
        return text
    return ""


def _approval(a: Any) -> str:
    """The approval decision of a tool call, as the tool line ends: who decided, after how long, and why not."""
    decision = a.get(sc.TOOL_APPROVAL)
    if not isinstance(decision, str):
        return ""
    if decision == "pending":
        return "  [awaiting approval]"
    by = a.get(sc.TOOL_APPROVAL_BY)
    waited = a.get(sc.TOOL_APPROVAL_WAIT_S)
    after = f" after {_wait(waited)}" if isinstance(waited, (int, float)) and not isinstance(waited, bool) else ""
    reason = a.get(sc.TOOL_APPROVAL_REASON)
    why = f": {short(reason, 60)}" if isinstance(reason, str) and reason else ""
    return f"  [{decision}{f' by {by}' if isinstance(by, str) else ''}{after}{why}]"


def _wait(seconds: float) -> str:
    """A person's wait reads in the unit it took: seconds, minutes, hours or days."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return duration(seconds)


def _failure(error_type: Any, message: str) -> str:
    """``TypeError: what went wrong``, once: a status message that already starts with its type keeps it as it is."""
    if not error_type:
        return message or "failed"
    if not message:
        return str(error_type)
    if message == str(error_type) or message.startswith(f"{error_type}:"):
        return message
    return f"{error_type}: {message}"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any, noun: str) -> str:
    """``1 turn``, ``4 turns``: a count with its noun; what another producer stored instead is shown as it is."""
    if _is_count(value):
        return plural(value, noun)
    return f"{_number(value)} {plural_of(noun)}"


def _number(value: Any, spec: str = ",") -> str:
    """A count or an amount as a person reads it; whatever another producer stored instead is shown as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return format(value, spec)
        except ValueError:  # a float given the integer spec, say
            return str(value)
    return short(value, 40)
