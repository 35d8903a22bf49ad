"""The overview's figures, summed run by run as the runs are judged (memory holds the sums, never the runs): how many
runs, how they ended, how many looped and what their loops cost, per hour of their start, per agent and per tool;
and the costliest loops.

Every figure is made of `detect`'s verdicts: a run's loop cost is its verdict's ``loop_cost`` (each turn counted once,
whatever number of loops it was in); a tool's is the sum of its loops' own costs (``Anomaly.cost``), so two loops on
different tools in the same turns count those turns under each tool.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .runs import RunRecord

TOP_LOOPS = 20  # the costliest loops listed
MAX_NAMES = 10_000  # agents or tools tallied apart; beyond this (a file that names every call anew) they are pooled
OTHER = "(others)"
SEVERAL_TOOLS = "(several tools)"  # a loop over more than one tool (a cycle)
HOURLY_UP_TO = timedelta(hours=48)  # a window this short is drawn by the hour, a longer one by the day


@dataclass(slots=True)
class Tally:
    """Runs and their loops, for one hour, one agent, or the whole report."""

    runs: int = 0
    looped: int = 0
    anomalies: int = 0
    loop_tokens: int = 0
    loop_usd: float = 0.0
    unpriced: int = 0  # looping runs whose loops include a model call without a price: their USD is not in loop_usd
    unresolved: int = 0  # runs that ended with a tool error unresolved (a fact, looped or not)
    statuses: Counter[str] = field(default_factory=Counter)

    def add(self, run: RunRecord) -> None:
        self.runs += 1
        self.statuses[run.status] += 1
        self.unresolved += 1 if run.verdict.unresolved_errors else 0
        if not run.looped:
            return
        self.looped += 1
        self.anomalies += len(run.verdict.anomalies)
        cost = run.loop_cost
        if cost is None:
            return
        self.loop_tokens += cost.total_tokens
        if cost.usd is None:
            self.unpriced += 1
        else:
            self.loop_usd += cost.usd

    def merge(self, other: Tally) -> None:
        self.runs += other.runs
        self.looped += other.looped
        self.anomalies += other.anomalies
        self.loop_tokens += other.loop_tokens
        self.loop_usd += other.loop_usd
        self.unpriced += other.unpriced
        self.unresolved += other.unresolved
        self.statuses.update(other.statuses)

    @property
    def share(self) -> float:
        """The share of runs that looped, 0 to 1."""
        return self.looped / self.runs if self.runs else 0.0


@dataclass(slots=True)
class ToolTally:
    """One tool: the runs that called it, those that looped on it, and what those loops cost."""

    runs: int = 0
    looped: int = 0
    anomalies: int = 0
    loop_tokens: int = 0
    loop_usd: float = 0.0
    unpriced: int = 0

    @property
    def share(self) -> float:
        return self.looped / self.runs if self.runs else 0.0


@dataclass(frozen=True, slots=True)
class Loop:
    """One anomaly of one run, for the list of the costliest."""

    run: RunRecord
    anomaly: Any  # detector.Anomaly

    @property
    def usd(self) -> float | None:
        return None if self.anomaly.cost is None else self.anomaly.cost.usd

    @property
    def tokens(self) -> int:
        return 0 if self.anomaly.cost is None else int(self.anomaly.cost.total_tokens)

    @property
    def since_turn(self) -> int:
        """The turn the loop's cost counts from (its first repeated turn), else where it first fired."""
        cost = self.anomaly.cost
        first = self.anomaly.first_turn or self.anomaly.turn
        return int(cost.since_turn) if cost is not None and cost.since_turn is not None else int(first)


def loop_rank(usd: float | None, tokens: int) -> tuple[float, int]:
    """How loops are ranked: by USD, then by tokens; a loop without a price after every priced one."""
    return (usd if usd is not None else -1.0, tokens)


