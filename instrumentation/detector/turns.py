"""The turn model: how a run's model calls become what the detector is told, the same live and offline.

A model call that asked for tools is a turn: its calls are observed, then the turn is closed (`end_turn`). A call that
paused (a server tool, `pause_turn`) closes a turn without calls. A call that answered (any other known stop reason)
is not a turn of its own: it ends the run (`end_run`), so the closing answer never breaks a streak that goes on in the
next run of the conversation. The agent loop feeds its detector this way as it goes; the run rebuilder
(`looptrace detect`, `watch`) replays a stored run through `feed_turn`, so both count the same turns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .types import Anomaly, FedCall

# Stop reasons after which the run goes on: Anthropic's tool_use and pause_turn, the GenAI finish reason tool_calls.
CONTINUING_STOP_REASONS = frozenset({"tool_use", "tool_calls", "pause_turn"})


class _Fed(Protocol):
    def observe(self, call: FedCall) -> list[Anomaly]: ...
    def end_turn(self, turn: int, text: str | None = None) -> list[Anomaly]: ...
    def end_run(self, stop_reason: str | None, final_text: str | None, turn: int) -> list[Anomaly]: ...


def answers(stop_reason: str | None, has_calls: bool) -> bool:
    """Whether a model call with this stop reason ended its run with an answer (told as `end_run`, not `end_turn`)."""
    return not has_calls and stop_reason is not None and stop_reason.strip().lower() not in CONTINUING_STOP_REASONS


def feed_turn(detector: _Fed, turn: int, calls: Iterable[FedCall], text: str | None,
              stop_reason: str | None) -> list[Anomaly]:
    """Tell the detector one model call of a stored run: its tool calls and the turn's end, or the run's end when it
    answered. Returns what the detector reported."""
    fired: list[Anomaly] = []
    has_calls = False
    for call in calls:
        has_calls = True
        fired += detector.observe(call)
    if answers(stop_reason, has_calls):
        return fired + detector.end_run(stop_reason, text, turn)
    return fired + detector.end_turn(turn, text)
