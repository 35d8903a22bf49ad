"""A streak that is nudged and then stopped is one anomaly: counted once in looptrace.anomalies and logged once as
loop_anomaly, as `watch` counts the same run; the stop is still on the turn's span and given to a callback."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from test_anomalies import MODEL, A, scenario_tools, turn_of

from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.recording import semconv as sc
from looptrace.runtime import Agent, RunStatus, ScriptedModel
from looptrace.testing import CapturedSpans, capture_logs


def anomalies_counted(reader: InMemoryMetricReader) -> float:
    return sum(p.value for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics if m.name == "looptrace.anomalies" for p in m.data.data_points)


def test_a_nudged_then_stopped_streak_is_counted_and_logged_once_per_run():
    reader = InMemoryMetricReader()
    spans = CapturedSpans()
    seen = []
    alerts = Alerts(callback=lambda anomaly, context: seen.append(context.action))
    meter_provider = MeterProvider(metric_readers=[reader])
    with capture_logs() as logs:
        for run in (1, 2):
            result = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 10), alerts=alerts,
                           meter_provider=meter_provider, tracer_provider=spans.provider).run("task")
            assert result.status is RunStatus.STOPPED_BY_DETECTOR and len(result.anomalies) == 1
            assert anomalies_counted(reader) == run  # one run, one anomaly: 1; two runs: 2
    assert [e["action"] for e in logs if e["event"] == "loop_anomaly"] == ["nudge", "nudge"]
    assert seen == ["nudge", "stop"] * 2  # the callback still learns that the run was stopped
    actions = [e.attributes[sc.ANOMALY_ACTION] for s in spans.named("turn") for e in s.events
               if e.name == sc.ANOMALY_EVENT]
    assert actions == ["nudge", "stop"] * 2
