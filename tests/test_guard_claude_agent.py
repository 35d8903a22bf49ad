"""The loop guard as Claude Agent SDK hooks. The hook callables are driven the way Claude Code calls them, with the
SDK's own input types (PreToolUse, then PostToolUse or PostToolUseFailure for each call, Stop at the end), and a
session that honours what they answer: it nudges and stops at the turns looptrace's Agent does on the same script,
leaves progress alone, catches a cycle, and its alert reaches every sink once.

(Claude Code itself is not run here: see docs/guards.md for what an end-to-end run against the local Messages-API
fake needs.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("claude_agent_sdk")

import guard_scenarios as gs
from claude_agent_sdk.types import (
    AssistantMessage,
    PostToolUseFailureHookInput,
    PostToolUseHookInput,
    PreToolUseHookInput,
    StopHookInput,
    TextBlock,
    ToolUseBlock,
    UserPromptSubmitHookInput,
)
from fakes.langfuse_api import FakeLangfuse
from opentelemetry.sdk.trace import TracerProvider

from looptrace.guards import ClaudeAgentGuard
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.offline.trace_detect import detect_spans

SESSION = "8d0f3c1e-session"
BASE = {"session_id": SESSION, "transcript_path": "/tmp/transcript.jsonl", "cwd": "/tmp"}


@dataclass
class Session:
    """What Claude Code did with the hooks' answers."""

    model_calls: int = 0
    context: list[tuple[int, str]] = field(default_factory=list)  # (turn, additionalContext) the model read
    stopped: str | None = None
    answer: str | None = None


async def drive(guard: ClaudeAgentGuard, scenario: gs.Scenario) -> Session:
    """Claude Code's order of hook calls for the scenario's script, honouring continue:false."""
    hooks = {event: matcher.hooks[0] for event, [matcher] in guard.hooks.items()}
    session = Session()
    tools = scenario.tools()
    await hooks["UserPromptSubmit"](UserPromptSubmitHookInput(**BASE, hook_event_name="UserPromptSubmit",
                                                              prompt="task"), None, {"signal": None})
    for n, turn in enumerate(scenario.turns, start=1):
        session.model_calls += 1
        guard.record(AssistantMessage(content=[], model=gs.MODEL, session_id=SESSION,
                                      usage={"input_tokens": 10, "output_tokens": 5}))
        for i, (name, arguments) in enumerate(turn):
            call_id = gs.call_id(n, i)
            await hooks["PreToolUse"](PreToolUseHookInput(**BASE, hook_event_name="PreToolUse", tool_name=name,
                                                          tool_input=arguments, tool_use_id=call_id),
                                      call_id, {"signal": None})
            try:
                done: Any = PostToolUseHookInput(**BASE, hook_event_name="PostToolUse", tool_name=name,
                                                 tool_input=arguments, tool_response=tools[name](**arguments),
                                                 tool_use_id=call_id)
            except Exception as exc:
                done = PostToolUseFailureHookInput(**BASE, hook_event_name="PostToolUseFailure", tool_name=name,
                                                   tool_input=arguments, tool_use_id=call_id, error=str(exc))
            answer = await hooks[done["hook_event_name"]](done, call_id, {"signal": None})
            if "additionalContext" in answer.get("hookSpecificOutput", {}):
                session.context.append((n, answer["hookSpecificOutput"]["additionalContext"]))
            if answer.get("continue_") is False:
                session.stopped = answer["stopReason"]
                return session
    session.model_calls += 1
    guard.record(AssistantMessage(content=[TextBlock(scenario.final)], model=gs.MODEL, session_id=SESSION,
                                  usage={"input_tokens": 10, "output_tokens": 5}))
    await hooks["Stop"](StopHookInput(**BASE, hook_event_name="Stop", stop_hook_active=False,
                                      last_assistant_message=scenario.final), None, {"signal": None})
    session.answer = scenario.final
    return session


def run_guarded(scenario: gs.Scenario, **options: Any) -> tuple[ClaudeAgentGuard, Session]:
    guard = ClaudeAgentGuard(**options)
    return guard, asyncio.run(drive(guard, scenario))


@pytest.fixture
def quiet() -> dict[str, Any]:
    return {"tracer_provider": TracerProvider(), "alerts": Alerts(log_warnings=False)}


def test_identical_failing_calls_are_nudged_then_stopped_at_the_agents_turns(quiet):
    guard, session = run_guarded(gs.FAILING_LOOP, **quiet)
    assert guard.guard.last_run.actions == gs.agent_actions(gs.FAILING_LOOP) == [
        (3, "nudge", "repeated_call"), (4, "stop", "repeated_call")]
    assert [turn for turn, _ in session.context] == [3]  # read with turn 3's result
    assert session.context[0][1].startswith("[looptrace loop detector]")
    assert session.model_calls == 4 and "run stopped" in (session.stopped or "")


def test_a_call_after_the_stop_is_denied_with_the_reason(quiet):
    guard, session = run_guarded(gs.FAILING_LOOP, **quiet)
    pre = guard.hooks["PreToolUse"][0].hooks[0]
    answer = asyncio.run(pre(PreToolUseHookInput(**BASE, hook_event_name="PreToolUse", tool_name="reserve",
                                                 tool_input={"item": "EQ-001"}, tool_use_id="call_late"),
                             "call_late", {"signal": None}))
    assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert answer["hookSpecificOutput"]["permissionDecisionReason"] == session.stopped


