"""failing_tool: one tool fails on every call, with varying arguments, `failing_tool_threshold` turns running.

The model rephrasing calls to a tool that is itself broken, or guessing ids that do not exist. It stays quiet where
repeated_call already covers all of that tool's calls in the turn, or while a cycle is active.

A tool that runs commands (`bash`, `execute_bash`) is no one operation: its commands are. For such a tool the rule
follows each operation (`pip install`, `git push`, `pytest`; `commands.py`) on its own, so that a grep finding
nothing, a reproduction script failing on purpose and a test run with a failing test are three things, not one tool
failing three times.
"""

from __future__ import annotations

from collections import deque

from .calls import ERROR_ONLY, TurnCall
from .commands import command_of, operations
from .config import DetectorConfig
from .cycle import CycleRule
from .repeated_call import RepeatedCallRule
from .rule import ClosedTurn, Rule
from .types import FAILING_TOOL, Anomaly, StreakStart


class _FailingToolStreak:
    """A tool whose every call failed in consecutive turns (a plain class, for start-up time: calls.py says why)."""

    __slots__ = ("call_ids", "count", "first_key", "operation", "start_turn", "tool", "varied")

    def __init__(self, tool: str, start_turn: int, first_key: str, call_ids: deque[str], operation: str = "") -> None:
        self.tool = tool
        self.operation = operation  # for a tool that runs commands, the operation followed ("pip install")
        self.start_turn = start_turn
        self.count = 0
        self.first_key = first_key
        self.varied = False  # whether its failing calls differed: one call failing again is repeated_call's
        self.call_ids = call_ids


class FailingToolRule(Rule):
    """Per tool, the consecutive turns in which every call of it failed. Judged after repeated_call and cycle, whose
    findings of the same turn it defers to."""

    def __init__(self, config: DetectorConfig, repeated: RepeatedCallRule, cycle: CycleRule) -> None:
        self.config = config
        self._repeated = repeated
        self._cycle = cycle
        # tools (and a command tool's operations) that failed in the last closed turn only
        self._streaks: dict[tuple[str, str], _FailingToolStreak] = {}

    def begin_run(self) -> None:
        self._streaks = {}

    def end_turn(self, turn: ClosedTurn) -> list[Anomaly]:
        threshold = self.config.failing_tool_threshold
        calls = turn.calls
        if not turn.failed:
            self._streaks = {}  # no call failed in this turn: every tool's streak ends here
            return []
        by_tool: dict[tuple[str, str], list[TurnCall]] = {}
        for call in calls.values():
            by_tool.setdefault((call.tool, _operation_of(call)), []).append(call)
        streaks: dict[tuple[str, str], _FailingToolStreak] = {}
        fired: list[Anomaly] = []
        repeating_keys = self._repeated.repeating_keys
        for (tool, operation), tool_calls in by_tool.items():
            if any(c.outcomes != ERROR_ONLY for c in tool_calls):
                continue  # a success (or no failure) in this turn ends the tool's streak
            streak = self._streaks.get((tool, operation)) or _FailingToolStreak(
                tool, turn.number, tool_calls[0].key, deque(maxlen=self.config.max_call_ids), operation)
            streak.count += 1
            streak.varied = streak.varied or any(c.key != streak.first_key for c in tool_calls)
            streak.call_ids.extend(i for c in tool_calls for i in c.call_ids)
            streaks[tool, operation] = streak
            covered = all(c.key in repeating_keys for c in tool_calls) or self._cycle.active
            if threshold and streak.count >= threshold and streak.varied and not covered:
                fired.append(self._anomaly(turn.number, streak))
        self._streaks = streaks
        return fired

    def container_sizes(self) -> dict[str, int]:
        return {
            "failing_tools": len(self._streaks),
            "failing_tool_ids": sum(len(s.call_ids) for s in self._streaks.values()),
        }

    def _anomaly(self, turn: int, streak: _FailingToolStreak) -> Anomaly:
        if streak.operation:
            what = f"{streak.tool} running `{streak.operation}`" if self.config.capture_content else streak.tool
            name = f"{streak.tool}:{streak.operation}"
        else:
            what = name = streak.tool
        return Anomaly(
            type=FAILING_TOOL,
            turn=turn,
            tool=streak.tool,
            arguments=None,
            call_ids=tuple(streak.call_ids),
            count=streak.count,
            message=(f"{what} failed on every call for {streak.count} turns running, with "
                     "varying arguments; the tool itself may be broken (credentials, a service "
                     "down, wrong usage): stop retrying it, use another tool, or report the error."),
            streak=f"failing_tool:{name}@t{streak.start_turn}",
            streak_start=StreakStart(streak.start_turn),
        )


def _operation_of(call: TurnCall) -> str:
    """For a call that runs a command, the operations it runs (`pip install`, `git push+pytest`); "" otherwise."""
    command = command_of(call.tool, call.raw_arguments)
    if command is None:
        return ""
    return "+".join(operation.name for operation in operations(command)) or "?"
