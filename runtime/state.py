"""A paused run as plain JSON: everything ``Agent.resume`` needs to finish it, in this process or another, later.

What a state holds: the history (the model's pending tool_use blocks last), what the paused turn's other calls
returned, the calls (or the anomaly) waiting for a person, the budget spent so far (turns, tokens, cost, and the time
the run was running, not waiting), the detector's feed (replayed on resume, so a streak that spans the pause is one
streak), the run's labels and ids (the resumed trace joins its session and links to the paused one).

A state resumes once, per paused run rather than per file: the first resume claims the state's id
(``resume_claims``: a file created atomically in a directory of the user's), so no second process resumes it,
whether through the same file, a symlink, a hard link, a copy or its JSON. Anything wrong with a state (unreadable,
another format version, another agent's, resumed already, a decision for a call that is not pending, a pending call
that is not the call the paused turn would run) is a ``StateError`` raised before anything runs.

A state file is trusted as a script is: resuming it imports the tools file and starts the MCP commands it names, and
it holds the conversation and those command lines (URL credentials included). It is written readable by its owner
only, in a directory created 0700. What it is checked for is consistency, not authorship: each pending call a person
decides must be the call the paused turn holds (same tool, same arguments, by a digest written with the state).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looptrace.instrumentation.detector import Anomaly, LoopCost
from looptrace.instrumentation.interface import redact

from . import resume_claims
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
    resumed: bool = False  # this object was resumed already (its claim says the same across processes)
    path: Path | None = None  # the file it was loaded from, named in messages and in the claim
    claim_file: Path | None = field(default=None, repr=False, compare=False)  # this object's claim, while it holds

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
            "pending": self._pending_with_digests(), "settled": self.settled,
            "pending_anomaly": None if pending_anomaly is None else {
                "anomaly": pending_anomaly.anomaly.to_dict(), "at_end": pending_anomaly.at_end,
                "finish_status": pending_anomaly.finish_status},
            "anomalies": self.anomalies, "nudged": list(self.nudged), "detector_feed": self.detector_feed,
            "app": self.app, "messages": self.messages,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)

    def _pending_with_digests(self) -> list[dict[str, Any]]:
        """The pending calls, each with a digest of the tool call the paused turn holds for it (its whole arguments,
        redacted ones included): what a resume checks the call it runs against."""
        blocks = paused_calls(self.messages)
        entries = []
        for pending in self.pending:
            entry = pending.to_dict()
            block = blocks.get(pending.call_id)
            if block is not None:
                entry[DIGEST_KEY] = call_digest(block)
            entries.append(entry)
        return entries

    @classmethod
    def from_dict(cls, data: object) -> RunState:
        """A state from its JSON data; StateError saying what is wrong with it otherwise."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise StateError("this is not a looptrace run state (no \"format\": \"looptrace-run-state\")")
        if data.get("version") != FORMAT_VERSION:
            raise StateError(f"this run state has format version {data.get('version')!r}, written by looptrace "
                             f"{data.get('looptrace_version') or '?'}; this looptrace reads version {FORMAT_VERSION}")
        try:
            asked = data.get("pending_anomaly")
            state = cls(
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
                state_id=_state_id(data["state_id"]), app=dict(data.get("app") or {}),
                looptrace_version=str(data.get("looptrace_version") or ""),
            )
            digests = {str(p.get("call_id")): p.get(DIGEST_KEY) for p in data.get("pending") or ()}
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise StateError(f"this run state is damaged: {type(exc).__name__}: {exc}") from None
        _check_detector_record(state)
        check_pending(state, digests)
        return state

    @classmethod
    def from_json(cls, text: str | bytes) -> RunState:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise StateError(f"this run state is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    # --- files ------------------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the state to ``path`` (readable by its owner only: it holds the conversation and the command lines of
        its MCP servers), atomically; missing directories are created 0700."""
        target = Path(path)
        _private_parents(target.parent)
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
    def load(cls, path: str | os.PathLike[str], *, claims: Path | None = None) -> RunState:
        """The state in a file; StateError when it cannot be read, is no state, or was resumed already (by a claim in
        ``claims``, the folder ``claim`` writes to, when given: ``Agent.resume`` and `looptrace resume` give theirs,
        so that a resumed state is refused before anything is set up)."""
        source = Path(path)
        state = cls.from_json(_read_state_file(source))
        state.path = source
        try:
            earlier = None if claims is None else resume_claims.claimed(state.state_id, claims)
        except resume_claims.ClaimError as exc:
            raise StateError(f"cannot tell whether run state {source} was resumed: {exc}") from None
        if earlier is None and _legacy_marker_applies(source):
            earlier = f"see {_legacy_marker(source)}"
        if earlier is not None:
            raise StateError(f"run state {source} was resumed already ({earlier}); a paused run resumes once")
        return state

    def claim(self, claims: Path | None = None) -> None:
        """Mark the paused run resumed, before the resumed run does anything: its id is claimed atomically in
        ``claims`` (``Agent.resume`` gives the folder its settings name: XDG_STATE_HOME's; without one,
        ``~/.local/state/looptrace/resumed``), so that of two processes resuming it (through one file, a link, a copy or
        its JSON), one fails."""
        where = self.path if self.path is not None else f"run state {self.state_id[:12]}"
        if self.resumed:
            raise StateError(f"{_named(where)} was resumed already; a paused run resumes once")
        folder = claims if claims is not None else resume_claims.claims_directory(None)
        try:
            self.claim_file = resume_claims.claim(self.state_id, folder, self.path)
        except resume_claims.AlreadyClaimed as exc:
            raise StateError(f"{_named(where)} was resumed already ({exc}); a paused run resumes once") from None
        except resume_claims.ClaimError as exc:
            raise StateError(f"cannot record that {_named(where)} is being resumed: {exc} (set XDG_STATE_HOME to a "
                             "directory of your own); nothing was run") from None
        self.resumed = True

    def release(self) -> None:
        """Take back a ``claim`` whose resume never began: the state can be resumed again."""
        if not self.resumed:
            return
        if self.claim_file is not None and not resume_claims.release(self.claim_file):
            return  # the claim stays: the state reads as resumed, which loses nothing but a retry
        self.claim_file = None
        self.resumed = False


# --- what a state file must be --------------------------------------------------------------------------------------

DIGEST_KEY = "input_sha256"  # beside each pending call: the digest of the tool call it stands for


def paused_calls(messages: list[Any]) -> dict[str, Mapping[str, Any]]:
    """The tool_use blocks of the paused turn (the last message, the model's), by id."""
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, Mapping) and last.get("role") == "assistant" else None
    if not isinstance(content, list):
        return {}
    return {block["id"]: block for block in content
            if isinstance(block, Mapping) and block.get("type") == "tool_use" and isinstance(block.get("id"), str)}