def test_a_polling_loop_that_makes_progress_is_left_alone(quiet):
    guard, session = run_guarded(gs.POLLING, **quiet)
    assert gs.agent_actions(gs.POLLING) == [] == guard.guard.last_run.actions
    assert session.answer == gs.POLLING.final and session.context == []


def test_an_a_b_a_b_cycle_is_caught_as_the_agent_catches_it(quiet):
    guard, _ = run_guarded(gs.CYCLE, **quiet)
    expected = gs.agent_actions(gs.CYCLE)
    assert [kind for _, _, kind in expected][:1] == ["cycle"]
    assert guard.guard.last_run.actions == expected


def test_the_alert_reaches_webhook_metric_and_langfuse_once_and_detect_agrees(spans):
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
        # Claude Code streams a response's tokens to the client beside the hooks, so the turn the loop is caught in
        # may not be priced yet when it fires: the cost counts the turns whose tokens had arrived.
        assert anomaly.cost is not None and anomaly.cost.since_turn == 1 and anomaly.cost.turns >= 2
        assert anomaly.cost.total_tokens > 0 and anomaly.cost.usd is not None

        assert [value for attributes, value in sinks.metric_points()
                if attributes["looptrace.anomaly.type"] == "repeated_call"] == [1]
    webhook.close()
    [verdict] = list(detect_spans(gs.as_records(spans.all)))
    assert [(a.type, a.turn) for a in verdict.anomalies] == [(a.type, a.turn) for a in run.anomalies.values()]


def test_token_usage_is_recorded_per_model_call(quiet):
    guard, _ = run_guarded(gs.POLLING, **quiet)
    calls = guard.guard.last_run.model_calls
    assert len(calls) == 7 and {(c.usage.input_tokens, c.usage.output_tokens) for c in calls} == {(10, 5)}
    assert [c.turn for c in calls] == list(range(1, 8))  # each answer's tokens in the turn it opened


def test_a_response_sent_as_one_message_per_block_is_counted_once(quiet):
    guard = ClaudeAgentGuard(**quiet)
    asyncio.run(guard.prompt_submitted(UserPromptSubmitHookInput(**BASE, hook_event_name="UserPromptSubmit",
                                                                 prompt="task"), None, {"signal": None}))
    for block in (TextBlock("Let me look."), ToolUseBlock("call_1", "read_file", {"path": "a.txt"})):
        guard.record(AssistantMessage(content=[block], model=gs.MODEL, session_id=SESSION, message_id="msg_1",
                                      usage={"input_tokens": 10, "output_tokens": 5}))
    run = guard.guard.last_run
    assert [(c.turn, c.usage.input_tokens) for c in run.model_calls] == [(1, 10)]


# ---- Claude Code itself, against the local Messages-API fake


@pytest.mark.slow
def test_claude_code_nudged_then_stopped_against_the_local_messages_api(tmp_path):
    """The SDK's bundled Claude Code CLI, its model pointed at the fake (ANTHROPIC_BASE_URL), an in-process MCP tool
    that always fails: the guard nudges at turn 3 (the model's fourth request carries the nudge with the result) and
    stops at turn 4, as the Agent does. Claude Code ignores ``continue: false`` from PostToolUseFailure, so the session
    ends at the model's next call, denied in PreToolUse: one request more than the Agent makes."""
    import json
    import shutil
    from pathlib import Path

    import claude_agent_sdk
    from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server, query, tool
    from fakes.messages_api import FakeMessagesAPI

    if not (Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude").exists() and not shutil.which("claude"):
        pytest.skip("no Claude Code CLI (bundled with the SDK's wheels, or on PATH)")
    agent_loop: list[dict] = []

    def answer(body: dict) -> dict:
        if "Bash" not in [t.get("name") for t in body.get("tools") or []]:
            return {"content": "ok"}  # Claude Code's side requests (titles and the like)
        agent_loop.append(body)
        return {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": f"toolu_{len(agent_loop):02d}",
                                                        "name": "mcp__shop__reserve", "input": {"item": "EQ-001"}}]}

    @tool("reserve", "Reserve an item", {"item": str})
    async def reserve(args: dict) -> dict:
        return {"content": [{"type": "text", "text": f"{args['item']} is out of stock"}], "is_error": True}

    async def session(guard: ClaudeAgentGuard, url: str) -> None:
        home = tmp_path / "home"
        home.mkdir()
        options = ClaudeAgentOptions(
            hooks=guard.hooks, mcp_servers={"shop": create_sdk_mcp_server("shop", tools=[reserve])},
            allowed_tools=["mcp__shop__reserve"], model=gs.MODEL, cwd=str(tmp_path),
            env={"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "test-key", "HOME": str(home),
                 "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                 "ENABLE_TOOL_SEARCH": "false"})
        async for message in query(prompt="Reserve EQ-001", options=options):
            guard.record(message)

    with FakeMessagesAPI([answer] * 40, validate=False) as api:
        guard = ClaudeAgentGuard(tracer_provider=TracerProvider(), alerts=Alerts(log_warnings=False))
        asyncio.run(session(guard, api.url))
    run = guard.guard.last_run
    assert run.actions == gs.agent_actions(gs.FAILING_LOOP) == [(3, "nudge", "repeated_call"),
                                                                 (4, "stop", "repeated_call")]
    last_results = [json.dumps(body["messages"][-1]) for body in agent_loop]
    assert "[looptrace loop detector]" in last_results[3] and "[looptrace loop detector]" not in last_results[2]
    assert len(agent_loop) == 5  # the fifth call is denied, and the session ends there
    assert len(run.model_calls) >= 4  # tokens of each model call, from the stream


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

