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
text is the identity. Nested strings are never parsed.

Normalisation, and why it is safe (`normal_text`, `NONCE_KEYS`, `result_digest`):
- every string and key is put in Unicode NFC: canonically equivalent text ("é" as one code
  point or as e + combining accent) is the same text by Unicode's own definition;
- a one-line string has runs of whitespace collapsed and its ends stripped (ids, queries and
  command lines do not change meaning with doubled or trailing spaces); a multi-line string
  (code, file contents, where indentation matters) only loses trailing whitespace at line ends
  and at its end;
- arguments named request_id, x-request-id, client_request_id, idempotency_key, nonce,
  correlation_id, trace_id, timestamp or ts (any case, "_" and "-" ignored) are left out: they are
  fresh on every call by design. Merging two calls that differ only there matters only when their
  outcomes are also identical, and then they are the same call made twice;
- a result's digest ignores the same whitespace, and UUIDs, date-times with a time of day and hex
  ids of 24+ digits inside it (a request id, a "fetched at" stamp). Dates, numbers and short ids
  are data and stay; results over 200,000 characters are digested as they are.

The outcome of a call is its result digest for a success, or the single flag "error" for a
failure: error *texts* are ignored, because a failing call that fails with a new message each
time is still not making progress. When neither result nor digest is known (another framework's
spans without content), results count as unchanged by default (`assume_unknown_results_unchanged`).

Runs and sessions
-----------------
A detector serves one run; `begin_run()` starts the next run of the same conversation
(`SessionDetectors` hands out one detector per session id, at most `max_sessions`, forgetting a
session idle for `ttl_s`). Consecutive-turn streaks and cycles end at a run boundary (a user
message came between); the memory of failing calls within `repeat_window` turns carries over.
`anomalies` holds one entry per streak: a streak fires again on every further turn (so a policy
can nudge at 3 and stop at 4), but each later firing carries the `first_turn` of the streak
(`Anomaly.is_update`) and replaces the entry, so callers alert once and report the latest count.

Rules (thresholds are `DetectorConfig` fields)
----------------------------------------------
repeated_call   The same canonical call in `repeat_threshold` (3) consecutive turns with no
                progress: every turn's outcome equals the previous one (same digest), or is an
                error each time (texts may differ). Calls are counted once per turn, so the same
                call three times inside ONE turn is not a loop. The streak ends at the first
                turn without the call or with a changed outcome: polling a job whose status
                moves on is not a loop. Parallel batches: calls whose streaks started in the same
                turn and fire together are one anomaly, so the same batch of parallel calls three
                turns running fires once. The order of parallel calls never matters.
                Also with other calls between: the same canonical call *failing* `repeat_threshold`
                times within the last `repeat_window` (10) turns, across the runs of a session
                (book, think, book, think, book; or the same failing lookup after each user
                message). Successful repeats with other calls between are not counted: re-checking
                after an action, or after the user did something, is how troubleshooting looks.
cycle           The sequence of turn signatures (the multiset of canonical call + outcome of
                every call in the turn) repeats with a period of `cycle_min_period`..
                `cycle_max_period` (2..5) for `cycle_repeats` (3) rounds: A B A B A B fires at the
                6th turn, A B C x3 at the 9th. Only primitive periods count. Turns without tool
                calls never take part. Once found, the cycle keeps firing at every further full
                round and ends at the first turn that breaks the period.
