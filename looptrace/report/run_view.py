"""One run as the page shows it: its timeline, its loops, its turns one by one with the content the spans hold
(folded away), and its final answer. A run recorded without content shows none: not a prompt, an argument or a
result, whatever else the page says about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from .content import Clipped, answer_text, clipped, conversation_text
from .facts import Kept, SpanFact
from .runs import RunRecord
from .timeline import LoopSpan, Turn, loops_of, turns_of
from .timeline_svg import loop_label, timeline_svg

MAX_TURNS_LISTED = 200  # a run's turns listed one by one below its timeline; the timeline draws them all


@dataclass(slots=True)
class TurnView:
    turn: Turn
    said: Clipped | None  # what the model wrote in this turn (content)
    loops: list[LoopSpan]  # the loops that fired at this turn
    calls: list[tuple[SpanFact, Clipped | None, Clipped | None, Clipped | None]]  # call, arguments, result, reason


@dataclass(slots=True)
class RunView:
    run: RunRecord
    timeline: Markup
    loops: list[LoopSpan]
    loop_labels: list[str]
    turns: list[TurnView]
    turn_count: int
    prompt: Clipped | None  # the task and system prompt (content)
    answer: Clipped | None  # the final answer (content)
    has_content: bool
    notes: list[str] = field(default_factory=list)


def run_view(run: RunRecord) -> RunView:
    turns = turns_of(run)
    loops = loops_of(run, len(turns) or run.verdict.turns)
    views = [_turn_view(turn, loops) for turn in turns[:MAX_TURNS_LISTED]]
    facts = run.facts or []
    notes = []
    if len(turns) > MAX_TURNS_LISTED:
        notes.append(f"{len(turns) - MAX_TURNS_LISTED:,} later turns are drawn on the timeline but not listed; "
                     f"`looptrace traces show --trace-id {run.trace_id}` shows them all")
    if run.verdict.tool_calls > sum(len(t.tools) for t in turns):
        notes.append("some tool calls were read from the model's messages (the producer recorded no tool span for "
                     "them): they count in the verdict but have no time to be drawn at")
    return RunView(run=run, timeline=timeline_svg(run, turns, loops), loops=loops,
                   loop_labels=[loop_label(loop) for loop in loops], turns=views, turn_count=len(turns),
                   prompt=_prompt(turns, run), answer=_answer(turns, run), has_content=_has_content(facts),
                   notes=notes)


def _turn_view(turn: Turn, loops: list[LoopSpan]) -> TurnView:
    said = None
    if turn.model is not None and turn.model.output is not None:
        text = answer_text(turn.model.output.text)
        said = clipped(text) if text else None
    calls = [(call, _shown(call.arguments), _shown(call.result), _shown(call.approval_reason)) for call in turn.tools]
    fired = [loop for loop in loops if turn.number in loop.fired]
    return TurnView(turn=turn, said=said, loops=fired, calls=calls)


def _shown(value: Kept | None) -> Clipped | None:
    if value is None:
        return None
    shown = clipped(value.text)
    if shown is None or value.length <= len(value.text):
        return shown
    return Clipped(shown.text, shown.more + value.length - len(value.text))


def _prompt(turns: list[Turn], run: RunRecord) -> Clipped | None:
    """The run's task and system prompt: looptrace records both on the run's root (once a run; files of before kept
    the system prompt on each model call), other producers on the first model call."""
    first = turns[0].model if turns else None
    root = run.root
    system = next((fact.system.text for fact in (root, first) if fact is not None and fact.system is not None), None)
    for fact in (root, first):
        if fact is not None and fact.input is not None:
            return clipped(conversation_text(fact.input.text, system))
    return None


def _answer(turns: list[Turn], run: RunRecord) -> Clipped | None:
    root = run.root
    if root is not None and root.output is not None:
        return clipped(answer_text(root.output.text))
    last = turns[-1].model if turns else None
    if last is not None and last.output is not None:
        return clipped(answer_text(last.output.text))
    return None


def _has_content(facts: list[SpanFact]) -> bool:
    return any(f.arguments or f.result or f.output or f.input or f.system or f.approval_reason for f in facts)


def verdict_lines(run: RunRecord) -> dict[str, Any]:
    """The verdict's facts beside the loops: tool errors left unresolved, rules the producer's spans could not feed."""
    verdict = run.verdict
    return {"unresolved": [error.describe() for error in verdict.unresolved_errors],
            "not_run": sorted(verdict.rules_not_run.items())}
