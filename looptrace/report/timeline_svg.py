"""One run's timeline as inline SVG: the run, its turns, its model calls and each tool's calls as bars on one time
axis; errors in red and crossed, approvals as a diamond where the call waited; each loop a band over the turns it
took, labelled with what it cost. Each turn's bar links to the turn's details below the chart.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from looptrace.instrumentation.detector import format_usd

from .facts import SpanFact
from .runs import RunRecord
from .svg import WIDTH, duration_text, time_ticks
from .timeline import LoopSpan, Turn

LABEL_W = 128  # the row names
RIGHT = 14
LANE = 24  # one row's height
LOOP_LANE = 20  # one loop's label lane
AXIS_H = 28
MAX_TOOL_ROWS = 12  # tools beyond these share one row


class _Scale:
    def __init__(self, start_ns: int, end_ns: int) -> None:
        self.start = start_ns
        self.span = max(end_ns - start_ns, 1)
        self.width = WIDTH - LABEL_W - RIGHT

    def x(self, ns: int) -> float:
        return LABEL_W + self.width * (ns - self.start) / self.span

    def bar(self, start_ns: int, end_ns: int) -> tuple[float, float]:
        x = self.x(start_ns)
        return x, max(self.x(end_ns) - x, 1.5)


def timeline_svg(run: RunRecord, turns: Sequence[Turn], loops: Sequence[LoopSpan]) -> Markup:
    """The run's timeline (``turns`` and ``loops`` from ``timeline``)."""
    facts = run.facts or []
    start = min([run.start_ns, *(f.start_ns for f in facts if f.start_ns)])
    end = max([run.end_ns, *(f.end_ns for f in facts)])
    scale = _Scale(start, end)
    tool_rows = _tool_rows(turns)
    rows = ["run", "turns", "model calls", *tool_rows]
    top = LOOP_LANE * len(loops) + 6
    height = top + LANE * len(rows) + AXIS_H
    out = [f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" role="img" '
           f'aria-label="timeline of run {escape(run.trace_id)}">']
    for index, name in enumerate(rows):
        y = top + LANE * index
        out.append(f'<text class="row" x="{LABEL_W - 8}" y="{y + LANE / 2 + 4:.0f}" text-anchor="end">'
                   f'{escape(_short(name, 18))}</text>')
    out.extend(_loop_marks(loops, turns, scale, top, top + LANE * len(rows)))
    root = run.root
    if root is not None:
        x, w = scale.bar(root.start_ns, root.end_ns)
        title = f"{root.name} · {run.status} · {duration_text(root.end_ns - root.start_ns)}"
        out.append(_rect("run", x, top + 5, w, LANE - 10, title, root.error))
    out.extend(_turn_bars(turns, scale, top + LANE, run.anchor))
    out.extend(_call_bars(turns, scale, top, tool_rows))
    out.extend(_axis(scale, top + LANE * len(rows), end - start))
    out.append("</svg>")
    return Markup("".join(out))


def _tool_rows(turns: Sequence[Turn]) -> list[str]:
    names: list[str] = []
    for turn in turns:
        for call in turn.tools:
            if call.tool and call.tool not in names:
                names.append(call.tool)
    return names if len(names) <= MAX_TOOL_ROWS else [*names[:MAX_TOOL_ROWS - 1], "other tools"]


def _turn_bars(turns: Sequence[Turn], scale: _Scale, y: float, anchor: str) -> list[str]:
    out = []
    for turn in turns:
        x, w = scale.bar(turn.start_ns, turn.end_ns)
        errors = f", {turn.errors} error{'s' if turn.errors != 1 else ''}" if turn.errors else ""
        title = (f"turn {turn.number}: {duration_text(turn.end_ns - turn.start_ns)}, {len(turn.tools)} tool "
                 f"call{'s' if len(turn.tools) != 1 else ''}{errors}")
        label = (f'<text class="turn-number" x="{x + w / 2:.1f}" y="{y + LANE / 2 + 4:.0f}" '
                 f'text-anchor="middle">{turn.number}</text>') if w >= 14 else ""
        bar = _rect("turn odd" if turn.number % 2 else "turn", x, y + 3, w, LANE - 6, title, False, turn=turn.number)
        out.append(f'<a href="#{escape(anchor)}-turn-{turn.number}">{bar}{label}</a>')
    return out


def _call_bars(turns: Sequence[Turn], scale: _Scale, top: float, tool_rows: list[str]) -> list[str]:
    out = []
    for turn in turns:
        model = turn.model
        if model is not None:
            x, w = scale.bar(model.start_ns, model.end_ns)
            kind = "judge" if model.judge else "model"
            out.append(_rect(kind, x, top + LANE * 2 + 5, w, LANE - 10, _model_title(model), model.error,
                             turn=turn.number))
        for call in turn.tools:
            row = 3 + (tool_rows.index(call.tool) if call.tool in tool_rows else len(tool_rows) - 1)
            x, w = scale.bar(call.start_ns, call.end_ns)
            y = top + LANE * row
            out.append(_rect("tool", x, y + 5, w, LANE - 10, _tool_title(call), call.error, turn=turn.number,
                             tool=call.tool))
            if call.error:
                out.append(f'<text class="error-mark" x="{x + w + 2:.1f}" y="{y + LANE / 2 + 4:.0f}">✗</text>')
            if call.approval:
                out.append(f'<path class="approval {escape(call.approval)}" d="M{x:.1f} {y + 3:.1f} l5 6 l-5 6 '
                           f'l-5 -6 z"><title>{escape(_approval_text(call))}</title></path>')
    return out


