"""What the CLI shows a person: turns as they happen, and a stored trace as a tree."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TextIO

from looptrace.instrumentation import semconv as sc
from looptrace.instrumentation.otlp_file import SpanRecord

from .events import AnomalyDetected, Event, ModelResponded, RunFinished, ToolFinished, TurnStarted

ERROR_MARK = "✗"
OK_MARK = "✓"
WARN_MARK = "⚠"


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
    """Prints each turn of a run as it happens; pass an instance as ``Agent(on_event=...)``."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: Event) -> None:
        write = self.out.write
        if isinstance(event, TurnStarted):
            write(f"turn {event.turn}\n")
        elif isinstance(event, ModelResponded):
            u = event.usage
            write(f"  model   stop_reason={event.stop_reason}  in={u.input_tokens} out={u.output_tokens}"
                  f" cache_read={u.cache_read_input_tokens} cache_write={u.cache_creation_input_tokens}"
                  f"  {duration(event.duration_s)}\n")
            if event.text and event.stop_reason != "tool_use":
                write(f"  says    {short(event.text, 100)}\n")
        elif isinstance(event, ToolFinished):
            mark = ERROR_MARK if event.is_error else OK_MARK
            write(f"  {mark} tool  {event.name}({short(event.arguments, 60)}) -> {short(event.result, 70)}"
                  f"  {duration(event.duration_s)}\n")
        elif isinstance(event, AnomalyDetected):
            a = event.anomaly
            write(f"  {WARN_MARK} {a.type} [{event.action}]  {a.message}\n")
        elif isinstance(event, RunFinished):
            r = event.result
            cost = "" if r.cost_usd is None else f"  ${r.cost_usd:.4f}"
            write(f"{r.status.value}: {r.turns} turns, {r.usage.total_tokens:,} tokens{cost}\n")
        self.out.flush()


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
    for root in by_parent[None]:
        lines.append(_describe(root))
        _render_children(root, by_parent, "", lines)
    return "\n".join(lines)


def _render_children(parent: SpanRecord, by_parent, prefix: str, lines: list[str]) -> None:
    children = by_parent.get(parent.span_id, [])
    for position, child in enumerate(children):
        last = position == len(children) - 1
        lines.append(f"{prefix}{'└─ ' if last else '├─ '}{_describe(child)}")
        for name, _, attributes in child.events:
            if name.startswith(sc.LEGACY_ANOMALY_EVENT) or name == sc.GEN_AI_EVALUATION_RESULT_EVENT:
                message = attributes.get(sc.ANOMALY_MESSAGE) or attributes.get(sc.EVENT_MESSAGE) or ""
                lines.append(f"{prefix}{'   ' if last else '│  '}{WARN_MARK} {name}: {short(message, 100)}")
        _render_children(child, by_parent, prefix + ("   " if last else "│  "), lines)


def _describe(span: SpanRecord) -> str:
    a = span.attributes
    operation = a.get(sc.GEN_AI_OPERATION_NAME)
    mark = f"{ERROR_MARK} " if span.is_error else ""
    took = duration(span.duration_s)
    if operation == sc.OPERATION_INVOKE_AGENT:
        cost = a.get(sc.RUN_COST_USD)
        cost_text = "" if cost is None else f"  ${cost:.4f}"
        anomalies = a.get(sc.RUN_ANOMALY_COUNT) or 0
        flagged = f"  {WARN_MARK} {anomalies} anomal{'y' if anomalies == 1 else 'ies'}" if anomalies else ""
        return (f"{mark}{span.name}  [{a.get(sc.RUN_STATUS, '?')}]  {a.get(sc.RUN_TURNS, '?')} turns  "
                f"{a.get(sc.RUN_USAGE_TOTAL_TOKENS, 0):,} tokens{cost_text}  {took}{flagged}  trace {span.trace_id}")
    if operation == sc.OPERATION_CHAT:
        cache = (f" (cache read {a.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, 0)},"
                 f" write {a.get(sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, 0)})")
        failure = f"  {a.get(sc.ERROR_TYPE)}: {span.status_message}" if span.is_error else ""
        return (f"{mark}{span.name}  in {a.get(sc.GEN_AI_USAGE_INPUT_TOKENS, 0)}{cache} out "
                f"{a.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, 0)}  {took}{failure}")
    if operation == sc.OPERATION_EXECUTE_TOOL:
        arguments = a.get(sc.GEN_AI_TOOL_CALL_ARGUMENTS)
        result = a.get(sc.GEN_AI_TOOL_CALL_RESULT)
        call = f"({short(arguments, 60)})" if arguments is not None else "(…)"
        outcome = f" -> {short(result, 70)}" if result is not None else ""
        error = f"  ERROR {a.get(sc.ERROR_TYPE, '')}".rstrip() if span.is_error else ""
        return f"{mark}{span.name}{call}{outcome}  {took}{error}"
    if sc.TURN_INDEX in a:
        # Turn spans share one name; the index is an attribute (traces written before that name it "turn 3").
        name = f"{span.name} {a[sc.TURN_INDEX]}" if span.name == sc.TURN_SPAN_NAME else span.name
        return f"{mark}{name}  stop_reason={a.get(sc.STOP_REASON, '?')}  {took}"
    return f"{mark}{span.name}  {took}"