ignored_error   At `end_run` with a stop reason in `ignored_error_stop_reasons` ("end_turn", "stop").
                1. Unresolved, per target: a tool error stands until a later success of the same
                   tool on the same target: the identical call, or the same operation with a
                   minority of its arguments corrected (more than half of the failed call's targets
                   unchanged). Targets (`call_targets`) are the top-level string arguments that read
                   as one token: ids, paths, codes, emails. A success of the tool on something else
                   (another file, another command) resolves nothing.
                2. Not dealt with: nothing the model said after the failure (the final answer, or
                   text beside later tool calls) deals with it, and no later call of another tool
                   (a hand-off, a ticket) names it. Dealing with it (`answer_addresses`) is judged
                   on structure, in any language: asking the user something (a question mark of
                   any script: it hands the decision back instead of presenting work as done),
                   naming what the failed call acted on (one of its targets), or quoting the error
                   (two words in a row of it, a token of it with a digit, or three characters in a
                   row for scripts written without spaces). No list of words.
                3. Evidence: the rule alone fires only where the structure shows that the answer
                   passed over a failure it had seen, in one of two ways:
                   a. persisted: the same call failed again after a retry and the model then went
                      on to other calls;
                   b. passed over in its batch (`_passed_over`): the failure came back beside other
                      tools' results, the answer draws on those results (repeats a token with a
                      digit from them: a flight number, an id, an amount), one of its statements
                      (a sentence without a question mark) names the failed operation by the words
                      of the tool's name (`update_reservation_passengers` -> "updated the passenger
                      list"), and nothing said after the failure quotes the error or names its
                      target. Here (2.) a question elsewhere in the answer does not count: a
                      question about the next step does not undo a statement that the failed step
                      was done. A batch where the same tool succeeded on another target is left
                      out: the statement may be about that success.
                   Known blind spot of b.: an answer that admits the failure in its own words
                   without quoting the error or naming its target ("the passenger change did not go
                   through") would be a false alarm; on the recorded trajectories b. fired once,
                   rightly, but a judge is the cure where this matters. An answer in
                   another language than the tool's name never matches b. (quiet, not wrong).
                   On the recorded trajectories, an answer written right after a single failure was
                   otherwise a report of it, so for every other unresolved, undealt-with failure the
                   verdict is the judge's.
                4. A later run of the session: a failure an earlier run left standing (reported at the
                   time), then a run that calls no tool at all and answers (the user said "go ahead",
                   the model answered "done" without doing anything). Words alone cannot tell that
                   from a goodbye, so the rule never fires here on its own; with a judge, the judge is
                   asked once for such a run, unless the answer names or quotes the failure.
                With a `judge` configured, a firing of the rule is confirmed by it (only a clear
                "not ignored" silences it; a judge that raises or answers nonsense leaves the rule's
                verdict), and the cases of 3. it leaves open are decided by it (only a clear
                "ignored" fires). Other stop reasons (max_tokens, refusal, limits) are already
                failures with their own status, so they do not fire.
failing_tool    One tool fails on every call in `failing_tool_threshold` (5) consecutive turns
                *with varying arguments* (0 disables): the model rephrasing calls to a tool that
                is itself broken, or guessing ids that do not exist. It stays quiet in a turn where
                repeated_call already covers all of that tool's calls, or while a cycle is active.

Content (`capture_content`)
---------------------------
With `capture_content=False` (the agent sets it from LOOPTRACE_CAPTURE_CONTENT / the GenAI
capture setting) anomalies carry no arguments and their messages name tools, turns and counts
only: no argument, no error text, no answer ever leaves the process inside an anomaly, a nudge,
a webhook payload, a score or a log line.

Cost and memory
---------------
Per call: canonicalise and digest the call (linear in its own size). Per turn: work bounded by
the calls in that turn (capped at `max_calls_per_turn`) plus a fixed (period x rounds) window of
turn-signature digests. State: streaks of the last turn only, the 15-turn window, unresolved
errors capped per tool and in tools, call ids capped per streak, failing calls of the last
`repeat_window` turns (capped), the last 32 texts the model wrote beside its calls, references to
at most 8 successful results of the turn an unresolved error came back in, the unresolved errors of
earlier runs of the session (capped), one entry per streak (at most `max_kept_anomalies`). A
10,000-turn run costs the same per call as a 10-turn one.
The ignored_error checks read the final answer and those texts once, at the end of the run.

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
import itertools
import json
import math
import re
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "CYCLE",
    "FAILING_TOOL",
    "IGNORED_ERROR",
    "REPEATED_CALL",
    "Anomaly",
    "DetectorConfig",
    "JudgeRequest",
    "LoopDetector",
    "SessionDetectors",
    "ToolCall",
    "answer_addresses",
    "call_targets",
    "canonical_arguments",
    "normal_text",
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
    # The result's digest, when the caller has it already (offline, from the trace): the outcome is compared on it,
    # and the result text, if also given, is read only for error texts and the batch an error came back in.
    result_digest: str | None = None


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
    first_turn: int | None = None  # the turn where this streak first fired; `turn` is its latest firing

    @property
    def is_update(self) -> bool:
        """A later firing of a streak that already alerted: update it, do not alert again."""
        return self.first_turn is not None and self.first_turn != self.turn

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
            "first_turn": self.first_turn if self.first_turn is not None else self.turn,
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
    max_kept_anomalies: int = 1000  # `LoopDetector.anomalies` keeps the most recent streaks
    repeat_window: int = 10  # turns in which 3 identical failing calls are a repeated_call, other calls between
    capture_content: bool = True  # False: messages name tools and counts only, never arguments or error text
    # Confirms an ignored_error before it is reported: a callable taking a JudgeRequest and returning True (ignored),
    # False (not ignored) or None (no opinion). A str is a model name the agent turns into such a callable.
    judge: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _require(self.repeat_threshold >= 2, "repeat_threshold must be at least 2")
        _require(
            2 <= self.cycle_min_period <= self.cycle_max_period,
            "need 2 <= cycle_min_period <= cycle_max_period (period 1 is repeated_call's job)",
        )
        _require(self.cycle_repeats >= 2, "cycle_repeats must be at least 2")
        _require(self.failing_tool_threshold >= 0, "failing_tool_threshold must be >= 0 (0 = off)")
        for name in ("max_calls_per_turn", "max_tools_with_errors", "max_errors_per_tool",
                     "max_call_ids", "max_argument_chars", "max_kept_anomalies", "repeat_window"):
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
        return normal_text(text)  # not JSON: the text is the only identity it has
    try:
        return _compact_json(_normalise(value, 0))
    except Exception:
        return f"<unrepresentable {type(value).__qualname__}>"


def _normalise(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return "<too deep>"
    if value is None or isinstance(value, bool):  # bool before int: True is not 1
        return value
    if isinstance(value, str):
        return normal_text(value)
    if isinstance(value, int):
        return value if value.bit_length() <= _MAX_INT_BITS else f"<int {value:x}>"
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else value
    if isinstance(value, Mapping):
        return {_key_text(k, depth): _normalise(v, depth + 1) for k, v in value.items() if not _is_nonce_key(k)}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_normalise(v, depth + 1) for v in value), key=_compact_json)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)  # Decimal, enums, custom objects: their text is the best identity we have


def _key_text(key: Any, depth: int) -> str:
    # JSON keys are strings; a non-string key gets its canonical text so 1 and 1.0 agree.
    return unicodedata.normalize("NFC", key) if isinstance(key, str) else _compact_json(_normalise(key, depth + 1))


# Argument names that carry a per-call nonce, compared case-insensitively without "_" and "-". A value under such a
# name is fresh on every call by design, so it says nothing about what the call does.
NONCE_KEYS = frozenset({"requestid", "xrequestid", "clientrequestid", "idempotencykey", "nonce", "correlationid",
                        "traceid", "timestamp", "ts"})