def _loop_marks(loops: Sequence[LoopSpan], turns: Sequence[Turn], scale: _Scale, top: float,
                bottom: float) -> list[str]:
    out = []
    for lane, loop in enumerate(loops):
        if not turns:
            break
        first, last = turns[loop.first - 1], turns[loop.last - 1]
        x0, x1 = scale.x(first.start_ns), max(scale.x(last.end_ns), scale.x(first.start_ns) + 3)
        a = loop.anomaly
        title = loop_title(loop)
        y = 3 + LOOP_LANE * lane
        out.append(f'<g class="loop" data-type="{escape(a.type)}" data-tool="{escape(a.tool or "")}" '
                   f'data-first-turn="{loop.first}" data-last-turn="{loop.last}"><title>{escape(title)}</title>'
                   f'<rect class="loop-band" x="{x0:.1f}" y="{top:.1f}" width="{x1 - x0:.1f}" '
                   f'height="{bottom - top:.1f}"/>'
                   f'<rect class="loop-bar" x="{x0:.1f}" y="{y:.1f}" width="{x1 - x0:.1f}" height="{LOOP_LANE - 6}"/>')
        for turn in loop.fired:
            mid = scale.x(turns[turn - 1].end_ns)
            out.append(f'<path class="fired" d="M{mid - 5:.1f} {y:.1f} h10 l-5 {LOOP_LANE - 6} z"/>')
        anchor_end = x0 > LABEL_W + scale.width * 0.55
        out.append(f'<text class="loop-label" x="{(x1 - 4 if anchor_end else x0 + 4):.1f}" y="{y + 11:.1f}" '
                   f'text-anchor="{"end" if anchor_end else "start"}">{escape(loop_label(loop))}</text></g>')
    return out


def loop_label(loop: LoopSpan) -> str:
    """"repeated_call search_equipment ×4, turns 1-4: 4 turns, 2,320 tokens, $0.0056"."""
    a = loop.anomaly
    tool = f" {a.tool}" if a.tool else ""
    where = f"turn {loop.first}" if loop.first == loop.last else f"turns {loop.first}–{loop.last}"
    cost = f": {a.cost.summary()}" if a.cost is not None else ""
    return f"{a.type}{tool} ×{a.count}, {where}{cost}"


def loop_title(loop: LoopSpan) -> str:
    earlier = " (the streak began in an earlier run of the session)" if loop.began_earlier else ""
    return f"{loop_label(loop)}{earlier}\n{loop.anomaly.message}"


def _rect(kind: str, x: float, y: float, w: float, h: float, title: str, error: bool, *, turn: int | None = None,
          tool: str | None = None) -> str:
    data = (f' data-turn="{turn}"' if turn is not None else "") + (f' data-tool="{escape(tool)}"' if tool else "")
    css = f"{kind}{' error' if error else ''}"
    return (f'<rect class="{css}" x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}"{data}>'
            f"<title>{escape(title)}</title></rect>")


def _model_title(model: SpanFact) -> str:
    parts = [model.name]
    if model.tokens is not None:
        parts.append(f"in {model.input_tokens or 0:,} out {model.output_tokens or 0:,} tokens")
    if model.usd is not None:
        parts.append(format_usd(model.usd))
    if model.stop_reason:
        parts.append(f"stop_reason={model.stop_reason}")
    if model.error:
        parts.append(f"error: {model.error_type or 'failed'}")
    parts.append(duration_text(model.end_ns - model.start_ns))
    return " · ".join(parts)


def _tool_title(call: SpanFact) -> str:
    parts = [call.tool or call.name, duration_text(call.end_ns - call.start_ns)]
    if call.error:
        parts.append(f"error: {call.error_type or call.outcome or 'failed'}")
    elif call.outcome and call.outcome != "ok":
        parts.append(call.outcome)
    if call.approval:
        parts.append(_approval_text(call))
    return " · ".join(parts)


def _approval_text(call: SpanFact) -> str:
    by = f" by {call.approval_by}" if call.approval_by else ""
    waited = f" after {duration_text(call.approval_wait_s * 1e9)}" if call.approval_wait_s is not None else ""
    return f"approval: {call.approval}{by}{waited}"


def _axis(scale: _Scale, y: float, span_ns: int) -> list[str]:
    out = [f'<line class="axis" x1="{LABEL_W}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>']
    for offset in time_ticks(span_ns):
        x = scale.x(scale.start + offset)
        out.append(f'<line class="tick-line" x1="{x:.1f}" x2="{x:.1f}" y1="{y:.1f}" y2="{y + 4:.1f}"/>'
                   f'<text class="tick" x="{x:.1f}" y="{y + 17:.1f}" text-anchor="middle">'
                   f'{escape("0" if offset == 0 else duration_text(offset))}</text>')
    return out


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
