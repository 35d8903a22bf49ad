"""Loop-anomaly detection for agent runs. Pure: standard library only.

The same code runs live inside the agent loop, in a span processor watching someone else's
agent, and offline over stored traces (`looptrace detect`). It is fed one tool call at a time
(with its result), told when each turn ends and when the run ends, and returns anomalies.

Feeding protocol
----------------
    detector = LoopDetector()
    for each turn:            detector.observe(ToolCall(...)) for every tool call, then
                              detector.end_turn(turn)          (also for a turn with no tool calls)
    at the end:               detector.end_run(stop_reason, final_text, turn)

Every pattern is evaluated when a turn closes, so `observe` returns [] except when a call of a
*new* turn number arrives while calls of an older turn are still open: that older turn is then
closed implicitly (feeds without `end_turn`, e.g. spans from another framework) and its
anomalies are returned by `observe`. `end_turn(t)` closes the open calls as turn `t`; a repeated
`end_turn` for the turn just closed is ignored. `end_run` closes any open turn first.

"Consecutive turns" means consecutive in the order the detector was shown them, not in turn
numbering: offline data with gaps in numbering still forms streaks, and a turn explicitly
closed without tool calls breaks every streak.

Identity of a call
------------------
`canonical_arguments`: object keys sorted at every depth; integral floats become ints
(10 == 10.0, -0.0 == 0) but strings stay strings ("10" != 10) and bools stay bools
(True != 1); tool_use ids are not part of it. A top-level `str` argument is parsed as JSON
text if it parses (so a trace reader may pass the stored attribute verbatim), otherwise the
raw text is the identity. Nested strings are never parsed.

The outcome of a call is its result digest (`result_digest`, blake2b-64 over the UTF-8 text,
"" for None) for a success, or the single flag "error" for a failure: error
*texts* are ignored, because a failing call that fails with a new message each time (a
timestamp, a request id) is still not making progress. When neither result nor digest is
known (another framework's spans without content), results count as unchanged by default, so
the detector degrades to "same call again" like its peers (`assume_unknown_results_unchanged`).

Rules (thresholds are `DetectorConfig` fields)
----------------------------------------------
repeated_call   The same canonical call in `repeat_threshold` (3) consecutive turns with no
                progress: every turn's outcome equals the previous one (same digest), or is an
                error each time (texts may differ). Calls are counted once per turn, so the same
                call three times inside ONE turn is not a loop. The streak ends at the first
                turn without the call or with a changed outcome (a changed outcome starts a new
                streak at 1): polling a job whose status moves on is not a loop.
                Parallel batches: calls whose streaks started in the same turn and fire together
                are one anomaly (tool/arguments None when they differ, the calls listed in the
                message), so the same batch of parallel calls three turns running fires once, at
                turn 3, and keeps its key if only some of its calls go on. The order of parallel
                calls never matters. A streak keeps firing on every further turn (count 4, 5,
                ...) with the same `streak` key, so a policy can nudge at 3 and stop at 4.
cycle           The sequence of turn signatures (the multiset of canonical call + outcome of
                every call in the turn: order-free, duplicates counted)
                repeats with a period of `cycle_min_period`..`cycle_max_period` (2..5) for
                `cycle_repeats` (3) rounds: A B A B A B fires at the 6th turn, A B C x3 at the
                9th. Only primitive periods count (A A A A A A is period 1: repeated_call's job;
                period 4 that is really period 2 is reported as 2). Turns without tool calls
                never take part. Once found, the cycle keeps firing at every further full round
                (count 4, 5, ...) and ends at the first turn that breaks the period.
                Overlaps, on purpose: a call present in every turn of a cycle is also a
                repeated_call, and failing_tool may fire before a cycle of failures is
                complete; each is its own streak.
ignored_error   At `end_run` with a stop reason in `ignored_error_stop_reasons` ("end_turn" and
                its normalised GenAI form "stop"): some tool error was never resolved by a
                success of the same tool (any arguments) observed after it, and the final text
                does not acknowledge a failure (`acknowledges_failure`). "After" is observation
                order: a parallel success observed before the failure in the same turn does not
                resolve it. Fires once per run; `count` is every unresolved error, the message
                quotes the 5 most recent. Other stop reasons (max_tokens, refusal, limits) are
                already failures with their own status, so they do not fire.
failing_tool    One tool fails on every call in `failing_tool_threshold` (5) consecutive turns
                *with varying arguments* (0 disables). This is deliberately not an
                "error_retry" rule: identical failing retries right after an error are already
                repeated_call (outcome "error" each time). failing_tool catches what no other
                rule does: the model rephrasing calls to a tool that is itself broken (expired
                credentials, a service down). It stays quiet in a turn where repeated_call
                already covers all of that tool's calls, or while a cycle is active.

Acknowledgement check (`acknowledges_failure`)
----------------------------------------------
The final text is NFKC-normalised (full-width digits become ASCII) and case-folded; obvious
negated mentions are removed first ("no errors", "without errors", "error-free", "did not
fail", "never failed", エラーなく, エラーはありません, エラーは発生しませんでした, 失敗なし ...),
then any failure phrase counts: English "fail/failed/failure", "unsuccessful", "couldn't/could
not", "can't/cannot", "unable", "not able to", "did not work/succeed", "not possible",
"impossible", "error(s)", "unavailable", "out of stock", "sold out", "unfortunately", "went
wrong", "denied/rejected/refused"; Japanese 失敗, できません/できなかった/できず, エラー,
在庫が0/在庫切れ/在庫がありません, 不可能, 見つかりません, 残念ながら, 問題が発生, うまくいきません,
未完了, 中断. All lists live in `FAILURE_PHRASES` and `NEGATED_FAILURE_PHRASES` below.
Known limits: any failure wording acknowledges every unresolved error (no per-tool
attribution); unrelated uses count ("error handling", "you cannot cancel it",
キャンセルはできません), which can hide an ignored error; negations beyond the listed phrases ("not
a single error", エラーは見当たりません) count as acknowledgement; apologies alone ("sorry",
申し訳ありません) do not; other languages are not covered; only the first and last
20,000 characters of a huge final text are read.

Cost and memory
---------------
Per call: canonicalise and digest the call (linear in its own size). Per turn: work bounded by
the calls in that turn (capped at `max_calls_per_turn`) plus a fixed (period x rounds) window of
turn-signature digests. State: streaks of the last turn only, the 15-turn window, unresolved
errors capped per tool and in tools, call ids capped per streak, the most recent
`max_kept_anomalies` anomalies. A 10,000-turn run costs the same per call as a 10-turn one.

The public methods never raise: a detector bug must not take down the agent it watches. An
internal failure is counted in `internal_errors` and the call returns [].

Compared with peers (from their sources): gemini-cli fires after 5 identical consecutive tool
calls keyed on the arguments' JSON text as sent (so key order matters) and never looks at
results; OpenHands' stuck detector compares recent action/observation pairs (4 repeats, 3 for
errors, a 6-step alternation) in the events since the last user message. Neither normalises
arguments, lets changing results count as progress, groups parallel batches, finds periods
above 2, nor checks whether the final answer admits a failure.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import unicodedata
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CYCLE",
    "FAILING_TOOL",
    "IGNORED_ERROR",
    "REPEATED_CALL",
    "Anomaly",
    "DetectorConfig",
    "LoopDetector",
    "ToolCall",
    "acknowledges_failure",
    "canonical_arguments",
    "result_digest",
]

REPEATED_CALL = "repeated_call"
CYCLE = "cycle"
IGNORED_ERROR = "ignored_error"
FAILING_TOOL = "failing_tool"


# --------------------------------------------------------------------------- public data


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call with its outcome, as the detector sees it."""

    turn: int  # 1-based turn (model call) that requested it
    tool: str
    arguments: Any  # parsed JSON value, or the raw string when it did not parse
    call_id: str | None = None
    is_error: bool = False
    result: str | None = None  # the result text, if known
    result_digest: str | None = None  # used when result is None (offline, content capture off)