def _is_nonce_key(key: Any) -> bool:
    return isinstance(key, str) and key.casefold().replace("_", "").replace("-", "") in NONCE_KEYS


def normal_text(text: str) -> str:
    """A string as the detector compares it: Unicode NFC, and whitespace that cannot change its meaning dropped.

    One-line strings (ids, queries, command lines) have runs of whitespace collapsed and their ends stripped;
    multi-line strings (code, file contents, where indentation matters) only lose trailing whitespace at line ends
    and at the end.
    """
    try:
        text = unicodedata.normalize("NFC", text)
    except (TypeError, ValueError):
        return text
    if "\n" not in text and "\r" not in text:
        return " ".join(text.split())
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip()


# Per-call nonces in tool results: UUIDs, date-times with a time of day, and long hex ids (request ids, trace ids).
# Dates alone, numbers and short ids are data and stay.
_RESULT_NONCES = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b[0-9a-fA-F]{24,}\b"
)
_MAX_NORMALISED_RESULT = 200_000  # longer results are digested as they are


def _compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def result_digest(text: str | None) -> str:
    """Short stable digest of a tool result's text: blake2b, 8 bytes, hex; "" for None.

    The text is normalised first (`normal_text`, then UUIDs, date-times and long hex ids replaced by one marker), so
    two results that differ only in a per-call nonce or in trailing whitespace are the same outcome.

    The span layer records this same function's value on every execute_tool span, so live and
    offline detection compare equal values.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = _safe_text(text)
    if len(text) <= _MAX_NORMALISED_RESULT:
        text = _RESULT_NONCES.sub("\x00", normal_text(text))
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


# --------------------------------------------------------------------------- ignored_error: targets and answers

_MAX_TARGET_CHARS = 200
_MIN_MENTION_CHARS = 3  # shorter values ("a", "EU") turn up in any text by chance
# Question marks of the scripts we know: Latin, full-width (CJK), Spanish opening, Arabic. Punctuation, not words.
_QUESTION_MARKS = ("?", "\uff1f", "\u00bf", "\u061f")


def call_targets(arguments: Any) -> frozenset[str]:
    """What a call acted on: its top-level string arguments that read as one token (ids, paths, codes, emails).

    Free text (a message, a query with spaces, code) is not a target; neither are nested values.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return frozenset()
    if not isinstance(arguments, Mapping):
        return frozenset()
    targets = set()
    for key, value in arguments.items():
        if isinstance(value, str) and not _is_nonce_key(key):
            value = normal_text(value)
            if value and len(value) <= _MAX_TARGET_CHARS and not any(c.isspace() for c in value):
                targets.add(value)
    return frozenset(targets)


def _resolves(error: _UnresolvedError, success_key: str, success_targets: frozenset[str]) -> bool:
    """A later success resolves an error when it is the same call, or the same operation retried on the same target
    with a minority of its arguments corrected: more than half of the failed call's targets are unchanged."""
    if error.key == success_key:
        return True
    return bool(error.targets) and 2 * len(error.targets & success_targets) > len(error.targets)


def answer_addresses(text: str | None, targets: frozenset[str], error_text: str = "") -> bool:
    """Whether a final answer deals with a failed call, judged on structure rather than wording.

    It does when it asks the user something (hands the decision back instead of presenting the work as done), when
    it names what the failed call acted on (one of its targets), or when it repeats the error itself: two words in a
    row of the error message, or a token of it that carries a digit (an id, an amount, a flight number). Nothing
    here is a list of words: the answer is compared with the failed call and its error, in whatever language both
    are written.
    """
    if not text:
        return False
    if len(text) > 2 * _ANSWER_SCAN_CHARS:
        text = text[:_ANSWER_SCAN_CHARS] + "\n" + text[-_ANSWER_SCAN_CHARS:]
    if any(mark in text for mark in _QUESTION_MARKS):
        return True
    folded = _fold(text)
    if any(len(t) >= _MIN_MENTION_CHARS and _fold(t) in folded for t in targets):
        return True
    return bool(error_text) and not _echo_units(_fold(error_text)).isdisjoint(_echo_units(folded))


def _names_or_quotes(folded: str, error: _UnresolvedError) -> bool:
    """Whether folded text names one of a failed call's targets or quotes its error."""
    if any(len(t) >= _MIN_MENTION_CHARS and _fold(t) in folded for t in error.targets):
        return True
    return bool(error.error_text) and not _echo_units(_fold(error.error_text)).isdisjoint(_echo_units(folded))


def states_operation(text: str, tool: str) -> bool:
    """Whether a statement in `text` (a sentence without a question mark) names the operation `tool` performs.

    The operation's words are those of the tool's name (`update_reservation_passengers`: update, reservation,
    passengers; camelCase and dotted names split too; words under four letters left out); a sentence names the
    operation when it holds two of them (the one, for a one-word name), each matched on its stem so that "updated"
    and "passenger list" count. This compares the answer with the failed call, not with a list of words.
    """
    words = _name_words(tool)
    needed = min(2, len(words))
    if not needed:
        return False
    for sentence in _SENTENCE.findall(_fold(text[:2 * _ANSWER_SCAN_CHARS])):
        if any(mark in sentence for mark in _QUESTION_MARKS):
            continue
        said = set(_LETTERS.findall(sentence))
        if sum(1 for word in words if any(_same_stem(word, other) for other in said)) >= needed:
            return True
    return False


