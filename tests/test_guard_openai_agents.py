"""The loop guard in the OpenAI Agents SDK (run hooks and tool guardrails), driven by a `Model` of our own that
replays scripted responses offline: it nudges and stops at the turns looptrace's Agent does on the same script,
leaves progress alone, catches a cycle, and its alert reaches every sink once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("agents")

import guard_scenarios as gs
from agents import Agent, Model, ModelResponse, RunConfig, Runner, ToolOutputGuardrailTripwireTriggered, function_tool
from agents.usage import Usage
from fakes.langfuse_api import FakeLangfuse
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from opentelemetry.sdk.trace import TracerProvider

from looptrace.guards import OpenAIAgentsGuard
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.offline.trace_detect import detect_spans


class ScriptedModel(Model):
    """The Agents SDK's model interface, answering each call with the script's next response, and keeping what it
    was sent (so a test can read what the model saw)."""

    def __init__(self, scenario: gs.Scenario) -> None:
        self.responses = [self._turn(n, turn) for n, turn in enumerate(scenario.turns, start=1)]
        self.responses.append(ModelResponse(
            output=[ResponseOutputMessage(id="msg_end", role="assistant", status="completed", type="message",
                                          content=[ResponseOutputText(text=scenario.final, type="output_text",
                                                                      annotations=[])])],
            usage=_usage(), response_id="resp_end"))
        self.inputs: list[Any] = []

    @staticmethod
    def _turn(n: int, turn: gs.Turn) -> ModelResponse:
        import json

        calls = [ResponseFunctionToolCall(type="function_call", call_id=gs.call_id(n, i), name=name,
                                          arguments=json.dumps(args), id=f"fc_{n}_{i}", status="completed")
                 for i, (name, args) in enumerate(turn)]
        return ModelResponse(output=list(calls), usage=_usage(), response_id=f"resp_{n}")

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(input)
        return self.responses.pop(0)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the script is not streamed")


def _usage() -> Usage:
    return Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)


def run_guarded(scenario: gs.Scenario, **options: Any) -> tuple[OpenAIAgentsGuard, ScriptedModel, Any]:
    guard = OpenAIAgentsGuard(**options)
    model = ScriptedModel(scenario)
    tools = guard.protect([function_tool(f) for f in scenario.tools().values()])
    agent = Agent(name="agent", instructions="Do the task.", model=model, tools=tools)
    try:
        outcome: Any = asyncio.run(Runner.run(agent, "task", hooks=guard, max_turns=20,
                                              run_config=RunConfig(tracing_disabled=True)))
    except ToolOutputGuardrailTripwireTriggered as stopped:
        outcome = stopped
    return guard, model, outcome


@pytest.fixture
def quiet() -> dict[str, Any]:
    return {"tracer_provider": TracerProvider(), "alerts": Alerts(log_warnings=False)}


def test_identical_failing_calls_are_nudged_then_stopped_at_the_agents_turns(quiet):
    guard, model, outcome = run_guarded(gs.FAILING_LOOP, **quiet)
    assert guard.guard.last_run.actions == gs.agent_actions(gs.FAILING_LOOP) == [
        (3, "nudge", "repeated_call"), (4, "stop", "repeated_call")]
    assert isinstance(outcome, ToolOutputGuardrailTripwireTriggered)  # the tripwire ends the run ...
    assert outcome.output.output_info["anomaly"]["type"] == "repeated_call"
    assert len(model.inputs) == 4  # ... before a fifth model call
    # The nudge reached the model with turn 3's result: the fourth call's input carries it.
    third_output = [item for item in model.inputs[3] if isinstance(item, dict)
                    and item.get("type") == "function_call_output"][-1]
    assert "An error occurred while running the tool" in str(third_output["output"])  # the result, then the nudge
    assert "[looptrace loop detector]" in str(third_output["output"])
    assert "[looptrace loop detector]" not in str(model.inputs[2])


def test_a_polling_loop_that_makes_progress_is_left_alone(quiet):
    guard, _, outcome = run_guarded(gs.POLLING, **quiet)
    assert gs.agent_actions(gs.POLLING) == [] == guard.guard.last_run.actions
    assert outcome.final_output == gs.POLLING.final


def test_an_a_b_a_b_cycle_is_caught_as_the_agent_catches_it(quiet):
    guard, _, _ = run_guarded(gs.CYCLE, **quiet)
    expected = gs.agent_actions(gs.CYCLE)
    assert [kind for _, _, kind in expected][:1] == ["cycle"]
    assert guard.guard.last_run.actions == expected


def test_the_alert_reaches_webhook_metric_and_langfuse_once_and_detect_agrees(spans):
    webhook = gs.Webhook()
    with FakeLangfuse() as langfuse:
        sinks = gs.Sinks(webhook, langfuse, spans.provider, spans.exporter)
        guard, _, _ = run_guarded(gs.FAILING_LOOP, on_anomaly="stop", **sinks.guard_options())
        sinks.settle()
        run = guard.guard.last_run
        assert run.actions == gs.agent_actions(gs.FAILING_LOOP, on_anomaly="stop") == [(3, "stop", "repeated_call")]
        assert [post["anomaly"]["type"] for post in webhook.received] == ["repeated_call"]
        assert [(score["traceId"], score["value"]) for score in langfuse.scores.values()
                if score["name"] == "loop_anomaly"] == [(run.trace_id, "repeated_call")]
        # What the loop cost, priced from the model calls' tokens, as on an Agent's run.
        [anomaly] = run.anomalies.values()
        assert anomaly.cost is not None and anomaly.cost.turns == 3 and anomaly.cost.total_tokens > 0
        assert {score["name"]: score["value"] for score in langfuse.scores.values()
                if score["name"] == "looped"} == {"looped": 1}
        assert [value for attributes, value in sinks.metric_points()
                if attributes["looptrace.anomaly.type"] == "repeated_call"] == [1]
    webhook.close()
    [verdict] = list(detect_spans(gs.as_records(spans.all)))
    assert [(a.type, a.turn) for a in verdict.anomalies] == [(a.type, a.turn) for a in run.anomalies.values()]
    assert spans.one("invoke_agent").attributes["looptrace.run.status"] == "stopped_by_detector"


def test_token_usage_is_recorded_per_model_call(quiet):
    guard, _, _ = run_guarded(gs.POLLING, **quiet)
    assert [(c.turn, c.usage.input_tokens, c.usage.output_tokens) for c in guard.guard.last_run.model_calls] == [
        (n, 10, 5) for n in range(1, 8)]


@pytest.mark.parametrize("scenario", [gs.FAILING_LOOP, gs.CYCLE], ids=lambda scenario: scenario.name)
def test_the_guard_and_the_agent_react_alike_through_one_run_monitor(quiet, monkeypatch, scenario):
    # Both loops go through the same RunMonitor: the same reactions at the same turns (nudges, stops, each anomaly
    # with its streak, count and the cost of its loop so far), and the same loop cost for the run.
    with gs.monitored(monkeypatch) as seen:
        gs.agent_actions(scenario)
        guard, _, _ = run_guarded(scenario, model=gs.MODEL, **quiet)
    agent_reactions, guard_reactions = seen.runs()
    assert agent_reactions and guard_reactions == agent_reactions
    assert gs.cost_key(guard.guard.last_run.monitor.loop_cost) == gs.agent_loop_cost(scenario) is not None
