"""What a rule is: the hooks `LoopDetector` calls, and what it hands them (a call, a closed turn, the run's end).

Each rule owns its state and reports its own anomalies; the detector only feeds the rules and merges what they return.
A rule overrides the hooks it needs; the others do nothing.
"""

from __future__ import annotations

from typing import NamedTuple

from .calls import ObservedCall, TurnCall
from .types import Anomaly

# A plain class and two NamedTuples rather than dataclasses: defining a dataclass costs start-up time, which
# `looptrace detect` pays on every invocation, and these need nothing a dataclass would add.


class OpenTurn:
    """The turn being fed: its number and its calls so far (capped; `overflow` counts the rest)."""

    __slots__ = ("calls", "failed", "number", "overflow")

    def __init__(self) -> None:
        self.number: int | None = None
        self.calls: list[ObservedCall] = []
        self.overflow = 0
        self.failed = False  # whether one of `calls` failed


class ClosedTurn(NamedTuple):
    """A turn the detector closed: every per-turn rule is judged on it."""

    number: int  # the turn number as the caller gave it
    seq: int  # turns closed so far in feed order, this one included: "consecutive" means consecutive here
    run: int  # which run of the session it belongs to (runs begun so far)
    observed: list[ObservedCall]  # its calls in the order they came (capped)
    calls: dict[str, TurnCall]  # its distinct calls, by identity
    overflow: int  # calls beyond the cap: they count towards the turn's signature only
    # Whether one of `observed` failed: most turns have none, and the rules that follow failures skip those on this.
    failed: bool


class RunEnd(NamedTuple):
    """How a run ended: its normalised stop reason (lower case, None if unknown), final answer and last turn."""

    turn: int
    stop_reason: str | None
    final_text: str | None


class Rule:
    """One loop pattern. The detector calls these hooks in feed order; the anomalies they return are reported."""

    # The hooks this kind of rule overrides, found once per class: the detector calls a rule only for those.
    hooks: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.hooks = frozenset(hook for hook in _HOOKS if getattr(cls, hook) is not getattr(Rule, hook))

    def begin_run(self) -> None:
        """A new run of the session begins: drop what ends at a run boundary, keep what a session carries."""

    def observe(self, call: ObservedCall, turn: OpenTurn) -> None:
        """A call came back (already added to `turn`). Nothing fires here: patterns are judged when a turn closes."""

    def model_said(self, turn: int, text: str) -> None:
        """What the model wrote beside its tool calls in `turn` (the user sees it too)."""

    def end_turn(self, turn: ClosedTurn) -> list[Anomaly]:
        """A turn closed: the anomalies it completes."""
        return []

    def end_run(self, end: RunEnd) -> list[Anomaly]:
        """The run ended (called once per run, after its last turn closed): the anomalies of the whole run."""
        return []

    def container_sizes(self) -> dict[str, int]:
        """Sizes of the containers this rule keeps, to check that memory stays bounded."""
        return {}


_HOOKS = ("begin_run", "observe", "model_said", "end_turn", "end_run", "container_sizes")
