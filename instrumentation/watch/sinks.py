"""Watch's anomaly fan-out, assembled in one place: the alert sinks (log line, webhook) and Langfuse scores.

The same sinks an agent's own anomalies reach (alerts.py): a structured log line, the webhook, and a ``loop_anomaly``
score on the trace when Langfuse keys are set. Built from settings already read, never from the environment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..alerts import AlertContext, Alerts
from ..readers import SESSION_PREFIX

if TYPE_CHECKING:
    from ..langfuse import LangfuseScores
    from ..settings import Settings


class ScoreSink(Protocol):
    """What the fan-out needs of `langfuse.LangfuseScores`: a score per anomaly, and a close that sends the rest."""

    def alert_callback(self, anomaly: Any, context: AlertContext) -> None: ...

    def close(self, timeout_s: float) -> object: ...


def langfuse_scores(settings: Settings) -> LangfuseScores | None:
    """Scores for the Langfuse project ``settings`` names, filed in the environment its resource attributes name
    (as the agent's own are); None without Langfuse keys."""
    if settings.langfuse is None:
        return None
    from ..langfuse import LangfuseScores

    return LangfuseScores.from_settings(settings.langfuse, resource=settings.resource_attributes)


def watch_alerts(webhook_url: str | None, scores: ScoreSink | None) -> Alerts:
    """The alert sinks: the log line always, the webhook when ``webhook_url`` is set, and ``scores`` when given."""
    # An empty URL, not None: Alerts would look the webhook up in the environment itself.
    return Alerts(webhook_url=webhook_url or "", callback=trace_scores(scores) if scores is not None else None)


def trace_scores(scores: ScoreSink) -> Callable[[Any, AlertContext], None]:
    """Langfuse scores for runs that are traces; a run assembled from a session has no one trace to score."""
    def score(anomaly: Any, context: AlertContext) -> None:
        if not context.trace_id.startswith(SESSION_PREFIX):
            scores.alert_callback(anomaly, context)
    return score
