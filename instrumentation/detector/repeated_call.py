"""repeated_call: the same call again and again with no progress.

Two ways: in `repeat_threshold` consecutive turns with an unchanged outcome (parallel batches that repeat together are
one anomaly), or failing `repeat_threshold` times within `repeat_window` turns with other calls between, with the same
error each time, across the runs of a session. A streak carried into a later run of the session is reported there as
`continued`: listed again, not alerted again. DESIGN.md has the details.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set as AbstractSet
from dataclasses import replace

from .calls import ERROR_ONLY, ERROR_OUTCOME, ObservedCall, describe_call, error_digests, recent_ids
from .config import DetectorConfig
from .identity import digest, key_id
from .rule import ClosedTurn, Rule
from .types import REPEATED_CALL, Anomaly, StreakStart

_NO_KEYS: frozenset[str] = frozenset()


# Plain classes with slots rather than dataclasses, for start-up time: calls.py says why.


class _CallStreak:
    """One call seen in consecutive turns with the same outcome."""

    __slots__ = ("arguments", "call_ids", "count", "key", "outcome", "start_seq", "start_turn", "streak", "tool")

    def __init__(self, tool: str, key: str, arguments: str, start_turn: int, start_seq: int, count: int,
                 outcome: tuple[str, ...], call_ids: deque[str]) -> None:
        self.tool = tool
        self.key = key
        self.arguments = arguments
        self.start_turn = start_turn
        self.start_seq = start_seq
        self.count = count
        self.outcome = outcome
        self.call_ids = call_ids
        self.streak: str | None = None  # set at first firing so a growing streak keeps its key


class _FailureRun:
    """One canonical call's recent failures (turn sequence numbers), for repeats with other calls between."""

    __slots__ = ("arguments", "call_ids", "last_failures", "reported_in", "runs", "seqs", "streak", "tool", "turns")

    def __init__(self, tool: str, arguments: str, max_call_ids: int) -> None:
        self.tool = tool
        self.arguments = arguments
        self.seqs: deque[int] = deque()
        self.turns: deque[int] = deque()
        self.runs: deque[int] = deque()  # which run of the session each failure was in
        self.call_ids: deque[str] = deque(maxlen=max_call_ids)
        self.last_failures: list[ObservedCall] = []  # its latest failed calls: compared with the next ones' errors
        self.streak: str | None = None
        self.reported_in: int | None = None  # the run of the session that first reported this streak (either way)

    def continued_in(self, run: int) -> bool:
        """Whether this streak was already reported in a run of the session before `run`."""
        return self.reported_in is not None and self.reported_in < run


