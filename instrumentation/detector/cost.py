"""What a loop cost: the tokens, dollars, turns and wall time spent on the turns of a streak.

The detector does not price anything. Whoever drives it knows what each model call used (the Agent after each call,
the run rebuilder from the chat spans' ``gen_ai.usage.*`` and a price table) and tells it with
``LoopDetector.record_usage(turn, TurnUsage(...))``. The ledger keeps running totals of the session and, for the most
recent model calls, the totals as they stood before each one (a mark); a streak's cost is the totals now minus the
mark of its first repeated turn. A streak keeps the mark it started from (its anchor), so its later firings, in this
run or a later run of the session, count on from the same turn: a loop that goes on across runs accumulates.

The run's and the session's loop cost count each turn once, whatever number of streaks it belongs to (a call that
repeats and a tool that keeps failing in the same turns are one loop for the bill).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple, TypedDict


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What one model call used, as the detector's driver knows it.

    ``input_tokens`` is every input token: uncached input, cache reads and cache writes (the GenAI conventions'
    rule for Anthropic). ``usd`` is None when the call has no price; ``unpriced`` then says why. ``started`` and
    ``ended`` are the call's start and end in seconds on any one clock (epoch seconds offline, the Agent's clock live).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    usd: float | None = None
    unpriced: str | None = None
    started: float | None = None
    ended: float | None = None


class LoopCostRecord(TypedDict):
    """A loop's cost as plain JSON data (`LoopCost.to_dict`)."""

    since_turn: int | None
    turns: int
    seconds: float | None
    input_tokens: int
    output_tokens: int
    total_tokens: int
    usd: float | None
    unpriced: str | None


@dataclass(frozen=True, slots=True)
class LoopCost:
    """The cost of a loop so far: from its first repeated turn (``since_turn``, in the run it began in) to now.

    ``usd`` is None when a model call in it had no price (``unpriced`` says why): a partial sum would look like a
    real figure. ``seconds`` is the wall time from the start of the first turn's model call to the end of the latest
    one; None when the driver gave no times.
    """

    turns: int
    seconds: float | None
    input_tokens: int
    output_tokens: int
    usd: float | None
    unpriced: str | None = None
    since_turn: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> LoopCostRecord:
        return {"since_turn": self.since_turn, "turns": self.turns,
                "seconds": None if self.seconds is None else round(self.seconds, 3),
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.total_tokens, "usd": self.usd, "unpriced": self.unpriced}

    @classmethod
    def from_dict(cls, data: object) -> LoopCost | None:
        """The cost ``to_dict`` wrote (a saved run state, a webhook body); None for anything else."""
        if not isinstance(data, dict):
            return None
        try:
            usd = data.get("usd")
            seconds = data.get("seconds")
            since = data.get("since_turn")
            return cls(turns=int(data["turns"]), seconds=None if seconds is None else float(seconds),
                       input_tokens=int(data["input_tokens"]), output_tokens=int(data["output_tokens"]),
                       usd=None if usd is None else float(usd), unpriced=data.get("unpriced"),
                       since_turn=None if since is None else int(since))
        except (KeyError, TypeError, ValueError):
            return None

    def summary(self) -> str:
        """"4 turns, 18,400 tokens, $0.3800" (the USD left out, saying why, when unpriced)."""
        turns = f"{self.turns} turn{'s' if self.turns != 1 else ''}"
        money = format_usd(self.usd) if self.usd is not None else f"USD unknown ({self.unpriced or 'no price'})"
        return f"{turns}, {self.total_tokens:,} tokens, {money}"


def format_usd(usd: float) -> str:
    """Dollars with enough digits for a cheap loop to read as more than $0.00."""
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.4f}"


