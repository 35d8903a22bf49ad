"""What a loop cost, on every sink: a scripted loop of known token usage gives the exact tokens and USD on the result,
the span event, the root span, the log line, the webhook, the metric and `looptrace detect` (the Langfuse scores are
checked in test_anomaly_sinks.py, `watch` in test_watch.py); and the loop budget stops a run at the first turn its
loop passes it.

Every response of the scripted model uses 1,000 uncached input tokens, 2,000 cache reads, 500 cache writes and 100
output tokens. claude-sonnet-4-5 costs $3 / $15 a million, cache reads $0.30 and 5-minute writes $3.75: $0.006975 a
turn, and 3,500 input tokens (cache included) and 100 output tokens.
"""

from __future__ import annotations

import json

import pytest
from fakes.webhook import WebhookReceiver as Webhook
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from looptrace import Agent, Limits, ScriptedModel, tool
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import LoopCost, LoopDetector, ToolCall, TurnUsage
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.tracefile.write import OTLPJsonFileExporter
from looptrace.runtime.result import RunStatus
from looptrace.testing import capture_logs

MODEL = "claude-sonnet-4-5"
USAGE = {"input_tokens": 1000, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 500,
         "output_tokens": 100}
PER_TURN_USD = (1000 * 3 + 2000 * 0.3 + 500 * 3.75 + 100 * 15) / 1e6  # 0.006975
PER_TURN_INPUT, PER_TURN_OUTPUT = 3500, 100


@tool
def search(query: str) -> str:
    """Search the catalogue.

    Args:
        query: what to look for.
    """
    return "no results"


def looping(turns: int, *, answer: bool = True) -> ScriptedModel:
    """The same search `turns` times (the same result each time), then an answer."""
    calls = [{"content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "search", "input": {"query": "osaka"}}],
              "stop_reason": "tool_use", "usage": USAGE} for n in range(turns)]
    end = [{"content": [{"type": "text", "text": "Nothing found."}], "stop_reason": "end_turn", "usage": USAGE}]
    return ScriptedModel(calls + (end if answer else []))


def expected_cost(turns: int) -> dict:
    return {"since_turn": 1, "turns": turns, "input_tokens": PER_TURN_INPUT * turns,
            "output_tokens": PER_TURN_OUTPUT * turns, "total_tokens": (PER_TURN_INPUT + PER_TURN_OUTPUT) * turns,
            "usd": pytest.approx(PER_TURN_USD * turns, abs=1e-9), "unpriced": None}


def without_seconds(cost: LoopCost | dict) -> dict:
    data = dict(cost.to_dict() if isinstance(cost, LoopCost) else cost)
    assert data.pop("seconds") is not None  # the wall time is there (its value is the clock's)
    return data


def test_every_anomaly_on_the_result_carries_its_loops_tokens_usd_turns_and_time():
    result = Agent(MODEL, tools=[search], client=looping(5), on_anomaly="warn").run("find it")
    [anomaly] = result.anomalies
    assert anomaly.count == 5
    assert without_seconds(anomaly.cost) == expected_cost(5)  # from the streak's first turn, not where it fired
    assert anomaly.cost.seconds >= 0
    assert result.to_dict()["anomalies"][0]["cost"]["usd"] == pytest.approx(5 * PER_TURN_USD)
    # the run's loop cost: the looping turns, each once; the answer after the loop is no part of it
    assert (result.loop_cost.turns, result.loop_cost.total_tokens) == (5, 5 * 3600)
    assert result.loop_cost.usd == pytest.approx(5 * PER_TURN_USD)
    assert result.cost_usd == pytest.approx(6 * PER_TURN_USD)


def test_the_span_event_carries_the_cost_when_the_loop_was_caught_and_the_root_the_runs_total(spans):
    Agent(MODEL, tools=[search], client=looping(5), on_anomaly="warn", tracer_provider=spans.provider).run("go")
    [event] = [e for turn in spans.named("turn") for e in turn.events if e.name == sc.ANOMALY_EVENT]
    attributes = dict(event.attributes)
    assert (attributes[sc.ANOMALY_TURNS], attributes[sc.ANOMALY_SINCE_TURN]) == (3, 1)  # reported at turn 3
    assert (attributes[sc.ANOMALY_INPUT_TOKENS], attributes[sc.ANOMALY_OUTPUT_TOKENS],
            attributes[sc.ANOMALY_TOTAL_TOKENS]) == (3 * 3500, 3 * 100, 3 * 3600)
    assert attributes[sc.ANOMALY_COST_USD] == pytest.approx(3 * PER_TURN_USD)
    assert attributes[sc.ANOMALY_DURATION_S] >= 0
    root = spans.one("invoke_agent").attributes
    assert (root[sc.RUN_LOOP_TURNS], root[sc.RUN_LOOP_TOTAL_TOKENS]) == (5, 5 * 3600)
    assert root[sc.RUN_LOOP_COST_USD] == pytest.approx(5 * PER_TURN_USD)
    assert sc.SESSION_LOOP_COST_USD not in root  # no session: the run is all there is