@dataclass(frozen=True, slots=True)
class Anomaly:
    type: str  # "repeated_call" | "cycle" | "ignored_error" | "failing_tool"
    turn: int  # 1-based turn where it fired
    tool: str | None
    arguments: str | None  # canonical arguments; None for a multi-call pattern (see message)
    call_ids: tuple[str, ...]  # tool_use ids involved (most recent, capped)
    count: int  # repetitions, cycle rounds, failing turns or unresolved errors
    message: str  # what happened and what to try
    streak: str  # same for every firing of one streak or pattern

    def to_dict(self) -> dict:
        return {
            "type": self.type,
            "turn": self.turn,
            "tool": self.tool,
            "arguments": self.arguments,
            "call_ids": list(self.call_ids),
            "count": self.count,
            "message": self.message,
            "streak": self.streak,
        }


@dataclass(frozen=True)
class DetectorConfig:
    repeat_threshold: int = 3
    cycle_min_period: int = 2
    cycle_max_period: int = 5
    cycle_repeats: int = 3
    failing_tool_threshold: int = 5  # 0 turns the rule off
    ignored_error_stop_reasons: tuple[str, ...] = ("end_turn", "stop")
    assume_unknown_results_unchanged: bool = True
    max_calls_per_turn: int = 128  # further calls in one turn only count towards its signature
    max_tools_with_errors: int = 64  # unresolved errors are tracked for at most this many tools
    max_errors_per_tool: int = 5  # ... and this many errors each (the most recent)
    max_call_ids: int = 20  # call ids kept per streak and reported per anomaly
    max_argument_chars: int = 500  # canonical arguments longer than this are cut in anomalies
    max_kept_anomalies: int = 1000  # `LoopDetector.anomalies` keeps the most recent ones

    def __post_init__(self) -> None:
        _require(self.repeat_threshold >= 2, "repeat_threshold must be at least 2")
        _require(
            2 <= self.cycle_min_period <= self.cycle_max_period,
            "need 2 <= cycle_min_period <= cycle_max_period (period 1 is repeated_call's job)",
        )
        _require(self.cycle_repeats >= 2, "cycle_repeats must be at least 2")
        _require(self.failing_tool_threshold >= 0, "failing_tool_threshold must be >= 0 (0 = off)")
        for name in ("max_calls_per_turn", "max_tools_with_errors", "max_errors_per_tool",
                     "max_call_ids", "max_argument_chars", "max_kept_anomalies"):
            _require(getattr(self, name) >= 1, f"{name} must be at least 1")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"DetectorConfig: {message}")


