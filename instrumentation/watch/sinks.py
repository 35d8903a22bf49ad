"""Watch's anomaly sinks: the same fan-out an agent's own anomalies reach (``alerts.AnomalySinks``), from settings.

A structured log line, the webhook, and a ``loop_anomaly`` score on the trace when Langfuse keys are set (a run watch
assembled from several traces, a session's or a conversation's, scores the latest of them, where the anomaly was
seen). Built from settings already read, never from the environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..alerts import Alerts, AnomalySinks

if TYPE_CHECKING:
    from ..langfuse.scores import LangfuseScores
    from ..settings import Settings


def langfuse_scores(settings: Settings) -> LangfuseScores | None:
    """Scores for the Langfuse project ``settings`` names, filed in the environment its resource attributes name
    (as the agent's own are); None without Langfuse keys."""
    if settings.langfuse is None:
        return None
    from ..langfuse.scores import LangfuseScores

    return LangfuseScores.from_settings(settings.langfuse, resource=settings.resource_attributes)


def watch_sinks(webhook_url: str | None, scores: LangfuseScores | None) -> AnomalySinks:
    """The log line always, the webhook when ``webhook_url`` is set, and ``scores`` when given."""
    return AnomalySinks(alerts=Alerts(webhook_url=webhook_url), scores=scores)
