"""A tool call as the rules compare it: reduced once when it is observed, then grouped per turn."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .config import DetectorConfig
from .identity import canonical_arguments, digest, result_digest, safe_text, shorten

ERROR_OUTCOME = "!error"  # not a hex digest, so no result can collide with it
ERROR_ONLY = frozenset({ERROR_OUTCOME})  # the outcomes of a call that failed every time in a turn
_MAX_FAILURES_KEPT = 4  # failures of one call in one turn whose errors are compared: a handful says whether it changed


@dataclass(slots=True)
class ObservedCall:
    """A ToolCall reduced to what the rules compare."""

    turn: int  # the turn it was fed in
    tool: str
    key: str  # digest of tool + canonical arguments
    arguments: str  # canonical arguments, cut for messages
    outcome: str  # result digest, ERROR_OUTCOME, or an unknown-result token
    is_error: bool
    call_id: str | None
    error_text: str  # start of the error text, for the ignored_error message
    recorded_digest: str | None = None  # a failure's result digest as an offline caller gave it
    raw_arguments: Any = None  # as given, for the targets of a failed call (parsed only when needed)
    raw_result: Any = None  # as given: a success's text, read only if an error of the same batch stays unresolved


@dataclass(slots=True)
class TurnCall:
    """One distinct call within a turn; duplicates in the turn merge here."""

    tool: str
    key: str
    arguments: str
    outcomes: set[str] = field(default_factory=set)
    call_ids: list[str] = field(default_factory=list)
    failures: list[ObservedCall] = field(default_factory=list)  # its failed calls in the turn (the first few)

    @property
    def outcome(self) -> tuple[str, ...]:
        """The call's outcomes in the turn, in a stable order."""
        outcomes = self.outcomes
        return (next(iter(outcomes)),) if len(outcomes) == 1 else tuple(sorted(outcomes))


def observe_call(call: Any, turn: int, config: DetectorConfig, turns_closed: int) -> ObservedCall:
    """Reduce a fed call (a `ToolCall`, or anything with its fields) of turn `turn` to what the rules compare.

    `turns_closed` makes an unknown result unique to its turn when unknown results must not count as unchanged.
    """
    # This runs for every call the loop makes: each field is read once, and a plain str skips the conversions.
    tool = getattr(call, "tool", None)
    if type(tool) is not str:
        tool = "" if tool is None else safe_text(tool)
    raw_arguments = getattr(call, "arguments", None)
    arguments = canonical_arguments(raw_arguments)
    is_error = bool(getattr(call, "is_error", False))
    result = getattr(call, "result", None)
    call_id = getattr(call, "call_id", None)
    if call_id is not None and (type(call_id) is not str or len(call_id) > 200):
        call_id = shorten(safe_text(call_id), 200)
    return ObservedCall(
        turn=turn,
        tool=tool,
        key=digest(tool + "\x00" + arguments),
        arguments=shorten(arguments, config.max_argument_chars),
        outcome=ERROR_OUTCOME if is_error else _success_outcome(call, config, turns_closed),
        is_error=is_error,
        call_id=call_id,
        error_text=shorten(safe_text(result), 500) if is_error and result is not None else "",
        recorded_digest=_given_digest(call) if is_error else None,
        raw_arguments=raw_arguments,
        raw_result=result,
    )


def _success_outcome(call: Any, config: DetectorConfig, turns_closed: int) -> str:
    given = getattr(call, "result_digest", None)
    if given is not None:
        return shorten(safe_text(given), 64)
    result = getattr(call, "result", None)
    if result is not None:
        return result_digest(result)
    if config.assume_unknown_results_unchanged:
        return "?unknown"
    return f"?unknown@{turns_closed}"  # unique per turn: never equal, never a loop


def _given_digest(call: Any) -> str | None:
    given = getattr(call, "result_digest", None)
    return None if given is None else shorten(safe_text(given), 64)


def error_digests(failures: Iterable[ObservedCall]) -> set[str]:
    """The digests of failed calls' errors, normalised as every result's is (`result_digest`): the digest an offline
    caller gave, else that of the error text; "" when neither is known. Worked out only when asked: a failure is
    compared with another only when the same call is retried after other calls."""
    return {o.recorded_digest if o.recorded_digest is not None else result_digest(o.raw_result) for o in failures}


def group_by_call(observed: list[ObservedCall]) -> dict[str, TurnCall]:
    """A turn's calls merged by identity, in the order they first came."""
    calls: dict[str, TurnCall] = {}
    for o in observed:
        call = calls.get(o.key)
        if call is None:
            call = calls[o.key] = TurnCall(o.tool, o.key, o.arguments)
        call.outcomes.add(o.outcome)
        if o.is_error and len(call.failures) < _MAX_FAILURES_KEPT:
            call.failures.append(o)
        if o.call_id is not None:
            call.call_ids.append(o.call_id)
    return calls


def describe_call(tool: str, arguments: str, capture_content: bool) -> str:
    """A call for an anomaly's message: with its arguments only when content may be captured."""
    return f"{tool}({arguments})" if capture_content else f"a call to {tool}"


def recent_ids(id_groups: list[Iterable[str]], limit: int) -> tuple[str, ...]:
    """The most recent ids of each group, a fair share each, at most `limit` in all."""
    share = max(1, limit // max(len(id_groups), 1))
    ids = [i for group in id_groups for i in list(group)[-share:]]
    return tuple(ids[-limit:])
