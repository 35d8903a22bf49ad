"""What a run's spans hand on beyond themselves, as protocols the layers above implement: where an anomaly report goes
(``AnomalySink``, implemented by ``alerts.AnomalySinks``) and a trace's link in a backend's UI (``TraceLinks``,
implemented by ``langfuse.api.TraceLinks``).

The spans are made here, in ``recording``; the alert channels, Langfuse's client and the exporters sit above it and
are handed in by whoever builds the telemetry (``agent_telemetry``, ``configure()``). So ``recording`` names only
what it calls, and imports none of them. Pure standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from ..detector import Anomaly, LoopCost

__all__ = ["ACTIONS", "Action", "AlertContext", "AnomalySink", "TraceLinks"]

Action = Literal["warn", "nudge", "ask", "stop"]
"""What the policy did about an anomaly: alert only, alert and send one corrective message, pause the run for a
person to say go on or stop, or end the run."""
ACTIONS: tuple[Action, ...] = ("warn", "nudge", "ask", "stop")


@dataclass(frozen=True, slots=True)
class AlertContext:
    """Where an anomaly happened, for the receivers that were not there."""

    agent: str
    trace_id: str
    span_id: str
    action: Action
    # A run `watch` assembled from several traces (a session's, or a conversation rebuilt from the history of a
    # producer with no agent span): its key, and its traces' real ids, oldest first; ``trace_id`` is the latest.
    conversation: str | None = None
    trace_ids: tuple[str, ...] = ()


class AnomalySink(Protocol):
    """Where a run's anomaly reports go besides its spans (``alerts.AnomalySinks``: the log line, the webhook, your
    callback, the Langfuse score). A sink that fails is the sink's business: the spans guard every call."""

    def send(self, anomaly: Anomaly, context: AlertContext) -> None:
        """One report of one anomaly, with where it happened and what the policy did."""
        ...

    def run_ended(self, trace_id: str, span_id: str, loop_cost_by_type: Mapping[str, LoopCost]) -> None:
        """A run ended; ``loop_cost_by_type`` is what its loops cost, per anomaly type (empty: it never looped)."""
        ...


class TraceLinks(Protocol):
    """Links to traces in a backend's UI (Langfuse's: ``langfuse.api.TraceLinks``)."""

    def url(self, trace_id: str) -> str | None:
        """The trace's URL, or None when it cannot be known (never an error, never a long wait)."""
        ...
