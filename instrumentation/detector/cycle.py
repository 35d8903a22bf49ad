"""cycle: the turns repeat with a period of 2 to 5 (A B A B A B, A B C x3) with identical results.

A turn's signature is the multiset of its calls with their outcomes; a cycle is a primitive period of those signatures
repeated `cycle_repeats` times. Once found it fires at every further full round and ends where the period breaks.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .calls import ERROR_OUTCOME, describe_call, recent_ids
from .config import DetectorConfig
from .identity import digest, shorten
from .rule import ClosedTurn, Rule
from .types import CYCLE, Anomaly, StreakStart


class _TurnSignature(NamedTuple):  # a NamedTuple: one is made per turn, and cheaper than a frozen dataclass
    # The turn's calls with their outcomes, as a tuple that compares equal for equal turns (() for a turn without
    # tool calls): compared as it is, digested only to name a cycle that fired.
    identity: tuple[object, ...]
    turn: ClosedTurn  # its calls, read only to describe a cycle that fired


class _CycleRun:
    """A cycle being followed (a plain class, for start-up time: calls.py says why)."""

    __slots__ = ("length", "period", "start_turn", "streak")

    def __init__(self, period: int, start_turn: int, length: int, streak: str) -> None:
        self.period = period
        self.start_turn = start_turn
        self.length = length  # turns covered so far, the first round included
        self.streak = streak


class CycleRule(Rule):
    """Finds a period in the signatures of the last turns (a fixed window), and follows it while it holds."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self._window: deque[_TurnSignature] = deque(maxlen=config.cycle_window)
        self._cycle: _CycleRun | None = None
        self._closed = 0  # turns closed in this run
        # The signatures of the last `cycle_max_period` + 1 turns, each with the turn (its count in `_closed`) it last
        # came in: a turn whose calls came in none of the turns a period back ends no cycle, as most turns show with
        # one lookup.
        self._last_seen: dict[tuple[object, ...], int] = {}
        self._reach = config.cycle_max_period + 1  # how far back a signature is kept in `_last_seen`

    @property
    def active(self) -> bool:
        """Whether the last closed turn was part of a cycle: failing_tool leaves such turns to this rule."""
        return self._cycle is not None

    def begin_run(self) -> None:
        # A cycle does not cross a run boundary: a user message came between.
        self._window.clear()
        self._cycle = None
        self._closed = 0
        self._last_seen = {}

    def end_turn(self, turn: ClosedTurn) -> list[Anomaly]:
        signature = self._signature(turn)
        self._window.append(signature)
        self._closed += 1
        last_seen = self._last_seen
        before = last_seen.get(signature.identity)
        last_seen[signature.identity] = self._closed
        # The turn a longest period and one back leaves the index, unless its signature came again since; the
        # window holds that turn (`cycle_window`), so the index is exactly the last turns' signatures.
        window, reach = self._window, self._reach
        if len(window) > reach:
            old = window[-1 - reach].identity
            if last_seen.get(old) == self._closed - reach:
                del last_seen[old]
        run = self._cycle
        if run is not None:
            if self._repeats_after(run.period):
                run.length += 1
                return [self._anomaly(run)] if run.length % run.period == 0 else []
            self._cycle = None  # the pattern broke
        if before is None or self._closed - before > self.config.cycle_max_period:
            return []  # the same calls came in none of the turns a period back: no cycle ends here
        run = self._find_cycle()
        if run is None:
            return []
        self._cycle = run
        return [self._anomaly(run)]

    def container_sizes(self) -> dict[str, int]:
        return {"window": len(self._window), "recent_signatures": len(self._last_seen)}

    def _signature(self, turn: ClosedTurn) -> _TurnSignature:
        observed = turn.observed
        if not observed:
            return _TurnSignature((), turn)
        if len(observed) == 1 and not turn.overflow:
            only = observed[0]  # the common turn, one call
            return _TurnSignature((only.key, only.outcome), turn)
        # a multiset: the order of parallel calls does not matter, their number does
        return _TurnSignature((tuple(sorted([(o.key, o.outcome) for o in observed])), turn.overflow), turn)

    def _repeats_after(self, period: int) -> bool:
        window = self._window
        return (len(window) > period and window[-1].identity != ()
                and window[-1].identity == window[-1 - period].identity)

    def _find_cycle(self) -> _CycleRun | None:
        cfg = self.config
        window = self._window
        if len(window) < cfg.cycle_min_period * cfg.cycle_repeats or not window[-1].identity:
            return None  # too few turns yet, or this one had no tool calls: no cycle ends here
        last, size = window[-1].identity, len(window)
        longest = min(cfg.cycle_max_period, size - 1)
        # The cheap test first: most turns end every candidate period right here.
        for shortest in range(cfg.cycle_min_period, longest + 1):
            if window[-1 - shortest].identity == last:
                break
        else:
            return None
        # The signatures of the whole window, once per turn, rather than a copy of the window for every period tried.
        signatures = [s.identity for s in window]
        for period in range(shortest, longest + 1):
            span = period * cfg.cycle_repeats
            if len(signatures) < span:
                break
            recent = signatures[-span:]
            if () in recent:
                continue  # a turn without tool calls is no part of a tool loop
            periodic = all(recent[i] == recent[i - period] for i in range(period, span))
            if periodic and _is_primitive(recent[:period]):
                start_turn = window[-span].turn.number
                block = digest(repr(recent[:period]))[:10]
                streak = f"cycle:p{period}:{block}@t{start_turn}"
                return _CycleRun(period, start_turn, span, streak)
        return None

    def _anomaly(self, run: _CycleRun) -> Anomaly:
        block = list(self._window)[-run.period:]
        covered = list(self._window)[-min(run.length, len(self._window)):]
        tools = {call.tool for s in block for call in s.turn.calls.values()}
        rounds = run.length // run.period
        pattern = " -> ".join(f"[{self._describe_turn(s)}]" for s in block)
        return Anomaly(
            type=CYCLE,
            turn=block[-1].turn.number,
            tool=tools.pop() if len(tools) == 1 else None,
            arguments=None,
            call_ids=recent_ids([_call_ids(s.turn, self.config.max_call_ids) for s in covered],
                                self.config.max_call_ids),
            count=rounds,
            message=(f"A {run.period}-turn cycle repeated {rounds} times with identical results "
                     f"(turns {run.start_turn}-{block[-1].turn.number}): {pattern}; the agent is going "
                     "round in circles: take stock of what these results already show and do "
                     "something different, or tell the user what is blocking you."),
            streak=run.streak,
            streak_start=StreakStart(run.start_turn),
        )

    def _describe_turn(self, signature: _TurnSignature) -> str:
        """A turn's calls for a cycle's message; made only when a cycle fires, not for every turn."""
        calls = signature.turn.calls.values()
        if not calls:
            return "(no tool calls)"
        description = ", ".join(f"{describe_call(call.tool, call.arguments, self.config.capture_content)}"
                                f"{' failed' if ERROR_OUTCOME in call.outcomes else ''}"
                                for call in calls)
        return shorten(description, 200)


def _call_ids(turn: ClosedTurn, limit: int) -> list[str]:
    """A turn's call ids in the order the calls came, the last `limit`."""
    return [o.call_id for o in turn.observed if o.call_id is not None][-limit:]


def _is_primitive(block: list[tuple[object, ...]]) -> bool:
    """False when the block is itself a repetition of a shorter block (A A, A B A B)."""
    size = len(block)
    return not any(
        size % d == 0 and all(block[i] == block[i % d] for i in range(size))
        for d in range(1, size)
    )
