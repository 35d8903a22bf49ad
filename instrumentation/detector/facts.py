"""`UnresolvedToolError`: the tool errors a run ended with, a fact it records whatever the rules make of it.

In a module of its own, standard library only, so that a reader of a run's recorded facts (``looptrace traces show``)
loads this record and nothing of the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class UnresolvedToolError:
    """A tool error that still stood when the run ended: no later success of the same tool on the same target.

    A fact, not a verdict: it is recorded for every run, whatever the rules or a judge make of it. ``error`` is the
    error's text as the spans hold it (secrets redacted), None when content capture is off. ``reported`` says how the
    model dealt with it, as far as the detector could read: "answer" (its final answer tells of the failure: names
    what failed, quotes the error, or admits it), "model" (text it wrote beside a later call did), "handed on" (a
    later call of another tool named it: a ticket, a hand-off); None when nothing addressed it, and always when the
    run's ignored_error found the answer passing over it (or the detector was off).
    """

    tool: str
    target: str | None  # what the call acted on (its id-like arguments, as given), None when it named nothing
    error: str | None
    turn: int  # the turn of its latest failure
    call_id: str | None
    failures: int = 1  # times the same call failed in the run without a success between
    reported: str | None = None  # "answer", "model", "handed on", or None: nothing addressed it

    def describe(self) -> str:
        """``reserve_equipment(EQ-001) at turn 2: 'EQ-001 is out of stock'``, as the CLI prints it."""
        target = f"({self.target})" if self.target else ""
        failed = f" (failed {self.failures} times)" if self.failures > 1 else ""
        said = f": {self.error!r}" if self.error else ""
        return f"{self.tool}{target} at turn {self.turn}{failed}{said}"

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "target": self.target, "error": self.error, "turn": self.turn,
                "call_id": self.call_id, "failures": self.failures, "reported": self.reported}
