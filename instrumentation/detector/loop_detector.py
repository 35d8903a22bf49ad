"""`LoopDetector`: feeds tool calls and turn ends to the rules, and keeps one entry per streak they report.

It owns the turn bookkeeping (which turn is open, closing it implicitly when a later turn's call arrives, ignoring a
repeated `end_turn`) and the guard that keeps a detector bug from reaching the agent. The rules own everything else.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace

from .calls import group_by_call, observe_call
from .config import DetectorConfig, default_config
from .cost import CostLedger, LoopCost, TurnUsage
from .cycle import CycleRule
from .errors import UnresolvedToolError
from .failing_tool import FailingToolRule
from .identity import call_key, canonical_arguments, safe_text, shorten
from .ignored_error import IgnoredErrorRule
from .judge import JudgeSummary, Judging
from .repeated_call import RepeatedCallRule
from .repeated_text import RepeatedTextRule
from .rule import ClosedTurn, OpenTurn, Rule, RunEnd
from .types import Anomaly, FedCall, ToolCall


class LoopDetector:
    """Feed it tool calls and turn ends; it returns the loop anomalies as they appear.

    ``observe(call)`` for every tool call of a turn, then ``end_turn(turn)`` (also for a turn with no tool calls), and
    ``end_run(stop_reason, final_text, turn)`` at the end; ``begin_run()`` before the next run of the same session.
    The public methods never raise: an internal failure is counted in `internal_errors` and the call returns [].
    """

    def __init__(self, config: DetectorConfig | None = None):
        self.config = config if isinstance(config, DetectorConfig) else default_config()
        self.internal_errors = 0
        self.last_internal_error: str | None = None
        self.anomalies_reported = 0
        # The judge's failures reach the detector by a weak reference: a bound method would make the two a cycle,
        # and every run's detector garbage for the cycle collector instead of freed when its run ends.
        self._judging = Judging(self.config.judge, _judge_failure_note(weakref.ref(self)),
                                self.config.judge_cap)
        repeated = self._repeated = RepeatedCallRule(self.config)
        cycle = CycleRule(self.config)
        ignored = IgnoredErrorRule(self.config, self._judging)
        self._errors = ignored._errors  # the run's error ledger, kept by ignored_error: read for the run's facts
        # In the order their anomalies are reported; failing_tool reads what the two before it found in the same turn.
        rules = self._rules = (repeated, cycle, FailingToolRule(self.config, repeated, cycle), ignored,
                               RepeatedTextRule(self.config))
        # Each hook goes only to the rules that define it: the feed is the hot path, and most hooks are no-ops.
        # Which rules those are is the same for every detector, worked out once (`_HOOKED`).
        self._observers = [rules[i] for i in _HOOKED["observe"]]
        self._listeners = [rules[i] for i in _HOOKED["model_said"]]
        self._turn_rules = [rules[i] for i in _HOOKED["end_turn"]]
        self._run_rules = [rules[i] for i in _HOOKED["end_run"]]
        self._streaks: dict[str, Anomaly] = {}  # this run's anomalies, one per streak (its latest firing)
        self._ledger = CostLedger(_ledger_window(self.config), 2 * self.config.max_kept_anomalies)
        self._open = OpenTurn()
        self._last_closed_turn: int | None = None
        self._turn_seq = 0  # turns closed so far, in feed order
        self._runs_begun = 0
        self._run_ended = False

    # ---- public API: thin guards around the real work

    @property
    def anomalies(self) -> list[Anomaly]:
        """This run's anomalies, one per streak with its latest count and turn (`first_turn` says where it began)."""
        return list(self._streaks.values())

    @property
    def judge_failures(self) -> int:
        """Times the judge raised instead of answering (the rule's own verdict stood)."""
        return self._judging.failures

    @property
    def judge_silenced(self) -> int:
        """ignored_error findings the judge said were not ignored."""
        return self._judging.silenced

    def unresolved_errors(self) -> list[UnresolvedToolError]:
        """The tool errors of this run that no later success resolved, so far (at the end of a run: the run's facts).

        What happened, whatever the rules make of it: recorded on every run, with or without an ignored_error. The
        error text is left out when the config's ``capture_content`` is off. Never raises: [] on an internal fault.
        """
        try:
            return self._errors.unresolved()
        except Exception as exc:  # a detector bug must never break the agent it watches
            self.internal_errors += 1
            self.last_internal_error = shorten(safe_text(exc), 300)
            return []

    @property
    def judge_summary(self) -> JudgeSummary:
        """What the judge did in this run: calls, tokens, cost, and the questions left unasked (no judge, or the
        run's cap on judge calls reached)."""
        return self._judging.summary()

    def record_usage(self, turn: int, usage: TurnUsage) -> None:
        """What the model call of ``turn`` used (its tokens, its price, when it ran): the ledger every anomaly's
        ``cost`` is worked out from. Call it once per model call, before the turn's calls are fed (the answer that
        ends the run too, before ``end_run``). Without it anomalies carry no cost."""
        try:
            if isinstance(usage, TurnUsage):
                self._ledger.record(self._runs_begun, _as_turn(turn, self._current_turn_guess()), usage)
        except Exception as exc:  # a detector bug must never break the agent it watches
            self.internal_errors += 1
            self.last_internal_error = shorten(safe_text(exc), 300)

    @property
    def loop_cost(self) -> LoopCost | None:
        """What the loops of this run cost, each turn counted once whatever number of streaks it is part of (a streak
        that began in an earlier run of the session brings its turns there too); None without a loop or usage."""
        return self._ledger.run_loop_cost()

    @property
    def loop_cost_by_type(self) -> dict[str, LoopCost]:
        """`loop_cost` split by the anomaly type whose streak counted each turn first: the parts add up to it."""
        return self._ledger.run_loop_cost_by_type()

    @property
    def session_loop_cost(self) -> LoopCost | None:
        """The same over every run of the session this detector served."""
        return self._ledger.session_loop_cost()

    def begin_run(self) -> None:
        """A new run of the same session: its own turns, streaks and errors; failing calls are remembered.

        Consecutive-turn streaks and cycles do not cross a run boundary (a user message came between); identical
        failing calls within `repeat_window` turns do, so a call that keeps failing across the user turns of one
        conversation is still a repeated_call. Such a streak, reported in an earlier run, is `continued` in this
        one: listed in `anomalies` with its count, not alerted again.
        """
        self._guarded(self._begin_run)

    def observe(self, call: FedCall) -> list[Anomaly]:
        """A tool call came back. Returns the anomalies of an older turn it closed implicitly, else []."""
        return self._guarded(self._observe, call)

    def before_calls(self, turn: int, calls: list[ToolCall]) -> list[Anomaly]:
        """The calls a turn asks for, before they run: with `repeat_threshold` 1, a call the previous turn made too is
        a repeated_call now (the caller may stop the run before it runs); [] otherwise."""
        return self._guarded(self._before_calls, turn, calls)

    def end_turn(self, turn: int, text: str | None = None) -> list[Anomaly]:
        """Close a turn. `text` is what the model said in it alongside its tool calls (the user sees it too)."""
        return self._guarded(self._end_turn, turn, text)

    def end_run(self, stop_reason: str | None, final_text: str | None, turn: int) -> list[Anomaly]:
        """The run ended: closes an open turn, then judges the whole run (once; a repeated end_run adds nothing)."""
        return self._guarded(self._end_run, stop_reason, final_text, turn)

    def container_sizes(self) -> dict[str, int]:
        """Sizes of every container the detector keeps, to check that memory stays bounded."""
        sizes = {"pending_calls": len(self._open.calls)}
        for rule in self._rules:
            sizes.update(rule.container_sizes())
        sizes["anomalies"] = len(self._streaks)
        sizes.update(self._ledger.sizes())
        return sizes

    def _guarded(self, action: Callable[..., list[Anomaly]], *args: object) -> list[Anomaly]:
        try:
            fired = action(*args)
        except Exception as exc:  # a detector bug must never break the agent it watches
            self.internal_errors += 1
            self.last_internal_error = shorten(safe_text(exc), 300)
            return []
        if fired:  # most checks find nothing
            fired = [self._remember(anomaly) for anomaly in fired]
            self.anomalies_reported += len(fired)
        return fired

    def _remember(self, anomaly: Anomaly) -> Anomaly:
        """Keep one entry per streak; a later firing carries the turn where the streak first fired in this run, and
        whether an earlier run of the session reported it already (`continued`, set by the rule that owns it)."""
        known = self._streaks.pop(anomaly.streak, None)
        start = anomaly.streak_start
        cost = self._ledger.cost(anomaly.streak, anomaly.type, self._runs_begun, start.turn if start else None,
                                 start.run if start else None)
        if cost is not None:
            anomaly = replace(anomaly, cost=cost)
        if known is None:
            anomaly = replace(anomaly, first_turn=anomaly.turn)
        else:
            first = known.first_turn if known.first_turn is not None else anomaly.turn
            anomaly = replace(anomaly, first_turn=first, continued=anomaly.continued or known.continued)
        self._streaks[anomaly.streak] = anomaly
        if len(self._streaks) > self.config.max_kept_anomalies:
            del self._streaks[next(iter(self._streaks))]
        return anomaly

    # ---- feeding

    def _begin_run(self) -> list[Anomaly]:
        self._runs_begun += 1
        self._ledger.begin_run(self._runs_begun)
        self._judging.begin_run()
        for rule in self._rules:
            rule.begin_run()
        self._open = OpenTurn()
        self._last_closed_turn = None
        self._streaks = {}
        self._run_ended = False
        return []

    def _observe(self, call: FedCall) -> list[Anomaly]:
        turn = getattr(call, "turn", None)
        if type(turn) is not int:  # the loop's own calls carry their turn: the guess is for other feeds
            turn = _as_turn(turn, self._current_turn_guess())
        open_turn = self._open
        # the caller moved on without end_turn: the turn it left is closed here
        fired = self._close_turn(open_turn.number) if open_turn.calls and turn != open_turn.number else []
        open_turn.number = turn
        observed = observe_call(call, turn, self.config, self._turn_seq)
        if len(open_turn.calls) < self.config.max_calls_per_turn:
            open_turn.calls.append(observed)
            if observed.is_error:
                open_turn.failed = True
        else:
            open_turn.overflow += 1
        for rule in self._observers:
            rule.observe(observed, open_turn)
        return fired

    def _before_calls(self, turn: object, calls: Iterable[object]) -> list[Anomaly]:
        if self.config.repeat_threshold != 1 or not calls:
            return []
        keys = {}
        for call in calls:
            arguments = canonical_arguments(getattr(call, "arguments", None))
            tool = safe_text(getattr(call, "tool", ""))
            keys[call_key(tool, arguments)] = (tool, arguments)
        return self._repeated.before_calls(_as_turn(turn, self._current_turn_guess()), keys)

    def _end_turn(self, turn: object, text: object = None) -> list[Anomaly]:
        open_turn = self._open
        if type(turn) is not int:  # the loop passes its turn number: the guess is for other feeds
            pending = open_turn.number if open_turn.calls else None
            turn = _as_turn(turn, pending if pending is not None else self._current_turn_guess())
        if isinstance(text, str) and text and not text.isspace():
            for rule in self._listeners:
                rule.model_said(turn, text)
        if turn == self._last_closed_turn and (not open_turn.calls or open_turn.number != turn):
            return []  # a repeated or late end_turn for a turn already closed
        return self._close_turn(turn)

    def _end_run(self, stop_reason: object, final_text: object, turn: object) -> list[Anomaly]:
        fired = self._close_turn(self._open.number) if self._open.calls else []
        if self._run_ended:
            return fired
        self._run_ended = True
        end = RunEnd(turn=_as_turn(turn, self._current_turn_guess()),
                     stop_reason=stop_reason.strip().lower() if isinstance(stop_reason, str) else None,
                     final_text=final_text if isinstance(final_text, str) else None)
        for rule in self._run_rules:
            fired += rule.end_run(end)
        return fired

    def _close_turn(self, turn: int | None) -> list[Anomaly]:
        """Close the open turn as `turn`: every per-turn rule is judged on it."""
        number = self._current_turn_guess() if turn is None else turn
        open_turn = self._open
        observed, overflow, failed = open_turn.calls, open_turn.overflow, open_turn.failed
        open_turn.number, open_turn.calls, open_turn.overflow, open_turn.failed = None, [], 0, False
        self._turn_seq += 1
        self._last_closed_turn = number
        closed = ClosedTurn(number, self._turn_seq, self._runs_begun, observed, group_by_call(observed), overflow,
                            failed)
        fired: list[Anomaly] = []
        for rule in self._turn_rules:
            fired += rule.end_turn(closed)
        return fired

    def _current_turn_guess(self) -> int:
        if self._open.number is not None:
            return self._open.number
        return (self._last_closed_turn or 0) + 1


