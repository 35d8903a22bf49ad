"""An anomaly reaches the same sinks whoever set telemetry up: configure() in an application, the pipeline of its own an
Agent falls back on, or the CLI. Each sink gets it once: the Langfuse score, the webhook, the metric, the log line.

The Langfuse stand-in is a local HTTP server that speaks the OTLP ingestion and score endpoints with Basic auth; the
webhook is a local HTTP server too; the metric is scraped from the Prometheus endpoint configure() serves.
"""

from __future__ import annotations

import gc
import os
import time
import urllib.request

import pytest
from fakes.otlp_receiver import OTLPReceiver, unused_port
from fakes.webhook import WebhookReceiver as _Webhook
from opentelemetry import trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.util._once import Once

from looptrace import Agent, ScriptedModel, configure, tool
from looptrace.instrumentation.langfuse.scores import stable_score_id

PUBLIC, SECRET = "pk-lf-sinks", "sk-lf-sinks"


@tool
def reserve_equipment(item_id: str) -> str:
    """Reserve one item."""
    raise RuntimeError(f"{item_id} is out of stock")


def _failing_three_times() -> list[dict]:
    calls = [{"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "claude-sonnet-5-5",
              "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "reserve_equipment",
                           "input": {"item_id": "EQ-001"}}],
              "stop_reason": "tool_use", "usage": {"input_tokens": 100, "output_tokens": 20}} for n in range(3)]
    answer = {"id": "msg_end", "type": "message", "role": "assistant", "model": "claude-sonnet-5-5",
              "content": [{"type": "text", "text": "EQ-001 could not be reserved: it is out of stock."}],
              "stop_reason": "end_turn", "usage": {"input_tokens": 100, "output_tokens": 20}}
    return [*calls, answer]


def _anomaly_scores(langfuse) -> list[dict]:
    """The loop_anomaly scores posted (each run also gets its looped and loop_cost_usd scores)."""
    return [score for score in langfuse.scores if score["name"] == "loop_anomaly"]




def _wait_for(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def environment(monkeypatch, tmp_path):
    """A clean environment with the README's Langfuse settings and a webhook, and no global tracer provider."""
    for name in list(os.environ):
        if name.startswith(("LANGFUSE_", "OTEL_", "LOOPTRACE_", "TRACEPARENT")):
            monkeypatch.delenv(name)
    # configure() installs its provider globally, as an application's would: give it a process of its own.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER_SET_ONCE", Once())
    monkeypatch.chdir(tmp_path)
    webhook = _Webhook()
    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC)
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET)
        monkeypatch.setenv("LANGFUSE_BASE_URL", langfuse.base_url)
        monkeypatch.setenv("LOOPTRACE_ALERT_WEBHOOK", webhook.url)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        yield langfuse, webhook
    webhook.close()


def _anomaly_count(metrics_text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
               if line.startswith("looptrace_anomalies_total{") and 'anomaly_type="repeated_call"' in line)


def _expected_score(result) -> dict:
    """The body the live path posts for the run's one anomaly: what the CLI posts too (the same sinks build it).
    Three calls of 100 input and 20 output tokens at claude-sonnet-5-5's $2 / $10 per million: $0.0012."""
    [anomaly] = result.anomalies
    return {"id": stable_score_id(result.trace_id, "loop_anomaly", anomaly.type),  # deterministic: a retry updates
            "traceId": result.trace_id, "name": "loop_anomaly", "value": "repeated_call",
            "dataType": "CATEGORICAL",
            "comment": "Loop cost so far: 3 turns, 360 tokens (300 in, 60 out), $0.0012. " + anomaly.message}


