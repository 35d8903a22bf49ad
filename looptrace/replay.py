"""Replay a stored run offline through the current loop: would today's detector, policy and limits catch it?

A run recorded with content holds every model response and every tool result (``recorded_run.rebuild_run`` reads
them back). ``replay`` sends the recorded responses to an ``Agent`` as a ``ScriptedModel``, answers its tool calls
with the recorded results (or with your tools, to see what they return now), and reports the anomalies the current
detector finds, at which turns, how the run ends under the current policy and limits, and how that differs from the
anomalies the live run reported::

    from looptrace.replay import rebuild_run, replay

    recorded = rebuild_run(spans_of_one_trace)
    replayed = replay(recorded, on_anomaly="stop")
    replayed.result.status, replayed.stop_turn, replayed.diff.new

The recorded responses do not change with the run: whatever the replay sends the model (a nudge, a different tool
result) the next response is the recorded one. So a replay answers questions about the loop's side (the detector's
thresholds, the policy, the limits, what the tools return), not about what the model would say to something new. A
replay that needs a response or a tool result the recording does not have stops there, as an error, and says where
(``past_recording_turn``).

Nothing a replay does leaves the process: its Agent records no spans and sends no alerts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from looptrace.instrumentation import Settings
from looptrace.instrumentation.detector import DetectorConfig
from looptrace.instrumentation.offline import (
    ContentNotRecorded,
    IncompleteRecording,
    NotReplayable,
    RecordedAnomaly,
    RecordedCall,
    RecordedModelError,
    RecordedRun,
    rebuild_run,
    reported_anomalies,
    runs_in,
)
from looptrace.runtime import AnomalyDetected, Event, Limits, RunResult, Tool, ToolError, TurnStarted

__all__ = [
    "LOOP_TYPES",
    "AnomalyDiff",
    "ContentNotRecorded",
    "Finding",
    "IncompleteRecording",
    "NotReplayable",
    "PastTheRecording",
    "RecordedAnomaly",
    "RecordedCall",
    "RecordedModelError",
    "RecordedModelFailure",
    "RecordedRun",
    "Replay",
    "ReplayedAnomaly",
    "findings",
    "rebuild_run",
    "recorded_tools",
    "replay",
    "replay_limits",
    "reported_anomalies",
    "runs_in",
    "tools_from_file",
]

LOOP_TYPES = ("repeated_call", "cycle")  # the anomalies that say the agent went round in circles


class PastTheRecording(Exception):
    """The replay asked for a model response or a tool result the recording does not have."""


class RecordedModelFailure(Exception):
    """A model call that failed in the recording, failed again at the same turn of the replay."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayedAnomaly:
    """An anomaly the replay reported, with what the policy did about it."""

    turn: int
    type: str
    tool: str | None
    count: int
    action: str
    message: str
    streak: str = ""  # the same for every report of one streak (``Anomaly.streak``)

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "type": self.type, "tool": self.tool, "count": self.count, "action": self.action,
                "message": self.message}


@dataclasses.dataclass(frozen=True, slots=True)
class AnomalyDiff:
    """The replayed anomalies against the recorded ones, matched by type, turn and tool."""

    same: list[tuple[RecordedAnomaly, ReplayedAnomaly]]
    gone: list[RecordedAnomaly]  # recorded, not found by the replay
    new: list[ReplayedAnomaly]  # found by the replay, not recorded

    @property
    def changed(self) -> bool:
        return bool(self.gone or self.new)

    def to_dict(self) -> dict[str, Any]:
        return {"same": [replayed.to_dict() for _, replayed in self.same], "gone": [a.to_dict() for a in self.gone],
                "new": [a.to_dict() for a in self.new]}


@dataclasses.dataclass(frozen=True, slots=True)
class Replay:
    """One replayed run: the recording, the result of running it again, and what changed."""

    recorded: RecordedRun
    result: RunResult
    anomalies: list[ReplayedAnomaly]  # every report, in order (as the recorded ones are: one per alert or stop)
    diff: AnomalyDiff
    past_recording_turn: int | None  # the turn that needed a response or result the recording does not have
    own_tools: bool  # the user's tools answered the calls, not the recorded results
    notes: tuple[str, ...]

    @property
    def stop_turn(self) -> int | None:
        """The turn where ``on_anomaly="stop"`` would have stopped the run: its first reported anomaly. Until then
        the policy changes nothing the recording can show (a nudge is text the recorded responses never read)."""
        return self.anomalies[0].turn if self.anomalies else None

    def to_dict(self) -> dict[str, Any]:
        recorded = self.recorded
        return {
            "trace_id": recorded.trace_id, "agent": recorded.agent, "model": recorded.model,
            "recorded": {"status": recorded.status, "turns": recorded.turns,
                         "anomalies": [a.to_dict() for a in recorded.anomalies]},
            "replayed": {"status": self.result.status.value, "turns": self.result.turns, "error": self.result.error,
                         "anomalies": [a.to_dict() for a in self.anomalies]},
            "stop_turn": self.stop_turn, "past_recording_turn": self.past_recording_turn,
            "tools": "yours" if self.own_tools else "recorded", "diff": self.diff.to_dict(),
            "notes": list(self.notes),
        }


