"""The detector's public data: a tool call as it is fed one and an anomaly as it reports one (a tool error a run left
unresolved is in `facts`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, Protocol, TypedDict

from .cost import LoopCost, LoopCostRecord

AnomalyType = Literal["repeated_call", "cycle", "ignored_error", "failing_tool", "repeated_text"]

REPEATED_CALL: Final = "repeated_call"
CYCLE: Final = "cycle"
IGNORED_ERROR: Final = "ignored_error"
FAILING_TOOL: Final = "failing_tool"
REPEATED_TEXT: Final = "repeated_text"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call with its outcome, as the detector sees it.

    The detector reads these fields by name, so any object that has them (a trace reader's own record) will do.
    """

    turn: int  # 1-based turn (model call) that requested it
    tool: str
    arguments: Any  # parsed JSON value, or the raw string when it did not parse
    call_id: str | None = None
    is_error: bool = False
    result: str | None = None  # the result text, if known
    # The result's digest, when the caller has it already (offline, from the trace): the outcome is compared on it,
    # and the result text, if also given, is read only for error texts and the batch an error came back in.
    result_digest: str | None = None
    # The canonical arguments (`canonical_arguments`), when the caller made them already (the loop's one view of the
    # call): taken as they are instead of worked out again.
    canonical_arguments: str | None = None


class FedCall(Protocol):
    """What the detector reads of a tool call it is fed: a `ToolCall`'s fields, by name. A `ToolCall` is one; so is a
    trace reader's own record that has the same fields."""

    @property
    def turn(self) -> int: ...
    @property
    def tool(self) -> str: ...
    @property
    def arguments(self) -> object: ...  # parsed JSON value, or the raw string when it did not parse
    @property
    def call_id(self) -> str | None: ...
    @property
    def is_error(self) -> bool: ...
    @property
    def result(self) -> str | None: ...  # the result text, if known
    @property
    def result_digest(self) -> str | None: ...


class AnomalyRecord(TypedDict):
    """An anomaly as plain JSON data (`Anomaly.to_dict`): what webhooks, `looptrace detect --json` and results carry."""

    type: AnomalyType
    turn: int
    tool: str | None
    arguments: str | None
    call_ids: list[str]
    count: int
    message: str
    streak: str
    first_turn: int
    continued: bool
    evidence: str | None
    cost: LoopCostRecord | None


class StreakStart(NamedTuple):
    """Where a streak's first repeated turn was: its turn number, and the run of the session it was in (the
    detector's own count of runs; None for the run being fed). What the loop cost is counted from."""

    turn: int
    run: int | None = None


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One finding of a rule: what pattern, where, how often, and a message saying what happened and what to try."""

    type: AnomalyType
    turn: int  # 1-based turn where it fired
    tool: str | None  # None when the pattern involves several tools
    arguments: str | None  # canonical arguments; None for a multi-call pattern (see message) or without content
    call_ids: tuple[str, ...]  # tool_use ids involved (most recent, capped)
    count: int  # repetitions, cycle rounds, failing turns or unresolved errors
    message: str  # what happened and what to try
    streak: str  # same for every firing of one streak or pattern
    first_turn: int | None = None  # the turn where this streak first fired; `turn` is its latest firing
    # The streak was already reported in an earlier run of the session: this run lists it with its count, but the
    # alert sinks (log line, webhook, score) do not announce it again.
    continued: bool = False
    # Why a verdict fired, in a few words (ignored_error: "the answer states the failed operation as done", "the model
    # retried, saw the same failure and moved on", "a judge said so"); None for a pattern that is its own evidence.
    evidence: str | None = None
    # What the loop cost so far (tokens, USD, turns, wall time from its first repeated turn), when the detector was
    # told each model call's usage (`LoopDetector.record_usage`); None otherwise.
    cost: LoopCost | None = None
    # Set by the rule that reports it, read by the detector to work out `cost`; not part of the JSON form.
    streak_start: StreakStart | None = field(default=None, compare=False, repr=False)

    @property
    def is_update(self) -> bool:
        """A later firing of a streak that already alerted: update it, do not alert again."""
        return self.first_turn is not None and self.first_turn != self.turn

    def to_dict(self) -> AnomalyRecord:
        """The anomaly as JSON data; `first_turn` is always set (to `turn` for a first firing of this run), `evidence`
        and `cost` may be None."""
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
            "continued": self.continued,
            "evidence": self.evidence,
            "cost": None if self.cost is None else self.cost.to_dict(),
        }