def call_digest(block: Mapping[str, Any]) -> str:
    """SHA-256 of a tool call's name and whole arguments, in canonical JSON."""
    text = json.dumps({"name": block.get("name"), "input": block.get("input")}, sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_pending(state: RunState, digests: Mapping[str, Any]) -> None:
    """StateError unless every pending call is the call the paused turn holds: the same id, the same tool and the same
    arguments (by the digest written with the state; a state without one, from an earlier looptrace, by the redacted
    arguments it shows), and every other call of the turn has its result."""
    blocks = paused_calls(state.messages)
    for pending in state.pending:
        block = blocks.get(pending.call_id)
        if block is None:
            raise StateError(f"this run state is inconsistent: pending call {pending.call_id!r} is not a tool call of "
                             "the paused turn; nothing was run")
        if block.get("name") != pending.tool:
            raise StateError(f"this run state was changed after the pause: pending call {pending.call_id!r} is "
                             f"{pending.tool!r}, but the paused turn would run {block.get('name')!r}; refusing to run "
                             "a call nobody was asked about")
        digest = digests.get(pending.call_id)
        same = digest == call_digest(block) if isinstance(digest, str) else \
            _canonical(redact(block.get("input"))) == _canonical(pending.arguments)
        if not same:
            raise StateError(f"this run state was changed after the pause: the arguments of pending call "
                             f"{pending.call_id!r} ({pending.tool}) are not those it was paused with; refusing to run "
                             "a call nobody was asked about")
    waiting = {p.call_id for p in state.pending}
    for call_id in blocks:
        if call_id not in waiting and call_id not in state.settled and state.pending:
            raise StateError(f"this run state is inconsistent: call {call_id!r} of the paused turn is neither pending "
                             "nor settled; nothing was run")


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _read_state_file(source: Path) -> bytes:
    """The bytes of a state file, at most MAX_STATE_BYTES; a FIFO, a device or a directory is refused without
    waiting on it (opened non-blocking, then looked at)."""
    try:
        descriptor = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise StateError(f"cannot read run state {source}: {exc.strerror or exc}") from None
    with os.fdopen(descriptor, "rb") as handle:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
            raise StateError(f"run state {source} is {what}, not a file `looptrace run` or RunState.save wrote")
        try:
            raw = handle.read(MAX_STATE_BYTES + 1)
        except OSError as exc:
            raise StateError(f"cannot read run state {source}: {exc.strerror or exc}") from None
    if len(raw) > MAX_STATE_BYTES:
        raise StateError(f"{source} is larger than {MAX_STATE_BYTES >> 20} MiB; is it a run state?")
    return raw


def _private_parents(directory: Path) -> None:
    """Create ``directory`` and its missing parents 0700 (``Path.mkdir`` would make the parents 0755)."""
    missing = []
    for parent in [directory, *directory.parents]:
        if os.path.isdir(parent):
            break
        missing.append(parent)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass


def _legacy_marker(path: Path) -> Path:
    return path.with_name(path.name + ".resumed")


def _legacy_marker_applies(path: Path) -> bool:
    """Whether a ``NAME.resumed`` marker, which looptrace 0.3 left beside a resumed state file, speaks for the state
    the file holds now: only when it is no older than the file (a state saved to the path later is another run)."""
    try:
        return os.stat(_legacy_marker(path)).st_mtime_ns >= os.stat(path).st_mtime_ns
    except OSError:
        return False


def _named(where: Path | str) -> str:
    return f"run state {where}" if isinstance(where, Path) else where


def _state_id(value: object) -> str:
    text = _text(value)
    resume_claims.check_state_id(text)
    return text


def _check_detector_record(state: RunState) -> None:
    """StateError unless the detector's record is in the shapes a resumed run replays: each feed entry an object (a
    call, a model call's usage or a turn's end, with their numbers), each anomaly one ``anomaly_from_dict`` reads."""
    try:
        for entry in state.detector_feed:
            if not isinstance(entry, dict):
                raise TypeError(f"a feed entry is {type(entry).__name__}, not an object")
            call, usage = entry.get("call"), entry.get("usage")
            if isinstance(usage, dict):
                int(usage["turn"]), int(usage["input_tokens"]), int(usage["output_tokens"])
            elif isinstance(call, dict):
                int(call["turn"]), _text(call["tool"])
            elif "end_turn" in entry:
                int(entry["end_turn"])
        for anomaly in state.anomalies:
            if not isinstance(anomaly, dict):
                raise TypeError(f"an anomaly is {type(anomaly).__name__}, not an object")
            anomaly_from_dict(anomaly)
            _text(anomaly["streak"])
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise StateError(f"run state {state.state_id[:12]} cannot be resumed: its detector record is damaged "
                         f"({type(exc).__name__}: {exc}); nothing was run") from None


def anomaly_from_dict(data: Mapping[str, Any]) -> Anomaly:
    """An Anomaly from its ``to_dict`` form."""
    return Anomaly(type=data["type"], turn=int(data["turn"]), tool=data.get("tool"), arguments=data.get("arguments"),
                   call_ids=tuple(str(c) for c in data.get("call_ids") or ()), count=int(data["count"]),
                   message=str(data["message"]), streak=str(data["streak"]), first_turn=data.get("first_turn"),
                   continued=bool(data.get("continued")), evidence=data.get("evidence"),
                   cost=LoopCost.from_dict(data.get("cost")))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value