def replay(recorded: RecordedRun, *, tools: Sequence[Tool] | None = None, limits: Limits | None = None,
           on_anomaly: Any = None, detector: DetectorConfig | None = None,
           settings: Settings | None = None) -> Replay:
    """Run ``recorded`` again through the current loop, offline.

    ``tools`` replace the recorded results with calls to your tools (given the recorded arguments, secrets as the
    spans hold them: redacted). ``limits`` default to ``replay_limits(recorded)``; ``on_anomaly`` and ``detector``
    are the Agent's own options (its defaults when None). Raises ``IncompleteRecording`` when a result the recorded
    tools would need was not recorded.
    """
    from looptrace.instrumentation import Alerts
    from looptrace.runtime import Agent, ScriptedModel

    tracker = _Tracker()
    own_tools = tools is not None
    if tools is None:
        recorded.require_results()
        tools = recorded_tools(recorded.tool_definitions, recorded.calls, on_missing=tracker.went_past)
    agent = Agent(
        recorded.model or "replay", tools=tools, system=recorded.system, name=recorded.agent,
        limits=replay_limits(recorded) if limits is None else limits,
        max_tokens=recorded.max_tokens or 4096, client=ScriptedModel(_script(recorded, tracker)),
        on_event=tracker, on_anomaly=on_anomaly, detector=detector if detector is not None else True,
        # Offline and silent: no spans, no log line, webhook or score; anomaly texts quote arguments as recorded.
        telemetry=False, alerts=Alerts(log_warnings=False), capture_content=True,
        settings=settings if settings is not None else Settings(),
    )
    with _past_the_recording_unlogged():
        result = agent.run(recorded.task, session_id=None)
    notes = list(recorded.notes)
    if recorded.status == "timeout":
        notes.append("the recorded run ended on its wall-clock limit, which a replay (it never waits) cannot reach")
    if own_tools and recorded.tool_definitions:
        recorded_names = {d["name"] for d in recorded.tool_definitions}
        missing = sorted(recorded_names - {t.name for t in tools})
        if missing:
            notes.append(f"the run had tools the replay was not given: {', '.join(missing)} (calls to them fail "
                         f"as unknown tools)")
    return Replay(recorded=recorded, result=result, anomalies=tracker.anomalies,
                  diff=compare(recorded.anomalies, tracker.anomalies), past_recording_turn=tracker.past_turn,
                  own_tools=own_tools, notes=tuple(notes))


class _PastTheRecordingIsNoFailure(logging.Filter):
    """Drops the loop's ``model_call_failed`` warning for a replay that went past its recording: no call failed, and
    the replay's outcome (``Replay.past_recording_turn``) says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "looptrace", None)
        return not (isinstance(fields, dict) and fields.get("event") == "model_call_failed"
                    and str(fields.get("error", "")).startswith(PastTheRecording.__name__))


@contextlib.contextmanager
def _past_the_recording_unlogged() -> Iterator[None]:
    from looptrace.instrumentation import logger

    quiet = _PastTheRecordingIsNoFailure()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def replay_limits(recorded: RecordedRun) -> Limits:
    """The limits a replay runs under unless told otherwise: the limit the recorded run ended on, so that it ends
    there again (its turns, its total tokens, its cost), and no other. A wall-clock limit cannot be replayed."""
    status = recorded.status
    return Limits(
        max_turns=recorded.turns if status == "max_turns" else None,
        max_total_tokens=recorded.total_tokens if status == "token_budget" and recorded.total_tokens else None,
        max_cost_usd=recorded.cost_usd if status == "cost_budget" and recorded.cost_usd else None,
        timeout_s=None,
        tool_timeout_s=None,
    )


def compare(recorded: Iterable[RecordedAnomaly], replayed: Iterable[ReplayedAnomaly]) -> AnomalyDiff:
    """Recorded and replayed anomalies matched by (type, turn, tool), each used once, in order."""
    left: list[RecordedAnomaly] = list(recorded)
    same, new = [], []
    for anomaly in replayed:
        match = next((r for r in left if (r.type, r.turn, r.tool) == (anomaly.type, anomaly.turn, anomaly.tool)), None)
        if match is None:
            new.append(anomaly)
        else:
            left.remove(match)
            same.append((match, anomaly))
    return AnomalyDiff(same=same, gone=left, new=new)


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One streak the detector flagged, where it first fired: what a threshold change moves, adds or removes."""

    type: str
    tool: str | None
    turn: int

    def __str__(self) -> str:
        return f"{self.type}{' ' + self.tool if self.tool else ''} @{self.turn}"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "tool": self.tool, "turn": self.turn}