# The rules a detector runs, in its order, and for each hook the positions of those that define it.
_RULE_CLASSES: tuple[type[Rule], ...] = (RepeatedCallRule, CycleRule, FailingToolRule, IgnoredErrorRule,
                                         RepeatedTextRule)
_HOOKED: dict[str, tuple[int, ...]] = {
    hook: tuple(i for i, rule in enumerate(_RULE_CLASSES) if hook in rule.hooks)
    for hook in ("observe", "model_said", "end_turn", "end_run")
}


def _ledger_window(config: DetectorConfig) -> int:
    """How many recent model calls keep a mark: every rule's first firing comes within this many of its first
    repeated turn (a failing call's repeats within `repeat_window` turns may span runs, each ending in an answer)."""
    reach = max(config.repeat_window, config.repeat_threshold, config.cycle_max_period * config.cycle_repeats,
                config.failing_tool_threshold, config.text_repeat_turns)
    return max(256, 2 * reach + 8)


def _as_turn(value: object, fallback: int) -> int:
    """A usable turn number from whatever the caller passed."""
    if isinstance(value, bool):
        return fallback
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return fallback
    return fallback


def _judge_failure_note(detector: weakref.ref[LoopDetector]) -> Callable[[str], None]:
    """What the judge calls on a failure: keeps it as the detector's last internal error, while the detector lives."""

    def note(description: str) -> None:
        alive = detector()
        if alive is not None:
            alive.last_internal_error = description

    return note