class _Totals(NamedTuple):
    """Running sums at one point of the feed: model calls, tokens, dollars, calls without a price so far."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    unpriced: int = 0
    started: float | None = None  # the start of the next model call after this point, once known


class CostLedger:
    """The session's usage, marks for the most recent model calls, and the anchors of the streaks that fired."""

    def __init__(self, window: int, max_anchors: int) -> None:
        self._window = max(window, 8)
        self._max_anchors = max(max_anchors, 8)
        self._total = _Totals()
        self._latest_end: float | None = None
        self._last_unpriced: str | None = None
        self._marks: OrderedDict[tuple[int, int], _Totals] = OrderedDict()  # (run, turn) -> totals before it
        self._run_start = _Totals()
        self._anchors: OrderedDict[str, tuple[_Totals, int | None]] = OrderedDict()  # streak -> (its mark, since_turn)
        self._loop_upto: _Totals | None = None  # how far the session's loop total has counted
        self._session_loop = _Totals()
        self._run_loop = _Totals()
        self._run_loop_by_type: dict[str, _Totals] = {}  # the same split by the anomaly type that counted each turn
        self._last: tuple[int, int] | None = None  # the (run, turn) of the latest model call
        self.fed = False  # whether the driver told us any usage: without it anomalies carry no cost

    def begin_run(self, run: int) -> None:
        self._run_start = self._total
        self._run_loop = _Totals()
        self._run_loop_by_type = {}

    def record(self, run: int, turn: int, usage: TurnUsage) -> None:
        before = self._total
        key = (run, turn)
        if key not in self._marks:  # a turn's second call (a paused turn resumed) adds to the same turn
            self._marks[key] = _Totals(before.calls, before.input_tokens, before.output_tokens, before.usd,
                                       before.unpriced, usage.started)  # not _replace: this runs for every call
            while len(self._marks) > self._window:
                self._marks.popitem(last=False)
        usd = usage.usd
        if usd is None:
            self._last_unpriced = usage.unpriced or "no price for the model"
        self._total = _Totals(before.calls + (key != self._last), before.input_tokens + max(usage.input_tokens, 0),
                              before.output_tokens + max(usage.output_tokens, 0),
                              before.usd + (usd if usd is not None else 0.0),
                              before.unpriced + (usd is None), None)
        self._last = key
        if usage.ended is not None:
            self._latest_end = usage.ended if self._latest_end is None else max(self._latest_end, usage.ended)
        self.fed = True

    def cost(self, streak: str, kind: str, run: int, start_turn: int | None,
             start_run: int | None) -> LoopCost | None:
        """The streak's cost: from its anchor if it fired before, else from the mark of its first turn (the run start
        when that mark is gone), to now. Counts its turns into the run's and the session's loop totals."""
        if not self.fed:
            return None
        anchor = self._anchors.get(streak)
        if anchor is None:
            found = None
            if start_turn is not None:
                found = self._marks.get((start_run if start_run is not None else run, start_turn))
            # the turn was not fed usage, or is older than the window: counted from the run's start
            anchor = (found, start_turn) if found is not None else (self._run_start, None)
            self._anchors[streak] = anchor
            while len(self._anchors) > self._max_anchors:
                self._anchors.popitem(last=False)
        else:
            self._anchors.move_to_end(streak)
        mark, since = anchor
        self._count_loop(mark, kind)
        return self._between(mark, since)

    def _between(self, mark: _Totals, since: int | None) -> LoopCost:
        now = self._total
        unpriced = now.unpriced - mark.unpriced
        seconds = None
        if mark.started is not None and self._latest_end is not None:
            seconds = max(self._latest_end - mark.started, 0.0)
        return LoopCost(turns=now.calls - mark.calls, seconds=seconds,
                        input_tokens=now.input_tokens - mark.input_tokens,
                        output_tokens=now.output_tokens - mark.output_tokens,
                        usd=None if unpriced else round(now.usd - mark.usd, 9),
                        unpriced=self._last_unpriced if unpriced else None, since_turn=since)

    def _count_loop(self, mark: _Totals, kind: str) -> None:
        """Add the turns from ``mark`` to now that no earlier streak counted to the loop totals."""
        counted = self._loop_upto
        start = mark if counted is None or counted.calls < mark.calls else counted
        now = self._total
        if now.calls <= start.calls and now.input_tokens == start.input_tokens:
            return
        added = _Totals(now.calls - start.calls, now.input_tokens - start.input_tokens,
                        now.output_tokens - start.output_tokens, now.usd - start.usd, now.unpriced - start.unpriced)
        self._session_loop = _plus(self._session_loop, added)
        self._run_loop = _plus(self._run_loop, added)
        self._run_loop_by_type[kind] = _plus(self._run_loop_by_type.get(kind, _Totals()), added)
        self._loop_upto = now

    def run_loop_cost(self) -> LoopCost | None:
        """The turns of this run that belong to a loop, each counted once; None without usage or a loop."""
        return self._as_cost(self._run_loop)

    def run_loop_cost_by_type(self) -> dict[str, LoopCost]:
        """The run's loop cost split by the anomaly type whose streak counted each turn first (the parts add up to
        `run_loop_cost`)."""
        return {kind: cost for kind, totals in self._run_loop_by_type.items()
                if (cost := self._as_cost(totals)) is not None}

    def session_loop_cost(self) -> LoopCost | None:
        """The same over every run of the session so far."""
        return self._as_cost(self._session_loop)

    def _as_cost(self, totals: _Totals) -> LoopCost | None:
        if not self.fed or (totals.calls == 0 and totals.input_tokens == 0):
            return None
        return LoopCost(turns=totals.calls, seconds=None, input_tokens=totals.input_tokens,
                        output_tokens=totals.output_tokens, usd=None if totals.unpriced else round(totals.usd, 9),
                        unpriced=self._last_unpriced if totals.unpriced else None)

    def sizes(self) -> dict[str, int]:
        return {"cost_marks": len(self._marks), "cost_anchors": len(self._anchors)}


def _plus(a: _Totals, b: _Totals) -> _Totals:
    return _Totals(a.calls + b.calls, a.input_tokens + b.input_tokens, a.output_tokens + b.output_tokens,
                   a.usd + b.usd, a.unpriced + b.unpriced)