# --------------------------------------------------------------------------- call identity


_MAX_DEPTH = 64  # deeper structures are cut: json would recurse past Python's limit
_MAX_INT_BITS = 13_000  # ints longer than ~4,000 digits cannot go through str() in Python 3.11+


def canonical_arguments(args: Any) -> str:
    """Compact JSON of `args` with keys sorted and numbers normalised; raw text if not JSON."""
    if isinstance(args, str):
        return _canonical_text(args)
    try:
        return _compact_json(_normalise(args, 0))
    except Exception:  # exotic objects whose __str__ fails, and the like
        return f"<unrepresentable {type(args).__qualname__}>"


@functools.lru_cache(maxsize=4096)  # stored traces give arguments as text, and a loop repeats the same text
def _canonical_text(text: str) -> str:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text  # not JSON: the raw text is the only identity it has
    try:
        return _compact_json(_normalise(value, 0))
    except Exception:
        return f"<unrepresentable {type(value).__qualname__}>"


def _normalise(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return "<too deep>"
    if value is None or isinstance(value, (bool, str)):  # bool before int: True is not 1
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= _MAX_INT_BITS else f"<int {value:x}>"
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, Mapping):
        return {_key_text(k, depth): _normalise(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_normalise(v, depth + 1) for v in value), key=_compact_json)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)  # Decimal, enums, custom objects: their text is the best identity we have


def _key_text(key: Any, depth: int) -> str:
    # JSON keys are strings; a non-string key gets its canonical text so 1 and 1.0 agree.
    return key if isinstance(key, str) else _compact_json(_normalise(key, depth + 1))


