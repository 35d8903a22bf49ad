"""LoopMetrics against a private MeterProvider: names, units, attributes, bucket boundaries, error.type on failure."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from looptrace.instrumentation.recording.metrics import (
    OPERATION_DURATION_BUCKETS,
    TOKEN_USAGE_BUCKETS,
    LoopMetrics,
    prometheus_reader,
)


@pytest.fixture
def recorded():
    """A LoopMetrics on its own provider, and a function returning {metric name: metric} of what it recorded."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    loop_metrics = LoopMetrics(meter_provider=provider)

    def collect():
        data = reader.get_metrics_data()
        return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}

    yield loop_metrics, collect
    provider.shutdown()


def points(metric):
    return list(metric.data.data_points)


def test_chat_records_token_usage_per_token_type_with_the_conventions_buckets(recorded):
    loop_metrics, collect = recorded
    loop_metrics.record_chat(
        agent="support", request_model="claude-sonnet-4-5", response_model="claude-sonnet-4-5-20250929",
        input_tokens=1200, output_tokens=80, duration_s=2.5, server_address="api.anthropic.com",
    )

    usage = collect()["gen_ai.client.token.usage"]
    assert usage.unit == "{token}"
    by_type = {p.attributes["gen_ai.token.type"]: p for p in points(usage)}
    assert set(by_type) == {"input", "output"}
    assert by_type["input"].sum == 1200 and by_type["output"].sum == 80
    assert dict(by_type["input"].attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.response.model": "claude-sonnet-4-5-20250929",
        "gen_ai.agent.name": "support",
        "server.address": "api.anthropic.com",
        "gen_ai.token.type": "input",
    }
    assert tuple(by_type["input"].explicit_bounds) == tuple(TOKEN_USAGE_BUCKETS)
    assert TOKEN_USAGE_BUCKETS[:3] == (1, 4, 16) and TOKEN_USAGE_BUCKETS[-1] == 67108864


def test_chat_duration_has_seconds_and_the_conventions_buckets_and_no_token_type(recorded):
    loop_metrics, collect = recorded
    loop_metrics.record_chat(
        agent="support", request_model="claude-sonnet-4-5", response_model=None,
        input_tokens=10, output_tokens=5, duration_s=0.7,
    )

    duration = collect()["gen_ai.client.operation.duration"]
    assert duration.unit == "s"
    (point,) = points(duration)
    assert point.sum == pytest.approx(0.7)
    assert tuple(point.explicit_bounds) == tuple(OPERATION_DURATION_BUCKETS)
    assert OPERATION_DURATION_BUCKETS[0] == 0.01 and OPERATION_DURATION_BUCKETS[-1] == 81.92
    assert "gen_ai.token.type" not in point.attributes
    assert "gen_ai.response.model" not in point.attributes  # None is left out, not recorded as an empty string
    assert "error.type" not in point.attributes


def test_a_failed_chat_records_error_type_on_the_duration_and_no_tokens(recorded):
    loop_metrics, collect = recorded
    loop_metrics.record_chat(
        agent="support", request_model="claude-sonnet-4-5", response_model=None,
        input_tokens=0, output_tokens=0, duration_s=30.0, error_type="APITimeoutError",
    )

    collected = collect()
    (point,) = points(collected["gen_ai.client.operation.duration"])
    assert point.attributes["error.type"] == "APITimeoutError"
    assert point.attributes["gen_ai.operation.name"] == "chat"
    assert "gen_ai.client.token.usage" not in collected


def test_cost_is_a_usd_counter_by_agent_and_model(recorded):
    loop_metrics, collect = recorded
    for cost in (0.004, 0.006):
        loop_metrics.record_chat(
            agent="support", request_model="claude-haiku-4-5", response_model="claude-haiku-4-5",
            input_tokens=100, output_tokens=10, duration_s=0.3, cost_usd=cost,
        )
    loop_metrics.record_chat(  # no price known: nothing is added
        agent="support", request_model="unpriced", response_model=None, input_tokens=1, output_tokens=1, duration_s=0.1,
    )

    cost = collect()["looptrace.cost"]
    assert cost.unit == "usd"
    assert cost.data.is_monotonic
    (point,) = points(cost)
    assert point.value == pytest.approx(0.010)
    assert dict(point.attributes) == {"gen_ai.agent.name": "support", "gen_ai.request.model": "claude-haiku-4-5"}


def test_tool_calls_count_by_tool_and_outcome_and_time_each_call(recorded):
    loop_metrics, collect = recorded
    loop_metrics.record_tool(agent="support", tool="search", outcome="ok", duration_s=0.2)
    loop_metrics.record_tool(agent="support", tool="search", outcome="ok", duration_s=0.4)
    loop_metrics.record_tool(agent="support", tool="search", outcome="timeout", duration_s=30.0)

    collected = collect()
    calls = collected["looptrace.tool.calls"]
    assert calls.unit == "{call}" and calls.data.is_monotonic
    counts = {p.attributes["looptrace.tool.outcome"]: p.value for p in points(calls)}
    assert counts == {"ok": 2, "timeout": 1}
    assert all(p.attributes["gen_ai.tool.name"] == "search" for p in points(calls))

    duration = collected["looptrace.tool.duration"]
    assert duration.unit == "s"
    ok = next(p for p in points(duration) if p.attributes["looptrace.tool.outcome"] == "ok")
    assert ok.count == 2 and ok.sum == pytest.approx(0.6)