class RepeatedCallRule(Rule):
    """Streaks of the same call in consecutive turns, and the same call failing repeatedly with others between."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self._streaks: dict[str, _CallStreak] = {}  # calls of the last closed turn only
        self._failures: dict[str, _FailureRun] = {}  # kept across the runs of a session
        # Calls whose consecutive streak fired in the last closed turn: failing_tool leaves them to this rule.
        self.repeating_keys: AbstractSet[str] = _NO_KEYS
        # Of those, the ones whose failures an earlier run already reported: the failure run goes on reporting them.
        self._carried_keys: AbstractSet[str] = _NO_KEYS
        self._reported_before: AbstractSet[str] = _NO_KEYS  # calls reported by `before_calls` in the open turn

    def begin_run(self) -> None:
        # Consecutive streaks end at a run boundary (a user message came between); failing calls are remembered.
        self._streaks = {}
        self.repeating_keys = self._carried_keys = _NO_KEYS

    def end_turn(self, turn: ClosedTurn) -> list[Anomaly]:
        fired = self._update_streaks(turn)
        return fired + self._update_failure_runs(turn)

    def container_sizes(self) -> dict[str, int]:
        return {
            "call_streaks": len(self._streaks),
            "call_streak_ids": sum(len(s.call_ids) for s in self._streaks.values()),
            "failure_runs": len(self._failures),
        }

    # ---- a repeat asked for, before it runs (repeat_threshold 1)

    def before_calls(self, turn: int, keys: dict[str, tuple[str, str]]) -> list[Anomaly]:
        """With `repeat_threshold` 1 no call may come again in the next turn: each requested call (by key, with its
        tool and canonical arguments) that the last closed turn made too is reported now, before it runs, under the
        streak its result will then extend (so the firing after it runs is an update, not a second alert)."""
        if self.config.repeat_threshold != 1:
            return []
        firing = [streak for key, streak in self._streaks.items() if key in keys]
        for streak in firing:
            streak.streak = streak.streak or _streak_key([streak])
        self._reported_before = {streak.key for streak in firing}
        return [replace(self._streak_anomaly(turn, [streak]), count=streak.count + 1,
                        message=self._blocked_message(streak)) for streak in firing]

    def _blocked_message(self, streak: _CallStreak) -> str:
        return (f"{describe_call(streak.tool, streak.arguments, self.config.capture_content)} was asked for again "
                f"right after turn {streak.start_turn + streak.count - 1} made it (at most 1 identical call in a row): "
                "the same call again will not help; use the result you have, change the arguments, or try another "
                "approach.")

    # ---- consecutive turns

    def _update_streaks(self, turn: ClosedTurn) -> list[Anomaly]:
        streaks: dict[str, _CallStreak] = {}
        firing: list[_CallStreak] = []
        # A streak's first turn never fires: with a threshold of 1 the second is caught before it runs, and fires
        # again (an update) once it has.
        threshold = max(self.config.repeat_threshold, 2)
        for key, call in turn.calls.items():
            streak = self._streaks.get(key)
            outcome = call.outcome
            if streak is None or streak.outcome != outcome:  # new call, or it made progress
                streak = _CallStreak(call.tool, key, call.arguments, turn.number, turn.seq, 1, outcome,
                                     deque(call.call_ids, self.config.max_call_ids))
            else:
                streak.count += 1
                streak.call_ids.extend(call.call_ids)
                if streak.count >= threshold:
                    firing.append(streak)
            streaks[key] = streak
        self._streaks = streaks  # calls absent from this turn end their streak here
        reported_before, self._reported_before = self._reported_before, _NO_KEYS
        if not firing:
            self.repeating_keys = self._carried_keys = _NO_KEYS
            return []
        self.repeating_keys = {s.key for s in firing}
        # A call failing here whose failures an earlier run of the session reported is that streak going on: its
        # failure run reports it (one key, the count across runs), not a new consecutive streak.
        self._carried_keys = {s.key for s in firing if s.outcome == (ERROR_OUTCOME,)
                              and (run := self._failures.get(s.key)) is not None and run.continued_in(turn.run)}
        if self._carried_keys:
            firing = [s for s in firing if s.key not in self._carried_keys]
        if reported_before:  # reported before they ran, in this turn, with this count: not again
            firing = [s for s in firing if s.key not in reported_before]
        return [self._streak_anomaly(turn.number, group) for group in _group_streaks(firing)]

    def _streak_anomaly(self, turn: int, group: list[_CallStreak]) -> Anomaly:
        group.sort(key=lambda s: (s.tool, s.arguments))
        key = group[0].streak or _streak_key(group)
        for streak in group:
            streak.streak = key
        count = max(s.count for s in group)
        tools = {s.tool for s in group}
        failing = all(s.outcome == (ERROR_OUTCOME,) for s in group)
        content = self.config.capture_content
        if len(group) == 1:
            what = (f"{describe_call(group[0].tool, group[0].arguments, content)} "
                    f"{'failed' if failing else 'returned the same result'}")
        else:
            listed = ", ".join(describe_call(s.tool, s.arguments, content) for s in group)
            what = (f"The same batch of {len(group)} parallel calls ({listed}) "
                    f"{'failed' if failing else 'returned the same results'}")
        advice = ("retrying unchanged will not help: fix the arguments, use another tool, "
                  "or tell the user what is failing." if failing else
                  "no progress is being made: use the results you already have, change the "
                  "arguments, or try another approach.")
        return Anomaly(
            type=REPEATED_CALL,
            turn=turn,
            tool=tools.pop() if len(tools) == 1 else None,
            arguments=group[0].arguments if len(group) == 1 and content else None,
            call_ids=recent_ids([s.call_ids for s in group], self.config.max_call_ids),
            count=count,
            message=f"{what} {count} turns running; {advice}",
            streak=key,
            streak_start=StreakStart(min(s.start_turn for s in group)),
        )

    # ---- the same call failing again and again, other calls between

    def _update_failure_runs(self, turn: ClosedTurn) -> list[Anomaly]:
        if not turn.failed and not self._failures:
            return []  # nothing failed, in this turn or lately
        cfg = self.config
        oldest = turn.seq - cfg.repeat_window + 1
        fired: list[Anomaly] = []
        for key, call in turn.calls.items():
            if call.outcomes != ERROR_ONLY:
                self._failures.pop(key, None)  # it worked (or did something else): no longer failing
                continue
            run = self._failures.pop(key, None)
            if run is not None and _made_progress(run, turn.seq, call.failures):
                run = None  # a new error after other calls (an edit between test runs): a new streak starts here
            if run is None:
                run = _FailureRun(call.tool, call.arguments, cfg.max_call_ids)
            self._failures[key] = run  # most recently failing last
            run.last_failures = call.failures
            run.seqs.append(turn.seq)
            run.turns.append(turn.number)
            run.runs.append(turn.run)
            run.call_ids.extend(call.call_ids)
            while run.seqs and run.seqs[0] < oldest:
                run.seqs.popleft()
                run.turns.popleft()
                run.runs.popleft()
            if len(run.seqs) < max(cfg.repeat_threshold, 2):  # a first failure is no repeat, whatever the threshold
                if len(run.seqs) == 1:
                    run.streak = run.reported_in = None  # the earlier failures left the window: a new streak
                continue
            if key in self.repeating_keys and key not in self._carried_keys:
                # consecutive turns: the streak reports it; remember its key, and that it was reported
                streak = self._streaks.get(key)
                run.streak = streak.streak if streak is not None else run.streak
                run.reported_in = turn.run if run.reported_in is None else run.reported_in
                continue
            if run.streak is None:
                run.streak = f"repeated_call:{call.tool}:{key_id(key)}@t{run.turns[0]}"
            continued = run.continued_in(turn.run)
            if run.reported_in is None:
                run.reported_in = turn.run
            fired.append(self._failure_run_anomaly(turn.number, run, continued))
        for stale in [k for k, r in self._failures.items() if r.seqs[-1] < oldest]:
            del self._failures[stale]
        while len(self._failures) > cfg.max_tools_with_errors * cfg.max_errors_per_tool:
            del self._failures[next(iter(self._failures))]
        return fired

    def _failure_run_anomaly(self, turn: int, run: _FailureRun, continued: bool) -> Anomaly:
        count = len(run.seqs)
        what = describe_call(run.tool, run.arguments, self.config.capture_content)
        return Anomaly(
            type=REPEATED_CALL, turn=turn, tool=run.tool,
            arguments=run.arguments if self.config.capture_content else None,
            call_ids=tuple(run.call_ids)[-self.config.max_call_ids:], count=count,
            message=(f"{what} failed {count} times in the last {self.config.repeat_window} turns ({_where(run)}), with "
                     "other calls between; retrying unchanged will not help: fix the arguments, use another tool, "
                     "or tell the user what is failing."),
            streak=run.streak or f"repeated_call:{run.tool}@t{run.turns[0]}",
            continued=continued,
            streak_start=StreakStart(run.turns[0], run.runs[0]),
        )


def _made_progress(run: _FailureRun, seq: int, failures: list[ObservedCall]) -> bool:
    """Whether a failure after other calls came back with a new error (no digest in common with the last failure's):
    what came between changed something.

    Consecutive failures keep the rule of consecutive turns (the error text does not matter); an unknown error text
    ("" digest, a trace without results) is no evidence of progress.
    """
    return seq - run.seqs[-1] > 1 and not (error_digests(failures) & error_digests(run.last_failures))


def _group_streaks(firing: list[_CallStreak]) -> list[list[_CallStreak]]:
    """Streaks that already fired keep their group; new ones group by the turn they began."""
    groups: dict[str, list[_CallStreak]] = {}
    for streak in firing:
        groups.setdefault(streak.streak or f"start:{streak.start_seq}", []).append(streak)
    return list(groups.values())


def _streak_key(group: list[_CallStreak]) -> str:
    if len(group) == 1:
        only = group[0]
        return f"repeated_call:{only.tool}:{key_id(only.key)}@t{only.start_turn}"
    members = digest("".join(key_id(s.key) for s in group))[:10]
    return f"repeated_call:batch:{members}@t{group[0].start_turn}"


def _where(run: _FailureRun) -> str:
    """The turns of a failure run, or how many runs of the session it spans."""
    if len(set(run.runs)) == 1:
        return "turns " + ", ".join(str(t) for t in run.turns)
    return f"across {len(set(run.runs))} runs of this session"