def _compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def result_digest(text: str | None) -> str:
    """Short stable digest of a tool result's text: blake2b, 8 bytes, hex; "" for None.

    The span layer records this same function's value on every execute_tool span, so live and
    offline detection compare equal values.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = _safe_text(text)
    return _digest(text, size=8)


def _digest(text: str, size: int = 16) -> str:
    # surrogatepass: a lone surrogate in a string must not make hashing fail
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


def _safe_text(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__qualname__}>"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


# --------------------------------------------------------------------------- acknowledgement

# Regular expressions over NFKC-normalised, case-folded text with curly apostrophes made straight.
FAILURE_PHRASES: dict[str, tuple[str, ...]] = {
    "en": (
        r"\bfail(?:s|ed|ing|ures?)?\b",
        r"\bunsuccessful(?:ly)?\b",
        r"\bcould(?:n't| not)\b",
        r"\bcan(?:'t|not| not)\b",
        r"\bunable\b",
        r"(?:\bnot|n't) able to\b",
        r"\b(?:did|does|do)(?:n't| not) (?:work|succeed|go through|complete)\b",
        r"\bwas(?:n't| not) (?:possible|successful|completed?)\b",
        r"\bnot possible\b",
        r"\bimpossible\b",
        r"\berror(?:s|ed)?\b",
        r"\b(?:unavailable|not available|out of stock|sold out)\b",
        r"\bunfortunately\b",
        r"\bwent wrong\b",
        r"\b(?:denied|rejected|refused)\b",
    ),
    "ja": (
        r"失敗",
        r"(?:でき|出来)(?:ません|なかった|ず)",
        r"エラー",
        r"在庫(?:が|は)?\s*(?:0|ゼロ|切れ|なし|無し|がありません|ありません)",
        r"不可能",
        r"見つかりません|見つからなかった",
        r"残念ながら",
        r"問題が(?:発生|ありました)",
        r"うまく(?:いきません|いかなかった|行きません|行かなかった)",
        r"未完了",
        r"中断",
    ),
}

# Mentions of failure words that say the opposite; removed before looking for FAILURE_PHRASES.
NEGATED_FAILURE_PHRASES: dict[str, tuple[str, ...]] = {
    "en": (
        r"\b(?:no|zero|0|without(?: any)?|free of|never (?:had|hit|saw)(?: any)?) (?:errors?|failures?)\b",
        r"\berror[- ]?free\b",
        r"\b(?:did|does|do|will|would)(?:n't| not) fail\b",
        r"\bnever fail(?:s|ed)?\b",
        r"\bwithout fail(?:ing|ure)?\b",
    ),
    "ja": (
        r"(?:エラー|失敗)(?:は|も)?(?:一切|特に)?"
        r"(?:なく|なし|無く|無し|ありません(?:でした)?|ございません(?:でした)?"
        r"|(?:発生|出)(?:せず|しませんでした|ませんでした|していません|しておりません))",
        r"(?:エラー|失敗)(?:は|が)?\s*0\s*件",
    ),
}

_FAILURE_RE = re.compile("|".join(p for ps in FAILURE_PHRASES.values() for p in ps))
_NEGATED_RE = re.compile("|".join(p for ps in NEGATED_FAILURE_PHRASES.values() for p in ps))
_ACK_SCAN_CHARS = 20_000  # of each end of the final text: an admission is near the start or end


def acknowledges_failure(text: str | None) -> bool:
    """True when `text` says that some work failed or could not be done (English, Japanese)."""
    if not isinstance(text, str) or not text:
        return False
    if len(text) > 2 * _ACK_SCAN_CHARS:
        text = text[:_ACK_SCAN_CHARS] + "\n" + text[-_ACK_SCAN_CHARS:]
    normal = unicodedata.normalize("NFKC", text).casefold()
    normal = normal.replace("\u2019", "'").replace("\u2018", "'").replace("\u02bc", "'")
    return _FAILURE_RE.search(_NEGATED_RE.sub(" ", normal)) is not None


# --------------------------------------------------------------------------- internal state


_ERROR_OUTCOME = "!error"  # not a hex digest, so no result can collide with it


@dataclass(slots=True)
class _Observed:
    """A ToolCall reduced to what the rules compare."""

    tool: str
    key: str  # digest of tool + canonical arguments
    arguments: str  # canonical arguments, cut for messages
    outcome: str  # result digest, _ERROR_OUTCOME, or an unknown-result token
    is_error: bool
    call_id: str | None
    error_text: str  # start of the error text, for the ignored_error message


@dataclass(slots=True)
class _TurnCall:
    """One distinct call within a turn; duplicates in the turn merge here."""

    tool: str
    key: str
    arguments: str
    outcomes: set[str] = field(default_factory=set)
    call_ids: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> tuple[str, ...]:
        return tuple(sorted(self.outcomes))


@dataclass(slots=True)
class _CallStreak:
    tool: str
    key: str
    arguments: str
    start_turn: int
    start_seq: int
    count: int
    outcome: tuple[str, ...]
    call_ids: deque[str]
    streak: str | None = None  # set at first firing so a growing streak keeps its key


@dataclass(slots=True)
class _FailingToolStreak:
    tool: str
    start_turn: int
    count: int
    first_key: str
    varied: bool
    call_ids: deque[str]


@dataclass(frozen=True, slots=True)
class _TurnSignature:
    turn: int
    digest: str  # "" for a turn without tool calls
    tools: frozenset[str]
    description: str
    call_ids: tuple[str, ...]


@dataclass(slots=True)
class _CycleRun:
    period: int
    start_turn: int
    length: int  # turns covered so far, the first round included
    streak: str


@dataclass(frozen=True, slots=True)
class _UnresolvedError:
    turn: int
    call_id: str | None
    arguments: str
    error_text: str


@dataclass(slots=True)
class _ToolErrors:
    """A tool's errors since its last success: all of them counted, the most recent kept."""

    recent: deque[_UnresolvedError]
    total: int = 0


