"""A run's turns and loops, in the detector's own turn model, so that a loop is drawn at the turns `detect` names.

The n-th model call begins turn n; a tool call belongs to the turn whose model call started last before it (the run
rebuilder's rule, for every producer). A turn lasts from its model call's start to the end of the last of its calls.
A loop spans from the turn its cost counts from (its first repeated turn) to the turn it last fired.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .facts import TOOL, SpanFact
from .runs import RunRecord, model_calls


@dataclass(slots=True)
class Turn:
    """One turn: its model call (None when the spans hold tool calls only) and its tool calls."""

    number: int
    start_ns: int
    end_ns: int
    model: SpanFact | None = None
    tools: list[SpanFact] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(1 for call in self.tools if call.error) + (1 if self.model is not None and self.model.error else 0)


@dataclass(frozen=True, slots=True)
class LoopSpan:
    """An anomaly placed on the run's turns."""

    anomaly: Any  # detector.Anomaly
    first: int  # the turn the streak began (its cost counts from it), 1-based
    last: int  # the turn it last fired
    fired: tuple[int, ...]  # the turns where it fired
    began_earlier: bool  # the streak began in an earlier run of the session


def turns_of(run: RunRecord) -> list[Turn]:
    """The run's turns in order, each with its model call and tool calls."""
    facts = run.facts or []
    calls = model_calls(facts)
    turns = [Turn(number, call.start_ns, call.end_ns, call) for number, call in enumerate(calls, start=1)]
    tools = sorted((f for f in facts if f.kind == TOOL), key=lambda f: f.start_ns)
    position = 0
    for tool in tools:
        while position < len(calls) and calls[position].start_ns <= tool.start_ns:
            position += 1
        if not turns:
            turns.append(Turn(1, tool.start_ns, tool.end_ns))
        turn = turns[max(position, 1) - 1]
        turn.tools.append(tool)
        turn.start_ns = min(turn.start_ns, tool.start_ns)
        turn.end_ns = max(turn.end_ns, tool.end_ns)
    return turns


def loops_of(run: RunRecord, turn_count: int) -> list[LoopSpan]:
    """Each anomaly of the run's verdict, from the turn its streak began to the turn it last fired."""
    spans = []
    for anomaly in run.verdict.anomalies:
        last = _within(anomaly.turn, turn_count)
        first_fired = _within(anomaly.first_turn or anomaly.turn, turn_count)
        cost = anomaly.cost
        began_earlier = bool(anomaly.continued)
        since = cost.since_turn if cost is not None and cost.since_turn is not None else first_fired
        first = 1 if began_earlier else min(_within(since, turn_count), first_fired)
        fired = tuple(sorted({first_fired, last}))
        spans.append(LoopSpan(anomaly, first, last, fired, began_earlier))
    return spans


def _within(turn: Any, count: int) -> int:
    try:
        number = int(turn)
    except (TypeError, ValueError):
        number = 1
    return min(max(number, 1), max(count, 1))