def draws_on(text: str, results: list[Any]) -> bool:
    """Whether an answer repeats something distinctive from the given results: a token with a digit in it (an id, a
    flight number, an amount, a date) that the result holds too."""
    answer = {unit for unit in _echo_units(_fold(text[:2 * _ANSWER_SCAN_CHARS])) if " " not in unit}
    if not answer:
        return False
    return any(not answer.isdisjoint(_echo_units(_fold(_safe_text(result)[:_BATCH_RESULT_CHARS])))
               for result in results)


def _name_words(tool: str) -> list[str]:
    spaced = _CAMEL_BOUNDARY.sub(" ", tool)
    return [word for word in _LETTERS.findall(_fold(spaced)) if len(word) >= 4]


def _same_stem(word: str, other: str) -> bool:
    """Two words share a stem when they agree on all but their last two letters, and on four letters at least."""
    shorter = min(len(word), len(other))
    shared = next((i for i in range(shorter) if word[i] != other[i]), shorter)
    return shared >= 4 and shared >= shorter - 2


_SENTENCE = re.compile(r"[^.!?\n\u3002\uff01\uff1f\u061f]+[.!?\u3002\uff01\uff1f\u061f]?")
_LETTERS = re.compile(r"[^\W\d_]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z])(?=[A-Z])")