# --------------------------------------------------------------------------- the detector


class LoopDetector:
    """Feed it tool calls and turn ends; it returns the loop anomalies as they appear."""

    def __init__(self, config: DetectorConfig | None = None):
        self.config = config if isinstance(config, DetectorConfig) else DetectorConfig()
        self.internal_errors = 0
        self.last_internal_error: str | None = None
        self.anomalies_reported = 0
        self._anomalies: deque[Anomaly] = deque(maxlen=self.config.max_kept_anomalies)
        self._pending: list[_Observed] = []
        self._pending_overflow = 0
        self._pending_turn: int | None = None
        self._last_closed_turn: int | None = None
        self._turn_seq = 0  # turns closed so far, in feed order
        self._call_streaks: dict[str, _CallStreak] = {}  # calls of the last closed turn only
        self._failing_tools: dict[str, _FailingToolStreak] = {}  # likewise
        window = max(self.config.cycle_max_period * self.config.cycle_repeats,
                     self.config.cycle_max_period + 1)
        self._window: deque[_TurnSignature] = deque(maxlen=window)
        self._cycle: _CycleRun | None = None
        self._unresolved: dict[str, _ToolErrors] = {}
        self._run_ended = False

    # ---- public API: thin guards around the real work

    @property
    def anomalies(self) -> list[Anomaly]:
        """Everything reported so far (the most recent `max_kept_anomalies`)."""
        return list(self._anomalies)

    def observe(self, call: ToolCall) -> list[Anomaly]:
        return self._guarded(self._observe, call)

    def end_turn(self, turn: int) -> list[Anomaly]:
        return self._guarded(self._end_turn, turn)

    def end_run(self, stop_reason: str | None, final_text: str | None, turn: int) -> list[Anomaly]:
        return self._guarded(self._end_run, stop_reason, final_text, turn)

    def container_sizes(self) -> dict[str, int]:
        """Sizes of every container the detector keeps, to check that memory stays bounded."""
        return {
            "pending_calls": len(self._pending),
            "call_streaks": len(self._call_streaks),
            "call_streak_ids": sum(len(s.call_ids) for s in self._call_streaks.values()),
            "failing_tools": len(self._failing_tools),
            "failing_tool_ids": sum(len(s.call_ids) for s in self._failing_tools.values()),
            "window": len(self._window),
            "unresolved_error_tools": len(self._unresolved),
            "unresolved_errors": sum(len(e.recent) for e in self._unresolved.values()),
            "anomalies": len(self._anomalies),
        }

    def _guarded(self, action, *args) -> list[Anomaly]:
        try:
            fired = action(*args)
        except Exception as exc:  # a detector bug must never break the agent it watches
            self.internal_errors += 1
            self.last_internal_error = _shorten(_safe_text(exc), 300)
            return []
        self._anomalies.extend(fired)
        self.anomalies_reported += len(fired)
        return fired

    # ---- feeding

    def _observe(self, call: ToolCall) -> list[Anomaly]:
        fired: list[Anomaly] = []
        turn = _as_turn(getattr(call, "turn", None), self._current_turn_guess())
        if self._pending and turn != self._pending_turn:
            fired += self._close_turn(self._pending_turn)  # the caller moved on without end_turn
        self._pending_turn = turn
        observed = self._reduce(call, turn)
        if len(self._pending) < self.config.max_calls_per_turn:
            self._pending.append(observed)
        else:
            self._pending_overflow += 1
        self._track_error(observed, turn)
        return fired

    def _end_turn(self, turn: Any) -> list[Anomaly]:
        fallback = self._pending_turn if self._pending else self._current_turn_guess()
        turn = _as_turn(turn, fallback)
        if turn == self._last_closed_turn and (not self._pending or self._pending_turn != turn):
            return []  # a repeated or late end_turn for a turn already closed
        return self._close_turn(turn)

    def _end_run(self, stop_reason: Any, final_text: Any, turn: Any) -> list[Anomaly]:
        fired = self._close_turn(self._pending_turn) if self._pending else []
        if self._run_ended:
            return fired
        self._run_ended = True
        turn = _as_turn(turn, self._current_turn_guess())
        reason = stop_reason.strip().lower() if isinstance(stop_reason, str) else None
        ending_reasons = {r.lower() for r in self.config.ignored_error_stop_reasons}
        if reason in ending_reasons and self._unresolved:
            if not acknowledges_failure(final_text if isinstance(final_text, str) else None):
                fired.append(self._ignored_error_anomaly(turn, reason))
        return fired

    def _current_turn_guess(self) -> int:
        if self._pending_turn is not None:
            return self._pending_turn
        return (self._last_closed_turn or 0) + 1

    def _reduce(self, call: Any, turn: int) -> _Observed:
        tool = getattr(call, "tool", None)
        tool = tool if isinstance(tool, str) else ("" if tool is None else _safe_text(tool))
        arguments = canonical_arguments(getattr(call, "arguments", None))
        is_error = bool(getattr(call, "is_error", False))
        result = getattr(call, "result", None)
        call_id = getattr(call, "call_id", None)
        return _Observed(
            tool=tool,
            key=_digest(tool + "\x00" + arguments),
            arguments=_shorten(arguments, self.config.max_argument_chars),
            outcome=_ERROR_OUTCOME if is_error else self._success_outcome(call),
            is_error=is_error,
            call_id=None if call_id is None else _shorten(_safe_text(call_id), 200),
            error_text=_shorten(_safe_text(result), 200) if is_error and result is not None else "",
        )

    def _success_outcome(self, call: Any) -> str:
        result = getattr(call, "result", None)
        if result is not None:
            return result_digest(result)
        digest = getattr(call, "result_digest", None)
        if digest is not None:
            return _shorten(_safe_text(digest), 64)
        if self.config.assume_unknown_results_unchanged:
            return "?unknown"
        return f"?unknown@{self._turn_seq}"  # unique per turn: never equal, never a loop

    def _track_error(self, observed: _Observed, turn: int) -> None:
        if not observed.is_error:
            # any later success of the tool resolves its earlier errors
            self._unresolved.pop(observed.tool, None)
            return
        errors = self._unresolved.get(observed.tool)
        if errors is None:
            if len(self._unresolved) >= self.config.max_tools_with_errors:
                del self._unresolved[next(iter(self._unresolved))]  # forget the oldest tool
            errors = _ToolErrors(deque(maxlen=self.config.max_errors_per_tool))
            self._unresolved[observed.tool] = errors
        errors.total += 1
        errors.recent.append(_UnresolvedError(turn, observed.call_id, observed.arguments,
                                              observed.error_text))

    # ---- closing a turn: every per-turn rule runs here

    def _close_turn(self, turn: int | None) -> list[Anomaly]:
        turn = self._current_turn_guess() if turn is None else turn
        observed, overflow = self._pending, self._pending_overflow
        self._pending, self._pending_overflow, self._pending_turn = [], 0, None
        self._turn_seq += 1
        self._last_closed_turn = turn
        calls = _group_by_call(observed)
        cycle_fired = self._update_cycle(self._signature(turn, observed, calls, overflow))
        repeated_fired, repeating_keys = self._update_repeated_calls(turn, calls)
        failing_fired = self._update_failing_tools(turn, calls, repeating_keys)
        return repeated_fired + cycle_fired + failing_fired

    # ---- repeated_call

    def _update_repeated_calls(self, turn: int, calls: dict[str, _TurnCall]
                               ) -> tuple[list[Anomaly], set[str]]:
        streaks: dict[str, _CallStreak] = {}
        for key, call in calls.items():
            streak = self._call_streaks.get(key)
            if streak is None or streak.outcome != call.outcome:  # new call, or it made progress
                streak = _CallStreak(call.tool, key, call.arguments, turn, self._turn_seq, 0,
                                     call.outcome, deque(maxlen=self.config.max_call_ids))
            streak.count += 1
            streak.call_ids.extend(call.call_ids)
            streaks[key] = streak
        self._call_streaks = streaks  # calls absent from this turn end their streak here

        firing = [s for s in streaks.values() if s.count >= self.config.repeat_threshold]
        anomalies = [self._repeated_call_anomaly(turn, group) for group in _group_streaks(firing)]
        return anomalies, {s.key for s in firing}

    def _repeated_call_anomaly(self, turn: int, group: list[_CallStreak]) -> Anomaly:
        group.sort(key=lambda s: (s.tool, s.arguments))
        key = group[0].streak or _repeated_streak_key(group)
        for streak in group:
            streak.streak = key
        count = max(s.count for s in group)
        tools = {s.tool for s in group}
        failing = all(s.outcome == (_ERROR_OUTCOME,) for s in group)
        if len(group) == 1:
            what = f"{_call_text(group[0])} {'failed' if failing else 'returned the same result'}"
        else:
            listed = ", ".join(_call_text(s) for s in group)
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
            arguments=group[0].arguments if len(group) == 1 else None,
            call_ids=_recent_ids([s.call_ids for s in group], self.config.max_call_ids),
            count=count,
            message=f"{what} {count} turns running; {advice}",
            streak=key,
        )

    # ---- cycle

    def _signature(self, turn: int, observed: list[_Observed], calls: dict[str, _TurnCall],
                   overflow: int) -> _TurnSignature:
        if not observed:
            return _TurnSignature(turn, "", frozenset(), "(no tool calls)", ())
        # a multiset: the order of parallel calls does not matter, their number does
        items = sorted(f"{o.key}={o.outcome}" for o in observed)
        items.append(f"+{overflow}")
        description = ", ".join(
            f"{c.tool}({c.arguments}){' failed' if _ERROR_OUTCOME in c.outcomes else ''}"
            for c in calls.values()
        )
        return _TurnSignature(
            turn=turn,
            digest=_digest("\n".join(items)),
            tools=frozenset(c.tool for c in calls.values()),
            description=_shorten(description, 200),
            call_ids=tuple(o.call_id for o in observed if o.call_id is not None)[-self.config.max_call_ids:],
        )

    def _update_cycle(self, signature: _TurnSignature) -> list[Anomaly]:
        self._window.append(signature)
        run = self._cycle
        if run is not None:
            if self._repeats_after(run.period):
                run.length += 1
                return [self._cycle_anomaly(run)] if run.length % run.period == 0 else []
            self._cycle = None  # the pattern broke
        run = self._find_cycle()
        if run is None:
            return []
        self._cycle = run
        return [self._cycle_anomaly(run)]

    def _repeats_after(self, period: int) -> bool:
        window = self._window
        return (len(window) > period and window[-1].digest != ""
                and window[-1].digest == window[-1 - period].digest)

    def _find_cycle(self) -> _CycleRun | None:
        cfg = self.config
        # The digests of the whole window, once per turn, rather than a copy of the window for every period tried.
        digests = [s.digest for s in self._window]
        for period in range(cfg.cycle_min_period, cfg.cycle_max_period + 1):
            span = period * cfg.cycle_repeats
            if len(digests) < span:
                break
            recent = digests[-span:]
            if recent[-1] != recent[-1 - period]:
                continue  # the cheap test first: most turns end every candidate period right here
            if "" in recent:
                continue  # a turn without tool calls is no part of a tool loop
            periodic = all(recent[i] == recent[i - period] for i in range(period, span))
            if periodic and _is_primitive(recent[:period]):
                start_turn = self._window[-span].turn
                streak = f"cycle:p{period}:{_digest(''.join(recent[:period]))[:10]}@t{start_turn}"
                return _CycleRun(period, start_turn, span, streak)
        return None

    def _cycle_anomaly(self, run: _CycleRun) -> Anomaly:
        block = list(self._window)[-run.period:]
        covered = list(self._window)[-min(run.length, len(self._window)):]
        tools = set().union(*(s.tools for s in block))
        rounds = run.length // run.period
        pattern = " -> ".join(f"[{s.description}]" for s in block)
        return Anomaly(
            type=CYCLE,
            turn=block[-1].turn,
            tool=tools.pop() if len(tools) == 1 else None,
            arguments=None,
            call_ids=_recent_ids([s.call_ids for s in covered], self.config.max_call_ids),
            count=rounds,
            message=(f"A {run.period}-turn cycle repeated {rounds} times with identical results "
                     f"(turns {run.start_turn}-{block[-1].turn}): {pattern}; the agent is going "
                     "round in circles: take stock of what these results already show and do "
                     "something different, or tell the user what is blocking you."),
            streak=run.streak,
        )

    # ---- failing_tool

    def _update_failing_tools(self, turn: int, calls: dict[str, _TurnCall],
                              repeating_keys: set[str]) -> list[Anomaly]:
        threshold = self.config.failing_tool_threshold
        by_tool: dict[str, list[_TurnCall]] = {}
        for call in calls.values():
            by_tool.setdefault(call.tool, []).append(call)
        streaks: dict[str, _FailingToolStreak] = {}
        fired: list[Anomaly] = []
        for tool, tool_calls in by_tool.items():
            if any(c.outcomes != {_ERROR_OUTCOME} for c in tool_calls):
                continue  # a success (or no failure) in this turn ends the tool's streak
            streak = self._failing_tools.get(tool) or _FailingToolStreak(
                tool, turn, 0, tool_calls[0].key, False, deque(maxlen=self.config.max_call_ids))
            streak.count += 1
            streak.varied = streak.varied or any(c.key != streak.first_key for c in tool_calls)
            streak.call_ids.extend(i for c in tool_calls for i in c.call_ids)
            streaks[tool] = streak
            covered = all(c.key in repeating_keys for c in tool_calls) or self._cycle is not None
            if threshold and streak.count >= threshold and streak.varied and not covered:
                fired.append(self._failing_tool_anomaly(turn, streak))
        self._failing_tools = streaks
        return fired

    def _failing_tool_anomaly(self, turn: int, streak: _FailingToolStreak) -> Anomaly:
        return Anomaly(
            type=FAILING_TOOL,
            turn=turn,
            tool=streak.tool,
            arguments=None,
            call_ids=tuple(streak.call_ids),
            count=streak.count,
            message=(f"{streak.tool} failed on every call for {streak.count} turns running, with "
                     "varying arguments; the tool itself may be broken (credentials, a service "
                     "down, wrong usage): stop retrying it, use another tool, or report the error."),
            streak=f"failing_tool:{streak.tool}@t{streak.start_turn}",
        )

    # ---- ignored_error

    def _ignored_error_anomaly(self, turn: int, stop_reason: str) -> Anomaly:
        errors = [(tool, e) for tool, kept in self._unresolved.items() for e in kept.recent]
        total = sum(kept.total for kept in self._unresolved.values())
        tools = {tool for tool, _ in errors}
        listed = "; ".join(
            f"{tool}({e.arguments}) at turn {e.turn}" + (f": {e.error_text!r}" if e.error_text else "")
            for tool, e in errors[-5:]
        )
        last_tool, last_error = errors[-1]
        return Anomaly(
            type=IGNORED_ERROR,
            turn=turn,
            tool=last_tool if len(tools) == 1 else None,
            arguments=last_error.arguments if total == 1 else None,
            call_ids=tuple(e.call_id for _, e in errors if e.call_id is not None)[-self.config.max_call_ids:],
            count=total,
            message=(f"The run ended ({stop_reason}) with {total} tool error(s) never resolved "
                     f"by a later success and not acknowledged in the final answer "
                     f"({'the most recent: ' if total > len(errors[-5:]) else ''}{listed}). Tell "
                     "the user what failed, or retry until it succeeds before finishing."),
            streak=f"ignored_error@t{turn}",
        )


