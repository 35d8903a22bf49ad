"""A tool call as the rules compare it: reduced once when it is observed, then grouped per turn."""

from __future__ import annotations

from collections.abc import Iterable

from .commands import without_override_flags
from .config import DetectorConfig
from .identity import call_key, canonical_arguments, failure_signature, result_digest, safe_text, shorten
from .types import FedCall, ToolCall

ERROR_OUTCOME = "!error"  # not a hex digest, so no result can collide with it
ERROR_ONLY = frozenset({ERROR_OUTCOME})  # the outcomes of a call that failed every time in a turn
_MAX_FAILURES_KEPT = 4  # failures of one call in one turn whose errors are compared: a handful says whether it changed


# Plain classes with slots rather than dataclasses: defining a dataclass costs about a millisecond at import, which
# `looptrace detect` pays on every invocation, and these records need nothing a dataclass would add.


class ObservedCall:
    """A ToolCall reduced to what the rules compare."""

    __slots__ = ("arguments", "call_id", "error_text", "is_error", "key", "outcome", "raw_arguments", "raw_result",
                 "recorded_digest", "tool", "turn")

    def __init__(self, turn: int, tool: str, key: str, arguments: str, outcome: str, is_error: bool,
                 call_id: str | None, error_text: str, recorded_digest: str | None = None,
                 raw_arguments: object = None, raw_result: str | None = None) -> None:
        self.turn = turn  # the turn it was fed in
        self.tool = tool
        self.key = key  # tool + canonical arguments (`call_key`)
        self.arguments = arguments  # canonical arguments, cut for messages
        self.outcome = outcome  # result digest, ERROR_OUTCOME, or an unknown-result token
        self.is_error = is_error
        self.call_id = call_id
        self.error_text = error_text  # start of the error text, for the ignored_error message
        self.recorded_digest = recorded_digest  # a failure's result digest as an offline caller gave it
        self.raw_arguments = raw_arguments  # as given, for the targets of a failed call (parsed only when needed)
        self.raw_result = raw_result  # as given: a success's text, read only if an error of its batch stays unresolved


class TurnCall:
    """One distinct call within a turn; duplicates in the turn merge here."""

    __slots__ = ("_failure_key", "arguments", "call_ids", "failures", "key", "outcome", "outcomes", "raw_arguments",
                 "tool")

    def __init__(self, first: ObservedCall) -> None:
        self.tool = first.tool
        self.key = first.key
        self.arguments = first.arguments
        self.raw_arguments = first.raw_arguments  # as given: a command's operation is read from them when needed
        self.outcomes = {first.outcome}
        self.outcome: tuple[str, ...] = (first.outcome,)  # the outcomes in a stable order: what a streak compares
        self.call_ids = [] if first.call_id is None else [first.call_id]
        self.failures = [first] if first.is_error else []  # its failed calls in the turn (the first few)
        self._failure_key: str | None = None

    @property
    def failure_key(self) -> str:
        """The call as a failure streak knows it: its key, without the flags that force a retry (`--no-verify`,
        `--force`, `--yes`, `-f`). Worked out on first use: only calls with a failure streak need it."""
        if self._failure_key is None:
            plain = without_override_flags(self.tool, self.raw_arguments)
            self._failure_key = self.key if plain is None else call_key(self.tool, canonical_arguments(plain))
        return self._failure_key

    def merge(self, again: ObservedCall) -> None:
        """The same call again in the turn."""
        if again.outcome not in self.outcomes:
            self.outcomes.add(again.outcome)
            self.outcome = tuple(sorted(self.outcomes))
        if again.is_error and len(self.failures) < _MAX_FAILURES_KEPT:
            self.failures.append(again)
        if again.call_id is not None:
            self.call_ids.append(again.call_id)


def observe_call(call: FedCall, turn: int, config: DetectorConfig, turns_closed: int) -> ObservedCall:
    """Reduce a fed call (a `ToolCall`, or anything with its fields) of turn `turn` to what the rules compare.

    `turns_closed` makes an unknown result unique to its turn when unknown results must not count as unchanged.
    """
    # This runs for every call the loop makes: each field is read once, a plain str skips the conversions, and the
    # record is built positionally.
    tool: object
    if type(call) is ToolCall:  # the loop's own record has every field; another feed's may lack some
        tool, raw_arguments, is_error = call.tool, call.arguments, call.is_error
        result, given, call_id = call.result, call.result_digest, call.call_id
        arguments = call.canonical_arguments
    else:
        tool, raw_arguments = getattr(call, "tool", None), getattr(call, "arguments", None)
        is_error, result = getattr(call, "is_error", False), getattr(call, "result", None)
        given, call_id = getattr(call, "result_digest", None), getattr(call, "call_id", None)
        arguments = None
    if type(tool) is not str:
        tool = "" if tool is None else safe_text(tool)
    if type(arguments) is not str:
        arguments = canonical_arguments(raw_arguments)
    if type(is_error) is not bool:
        is_error = bool(is_error)
    if given is not None:
        given = shorten(safe_text(given), 64)
    if call_id is not None and (type(call_id) is not str or len(call_id) > 200):
        call_id = shorten(safe_text(call_id), 200)
    if is_error:
        outcome, error_text, recorded = ERROR_OUTCOME, "" if result is None else shorten(safe_text(result), 500), given
    else:
        outcome, error_text, recorded = _success_outcome(given, result, config, turns_closed), "", None
    limit = config.max_argument_chars
    return ObservedCall(turn, tool, call_key(tool, arguments),
                        arguments if len(arguments) <= limit else shorten(arguments, limit),
                        outcome, is_error, call_id, error_text, recorded, raw_arguments, result)


def _success_outcome(given: str | None, result: str | None, config: DetectorConfig, turns_closed: int) -> str:
    if given is not None:
        return given
    if result is not None:
        return result_digest(result)
    if config.assume_unknown_results_unchanged:
        return "?unknown"
    return f"?unknown@{turns_closed}"  # unique per turn: never equal, never a loop


def error_digests(failures: Iterable[ObservedCall]) -> set[str]:
    """What the failed calls' errors were, to tell a new failure from the same one again: the `failure_signature` of
    each error text (numbers, ids, time stamps and paths left out, so a hook that lists other files and timings each
    time is the same failure), else the digest an offline caller gave (a trace without content); "" when neither is
    known. Worked out only when asked: a failure is compared with another only when the same call is retried after
    other calls."""
    return {failure_signature(o.raw_result) if o.raw_result is not None
            else (o.recorded_digest if o.recorded_digest is not None else "") for o in failures}


def group_by_call(observed: list[ObservedCall]) -> dict[str, TurnCall]:
    """A turn's calls merged by identity, in the order they first came."""
    if len(observed) == 1:  # the usual turn
        only = observed[0]
        return {only.key: TurnCall(only)}
    calls: dict[str, TurnCall] = {}
    for o in observed:
        call = calls.get(o.key)
        if call is None:
            calls[o.key] = TurnCall(o)
        else:
            call.merge(o)
    return calls


def describe_call(tool: str, arguments: str, capture_content: bool) -> str:
    """A call for an anomaly's message: with its arguments only when content may be captured."""
    return f"{tool}({arguments})" if capture_content else f"a call to {tool}"


def recent_ids(id_groups: list[Iterable[str]], limit: int) -> tuple[str, ...]:
    """The most recent ids of each group, a fair share each, at most `limit` in all."""
    share = max(1, limit // max(len(id_groups), 1))
    ids = [i for group in id_groups for i in list(group)[-share:]]
    return tuple(ids[-limit:])