class Overview:
    """The sums of every run judged, and the costliest loops."""

    def __init__(self) -> None:
        self.total = Tally()
        self.hours: dict[datetime, Tally] = {}  # local hour of the runs' start -> their tally
        self.agents: dict[str, Tally] = {}
        self.tools: dict[str, ToolTally] = {}
        self._top: list[tuple[tuple[float, int], int, Loop]] = []  # a min-heap of the TOP_LOOPS costliest
        self._order = itertools.count()

    def add(self, run: RunRecord) -> None:
        self.total.add(run)
        if run.start_ns:  # (a run whose spans carry no time is counted, but in no hour)
            self.hours.setdefault(local_hour(run.start_ns), Tally()).add(run)
        _named(self.agents, run.agent, Tally).add(run)
        on_tool: dict[str, list[Any]] = {}
        for anomaly in run.verdict.anomalies:
            on_tool.setdefault(anomaly.tool or SEVERAL_TOOLS, []).append(anomaly)
            self._rank(Loop(run, anomaly))
        for tool in run.tools | on_tool.keys():
            self._add_tool(_named(self.tools, tool, ToolTally), on_tool.get(tool, []))

    @staticmethod
    def _add_tool(tally: ToolTally, anomalies: list[Any]) -> None:
        tally.runs += 1  # a run that called it, or looped on it (its calls read from messages: no tool span)
        if not anomalies:
            return
        tally.looped += 1
        tally.anomalies += len(anomalies)
        for anomaly in anomalies:
            if anomaly.cost is None:
                continue
            tally.loop_tokens += anomaly.cost.total_tokens
            if anomaly.cost.usd is None:
                tally.unpriced += 1
            else:
                tally.loop_usd += anomaly.cost.usd

    def _rank(self, loop: Loop) -> None:
        # Ties keep file order: of two loops that cost the same, the earlier ranks first.
        entry = (loop_rank(loop.usd, loop.tokens), -next(self._order), loop)
        if len(self._top) < TOP_LOOPS:
            heapq.heappush(self._top, entry)
        elif entry[:2] > self._top[0][:2]:
            heapq.heapreplace(self._top, entry)

    def top_loops(self) -> list[Loop]:
        """The costliest loops, costliest first."""
        return [loop for _, _, loop in sorted(self._top, key=lambda entry: entry[:2], reverse=True)]

    def periods(self) -> tuple[str, list[tuple[datetime, Tally]]]:
        """("hour" or "day", each period from the first run's to the last run's with its tally, empty ones too)."""
        if not self.hours:
            return "day", []
        first, last = min(self.hours), max(self.hours)
        if last - first <= HOURLY_UP_TO:
            return "hour", [(hour, self.hours.get(hour, Tally())) for hour in _steps(first, last, timedelta(hours=1))]
        days: dict[datetime, Tally] = {}
        for hour, tally in self.hours.items():
            days.setdefault(hour.replace(hour=0), Tally()).merge(tally)
        start, end = min(days), max(days)
        if (end - start).days > 400:  # years of runs: the days that had some, not every empty day between
            return "day", sorted(days.items())
        return "day", [(day, days.get(day, Tally())) for day in _steps(start, end, timedelta(days=1))]


def local_hour(start_ns: int) -> datetime:
    """The hour a run started in, local time (as `looptrace traces list` shows times)."""
    return datetime.fromtimestamp(start_ns / 1e9).replace(minute=0, second=0, microsecond=0)


def _steps(first: datetime, last: datetime, step: timedelta) -> list[datetime]:
    """From ``first`` to ``last`` by ``step``, on the wall clock (a day is a calendar day across a clock change)."""
    found = []
    current = first
    while current <= last:
        found.append(current)
        current = current + step
    return found


def _named(table: dict[str, Any], name: str, kind: type) -> Any:
    if name not in table and len(table) >= MAX_NAMES:
        name = OTHER
    found = table.get(name)
    if found is None:
        found = table[name] = kind()
    return found
