"""The loop guard as LangChain `create_agent` middleware, driven by LangChain's own fake chat model: it nudges and
stops at the turns looptrace's Agent does on the same script, leaves progress alone, catches a cycle, and its alert
reaches every sink once."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain.agents")

import guard_scenarios as gs
from fakes.langfuse_api import FakeLangfuse
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool, ToolException

from looptrace.guards import LoopGuardMiddleware
from looptrace.instrumentation.offline.trace_detect import detect_spans


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's fake chat model, replaying AIMessages (tool calls included), with the tools bound as a no-op."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def scripted_model(scenario: gs.Scenario) -> ToolCallingFakeModel:
    usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    replies = [AIMessage("", tool_calls=[{"name": name, "args": args, "id": gs.call_id(n, i)}
                                         for i, (name, args) in enumerate(turn)], usage_metadata=usage)
               for n, turn in enumerate(scenario.turns, start=1)]
    replies.append(AIMessage(scenario.final, usage_metadata=usage))
    return ToolCallingFakeModel(messages=iter(replies))


def langchain_tools(scenario: gs.Scenario) -> list[StructuredTool]:
    """The scenario's tools as LangChain tools; a failure is a ToolException, which LangChain hands the model."""

    def as_tool(function: Any) -> StructuredTool:
        def run(**arguments: Any) -> str:
            try:
                return function(**arguments)
            except Exception as exc:
                raise ToolException(str(exc)) from exc

        return StructuredTool.from_function(run, name=function.__name__, description=function.__doc__,
                                            args_schema=_schema(function), handle_tool_error=True)

    return [as_tool(f) for f in scenario.tools().values()]


def _schema(function: Any) -> dict[str, Any]:
    [argument] = [name for name in function.__annotations__ if name != "return"]
    return {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument],
            "title": function.__name__, "description": function.__doc__}


def run_guarded(scenario: gs.Scenario, **options: Any) -> tuple[LoopGuardMiddleware, dict[str, Any]]:
    guard = LoopGuardMiddleware(**options)
    agent = create_agent(scripted_model(scenario), langchain_tools(scenario), middleware=[guard])
    state = agent.invoke({"messages": [HumanMessage("task")]})
    return guard, state


def model_calls(state: dict[str, Any]) -> int:
    return sum(1 for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls)


@pytest.fixture
def quiet() -> dict[str, Any]:
    """No telemetry beyond an in-memory provider, no log lines."""
    from opentelemetry.sdk.trace import TracerProvider

    from looptrace.instrumentation.alerts import Alerts

    return {"tracer_provider": TracerProvider(), "alerts": Alerts(log_warnings=False)}


def test_identical_failing_calls_are_nudged_then_stopped_at_the_agents_turns(quiet):
    guard, state = run_guarded(gs.FAILING_LOOP, **quiet)
    expected = gs.agent_actions(gs.FAILING_LOOP)
    assert expected == [(3, "nudge", "repeated_call"), (4, "stop", "repeated_call")]
    assert guard.guard.last_run.actions == expected
    assert model_calls(state) == 4  # the model was not asked again after the stop
    nudge_at = next(i for i, m in enumerate(state["messages"]) if isinstance(m, HumanMessage) and "looptrace" in m.text)
    assert all(isinstance(m, ToolMessage) for m in state["messages"][nudge_at - 1:nudge_at])  # after turn 3's result
    assert sum(isinstance(m, ToolMessage) for m in state["messages"][:nudge_at]) == 3
    assert "run stopped" in state["messages"][-1].text


def test_a_polling_loop_that_makes_progress_is_left_alone(quiet):
    guard, state = run_guarded(gs.POLLING, **quiet)
    assert gs.agent_actions(gs.POLLING) == [] == guard.guard.last_run.actions
    assert state["messages"][-1].text == gs.POLLING.final


def test_an_a_b_a_b_cycle_is_caught_as_the_agent_catches_it(quiet):
    guard, _ = run_guarded(gs.CYCLE, **quiet)
    expected = gs.agent_actions(gs.CYCLE)
    assert [kind for _, _, kind in expected][:1] == ["cycle"]
    assert guard.guard.last_run.actions == expected


def test_the_alert_reaches_webhook_metric_and_langfuse_once_and_detect_agrees(spans):
    # One report (stop at once): the metric counts reports, as the Agent's does (a nudge then a stop is two).
    webhook = gs.Webhook()
    with FakeLangfuse() as langfuse:
        sinks = gs.Sinks(webhook, langfuse, spans.provider, spans.exporter)
        guard, _ = run_guarded(gs.FAILING_LOOP, on_anomaly="stop", **sinks.guard_options())
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
    # The stored trace says what the guard said live.
    [verdict] = list(detect_spans(gs.as_records(spans.all)))
    assert [(a.type, a.turn) for a in verdict.anomalies] == [(a.type, a.turn) for a in run.anomalies.values()]
    root = spans.one("invoke_agent")
    assert root.attributes["looptrace.run.status"] == "stopped_by_detector"
    assert len(spans.named("execute_tool")) == 3


def test_token_usage_is_recorded_per_model_call(quiet):
    guard, _ = run_guarded(gs.POLLING, **quiet)
    run = guard.guard.last_run
    assert [(c.turn, c.usage.input_tokens, c.usage.output_tokens) for c in run.model_calls] == [
        (n, 10, 5) for n in range(1, 8)]
    assert run.usage.input_tokens == 70


@pytest.mark.parametrize("scenario", [gs.FAILING_LOOP, gs.CYCLE], ids=lambda scenario: scenario.name)
def test_the_guard_and_the_agent_react_alike_through_one_run_monitor(quiet, monkeypatch, scenario):
    # Both loops go through the same RunMonitor: the same reactions at the same turns (nudges, stops, each anomaly
    # with its streak, count and the cost of its loop so far), and the same loop cost for the run.
    with gs.monitored(monkeypatch) as seen:
        gs.agent_actions(scenario)
        guard, _ = run_guarded(scenario, model=gs.MODEL, **quiet)
    agent_reactions, guard_reactions = seen.runs()
    assert agent_reactions and guard_reactions == agent_reactions
    assert gs.cost_key(guard.guard.last_run.monitor.loop_cost) == gs.agent_loop_cost(scenario) is not None