def test_the_log_line_says_what_the_loop_cost():
    with capture_logs() as logs:
        Agent(MODEL, tools=[search], client=looping(3), on_anomaly="warn").run("go")
    [line] = [entry for entry in logs if entry.get("event") == "loop_anomaly"]
    assert (line["loop_turns"], line["loop_input_tokens"], line["loop_output_tokens"], line["loop_total_tokens"]) == (
        3, 10_500, 300, 10_800)
    assert line["loop_cost_usd"] == pytest.approx(0.020925)
    assert line["loop_seconds"] >= 0




def test_the_webhook_text_says_how_long_it_has_looped_and_what_it_cost_so_far():
    webhook = Webhook()
    try:
        alerts = Alerts(webhook_url=webhook.url, log_warnings=False)
        Agent(MODEL, tools=[search], client=looping(4), on_anomaly="warn", alerts=alerts).run("go")
        alerts.wait(10.0)
    finally:
        webhook.close()
    [post] = webhook.received
    assert "looping for 3 turns, 10,800 tokens, $0.0209 so far" in post["text"]
    cost = post["anomaly"]["cost"]
    assert without_seconds(cost) == expected_cost(3)


def test_the_loop_cost_metric_counts_each_looping_turn_once_by_type_and_agent():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    Agent(MODEL, tools=[search], client=looping(5), on_anomaly="warn", name="support",
          meter_provider=provider).run("go")
    points = [(dict(point.attributes), point.value, metric.unit)
              for resource in reader.get_metrics_data().resource_metrics for scope in resource.scope_metrics
              for metric in scope.metrics if metric.name == sc.METRIC_LOOP_COST for point in metric.data.data_points]
    [(attributes, value, unit)] = points
    assert attributes == {sc.GEN_AI_AGENT_NAME: "support", sc.ANOMALY_TYPE: "repeated_call"} and unit == "usd"
    assert value == pytest.approx(5 * PER_TURN_USD)


def test_detect_reads_the_same_cost_from_the_stored_spans(tmp_path, capsys):
    from looptrace.cli.trace_commands import main as trace_commands

    path = tmp_path / "traces.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter(path)))
    live = Agent(MODEL, tools=[search], client=looping(4), on_anomaly="warn", tracer_provider=provider).run("go")
    provider.shutdown()
    assert trace_commands(["detect", "--json", str(path)]) == 1
    [verdict] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [anomaly] = verdict["anomalies"]
    assert without_seconds(anomaly["cost"]) == expected_cost(4) == without_seconds(live.anomalies[0].cost)
    assert verdict["loop_cost"]["usd"] == pytest.approx(4 * PER_TURN_USD)

    assert trace_commands(["detect", str(path)]) == 1
    text = capsys.readouterr().out
    assert "repeated_call search x4 (4 turns, 14,400 tokens, $0.0279)" in text
    assert "1 anomaly (loops cost 4 turns, 14,400 tokens, $0.0279)" in text


def test_a_model_without_a_price_keeps_its_tokens_and_says_why_it_has_no_usd(tmp_path, capsys):
    result = Agent("claude-experimental-9", tools=[search], client=looping(3), on_anomaly="warn").run("go")
    cost = result.anomalies[0].cost
    assert (cost.turns, cost.input_tokens, cost.output_tokens, cost.usd) == (3, 10_500, 300, None)
    assert cost.unpriced == "no price for model 'claude-experimental-9'"

    # offline alike: the stored calls name a model the table does not know
    detector = LoopDetector()
    for turn in (1, 2, 3):
        from looptrace.instrumentation.offline.span_usage import model_call_usage

        usage = model_call_usage({sc.GEN_AI_REQUEST_MODEL: "gpt-9", sc.GEN_AI_USAGE_INPUT_TOKENS: 50,
                                  sc.GEN_AI_USAGE_OUTPUT_TOKENS: 5}, turn * 10**9, turn * 10**9 + 10**8)
        detector.record_usage(turn, usage)
        detector.observe(ToolCall(turn=turn, tool="search", arguments={"q": "x"}, result="none"))
        fired = detector.end_turn(turn)
    assert (fired[0].cost.total_tokens, fired[0].cost.usd) == (165, None)
    assert fired[0].cost.unpriced == "no price for model 'gpt-9' in the price table"
    assert fired[0].cost.seconds == pytest.approx(2.1)