def test_runs_count_by_status_and_turns_are_a_histogram_per_run(recorded):
    loop_metrics, collect = recorded
    loop_metrics.record_run(agent="support", status="done", turns=3)
    loop_metrics.record_run(agent="support", status="max_turns", turns=10)

    collected = collect()
    runs = collected["looptrace.runs"]
    assert runs.unit == "{run}"
    assert {p.attributes["looptrace.run.status"]: p.value for p in points(runs)} == {"done": 1, "max_turns": 1}
    assert all(p.attributes["gen_ai.agent.name"] == "support" for p in points(runs))

    turns = collected["looptrace.turns"]
    assert turns.unit == "{turn}"
    (point,) = points(turns)
    assert point.count == 2 and point.sum == 13
    assert dict(point.attributes) == {"gen_ai.agent.name": "support"}


def test_anomalies_count_by_type_tool_and_agent_and_omit_a_missing_tool(recorded):
    loop_metrics, collect = recorded
    loop_metrics.record_anomaly(agent="support", type="repeated_call", tool="search")
    loop_metrics.record_anomaly(agent="support", type="ignored_error", tool=None)

    anomalies = collect()["looptrace.anomalies"]
    assert anomalies.unit == "{anomaly}"
    by_type = {p.attributes["looptrace.anomaly.type"]: (dict(p.attributes), p.value) for p in points(anomalies)}
    assert by_type == {
        "repeated_call": (
            {"gen_ai.agent.name": "support", "looptrace.anomaly.type": "repeated_call", "gen_ai.tool.name": "search"}, 1
        ),
        "ignored_error": ({"gen_ai.agent.name": "support", "looptrace.anomaly.type": "ignored_error"}, 1),
    }


def test_the_meter_is_named_looptrace():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    LoopMetrics(meter_provider=provider).record_run(agent="a", status="done", turns=1)
    (scope_metrics,) = reader.get_metrics_data().resource_metrics[0].scope_metrics
    assert scope_metrics.scope.name == "looptrace"
    provider.shutdown()


def test_without_an_sdk_every_method_is_a_silent_no_op():
    from opentelemetry.metrics import NoOpMeterProvider

    loop_metrics = LoopMetrics(meter_provider=NoOpMeterProvider())
    loop_metrics.record_chat(agent="a", request_model="m", response_model=None, input_tokens=1, output_tokens=1,
                             duration_s=0.1, cost_usd=0.1)
    loop_metrics.record_tool(agent="a", tool="t", outcome="ok", duration_s=0.1)
    loop_metrics.record_run(agent="a", status="done", turns=1)
    loop_metrics.record_anomaly(agent="a", type="repeated_call", tool=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_reader_serves_the_providers_metrics_and_stops_with_it():
    port = free_port()
    provider = MeterProvider(metric_readers=[prometheus_reader(port)])
    LoopMetrics(meter_provider=provider).record_run(agent="support", status="done", turns=2)

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'looptrace_runs_total{gen_ai_agent_name="support"' in body
    assert "looptrace_turns_bucket{" in body
    assert "python_gc_objects_collected_total" not in body  # a private registry: nothing from the global one

    provider.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_prometheus_reader_says_which_port_is_taken():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port}.*LOOPTRACE_PROMETHEUS_PORT"):
            prometheus_reader(port)


def test_server_port_is_recorded_beside_the_server_address(recorded):
    # Conditionally required by the conventions wherever server.address is set.
    loop_metrics, collect = recorded
    loop_metrics.record_chat(agent="support", request_model="claude-haiku-4-5", response_model=None, input_tokens=1,
                             output_tokens=1, duration_s=0.1, server_address="proxy.internal", server_port=8443)
    [point] = points(collect()["gen_ai.client.operation.duration"])
    assert (point.attributes["server.address"], point.attributes["server.port"]) == ("proxy.internal", 8443)


def test_a_run_against_a_server_records_its_port_on_the_client_metrics():
    from fakes.messages_api import FakeMessagesAPI

    from looptrace.cli.demo import equipment_script
    from looptrace.runtime import Agent, AnthropicModel

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with FakeMessagesAPI(equipment_script()[-1:]) as api:
        model = AnthropicModel(api_key="test-key", base_url=api.url)
        Agent("claude-sonnet-5-5", client=model, meter_provider=provider).run("x")
        port = int(api.url.rsplit(":", 1)[1].split("/")[0])
    data = reader.get_metrics_data()
    duration = next(m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                    if m.name == "gen_ai.client.operation.duration")
    [point] = points(duration)
    assert (point.attributes["server.address"], point.attributes["server.port"]) == ("127.0.0.1", port)
    provider.shutdown()
