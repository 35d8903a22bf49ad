"""cycle: the turns repeat with a period of 2 to 5 (A B A B A B, A B C x3) with identical results.

A turn's signature is the multiset of its calls with their outcomes; a cycle is a primitive period of those signatures
repeated `cycle_repeats` times. Once found it fires at every further full round and ends where the period breaks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from .calls import ERROR_OUTCOME, describe_call, recent_ids
from .config import DetectorConfig
from .identity import digest, shorten
from .rule import ClosedTurn, Rule
from .types import CYCLE, Anomaly


class _TurnSignature(NamedTuple):  # a NamedTuple: one is made per turn, and cheaper than a frozen dataclass
    turn: int
    digest: str  # "" for a turn without tool calls
    calls: tuple[tuple[str, str, bool], ...]  # (tool, arguments, failed) per distinct call: described only in a cycle
    call_ids: tuple[str, ...]


@dataclass(slots=True)
class _CycleRun:
    period: int
    start_turn: int
    length: int  # turns covered so far, the first round included
    streak: str


class CycleRule(Rule):
    """Finds a period in the signatures of the last turns (a fixed window), and follows it while it holds."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self._window: deque[_TurnSignature] = deque(maxlen=config.cycle_window)
        self._cycle: _CycleRun | None = None

    @property
    def active(self) -> bool:
        """Whether the last closed turn was part of a cycle: failing_tool leaves such turns to this rule."""
        return self._cycle is not None

    def begin_run(self) -> None:
        # A cycle does not cross a run boundary: a user message came between.
        self._window.clear()
        self._cycle = None

    def end_turn(self, turn: ClosedTurn) -> list[Anomaly]:
        self._window.append(self._signature(turn))
        run = self._cycle
        if run is not None:
            if self._repeats_after(run.period):
                run.length += 1
                return [self._anomaly(run)] if run.length % run.period == 0 else []
            self._cycle = None  # the pattern broke
        run = self._find_cycle()
        if run is None:
            return []
        self._cycle = run
        return [self._anomaly(run)]

    def container_sizes(self) -> dict[str, int]:
        return {"window": len(self._window)}

    def _signature(self, turn: ClosedTurn) -> _TurnSignature:
        observed = turn.observed
        if not observed:
            return _TurnSignature(turn.number, "", (), ())
        if len(observed) == 1 and not turn.overflow:
            # The common turn, one call: the same signature as below, without the sort and the lists.
            only = observed[0]
            return _TurnSignature(
                turn=turn.number,
                digest=digest(only.key + "=" + only.outcome + "\n+0"),
                calls=((only.tool, only.arguments, only.outcome == ERROR_OUTCOME),),
                call_ids=() if only.call_id is None else (only.call_id,),
            )
        # a multiset: the order of parallel calls does not matter, their number does
        items = sorted([o.key + "=" + o.outcome for o in observed])
        items.append(f"+{turn.overflow}")
        return _TurnSignature(
            turn=turn.number,
            digest=digest("\n".join(items)),
            calls=tuple([(c.tool, c.arguments, ERROR_OUTCOME in c.outcomes) for c in turn.calls.values()]),
            call_ids=tuple([o.call_id for o in observed if o.call_id is not None])[-self.config.max_call_ids:],
        )

    def _repeats_after(self, period: int) -> bool:
        window = self._window
        return (len(window) > period and window[-1].digest != ""
                and window[-1].digest == window[-1 - period].digest)

    def _find_cycle(self) -> _CycleRun | None:
        cfg = self.config
        window = self._window
        if len(window) < cfg.cycle_min_period * cfg.cycle_repeats or not window[-1].digest:
            return None  # too few turns yet, or this one had no tool calls: no cycle ends here
        last = window[-1].digest
        periods = [period for period in range(cfg.cycle_min_period, cfg.cycle_max_period + 1)
                   if len(window) > period and window[-1 - period].digest == last]
        if not periods:
            return None  # the cheap test first: most turns end every candidate period right here
        # The digests of the whole window, once per turn, rather than a copy of the window for every period tried.
        digests = [s.digest for s in window]
        for period in periods:
            span = period * cfg.cycle_repeats
            if len(digests) < span:
                break
            recent = digests[-span:]
            if "" in recent:
                continue  # a turn without tool calls is no part of a tool loop
            periodic = all(recent[i] == recent[i - period] for i in range(period, span))
            if periodic and _is_primitive(recent[:period]):
                start_turn = window[-span].turn
                streak = f"cycle:p{period}:{digest(''.join(recent[:period]))[:10]}@t{start_turn}"
                return _CycleRun(period, start_turn, span, streak)
        return None

    def _anomaly(self, run: _CycleRun) -> Anomaly:
        block = list(self._window)[-run.period:]
        covered = list(self._window)[-min(run.length, len(self._window)):]
        tools = {tool for s in block for tool, _, _ in s.calls}
        rounds = run.length // run.period
        pattern = " -> ".join(f"[{self._describe_turn(s)}]" for s in block)
        return Anomaly(
            type=CYCLE,
            turn=block[-1].turn,
            tool=tools.pop() if len(tools) == 1 else None,
            arguments=None,
            call_ids=recent_ids([s.call_ids for s in covered], self.config.max_call_ids),
            count=rounds,
            message=(f"A {run.period}-turn cycle repeated {rounds} times with identical results "
                     f"(turns {run.start_turn}-{block[-1].turn}): {pattern}; the agent is going "
                     "round in circles: take stock of what these results already show and do "
                     "something different, or tell the user what is blocking you."),
            streak=run.streak,
        )

    def _describe_turn(self, signature: _TurnSignature) -> str:
        """A turn's calls for a cycle's message; made only when a cycle fires, not for every turn."""
        if not signature.calls:
            return "(no tool calls)"
        description = ", ".join(f"{describe_call(tool, arguments, self.config.capture_content)}"
                                f"{' failed' if failed else ''}"
                                for tool, arguments, failed in signature.calls)
        return shorten(description, 200)


def _is_primitive(block: list[str]) -> bool:
    """False when the block is itself a repetition of a shorter block (A A, A B A B)."""
    size = len(block)
    return not any(
        size % d == 0 and all(block[i] == block[i % d] for i in range(size))
        for d in range(1, size)
    )