def _strings_in(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a JSON-like value (arguments given as JSON text are parsed), to a bounded depth."""
    if depth > 8:
        return
    if isinstance(value, str):
        if depth == 0 and value[:1] in "{[":
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                yield value
                return
            yield from _strings_in(value, depth + 1)
            return
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings_in(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings_in(item, depth + 1)


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


_WORD = re.compile(r"\w+")


def _echo_units(folded: str) -> set[str]:
    """Pieces of text distinctive enough that sharing one means quoting: word pairs, tokens with a digit, and for
    scripts written without spaces (CJK) runs of three characters."""
    words = _WORD.findall(folded)
    units = {f"{a} {b}" for a, b in itertools.pairwise(words)}
    for word in words:
        if len(word) >= 3 and any(c.isdigit() for c in word):
            units.add(word)
        if len(word) >= 3 and any(_is_unspaced_script(c) for c in word):
            units.update(word[i:i + 3] for i in range(len(word) - 2))
    return units


def _is_unspaced_script(char: str) -> bool:
    return "\u3040" <= char <= "\u30ff" or "\u3400" <= char <= "\u9fff" or "\uac00" <= char <= "\ud7af"


_ANSWER_SCAN_CHARS = 20_000  # of each end of a huge final answer
_MAX_SAID_TURNS = 32  # texts beside tool calls kept per run, the most recent
_MAX_BATCH_RESULTS = 8  # successful results kept per turn while an error of that turn stands
_BATCH_RESULT_CHARS = 20_000  # of each, read when the run ends


@dataclass(frozen=True, slots=True)
class JudgeRequest:
    """What a judge is shown: the rule's finding, the failed call and the final answer."""

    anomaly: Anomaly
    tool: str
    arguments: str  # canonical arguments of the most recent ignored error
    error_text: str  # its start
    final_text: str


# --------------------------------------------------------------------------- internal state


_ERROR_OUTCOME = "!error"  # not a hex digest, so no result can collide with it
_ERROR_ONLY = frozenset({_ERROR_OUTCOME})  # the outcomes of a call that failed every time in a turn


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
    raw_arguments: Any = None  # as given, for the targets of a failed call (parsed only when needed)
    raw_result: Any = None  # as given: a success's text, read only if an error of the same batch stays unresolved


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
        outcomes = self.outcomes
        return (next(iter(outcomes)),) if len(outcomes) == 1 else tuple(sorted(outcomes))


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
    calls: tuple[tuple[str, str, bool], ...]  # (tool, arguments, failed) per distinct call: described only in a cycle
    call_ids: tuple[str, ...]


@dataclass(slots=True)
class _CycleRun:
    period: int
    start_turn: int
    length: int  # turns covered so far, the first round included
    streak: str


@dataclass(slots=True)
class _UnresolvedError:
    turn: int
    call_id: str | None
    arguments: str
    error_text: str
    key: str  # tool + canonical arguments
    targets: frozenset[str]  # identifier-like argument values: what the call acted on
    failures: int = 1  # times this same call failed in the run without a success between
    moved_on: bool = False  # another call in a later turn: the model saw the failure and went on with other work
    reported: bool = False  # a later successful call named its target or quoted its error (a ticket, a hand-off)
    first_turn: int = 0  # where this call first failed: anything the model said after that may report it
    batch: _Batch | None = None  # the calls that came back with this failure (a parallel batch)


@dataclass(slots=True)
class _Batch:
    """The successful results of a turn that returned an error, kept while an error of that turn is unresolved. Made
    at the turn's first error (a turn without errors makes none), from the successes the turn had returned so far."""

    turn: int
    results: list[tuple[str, Any]] = field(default_factory=list)  # (tool, its result as given: a reference, no copy)

    def add(self, observed: _Observed) -> None:
        if len(self.results) < _MAX_BATCH_RESULTS and observed.raw_result is not None:
            self.results.append((observed.tool, observed.raw_result))


@dataclass(slots=True)
class _FailureRun:
    """One canonical call's recent failures (turn sequence numbers), for repeats with other calls between."""

    tool: str
    arguments: str
    seqs: deque[int]
    turns: deque[int]
    runs: deque[int]  # which run of the session each failure was in
    call_ids: deque[str]
    streak: str | None = None


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
        self._streaks: dict[str, Anomaly] = {}  # this run's anomalies, one per streak (its latest firing)
        self._failures: dict[str, _FailureRun] = {}  # kept across the runs of a session
        self._runs_begun = 0
        self.judge_failures = 0
        self.judge_silenced = 0
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
        self._said: deque[tuple[int, str]] = deque(maxlen=_MAX_SAID_TURNS)  # what the model told the user, by turn
        self._batch: _Batch | None = None  # the current turn's successful results, once the turn returned an error
        # Failures of earlier runs of the session still unresolved, the most recent; only the judge reads them.
        self._earlier_errors: deque[tuple[str, _UnresolvedError]] = deque(maxlen=self.config.max_errors_per_tool)
        self._calls_this_run = 0

    # ---- public API: thin guards around the real work

    @property
    def anomalies(self) -> list[Anomaly]:
        """This run's anomalies, one per streak with its latest count and turn (`first_turn` says where it began)."""
        return list(self._streaks.values())

    def begin_run(self) -> None:
        """A new run of the same session: its own turns, streaks and errors; failing calls are remembered.

        Consecutive-turn streaks and cycles do not cross a run boundary (a user message came between); identical
        failing calls within `repeat_window` turns do, so a call that keeps failing across the user turns of one
        conversation is still a repeated_call.
        """
        self._guarded(self._begin_run)

    def _begin_run(self) -> list[Anomaly]:
        self._runs_begun += 1
        ending = [(tool, e) for tool, kept in self._unresolved.items() for e in kept.recent]
        if ending:
            keys = {e.key for _, e in ending}
            self._earlier_errors = deque([item for item in self._earlier_errors if item[1].key not in keys] + ending,
                                         maxlen=self.config.max_errors_per_tool)
        self._calls_this_run = 0
        self._pending, self._pending_overflow, self._pending_turn = [], 0, None
        self._last_closed_turn = None
        self._call_streaks, self._failing_tools = {}, {}
        self._window.clear()
        self._cycle = None
        self._unresolved = {}
        self._streaks = {}
        self._said.clear()
        self._batch = None
        self._run_ended = False
        return []

    def observe(self, call: ToolCall) -> list[Anomaly]:
        return self._guarded(self._observe, call)

    def end_turn(self, turn: int, text: str | None = None) -> list[Anomaly]:
        """Close a turn. `text` is what the model said in it alongside its tool calls (the user sees it too)."""
        return self._guarded(self._end_turn, turn, text)

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
            "earlier_run_errors": len(self._earlier_errors),
            "anomalies": len(self._streaks),
            "failure_runs": len(self._failures),
        }

    def _guarded(self, action, *args) -> list[Anomaly]:
        try:
            fired = action(*args)
        except Exception as exc:  # a detector bug must never break the agent it watches
            self.internal_errors += 1
            self.last_internal_error = _shorten(_safe_text(exc), 300)
            return []
        fired = [self._remember(anomaly) for anomaly in fired]
        self.anomalies_reported += len(fired)
        return fired

    def _remember(self, anomaly: Anomaly) -> Anomaly:
        """Keep one entry per streak; a later firing carries the turn where the streak first fired."""
        known = self._streaks.pop(anomaly.streak, None)
        first = known.first_turn if known is not None and known.first_turn is not None else anomaly.turn
        anomaly = replace(anomaly, first_turn=first)
        self._streaks[anomaly.streak] = anomaly
        if len(self._streaks) > self.config.max_kept_anomalies:
            del self._streaks[next(iter(self._streaks))]
        return anomaly

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
        if self._unresolved:
            self._note_later_call(observed, turn)
        self._track_error(observed, turn)
        return fired

    def _end_turn(self, turn: Any, text: Any = None) -> list[Anomaly]:
        pending = self._pending_turn if self._pending else None
        fallback = pending if pending is not None else self._current_turn_guess()
        turn = _as_turn(turn, fallback)
        if isinstance(text, str) and text.strip():
            self._said.append((turn, _shorten(text, 2 * _ANSWER_SCAN_CHARS)))
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
            text = final_text if isinstance(final_text, str) else None
            ignored = [(tool, e) for tool, kept in self._unresolved.items() for e in kept.recent
                       if not e.reported and not self._addressed(e, text)]
            # The rule's own verdict needs a failure the model knew about and then left behind: it retried the call,
            # saw it fail again, and went on to other calls. Any other unaddressed failure (above all a single one
            # seen just before the answer, which the answer is most likely about) is for a judge to decide.
            persistent = [(tool, e) for tool, e in ignored if e.failures > 1 and e.moved_on]
            passed_over = [(tool, e) for tool, kept in self._unresolved.items() for e in kept.recent
                           if not e.reported and self._passed_over(tool, e, text)]
            why = None
            if passed_over and not persistent:
                ignored = passed_over + [item for item in ignored if item not in passed_over]
                why = ("a final answer that states the failed operation as done while using the results that came "
                       "back beside it")
            if persistent or passed_over:
                anomaly = self._ignored_error_anomaly(turn, reason, ignored, *([why] if why else []))
                if self._judge_says(anomaly, ignored, text) is not False:
                    fired.append(anomaly)
            elif ignored:
                anomaly = self._ignored_error_anomaly(turn, reason, ignored)
                if self._judge_says(anomaly, ignored, text) is True:
                    fired.append(anomaly)
        elif reason in ending_reasons and self._earlier_errors and not self._calls_this_run:
            fired += self._judge_earlier_errors(turn, reason, final_text if isinstance(final_text, str) else None)
        return fired

    def _judge_earlier_errors(self, turn: int, reason: str, text: str | None) -> list[Anomaly]:
        """A run that called no tool and answered while a failure of an earlier run of the session stands: the user
        may have said "go ahead" and the model answered "done" without doing anything. Words alone cannot tell that
        from a polite goodbye, so only the judge decides, once per such run; without a judge nothing fires."""
        if not callable(self.config.judge) or not text:
            return []
        # A question does not exempt the answer here: "Is there anything else?" closes a false "done" as often as not.
        folded = _fold(text[:2 * _ANSWER_SCAN_CHARS])
        standing = [(tool, e) for tool, e in self._earlier_errors if not _names_or_quotes(folded, e)]
        if not standing:
            return []
        anomaly = self._ignored_error_anomaly(
            turn, reason, standing, "an earlier run of this conversation left it standing; this run called no tool "
            "and its answer presents the work as done (the judge's verdict)")
        return [anomaly] if self._judge_says(anomaly, standing, text) is True else []

    def _passed_over(self, tool: str, error: _UnresolvedError, final_text: str | None) -> bool:
        """Whether the answer used the results that came back beside the failure and stated the failed operation as
        done: it draws on another tool's result of the same batch, one of its statements names the operation, and
        nothing the model said after the failure quotes the error or names what the call acted on.

        A batch where the same tool also succeeded (on another target: one of several candidate ids) is left out:
        the operation did succeed there, and a statement naming it may be about that success."""
        if not final_text or error.batch is None:
            return False
        if any(other == tool for other, _ in error.batch.results):
            return False
        beside = [text for _, text in error.batch.results]
        if not beside or not states_operation(final_text, tool) or not draws_on(final_text, beside):
            return False
        said = [text for turn, text in self._said if turn > error.first_turn]
        return not any(_names_or_quotes(_fold(text), error) for text in [final_text, *said])

    def _addressed(self, error: _UnresolvedError, final_text: str | None) -> bool:
        """Whether anything the model said after seeing the failure (the final answer, or text beside later tool
        calls) deals with it."""
        if answer_addresses(final_text, error.targets, error.error_text):
            return True
        return any(turn > error.first_turn and answer_addresses(said, error.targets, error.error_text)
                   for turn, said in self._said)

    def _judge_says(self, anomaly: Anomaly, ignored: list, text: str | None) -> bool | None:
        """The configured judge's verdict: True ignored, False not ignored, None no judge or no usable answer.

        A judge that raises counts as no answer, so the rule's own verdict stands.
        """
        judge = self.config.judge
        if not callable(judge):
            return None
        tool, error = ignored[-1]
        request = JudgeRequest(anomaly=anomaly, tool=tool, arguments=error.arguments, error_text=error.error_text,
                               final_text=text or "")
        try:
            verdict = judge(request)
        except Exception as exc:
            self.judge_failures += 1
            self.last_internal_error = _shorten(f"judge: {type(exc).__name__}: {_safe_text(exc)}", 300)
            return None
        if verdict is False:
            self.judge_silenced += 1
        return verdict if isinstance(verdict, bool) else None

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
            error_text=_shorten(_safe_text(result), 500) if is_error and result is not None else "",
            raw_arguments=getattr(call, "arguments", None),
            raw_result=result,
        )

    def _success_outcome(self, call: Any) -> str:
        digest = getattr(call, "result_digest", None)
        if digest is not None:
            return _shorten(_safe_text(digest), 64)
        result = getattr(call, "result", None)
        if result is not None:
            return result_digest(result)
        if self.config.assume_unknown_results_unchanged:
            return "?unknown"
        return f"?unknown@{self._turn_seq}"  # unique per turn: never equal, never a loop

    def _track_error(self, observed: _Observed, turn: int) -> None:
        self._calls_this_run += 1
        if self._batch is not None and self._batch.turn != turn:
            self._batch = None
        if not observed.is_error:
            if self._batch is not None:  # this turn already returned an error: its batch keeps this result too
                self._batch.add(observed)
            if self._earlier_errors:
                self._resolve_earlier(observed)
            if self._unresolved:
                self._note_later_success(observed, turn)
            errors = self._unresolved.get(observed.tool)
            if errors is not None:  # a later success resolves the errors of the same call on the same target
                targets = call_targets(observed.raw_arguments)
                kept = [e for e in errors.recent if not _resolves(e, observed.key, targets)]
                errors.total -= len(errors.recent) - len(kept)
                errors.recent = deque(kept, maxlen=self.config.max_errors_per_tool)
                if not kept:
                    del self._unresolved[observed.tool]
            return
        errors = self._unresolved.get(observed.tool)
        if errors is None:
            if len(self._unresolved) >= self.config.max_tools_with_errors:
                del self._unresolved[next(iter(self._unresolved))]  # forget the oldest tool
            errors = _ToolErrors(deque(maxlen=self.config.max_errors_per_tool))
            self._unresolved[observed.tool] = errors
        same = next((e for e in errors.recent if e.key == observed.key), None)
        if same is not None:  # the same call failing again: one error, failed more than once
            errors.recent.remove(same)
            errors.recent.append(_UnresolvedError(turn, observed.call_id, observed.arguments, observed.error_text,
                                                  observed.key, same.targets, same.failures + 1,
                                                  moved_on=same.moved_on, first_turn=same.first_turn))
            return
        errors.total += 1
        if self._batch is None:  # the turn's first error: its batch starts with the successes already returned
            self._batch = _Batch(turn)
            for earlier in self._pending:
                if not earlier.is_error:
                    self._batch.add(earlier)
        errors.recent.append(_UnresolvedError(turn, observed.call_id, observed.arguments, observed.error_text,
                                              observed.key, call_targets(observed.raw_arguments), first_turn=turn,
                                              batch=self._batch))

    def _resolve_earlier(self, observed: _Observed) -> None:
        targets = call_targets(observed.raw_arguments)
        kept = [(tool, e) for tool, e in self._earlier_errors
                if tool != observed.tool or not _resolves(e, observed.key, targets)]
        if len(kept) != len(self._earlier_errors):
            self._earlier_errors = deque(kept, maxlen=self.config.max_errors_per_tool)

    def _note_later_call(self, observed: _Observed, turn: int) -> None:
        for errors in self._unresolved.values():
            for error in errors.recent:
                if turn > error.turn and observed.key != error.key:
                    error.moved_on = True

    def _note_later_success(self, observed: _Observed, turn: int) -> None:
        """A success of another tool after an error may report the failure: a hand-off or a ticket whose free text
        names what failed or quotes its error. (An id argument naming the same order is the next operation on it, and
        another call of the same tool is a retry: neither is a report.)"""
        text = None
        for errors in self._unresolved.values():
            for error in errors.recent:
                if not error.reported and errors is not self._unresolved.get(observed.tool):
                    if text is None:
                        # free text only (a summary, a message): an id argument is the next operation, not a report
                        text = _fold(" ".join(t for t in _strings_in(observed.raw_arguments)
                                              if any(c.isspace() for c in t.strip())))[:_ANSWER_SCAN_CHARS]
                    error.reported = _names_or_quotes(text, error)

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
        repeated_fired += self._update_failure_runs(turn, calls, repeating_keys)
        failing_fired = self._update_failing_tools(turn, calls, repeating_keys)
        return repeated_fired + cycle_fired + failing_fired

    # ---- repeated_call with other calls between: the same call failing again and again

    def _update_failure_runs(self, turn: int, calls: dict[str, _TurnCall], repeating_keys: set[str]) -> list[Anomaly]:
        cfg = self.config
        oldest = self._turn_seq - cfg.repeat_window + 1
        fired: list[Anomaly] = []
        for key, call in calls.items():
            if call.outcomes != _ERROR_ONLY:
                self._failures.pop(key, None)  # it worked (or did something else): no longer failing
                continue
            run = self._failures.pop(key, None) or _FailureRun(
                call.tool, call.arguments, deque(), deque(), deque(), deque(maxlen=cfg.max_call_ids))
            self._failures[key] = run  # most recently failing last
            run.seqs.append(self._turn_seq)
            run.turns.append(turn)
            run.runs.append(self._runs_begun)
            run.call_ids.extend(call.call_ids)
            while run.seqs and run.seqs[0] < oldest:
                run.seqs.popleft()
                run.turns.popleft()
                run.runs.popleft()
            if len(run.seqs) < cfg.repeat_threshold:
                if len(run.seqs) == 1:
                    run.streak = None  # the earlier failures left the window: a new streak
                continue
            if key in repeating_keys:  # consecutive turns: the streak rule reports it; remember its key
                run.streak = next((s.streak for s in self._call_streaks.values() if s.key == key), run.streak)
                continue
            if run.streak is None:
                run.streak = f"repeated_call:{call.tool}:{key[:10]}@t{run.turns[0]}"
            fired.append(self._failure_run_anomaly(turn, run))
        for stale in [k for k, r in self._failures.items() if r.seqs[-1] < oldest]:
            del self._failures[stale]
        while len(self._failures) > cfg.max_tools_with_errors * cfg.max_errors_per_tool:
            del self._failures[next(iter(self._failures))]
        return fired

    def _failure_run_anomaly(self, turn: int, run: _FailureRun) -> Anomaly:
        count = len(run.seqs)
        what = self._describe_call(run.tool, run.arguments)
        return Anomaly(
            type=REPEATED_CALL, turn=turn, tool=run.tool,
            arguments=run.arguments if self.config.capture_content else None,
            call_ids=tuple(run.call_ids)[-self.config.max_call_ids:], count=count,
            message=(f"{what} failed {count} times in the last {self.config.repeat_window} turns ({_where(run)}), with "
                     "other calls between; retrying unchanged will not help: fix the arguments, use another tool, "
                     "or tell the user what is failing."),
            streak=run.streak or f"repeated_call:{run.tool}@t{run.turns[0]}",
        )

    def _describe_call(self, tool: str, arguments: str) -> str:
        return f"{tool}({arguments})" if self.config.capture_content else f"a call to {tool}"

    # ---- repeated_call

    def _update_repeated_calls(self, turn: int, calls: dict[str, _TurnCall]
                               ) -> tuple[list[Anomaly], set[str]]:
        streaks: dict[str, _CallStreak] = {}
        for key, call in calls.items():
            streak = self._call_streaks.get(key)
            outcome = call.outcome
            if streak is None or streak.outcome != outcome:  # new call, or it made progress
                streak = _CallStreak(call.tool, key, call.arguments, turn, self._turn_seq, 0,
                                     outcome, deque(maxlen=self.config.max_call_ids))
            streak.count += 1
            streak.call_ids.extend(call.call_ids)
            streaks[key] = streak
        self._call_streaks = streaks  # calls absent from this turn end their streak here

        firing = [s for s in streaks.values() if s.count >= self.config.repeat_threshold]
        if not firing:
            return [], set()
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
            what = (f"{self._describe_call(group[0].tool, group[0].arguments)} "
                    f"{'failed' if failing else 'returned the same result'}")
        else:
            listed = ", ".join(self._describe_call(s.tool, s.arguments) for s in group)
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
            arguments=group[0].arguments if len(group) == 1 and self.config.capture_content else None,
            call_ids=_recent_ids([s.call_ids for s in group], self.config.max_call_ids),
            count=count,
            message=f"{what} {count} turns running; {advice}",
            streak=key,
        )

    # ---- cycle

    def _signature(self, turn: int, observed: list[_Observed], calls: dict[str, _TurnCall],
                   overflow: int) -> _TurnSignature:
        if not observed:
            return _TurnSignature(turn, "", (), ())
        # a multiset: the order of parallel calls does not matter, their number does
        items = sorted([o.key + "=" + o.outcome for o in observed])
        items.append(f"+{overflow}")
        return _TurnSignature(
            turn=turn,
            digest=_digest("\n".join(items)),
            calls=tuple([(c.tool, c.arguments, _ERROR_OUTCOME in c.outcomes) for c in calls.values()]),
            call_ids=tuple([o.call_id for o in observed if o.call_id is not None])[-self.config.max_call_ids:],
        )

    def _describe_turn(self, signature: _TurnSignature) -> str:
        """A turn's calls for a cycle's message; made only when a cycle fires, not for every turn."""
        if not signature.calls:
            return "(no tool calls)"
        description = ", ".join(f"{self._describe_call(tool, arguments)}{' failed' if failed else ''}"
                                for tool, arguments, failed in signature.calls)
        return _shorten(description, 200)

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
        window = self._window
        if len(window) < cfg.cycle_min_period * cfg.cycle_repeats or not window[-1].digest:
            return None  # too few turns yet, or this one had no tool calls: no cycle ends here
        # The digests of the whole window, once per turn, rather than a copy of the window for every period tried.
        digests = [s.digest for s in window]
        for period in range(cfg.cycle_min_period, cfg.cycle_max_period + 1):
            span = period * cfg.cycle_repeats
            if len(digests) < span:
                break
            if digests[-1] != digests[-1 - period]:
                continue  # the cheap test first: most turns end every candidate period right here
            recent = digests[-span:]
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
        tools = {tool for s in block for tool, _, _ in s.calls}
        rounds = run.length // run.period
        pattern = " -> ".join(f"[{self._describe_turn(s)}]" for s in block)
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
        if not any(_ERROR_OUTCOME in c.outcomes for c in calls.values()):
            self._failing_tools = {}  # no call failed in this turn: every tool's streak ends here
            return []
        by_tool: dict[str, list[_TurnCall]] = {}
        for call in calls.values():
            by_tool.setdefault(call.tool, []).append(call)
        streaks: dict[str, _FailingToolStreak] = {}
        fired: list[Anomaly] = []
        for tool, tool_calls in by_tool.items():
            if any(c.outcomes != _ERROR_ONLY for c in tool_calls):
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

    def _ignored_error_anomaly(self, turn: int, stop_reason: str, ignored: list,
                               why: str = "a final answer that neither names what failed nor asks the user") -> Anomaly:
        total = len(ignored) + sum(kept.total - len(kept.recent) for kept in self._unresolved.values())
        tools = {tool for tool, _ in ignored}
        content = self.config.capture_content
        if content:
            listed = "; ".join(
                f"{tool}({e.arguments}) at turn {e.turn}" + (f": {e.error_text!r}" if e.error_text else "")
                for tool, e in ignored[-5:])
        else:
            listed = "; ".join(f"{tool} at turn {e.turn}" for tool, e in ignored[-5:])
        last_tool, last_error = ignored[-1]
        return Anomaly(
            type=IGNORED_ERROR,
            turn=turn,
            tool=last_tool if len(tools) == 1 else None,
            arguments=last_error.arguments if total == 1 and content else None,
            call_ids=tuple(e.call_id for _, e in ignored if e.call_id is not None)[-self.config.max_call_ids:],
            count=total,
            message=(f"The run ended ({stop_reason}) with {total} tool error(s) never resolved by a later success "
                     f"on the same target, and {why} "
                     f"({'the most recent: ' if total > len(ignored[-5:]) else ''}{listed}). Tell the user what "
                     "failed, or retry until it succeeds before finishing."),
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


def _where(run: _FailureRun) -> str:
    """The turns of a failure run, or how many runs of the session it spans."""
    if len(set(run.runs)) == 1:
        return "turns " + ", ".join(str(t) for t in run.turns)
    return f"across {len(set(run.runs))} runs of this session"


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


class SessionDetectors:
    """Detector memory shared by the runs of one session (a conversation), bounded and evicted by age.

    ``detector_for(session_id)`` returns the session's detector, ready for a new run (`LoopDetector.begin_run`), so a
    call that keeps failing across the user turns of a conversation is caught. At most `max_sessions` are kept; a
    session idle for `ttl_s` seconds is forgotten, and the least recently used goes first when full. Runs of one
    session are expected one at a time (a conversation); concurrent runs of one session share a lock-protected
    lookup but then feed the same detector.
    """

    def __init__(self, config: DetectorConfig | None = None, *, max_sessions: int = 1000, ttl_s: float = 3600.0,
                 clock: Any = None) -> None:
        self.config = config
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[float, LoopDetector]] = {}

    def detector_for(self, session_id: str) -> LoopDetector:
        now = self._clock()
        with self._lock:
            for stale in [k for k, (seen, _) in self._sessions.items() if now - seen > self.ttl_s]:
                del self._sessions[stale]
            entry = self._sessions.pop(session_id, None)
            detector = entry[1] if entry is not None else LoopDetector(self.config)
            self._sessions[session_id] = (now, detector)  # most recently used last
            while len(self._sessions) > self.max_sessions:
                del self._sessions[next(iter(self._sessions))]
        detector.begin_run()
        return detector

    def __len__(self) -> int:
        return len(self._sessions)
