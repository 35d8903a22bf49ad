"""A paused run as plain JSON: everything ``Agent.resume`` needs to finish it, in this process or another, later.

What a state holds: the history (the model's pending tool_use blocks last), what the paused turn's other calls
returned, the calls (or the anomaly) waiting for a person, the budget spent so far (turns, tokens, cost, and the time
the run was running, not waiting), the detector's feed (replayed on resume, so a streak that spans the pause is one
streak), the run's labels and ids (the resumed trace joins its session and links to the paused one).

A state resumes once: the state object remembers it was resumed, and a state file gets a ``.resumed`` marker beside it,
created atomically, so two processes cannot both resume one file. Anything wrong with a state (unreadable, another
format version, another agent's, resumed already, a decision for a call that is not pending) is a ``StateError``
raised before anything runs.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looptrace.instrumentation.detector import Anomaly, LoopCost

from .approvals import PendingCall

FORMAT = "looptrace-run-state"
FORMAT_VERSION = 1
MAX_STATE_BYTES = 256 << 20  # a state holds a conversation; beyond this, it is the wrong file


class StateError(ValueError):
    """A run state that cannot be resumed, or decisions that do not fit it. Nothing was run."""


@dataclass(frozen=True, slots=True)
class PendingAnomaly:
    """An anomaly whose policy said "ask": the run waits for a person to say go on or stop."""

    anomaly: Anomaly
    at_end: bool  # fired as the model ended the run (go on without a message finishes it with `finish_status`)
    finish_status: str | None = None


@dataclass(slots=True)
class RunState:
    """A paused run (``RunResult.state``). ``to_json``/``save`` write it, ``from_json``/``load`` read it back;
    ``Agent.resume(state, approve=[...], reject={call_id: reason})`` finishes it.

    ``app`` is yours: whatever your application needs to rebuild the agent that resumes it (the CLI keeps its flags
    there). Everything else is looptrace's.
    """

    agent: str
    model: str
    tools: list[str]
    messages: list[dict[str, Any]]
    turns: int
    usage: dict[str, int]
    cost_usd: float | None
    running_s: float  # time the run spent running before the pause; its timeout counts on from here
    trace_id: str
    span_id: str
    session_id: str | None
    user_id: str | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] | None = None
    final_text: str = ""
    stop_reason: str | None = None
    pending: list[PendingCall] = field(default_factory=list)
    settled: dict[str, dict[str, Any]] = field(default_factory=dict)  # call id -> tool_result, the turn's others
    pending_anomaly: PendingAnomaly | None = None
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    nudged: list[str] = field(default_factory=list)
    detector_feed: list[dict[str, Any]] = field(default_factory=list)
    paused_at: float = field(default_factory=time.time)  # wall clock (epoch seconds): another process reads it
    state_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    app: dict[str, Any] = field(default_factory=dict)
    looptrace_version: str = ""
    resumed: bool = False  # this object was resumed already (a file's marker says the same across processes)
    path: Path | None = None  # the file it was loaded from, which gets the `.resumed` marker

    # --- JSON -------------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        pending_anomaly = self.pending_anomaly
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "looptrace_version": self.looptrace_version,
            "state_id": self.state_id, "agent": self.agent, "model": self.model, "tools": list(self.tools),
            "trace_id": self.trace_id, "span_id": self.span_id, "session_id": self.session_id,
            "user_id": self.user_id, "tags": list(self.tags), "metadata": self.metadata,
            "turns": self.turns, "usage": dict(self.usage), "cost_usd": self.cost_usd, "running_s": self.running_s,
            "paused_at": self.paused_at, "final_text": self.final_text, "stop_reason": self.stop_reason,
            "pending": [p.to_dict() for p in self.pending], "settled": self.settled,
            "pending_anomaly": None if pending_anomaly is None else {
                "anomaly": pending_anomaly.anomaly.to_dict(), "at_end": pending_anomaly.at_end,
                "finish_status": pending_anomaly.finish_status},
            "anomalies": self.anomalies, "nudged": list(self.nudged), "detector_feed": self.detector_feed,
            "app": self.app, "messages": self.messages,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)

    @classmethod
    def from_dict(cls, data: Any) -> RunState:
        """A state from its JSON data; StateError saying what is wrong with it otherwise."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise StateError("this is not a looptrace run state (no \"format\": \"looptrace-run-state\")")
        if data.get("version") != FORMAT_VERSION:
            raise StateError(f"this run state has format version {data.get('version')!r}, written by looptrace "
                             f"{data.get('looptrace_version') or '?'}; this looptrace reads version {FORMAT_VERSION}")
        try:
            asked = data.get("pending_anomaly")
            return cls(
                agent=_text(data["agent"]), model=_text(data["model"]), tools=[_text(t) for t in data["tools"]],
                messages=_list(data["messages"]), turns=int(data["turns"]),
                usage={k: int(v) for k, v in dict(data["usage"]).items()},
                cost_usd=None if data.get("cost_usd") is None else float(data["cost_usd"]),
                running_s=float(data["running_s"]), trace_id=_text(data["trace_id"]), span_id=_text(data["span_id"]),
                session_id=data.get("session_id"), user_id=data.get("user_id"), tags=list(data.get("tags") or []),
                metadata=data.get("metadata"), final_text=str(data.get("final_text") or ""),
                stop_reason=data.get("stop_reason"),
                pending=[PendingCall.from_dict(p) for p in _list(data.get("pending") or [])],
                settled={str(k): dict(v) for k, v in dict(data.get("settled") or {}).items()},
                pending_anomaly=None if asked is None else PendingAnomaly(
                    anomaly=anomaly_from_dict(asked["anomaly"]), at_end=bool(asked["at_end"]),
                    finish_status=asked.get("finish_status")),
                anomalies=_list(data.get("anomalies") or []), nudged=[str(s) for s in data.get("nudged") or []],
                detector_feed=_list(data.get("detector_feed") or []), paused_at=float(data["paused_at"]),
                state_id=_text(data["state_id"]), app=dict(data.get("app") or {}),
                looptrace_version=str(data.get("looptrace_version") or ""),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"this run state is damaged: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> RunState:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise StateError(f"this run state is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    # --- files ------------------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the state to ``path`` (readable by its owner only: it holds the conversation), atomically."""
        target = Path(path)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(self.to_json())
            os.replace(temporary, target)
        except BaseException:  # a full disk, an interrupt: no half-written temporary file is left behind
            temporary.unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunState:
        """The state in a file; StateError when it cannot be read, is no state, or was resumed already."""
        source = Path(path)
        try:
            with open(source, "rb") as handle:
                raw = handle.read(MAX_STATE_BYTES + 1)
        except OSError as exc:
            raise StateError(f"cannot read run state {source}: {exc.strerror or exc}") from None
        if len(raw) > MAX_STATE_BYTES:
            raise StateError(f"{source} is larger than {MAX_STATE_BYTES >> 20} MiB; is it a run state?")
        state = cls.from_json(raw)
        state.path = source
        marker = resumed_marker(source)
        if marker.exists():
            raise StateError(f"run state {source} was resumed already ({_marker_text(marker)}); "
                             "a paused run resumes once")
        return state

    def claim(self) -> None:
        """Mark the state resumed, before the resumed run does anything: its file gets the marker, created
        atomically, so that of two processes resuming one file, one fails."""
        if self.resumed:
            raise StateError(f"run state {self.state_id[:12]} was resumed already; a paused run resumes once")
        if self.path is not None:
            marker = resumed_marker(self.path)
            try:
                descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                raise StateError(f"run state {self.path} was resumed already ({_marker_text(marker)}); "
                                 "a paused run resumes once") from None
            except OSError as exc:
                raise StateError(f"cannot mark run state {self.path} as resumed: {exc.strerror or exc}") from None
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(json.dumps({"resumed_at": time.time(), "pid": os.getpid()}) + "\n")
        self.resumed = True


    def release(self) -> None:
        """Take back a ``claim`` whose resume never began: the state can be resumed again."""
        if not self.resumed:
            return
        if self.path is not None:
            try:
                resumed_marker(self.path).unlink()
            except OSError:
                return  # the marker stays: the state reads as resumed, which loses nothing but a retry
        self.resumed = False


def resumed_marker(path: Path) -> Path:
    """The file whose existence says a state file was resumed."""
    return path.with_name(path.name + ".resumed")


def _marker_text(marker: Path) -> str:
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
        return time.strftime("at %Y-%m-%d %H:%M:%S UTC", time.gmtime(float(data["resumed_at"])))
    except (OSError, ValueError, KeyError, TypeError):
        return f"see {marker}"


def anomaly_from_dict(data: Mapping[str, Any]) -> Anomaly:
    """An Anomaly from its ``to_dict`` form."""
    return Anomaly(type=data["type"], turn=int(data["turn"]), tool=data.get("tool"), arguments=data.get("arguments"),
                   call_ids=tuple(str(c) for c in data.get("call_ids") or ()), count=int(data["count"]),
                   message=str(data["message"]), streak=str(data["streak"]), first_turn=data.get("first_turn"),
                   continued=bool(data.get("continued")), evidence=data.get("evidence"),
                   cost=LoopCost.from_dict(data.get("cost")))


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value