# --------------------------------------------------------------------------- helpers


def _as_turn(value: Any, fallback: int) -> int:
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


def _group_by_call(observed: list[_Observed]) -> dict[str, _TurnCall]:
    calls: dict[str, _TurnCall] = {}
    for o in observed:
        call = calls.get(o.key)
        if call is None:
            call = calls[o.key] = _TurnCall(o.tool, o.key, o.arguments)
        call.outcomes.add(o.outcome)
        if o.call_id is not None:
            call.call_ids.append(o.call_id)
    return calls


def _group_streaks(firing: list[_CallStreak]) -> list[list[_CallStreak]]:
    """Streaks that already fired keep their group; new ones group by the turn they began."""
    groups: dict[str, list[_CallStreak]] = {}
    for streak in firing:
        groups.setdefault(streak.streak or f"start:{streak.start_seq}", []).append(streak)
    return list(groups.values())


def _repeated_streak_key(group: list[_CallStreak]) -> str:
    if len(group) == 1:
        only = group[0]
        return f"repeated_call:{only.tool}:{only.key[:10]}@t{only.start_turn}"
    members = _digest("".join(s.key for s in group))[:10]
    return f"repeated_call:batch:{members}@t{group[0].start_turn}"


def _call_text(streak: _CallStreak) -> str:
    return f"{streak.tool}({streak.arguments})"


def _recent_ids(id_groups: list, limit: int) -> tuple[str, ...]:
    """The most recent ids of each group, a fair share each, at most `limit` in all."""
    share = max(1, limit // max(len(id_groups), 1))
    ids = [i for group in id_groups for i in list(group)[-share:]]
    return tuple(ids[-limit:])


def _is_primitive(block: list[str]) -> bool:
    """False when the block is itself a repetition of a shorter block (A A, A B A B)."""
    size = len(block)
    return not any(
        size % d == 0 and all(block[i] == block[i % d] for i in range(size))
        for d in range(1, size)
    )