def findings(anomalies: Iterable[Any]) -> list[Finding]:
    """The first report of each streak among ``anomalies`` (recorded, replayed, or the detector's own ``Anomaly``
    values, whose ``first_turn`` says where their streak first fired), in order."""
    seen: set[str] = set()
    found = []
    for anomaly in anomalies:
        streak = getattr(anomaly, "streak", "")
        if streak and streak in seen:
            continue
        seen.add(streak)
        turn = getattr(anomaly, "first_turn", None) or anomaly.turn
        found.append(Finding(type=anomaly.type, tool=anomaly.tool, turn=turn))
    return found


def recorded_tools(definitions: Iterable[Mapping[str, Any]], calls: Iterable[RecordedCall | Mapping[str, Any]], *,
                   on_missing: Callable[[str], None] | None = None) -> list[Tool]:
    """Tools that answer each call with the recorded result, per tool in the order it was called (the recorded
    responses ask for them in that order again). An error result comes back as an error, with its recorded text.

    ``definitions`` are Messages API tools (name, description, input_schema); ``calls`` are ``RecordedCall`` values
    or mappings with ``tool``, ``result`` and ``is_error``, in the order the model asked for them. A call with no
    result left (the replay went past the recording) fails, after telling ``on_missing`` the tool's name.
    """
    names = [str(d["name"]) for d in definitions]
    queues: dict[str, deque[tuple[str | None, bool]]] = {name: deque() for name in names}
    for call in calls:
        tool, arguments, result, is_error = _call_fields(call)
        # A call the loop answers itself (an unknown tool, arguments that are not an object) never reaches a tool.
        if tool in queues and isinstance(arguments, Mapping):
            queues[tool].append((result, is_error))
    return [Tool(name=str(d["name"]), description=str(d.get("description") or d["name"]),
                 input_schema=dict(d.get("input_schema") or {"type": "object", "properties": {}}),
                 fn=_player(str(d["name"]), queues[str(d["name"])], on_missing))
            for d in definitions]


def tools_from_file(path: str | Path) -> list[Tool]:
    """Every ``@tool`` a Python file defines, in the order it defines them (what ``looptrace run --tools`` offers)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"looptrace_tools_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not found:
        raise ImportError(f"{path} defines no @tool functions")
    return found


# --- the pieces ---------------------------------------------------------------------------------------------------


class _Tracker:
    """The replay's observer: the reported anomalies, the current turn, and where the recording ran out."""

    def __init__(self) -> None:
        self.anomalies: list[ReplayedAnomaly] = []
        self.turn = 0
        self.past_turn: int | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, TurnStarted):
            self.turn = event.turn
        elif isinstance(event, AnomalyDetected):
            a = event.anomaly
            self.anomalies.append(ReplayedAnomaly(turn=a.turn, type=a.type, tool=a.tool, count=a.count,
                                                  action=event.action, message=a.message, streak=a.streak))

    def went_past(self, what: str = "") -> None:
        if self.past_turn is None:
            self.past_turn = self.turn


def _script(recorded: RecordedRun, tracker: _Tracker) -> list[Any]:
    """The scripted model's items: each recorded response (or failure), then a call that says the recording ended."""
    items: list[Any] = [RecordedModelFailure(r.error) if isinstance(r, RecordedModelError) else r
                        for r in recorded.responses]

    def beyond(params: dict[str, Any]) -> dict[str, Any]:
        tracker.went_past()
        raise PastTheRecording(f"the recording ends at turn {len(recorded.responses)}; the replay asked for a "
                               f"response to turn {tracker.turn}")

    return [*items, beyond]


def _call_fields(call: RecordedCall | Mapping[str, Any]) -> tuple[str, Any, str | None, bool]:
    if isinstance(call, RecordedCall):
        return call.tool, call.arguments, call.result, call.is_error
    return (str(call.get("tool", "")), call.get("arguments", {}), call.get("result"), bool(call.get("is_error")))


def _player(name: str, queue: deque[tuple[str | None, bool]],
            on_missing: Callable[[str], None] | None) -> Callable[..., str]:
    def play(**arguments: Any) -> str:
        result, is_error = queue.popleft() if queue else (None, False)
        if result is None:
            if on_missing is not None:
                on_missing(name)
            raise ToolError(f"(replay: no result of {name} was recorded for this call; the recording ends before it)")
        if is_error:
            raise ToolError(result)  # the loop sends a ToolError's text as it is, marked is_error
        return result

    play.__name__ = name
    return play