def test_configure_langfuse_posts_one_score_one_webhook_and_one_metric_per_anomaly(environment):
    langfuse, webhook = environment
    port = unused_port()
    telemetry = configure(exporters="langfuse", prometheus_port=port)
    try:
        agent = Agent("claude-sonnet-5-5", tools=[reserve_equipment], client=ScriptedModel(_failing_three_times()),
                      on_anomaly="warn")
        result = agent.run("Reserve EQ-001")
        assert [a.type for a in result.anomalies] == ["repeated_call"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert _anomaly_count(response.read().decode()) == 1
        telemetry.flush()
        _wait_for(lambda: webhook.received, "the webhook post")
    finally:
        telemetry.shutdown()
    [score] = _anomaly_scores(langfuse)
    expected = _expected_score(result)
    assert {k: score[k] for k in expected} == expected
    assert set(score) - set(expected) <= {"metadata", "environment"}
    assert score["metadata"]["span_id"] == next(s.span_id for s in langfuse.spans if s.parent_span_id is None)
    assert score["metadata"]["loop_cost"] == result.anomalies[0].cost.to_dict()
    assert {k: v for k, v in score["metadata"]["loop_cost"].items() if k != "seconds"} == {
        "since_turn": 1, "turns": 3, "input_tokens": 300, "output_tokens": 60, "total_tokens": 360, "usd": 0.0012,
        "unpriced": None}
    # Beside it, as the run ends: what its loops cost, for a Langfuse alert to sum, and whether it looped at all.
    by_name = {s["name"]: s for s in langfuse.scores}
    assert (by_name["loop_cost_usd"]["value"], by_name["loop_cost_usd"]["dataType"]) == (0.0012, "NUMERIC")
    assert by_name["loop_cost_usd"]["metadata"]["anomaly_type"] == "repeated_call"
    assert (by_name["looped"]["value"], by_name["looped"]["dataType"]) == (1, "BOOLEAN")
    assert {s["traceId"] for s in langfuse.scores} == {result.trace_id}
    [post] = webhook.received
    assert (post["anomaly"]["type"], post["trace_id"]) == ("repeated_call", result.trace_id)


def test_an_agents_own_pipeline_with_only_langfuse_keys_posts_the_score_and_the_webhook(environment):
    langfuse, webhook = environment
    agent = Agent("claude-sonnet-5-5", tools=[reserve_equipment], client=ScriptedModel(_failing_three_times()),
                  on_anomaly="warn")
    result = agent.run("Reserve EQ-001")
    del agent  # the Agent goes: what its telemetry opened delivers what it holds and closes, without an exit
    gc.collect()
    _wait_for(lambda: _anomaly_scores(langfuse) and webhook.received, "the score and the webhook post")
    assert {s.trace_id for s in langfuse.wait_for_spans(1)} == {result.trace_id}  # its spans too
    [score] = _anomaly_scores(langfuse)
    expected = _expected_score(result)
    assert {k: score[k] for k in expected} == expected
    [post] = webhook.received
    assert post["anomaly"]["type"] == "repeated_call"


def test_an_agents_own_alerts_replace_the_log_and_webhook_but_keep_the_score(environment):
    from looptrace import Alerts

    langfuse, webhook = environment
    seen = []
    telemetry = configure(exporters="langfuse")
    try:
        Agent("claude-sonnet-5-5", tools=[reserve_equipment], client=ScriptedModel(_failing_three_times()),
              on_anomaly="warn", alerts=Alerts(callback=lambda anomaly, context: seen.append(anomaly.type),
                                               log_warnings=False)).run("Reserve EQ-001")
        telemetry.flush()
        # The Agent was given no telemetry: its score goes out through sinks of its own, queued off the run's thread,
        # which the telemetry configure() returned does not flush.
        _wait_for(lambda: _anomaly_scores(langfuse), "the loop_anomaly score")
    finally:
        telemetry.shutdown()
    assert seen == ["repeated_call"]
    assert [s["value"] for s in _anomaly_scores(langfuse)] == ["repeated_call"]
    assert webhook.received == []  # the Agent's alerts name no webhook


# --- the wiring: the run is handed its sinks and its trace link by the telemetry it records through ---------------


def test_an_agent_handed_the_telemetry_configure_returned_reports_to_its_sinks_and_links_its_trace(environment):
    langfuse, webhook = environment
    telemetry = configure(exporters="langfuse", set_global=False)
    try:
        agent = Agent("claude-sonnet-5-5", tools=[reserve_equipment], client=ScriptedModel(_failing_three_times()),
                      on_anomaly="warn", telemetry=telemetry)
        result = agent.run("Reserve EQ-001")
        telemetry.flush()
        _wait_for(lambda: webhook.received, "the webhook post")
    finally:
        telemetry.shutdown()
    assert {s.trace_id for s in langfuse.wait_for_spans(1)} == {result.trace_id}
    [score] = _anomaly_scores(langfuse)
    assert {k: score[k] for k in _expected_score(result)} == _expected_score(result)
    assert result.trace_url == f"{langfuse.base_url}/project/{langfuse.project_id}/traces/{result.trace_id}"


def test_an_agent_on_the_applications_own_provider_gets_the_log_webhook_and_score_its_settings_describe(environment):
    from opentelemetry.sdk.trace import TracerProvider

    from looptrace.testing import capture_logs

    langfuse, webhook = environment
    trace.set_tracer_provider(TracerProvider())  # the application's SDK, exporting nowhere looptrace knows of
    agent = Agent("claude-sonnet-5-5", tools=[reserve_equipment], client=ScriptedModel(_failing_three_times()),
                  on_anomaly="warn")
    with capture_logs() as logs:
        result = agent.run("Reserve EQ-001")
    del agent  # what the Agent's telemetry opened (the score queue) delivers and closes as the Agent goes
    gc.collect()
    _wait_for(lambda: _anomaly_scores(langfuse) and webhook.received, "the score and the webhook post")
    assert [entry["anomaly_type"] for entry in logs if entry["event"] == "loop_anomaly"] == ["repeated_call"]
    assert [post["trace_id"] for post in webhook.received] == [result.trace_id]
    assert [(score["traceId"], score["value"]) for score in _anomaly_scores(langfuse)] == [(result.trace_id, "repeated_call")]
    assert langfuse.spans == []  # the spans went to the application's provider, not to Langfuse behind its back


def test_telemetry_and_providers_of_its_own_are_one_choice_too_many(environment):
    from looptrace.instrumentation.settings import ConfigurationError

    telemetry = configure(exporters="file", set_global=False)
    try:
        with pytest.raises(ConfigurationError, match="either the telemetry configure"):
            Agent("claude-sonnet-5-5", telemetry=telemetry, tracer_provider=telemetry.tracer_provider)
    finally:
        telemetry.shutdown()


@pytest.mark.slow
def test_a_script_on_its_own_provider_leaves_its_anomaly_score_behind_as_it_exits(environment, tmp_path):
    # No configure(), no shutdown: the score queued by the last turn still reaches Langfuse before the process ends.
    import subprocess
    import sys

    langfuse, _ = environment
    script = tmp_path / "agent_script.py"
    script.write_text(
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from test_anomaly_sinks import _failing_three_times, reserve_equipment\n"
        "from looptrace import Agent, ScriptedModel\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "agent = Agent('claude-sonnet-5-5', tools=[reserve_equipment], client=ScriptedModel(_failing_three_times()),\n"
        "              on_anomaly='warn')\n"
        "print(agent.run('Reserve EQ-001').trace_id)\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ["PYTHONPATH"]])}
    env.pop("LOOPTRACE_ALERT_WEBHOOK")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [(s["traceId"], s["value"]) for s in _anomaly_scores(langfuse)] == [(done.stdout.strip(), "repeated_call")]
