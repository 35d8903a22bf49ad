"""A run's per-turn bookkeeping, the same for looptrace's own `Agent` and for every framework guard.

The loop that drives a run (the Agent's, or LangChain's, the Agents SDK's, Claude Code's through a guard) tells the
monitor what happened: a turn began, the model answered at such a cost, a tool call settled, the turn or the run is
over. The monitor feeds the detector (or, with the detector off, the error ledger alone) and its cost ledger, asks the
policy what each anomaly calls for, reports each anomaly once to the turn's trace (and through it to every sink:
span events, metric, log line, webhook, Langfuse score), ends the call traces after the verdict (so an offending
call's span carries the anomaly), and hands back a `Reaction`: the nudges to show the model, the reason to stop, the
anomalies a person must decide on. What the loop does with a reaction is the loop's own business.

Everything the detector is fed is also kept, in order (``feed``), so that a paused run resumed elsewhere can feed a
new detector the same and carry on its streaks (``replay``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from looptrace.instrumentation.detector import (
    Anomaly,
    DetectorConfig,
    JudgeSummary,
    LoopCost,
    LoopDetector,
    ToolCall,
    ToolErrorFacts,
    TurnUsage,
    UnresolvedToolError,
)
from looptrace.instrumentation.interface import Action, RunTrace, ToolCallView, ToolTrace, TurnTrace, Usage
from looptrace.runtime import policy as policies

__all__ = ["NOTHING", "Reaction", "RunMonitor"]

FeedEntry = dict[str, Any]  # one thing the detector was fed, as JSON data (a call, a model call's usage, a turn's end)


@dataclass(frozen=True, slots=True)
class Reaction:
    """What the loop should do now: nothing, show the model ``nudges``, or end the run (``stop``)."""

    nudges: tuple[str, ...] = ()
    stop: str | None = None  # why the run stops (the anomaly's message), when the policy says stop
    reports: tuple[tuple[Anomaly, Action], ...] = ()  # every anomaly reported, with the action taken
    asks: tuple[Anomaly, ...] = ()  # anomalies the policy wants a person to decide on ("ask")

    @property
    def nudge_text(self) -> str | None:
        """The nudges as one message, or None."""
        return "\n\n".join(self.nudges) if self.nudges else None

    def then(self, later: Reaction) -> Reaction:
        """This reaction and a later one, in order."""
        if later is NOTHING:
            return self
        if self is NOTHING:
            return later
        return Reaction(self.nudges + later.nudges, self.stop or later.stop, self.reports + later.reports,
                        self.asks + later.asks)


NOTHING = Reaction()


class RunMonitor:
    """One run's bookkeeping between the loop and its telemetry (see the module's note)."""

    def __init__(self, trace: RunTrace, policy: policies.AnomalyPolicy, *, detector: LoopDetector | None = None,
                 facts_config: DetectorConfig | None = None, max_loop_cost_usd: float | None = None) -> None:
        self.trace = trace
        self.policy = policy
        self.detector = detector
        # With the detector off, the error ledger alone records the run's unresolved tool errors.
        self.facts = ToolErrorFacts(facts_config) if detector is None else None
        self.max_loop_cost_usd = max_loop_cost_usd
        self.anomalies: dict[str, Anomaly] = {}  # streak -> its latest firing
        self.nudged: set[str] = set()  # streaks already nudged: nudge once, then escalate
        self.feed: list[FeedEntry] = []  # what the detector was fed, for a resumed run's replay
        self.loop_budget_spent = False  # a loop passed max_loop_cost_usd: the stop's status says so
        self.turn: TurnTrace | None = None  # the open turn
        self.turn_index = 0

    # ---- what the loop tells it

    def start_turn(self, index: int) -> TurnTrace:
        """Turn ``index`` begins (its model call is about to be made)."""
        self.turn_index = index
        self.turn = self.trace.start_turn(index)
        return self.turn

    def end_turn(self, stop_reason: str | None) -> None:
        """The open turn is over (its verdict, if any, was given): its trace ends."""
        if self.turn is not None:
            self.turn.end(stop_reason=stop_reason)
            self.turn = None

    def model_called(self, usage: Usage, cost_usd: float | None, *, model: str, started: float,
                     ended: float) -> None:
        """The turn's model call answered: what it used goes to the detector's cost ledger (each anomaly's cost is
        counted from it)."""
        if self.detector is None:
            return
        entry = {"turn": self.turn_index, "input_tokens": usage.all_input_tokens, "output_tokens": usage.output_tokens,
                 "usd": cost_usd, "unpriced": None if cost_usd is not None else f"no price for model {model!r}",
                 "started": started, "ended": ended}
        self.detector.record_usage(self.turn_index, turn_usage(entry))
        self.feed.append({"usage": entry})

    def start_call(self, view: ToolCallView, *, description: str | None = None) -> ToolTrace:
        """A tool call of the open turn begins: its trace, written from the loop's view of it."""
        assert self.turn is not None, "a tool call belongs to a turn"
        return self.turn.start_tool(view, description=description)

    def call_settled(self, view: ToolCallView) -> None:
        """A call of the open turn came back (its view settled): the detector sees it as the model will."""
        watcher = self.detector if self.detector is not None else self.facts
        if watcher is None:
            return
        # Redacted as on the spans (anomaly messages quote arguments); a person's rejection is a decision, not a
        # failure the model could leave unresolved, so the detector sees it as an answer.
        watcher.observe(ToolCall(turn=self.turn_index, tool=view.name, arguments=view.arguments,
                                 call_id=view.call_id, is_error=view.failed, result=view.result,
                                 result_digest=view.result_digest, canonical_arguments=view.canonical))
        self.feed.append({"call": {"turn": self.turn_index, "tool": view.name, "arguments": view.arguments,
                                   "call_id": view.call_id, "is_error": view.failed, "result": view.result}})

    # ---- verdicts

    def before_calls(self, asked: Sequence[tuple[str, Any]], *, turns_left: bool = True) -> Reaction:
        """The strictest setting (``repeat_threshold=1``): the calls the model asks for, as (tool, arguments), judged
        before they run, so that a stop stops the repeat before it is made."""
        detector = self.detector
        if detector is None or detector.config.repeat_threshold != 1:
            return NOTHING
        calls = [ToolCall(turn=self.turn_index, tool=tool, arguments=arguments) for tool, arguments in asked]
        return self._react(self._checked(detector.before_calls, self.turn_index, calls), (), turns_left)

    def judge_turn(self, text: str | None = None, calls: Sequence[ToolTrace] = (), *,
                   turns_left: bool = True) -> Reaction:
        """The turn's calls are all back (``text``: what the model wrote beside them, which may already report a
        failure): the turn's verdict, then the calls' traces end, carrying any anomaly they are part of."""
        reaction = NOTHING
        if self.detector is not None:
            self.feed.append({"end_turn": self.turn_index, "text": text})
            found = self._checked(self.detector.end_turn, self.turn_index, *(() if text is None else (text,)))
            reaction = self._react(found, calls, turns_left)
        for call in calls:
            call.end()
        return reaction

    def judge_run(self, stop_reason: str | None, final_text: str | None, *, turns_left: bool = True) -> Reaction:
        """The model says it is finished: the moment to look for errors it never dealt with."""
        if self.detector is None:
            return NOTHING
        found = self._checked(self.detector.end_run, stop_reason, final_text, self.turn_index)
        return self._react(found, (), turns_left)

    def finish(self, *, status: str, turns: int, usage: Usage, cost_usd: float | None, final_text: str | None,
               error: str | None = None, error_type: str | None = None,
               unresolved_errors: Sequence[UnresolvedToolError] | None = None, session_id: str | None = None,
               in_session: bool = True) -> None:
        """The run is over: its trace ends with its totals, the errors it left standing (``unresolved_errors``, when
        the caller has them already) and what its loops cost (in its session too, ``in_session``). ``session_id``:
        the session a run that had none joins as it ends (a paused run: the run that resumes it continues there)."""
        detector = self.detector
        self.trace.end(status=status, turns=turns, usage=usage, cost_usd=cost_usd, anomalies=len(self.anomalies),
                       final_text=final_text, error=error, error_type=error_type,
                       unresolved_errors=self.unresolved_errors() if unresolved_errors is None else unresolved_errors,
                       session_id=session_id, loop_cost=self.loop_cost,
                       session_loop_cost=detector.session_loop_cost if detector is not None and in_session else None,
                       loop_cost_by_type=detector.loop_cost_by_type if detector is not None else None)

    # ---- what it knows

    def unresolved_errors(self) -> list[UnresolvedToolError]:
        """The tool errors standing now, from the detector's ledger (or the ledger alone)."""
        watcher = self.detector if self.detector is not None else self.facts
        return watcher.unresolved_errors() if watcher is not None else []

    @property
    def loop_cost(self) -> LoopCost | None:
        return self.detector.loop_cost if self.detector is not None else None

    @property
    def session_loop_cost(self) -> LoopCost | None:
        return self.detector.session_loop_cost if self.detector is not None else None

    @property
    def judge_summary(self) -> JudgeSummary:
        return self.detector.judge_summary if self.detector is not None else JudgeSummary()

    def replay(self, feed: Iterable[Mapping[str, Any]]) -> None:
        """Feed the detector (or the error ledger) what a paused run's saw, in order: its streaks, cycles and standing
        errors continue. What the replay fires was reported before the pause, and is not reported again. Raises
        KeyError, TypeError or ValueError for an entry that is not what ``feed`` keeps."""
        watcher = self.detector if self.detector is not None else self.facts
        for entry in feed:
            if not isinstance(entry, Mapping):
                raise TypeError(f"a detector feed entry is an object, not {type(entry).__name__}")
            call, usage = entry.get("call"), entry.get("usage")
            if isinstance(usage, Mapping):
                if self.detector is not None:
                    self.detector.record_usage(int(usage["turn"]), turn_usage(usage))
            elif isinstance(call, Mapping) and watcher is not None:
                watcher.observe(ToolCall(turn=int(call["turn"]), tool=str(call["tool"]),
                                         arguments=call.get("arguments"), call_id=call.get("call_id"),
                                         is_error=bool(call.get("is_error")), result=call.get("result")))
            elif "end_turn" in entry and self.detector is not None:
                text = entry.get("text")
                self.detector.end_turn(int(entry["end_turn"]), *(() if text is None else (str(text),)))
            self.feed.append(dict(entry))

    # ---- the reaction, shared by the Agent and the guards

    def _checked(self, check: Callable[..., list[Anomaly]], *args: Any) -> list[Anomaly]:
        """A detector check, made with the turn current: a judge it asks opens its span under the turn. Without a
        judge nothing opens a span, so the check runs as it is (making the turn current costs a context switch)."""
        assert self.detector is not None
        if self.detector.config.judge is None or self.turn is None:
            return check(*args)
        with self.turn.activate():
            return check(*args)

    def _react(self, found: list[Anomaly], calls: Sequence[ToolTrace], turns_left: bool) -> Reaction:
        """Each anomaly decided by the policy and reported once (``policy.reported``)."""
        if not found:  # the usual turn
            return NOTHING
        turn = self.turn
        assert turn is not None, "anomalies are found in a turn"
        nudges: list[str] = []
        reports: list[tuple[Anomaly, Action]] = []
        asks: list[Anomaly] = []
        stop: str | None = None
        for anomaly, action, nudge in policies.reported(
                found, turn, decide=lambda anomaly: self._decide(anomaly, turns_left), latest=self.anomalies,
                nudged=self.nudged, offending=lambda ids: [c for c in calls if c.view.call_id in ids]):
            reports.append((anomaly, action))
            if nudge is not None:
                nudges.append(nudge)
            elif action == policies.STOP:
                stop = stop or anomaly.message
            elif action == policies.ASK:
                asks.append(anomaly)
        return Reaction(tuple(nudges), stop, tuple(reports), tuple(asks))

    def _decide(self, anomaly: Anomaly, turns_left: bool) -> Action:
        action = self.policy.decide(anomaly, anomaly.streak in self.nudged)
        if action == policies.NUDGE and not turns_left:
            action = policies.WARN  # a nudge the model will never read would only turn `done` into max_turns
        budget, cost = self.max_loop_cost_usd, anomaly.cost
        if budget is not None and cost is not None and cost.usd is not None and cost.usd > budget:
            action = policies.STOP  # the loop's budget is spent: whatever the policy said
            self.loop_budget_spent = True
        return action


def turn_usage(entry: Mapping[str, Any]) -> TurnUsage:
    """A model call's usage as the detector takes it, from the entry the feed keeps."""
    return TurnUsage(input_tokens=int(entry["input_tokens"]), output_tokens=int(entry["output_tokens"]),
                     usd=entry.get("usd"), unpriced=entry.get("unpriced"), started=entry.get("started"),
                     ended=entry.get("ended"))
