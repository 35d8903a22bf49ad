"""What an anomaly does to the run: warn (alerts only), nudge (alerts and one corrective message), ask (the run pauses
until a person says go on or stop, see docs/approvals.md), or stop.

``Agent(on_anomaly=...)`` takes one action for every type ("warn", "nudge", "ask", "stop"), a mapping from type to
action (merged over the defaults), or a callable that receives the anomaly and returns an action. The defaults give a
loop one chance: repeated calls and cycles are nudged the first time a streak fires and stopped if the same streak fires
again; a tool that keeps failing is nudged once; an ignored error is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, MutableSet, Sequence
from typing import Final, Literal

from looptrace.instrumentation.detector import Anomaly
from looptrace.instrumentation.interface import Action, ToolTrace, TurnTrace, log

WARN: Final = "warn"
NUDGE: Final = "nudge"
ASK: Final = "ask"  # pause the run: a person says go on (perhaps with a message for the model) or stop
STOP: Final = "stop"
ESCALATE: Final = "escalate"  # nudge the first time a streak fires, stop if it fires again
Rule = Action | Literal["escalate"]  # what a policy may say; ESCALATE becomes NUDGE or STOP per firing
ACTIONS: tuple[Rule, ...] = (WARN, NUDGE, ASK, STOP, ESCALATE)

DEFAULT_ACTIONS: dict[str, Rule] = {
    "repeated_call": ESCALATE,
    "cycle": ESCALATE,
    "failing_tool": NUDGE,
    "ignored_error": WARN,
}

Policy = str | Mapping[str, str] | Callable[[Anomaly], str] | None


class AnomalyPolicy:
    def __init__(self, on_anomaly: Policy = None) -> None:
        self._callable = on_anomaly if callable(on_anomaly) else None
        actions = dict(DEFAULT_ACTIONS)
        if isinstance(on_anomaly, str):
            actions = {kind: _checked(on_anomaly) for kind in DEFAULT_ACTIONS}
            self._fallback = _checked(on_anomaly)
        else:
            self._fallback = WARN
            if isinstance(on_anomaly, Mapping):
                actions.update({kind: _checked(action) for kind, action in on_anomaly.items()})
        self._actions = actions

    def decide(self, anomaly: Anomaly, nudged_before: bool) -> Action:
        """The action for this firing; ``nudged_before`` says whether its streak was already nudged.

        A policy callable that raises or answers nonsense is logged and treated as "warn": a bug in the user's policy
        must not leave a run half-ended.
        """
        try:
            action = self._callable(anomaly) if self._callable else self._actions.get(anomaly.type, self._fallback)
            action = _checked(action)
        except Exception as exc:
            log.warning("anomaly_policy_failed", anomaly_type=anomaly.type, error=f"{type(exc).__name__}: {exc}")
            return WARN
        if action == ESCALATE:
            return STOP if nudged_before else NUDGE
        if action == NUDGE and nudged_before:
            return WARN  # once per streak: a second identical nudge would only add noise to the history
        return action


def nudge_text(anomaly: Anomaly) -> str:
    """The corrective message the model receives, in the user turn after the tool results."""
    return f"[looptrace loop detector] {anomaly.message}"


def reported(anomalies: Sequence[Anomaly], turn: TurnTrace, *, decide: Callable[[Anomaly], Action],
             latest: MutableMapping[str, Anomaly], nudged: MutableSet[str],
             offending: Callable[[set[str]], Sequence[ToolTrace]]) -> Iterator[tuple[Anomaly, Action, str | None]]:
    """A turn's anomalies, each reported once: the reaction an Agent and the guards inside other frameworks share.

    Each anomaly gets its action (``decide``, asked as it comes, so that a nudge given earlier in the turn counts) and
    is kept in ``latest``, one entry per streak. A streak that already alerted is updated there, not reported again,
    unless it now stops the run. Each report goes to ``turn`` (span events, metric, log line, webhook, Langfuse score),
    naming the tool calls ``offending`` finds for the anomaly's call ids; a nudge is marked on the turn and its streak
    added to ``nudged``. Yields each reported anomaly with its action and, for a nudge, the text the model is sent.
    """
    for anomaly in anomalies:
        action = decide(anomaly)
        latest[anomaly.streak] = anomaly
        if anomaly.is_update and action != STOP:
            continue
        turn.report(anomaly, action, offending(set(anomaly.call_ids)))
        nudge = None
        if action == NUDGE:
            nudged.add(anomaly.streak)
            nudge = nudge_text(anomaly)
            turn.nudged(nudge)
        yield anomaly, action, nudge


def _checked(action: object) -> Rule:
    for known in ACTIONS:
        if action == known:
            return known
    raise ValueError(f"unknown anomaly action {action!r}; choose from {', '.join(ACTIONS)}")