def test_a_loop_that_goes_on_across_the_runs_of_a_session_accumulates():
    @tool
    def book(flight: str) -> str:
        """Book a flight."""
        raise RuntimeError("not enough seats")

    def failing_twice() -> list[dict]:
        call = [{"content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "book", "input": {"flight": "HAT1"}}],
                 "stop_reason": "tool_use", "usage": USAGE} for n in range(2)]
        return call + [{"content": [{"type": "text", "text": "Could not book HAT1."}], "stop_reason": "end_turn",
                        "usage": USAGE}]

    agent = Agent(MODEL, tools=[book], client=ScriptedModel(failing_twice() * 2), on_anomaly="warn")
    first = agent.run("book HAT1", session_id="conversation-1")
    second = agent.run("try again", session_id="conversation-1")
    assert first.anomalies == []  # two failures: no loop yet
    [anomaly] = second.anomalies
    # the streak began in the first run: its two failures and its answer count, then this run's two failures
    assert anomaly.cost.since_turn == 1 and anomaly.cost.turns == 5
    assert anomaly.cost.usd == pytest.approx(5 * PER_TURN_USD)
    assert second.session_loop_cost.usd == pytest.approx(5 * PER_TURN_USD)


@pytest.mark.parametrize("turns_within", [1, 2, 4])
def test_the_loop_budget_stops_the_run_at_the_first_turn_its_loop_passes_it(turns_within):
    # A budget between what `turns_within + 2` and `turns_within + 3` looping turns cost: the loop is caught at turn
    # 3, and must stop exactly when its cost first exceeds the budget, whatever the policy says (warn here).
    budget = PER_TURN_USD * (turns_within + 2.5)
    agent = Agent(MODEL, tools=[search], client=looping(12), on_anomaly="warn",
                  limits=Limits(max_turns=20, max_loop_cost_usd=budget))
    result = agent.run("find it")
    stop_turn = turns_within + 3
    assert result.status is RunStatus.LOOP_BUDGET and result.turns == stop_turn
    [anomaly] = result.anomalies
    assert anomaly.turn == stop_turn and anomaly.cost.usd > budget
    assert anomaly.cost.usd - PER_TURN_USD <= budget  # a turn earlier it was still within


def test_a_budget_the_loop_passes_when_it_is_caught_stops_it_there():
    result = Agent(MODEL, tools=[search], client=looping(12), on_anomaly="warn",
                   limits=Limits(max_loop_cost_usd=0.01)).run("find it")
    assert (result.status, result.turns) == (RunStatus.LOOP_BUDGET, 3)  # caught at turn 3, already past $0.01


def test_a_loop_budget_needs_a_price_and_the_detector():
    with pytest.raises(ValueError, match="max_loop_cost_usd needs"):
        Agent("claude-experimental-9", limits=Limits(max_loop_cost_usd=1.0))
    with pytest.raises(ValueError, match="max_loop_cost_usd needs"):
        Agent(MODEL, detector=False, limits=Limits(max_loop_cost_usd=1.0))
    with pytest.raises(ValueError, match="max_loop_cost_usd"):
        Limits(max_loop_cost_usd=0)


def test_the_ledger_stays_bounded_on_a_long_run():
    detector = LoopDetector()
    for turn in range(1, 2001):
        detector.record_usage(turn, TurnUsage(10, 1, usd=0.001, started=float(turn), ended=turn + 0.5))
        detector.observe(ToolCall(turn=turn, tool="search", arguments={"q": turn % 7}, result="r"))
        detector.end_turn(turn)
    sizes = detector.container_sizes()
    assert sizes["cost_marks"] <= 256 and sizes["cost_anchors"] <= 2 * detector.config.max_kept_anomalies


def test_a_langfuse_generation_without_span_attributes_is_priced_from_its_usage_details():
    # What the Langfuse SDK's own observations hold: the model and usageDetails in Langfuse's names (input without
    # the cache), read by `looptrace detect --langfuse` into the conventions' counts.
    from looptrace.instrumentation.langfuse.observations import observation_span
    from looptrace.instrumentation.offline.span_usage import model_call_usage

    span = observation_span({"id": "obs1", "traceId": "t" * 32, "type": "GENERATION", "name": "claude",
                             "startTime": "2026-11-30T10:00:00.000Z", "endTime": "2026-11-30T10:00:01.500Z",
                             "model": MODEL, "usageDetails": {"input": 1000, "output": 100, "input_cache_read": 2000,
                                                              "input_cache_creation": 500}})
    usage = model_call_usage(span.attributes, span.start_ns, span.end_ns)
    assert (usage.input_tokens, usage.output_tokens) == (PER_TURN_INPUT, PER_TURN_OUTPUT)
    assert usage.usd == pytest.approx(PER_TURN_USD) and usage.ended - usage.started == pytest.approx(1.5)
