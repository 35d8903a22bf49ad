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


class _Failure:
    """One turn in which a call failed: where, and which failure it was (its group in the call's failure run)."""

    __slots__ = ("calls", "group", "run", "seq", "signatures", "turn")

    def __init__(self, seq: int, turn: int, run: int, calls: list[ObservedCall], group: int) -> None:
        self.seq = seq
        self.turn = turn
        self.run = run  # which run of the session it was in
        self.calls = calls  # its failed calls, until their errors are compared
        self.signatures: set[str] | None = None
        self.group = group

    def digests(self) -> set[str]:
        """What its errors were (`error_digests`), worked out on first use: a failure is compared with the others
        only when the same call fails again after other calls."""
        if self.signatures is None:
            self.signatures = error_digests(self.calls)
            self.calls = []
        return self.signatures


class _Group:
    """The failures of one call that were the same failure: one streak."""

    __slots__ = ("reported_in", "streak")

    def __init__(self) -> None:
        self.streak: str | None = None
        self.reported_in: int | None = None  # the run of the session that first reported this streak (either way)


class _FailureRun:
    """One call's recent failures (within `repeat_window` turns, no success of it between), each in the group of the
    same failure seen before in the run: a failure that comes back after a different one counts with its kind."""

    __slots__ = ("arguments", "call_ids", "failures", "groups", "next_group", "tool")

    def __init__(self, tool: str, arguments: str, max_call_ids: int) -> None:
        self.tool = tool
        self.arguments = arguments
        self.failures: deque[_Failure] = deque()
        self.groups: dict[int, _Group] = {}
        self.next_group = 0
        self.call_ids: deque[str] = deque(maxlen=max_call_ids)

    def add(self, seq: int, turn: int, run: int, calls: list[ObservedCall], oldest: int) -> _Failure:
        """A new failure: the same failure as the one before it when it came in the very next turn (the text does not
        matter there: nothing changed between), else as the most recent earlier one with an error in common (after
        the same `failure_signature`), else a new one."""
        while self.failures and self.failures[0].seq < oldest:
            self.failures.popleft()
        failure = _Failure(seq, turn, run, calls, -1)
        previous = self.failures[-1] if self.failures else None
        if previous is not None and seq - previous.seq == 1:
            failure.group = previous.group
        else:
            mine = failure.digests()
            failure.group = next((f.group for f in reversed(self.failures) if not mine.isdisjoint(f.digests())), -1)
        if failure.group < 0:
            failure.group = self.next_group
            self.next_group += 1
        self.failures.append(failure)
        live = {f.group for f in self.failures}
        self.groups = {g: state for g, state in self.groups.items() if g in live}
        return failure

    def members(self, group: int) -> list[_Failure]:
        return [f for f in self.failures if f.group == group]

    def continued_in(self, run: int) -> bool:
        """Whether the streak of its latest failure was already reported in a run of the session before `run`."""
        state = self.groups.get(self.failures[-1].group) if self.failures else None
        return state is not None and state.reported_in is not None and state.reported_in < run


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
                              and (run := self._failures.get(turn.calls[s.key].failure_key)) is not None
                              and run.continued_in(turn.run)}
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
        counted: set[str] = set()  # `git commit` and `git commit --no-verify` in one turn: one failure of one call
        for key, call in turn.calls.items():
            if call.outcomes != ERROR_ONLY:  # it worked (or did something else): no longer failing
                if self._failures:
                    self._failures.pop(key, None)
                    if call.failure_key != key:
                        self._failures.pop(call.failure_key, None)
                continue
            failure_key = call.failure_key
            if failure_key in counted:
                continue
            counted.add(failure_key)
            run = self._failures.pop(failure_key, None) or _FailureRun(call.tool, call.arguments, cfg.max_call_ids)
            self._failures[failure_key] = run  # most recently failing last
            run.call_ids.extend(call.call_ids)
            failure = run.add(turn.seq, turn.number, turn.run, call.failures, oldest)
            members = run.members(failure.group)
            state = run.groups.setdefault(failure.group, _Group())
            if len(members) < max(cfg.repeat_threshold, 2):  # a first failure is no repeat, whatever the threshold
                if len(members) == 1:
                    state.streak = state.reported_in = None  # the earlier failures left the window: a new streak
                continue
            if key in self.repeating_keys and key not in self._carried_keys:
                # consecutive turns: the streak reports it; remember its key, and that it was reported
                streak = self._streaks.get(key)
                state.streak = streak.streak if streak is not None else state.streak
                state.reported_in = turn.run if state.reported_in is None else state.reported_in
                continue
            if state.streak is None:
                state.streak = f"repeated_call:{call.tool}:{key_id(failure_key)}@t{members[0].turn}"
            continued = state.reported_in is not None and state.reported_in < turn.run
            if state.reported_in is None:
                state.reported_in = turn.run
            fired.append(self._failure_run_anomaly(turn.number, run, members, state, continued))
        for stale in [k for k, r in self._failures.items() if r.failures[-1].seq < oldest]:
            del self._failures[stale]
        while len(self._failures) > cfg.max_tools_with_errors * cfg.max_errors_per_tool:
            del self._failures[next(iter(self._failures))]
        return fired

    def _failure_run_anomaly(self, turn: int, run: _FailureRun, members: list[_Failure], state: _Group,
                             continued: bool) -> Anomaly:
        count = len(members)
        what = describe_call(run.tool, run.arguments, self.config.capture_content)
        return Anomaly(
            type=REPEATED_CALL, turn=turn, tool=run.tool,
            arguments=run.arguments if self.config.capture_content else None,
            call_ids=tuple(run.call_ids)[-self.config.max_call_ids:], count=count,
            message=(f"{what} failed the same way {count} times in the last {self.config.repeat_window} turns "
                     f"({_where(members)}), with other calls between; retrying unchanged will not help: fix the "
                     "arguments, use another tool, or tell the user what is failing."),
            streak=state.streak or f"repeated_call:{run.tool}@t{members[0].turn}",
            continued=continued,
            streak_start=StreakStart(members[0].turn, members[0].run),
        )


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


def _where(members: list[_Failure]) -> str:
    """The turns of a failure streak, or how many runs of the session it spans."""
    runs = {f.run for f in members}
    if len(runs) == 1:
        return "turns " + ", ".join(str(f.turn) for f in members)
    return f"across {len(runs)} runs of this session"
