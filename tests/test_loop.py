"""The loop's rules through the public API, with a scripted model: stop reasons, budgets, tool results, drivers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from looptrace.cli.demo import DEMO_TASK, Inventory, equipment_script
from looptrace.runtime import Agent, Limits, Price, RunInterrupted, RunStatus, ScriptedModel, tool

MODEL = "claude-sonnet-4-5"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


def tool_use(*calls, usage=(10, 5), **extra):
    blocks = [{"type": "tool_use", "id": call_id, "name": name, "input": args} for call_id, name, args in calls]
    return {"stop_reason": "tool_use", "content": blocks, "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
            **extra}


def answer(text="done", stop_reason="end_turn", **usage):
    return {"stop_reason": stop_reason, "content": [{"type": "text", "text": text}],
            "usage": {"input_tokens": 10, "output_tokens": 5, **usage}}


def agent_for(script, tools=(lookup,), **limits):
    limits = {"max_turns": 8, "max_total_tokens": 50_000, **limits}
    # The seed's loop has no detector; with ours on, its "max turns" model would be stopped as a runaway at 4.
    return Agent(MODEL, tools=tools, client=ScriptedModel(script), limits=Limits(**limits), telemetry=False,
                 detector=False)


LOOKUP = ("toolu_1", "lookup", {"key": "a"})


# --- the seven scripted paths of the agent-loop article (max 8 steps, 50k-token budget) ------------------------------


@pytest.mark.parametrize(
    "script, tools, status, turns",
    [
        pytest.param([tool_use(LOOKUP), answer()], (lookup,), RunStatus.DONE, 2, id="done at 2"),
        pytest.param([tool_use(LOOKUP)] * 9, (lookup,), RunStatus.MAX_TURNS, 8, id="max turns at 8"),
        pytest.param([tool_use(LOOKUP, usage=(30_000, 0))] * 3, (lookup,), RunStatus.TOKEN_BUDGET, 2,
                     id="30k per turn hits the 50k budget at 2"),
        pytest.param([answer(input_tokens=60_000)], (lookup,), RunStatus.TOKEN_BUDGET, 1,
                     id="a 60k answer that ended is still over budget"),
        pytest.param([answer(input_tokens=10, cache_read_input_tokens=60_000)], (lookup,), RunStatus.TOKEN_BUDGET, 1,
                     id="60k cache-read tokens count"),
        pytest.param([{"stop_reason": "refusal", "content": []}], (lookup,), RunStatus.REFUSAL, 1, id="refusal at 1"),
        pytest.param([tool_use(("toolu_1", "explode", {})), answer()], (explode,), RunStatus.DONE, 2,
                     id="a raising tool, then done at 2"),
    ],
)
def test_seed_paths(script, tools, status, turns):
    result = agent_for(script, tools).run("task")
    assert (result.status, result.turns) == (status, turns)


def test_cache_creation_tokens_count_toward_the_budget():
    result = agent_for([answer(input_tokens=1, cache_creation_input_tokens=50_000)]).run("task")
    assert result.status is RunStatus.TOKEN_BUDGET
    assert result.usage.total_tokens == 50_006


def test_the_equipment_story():
    inventory = Inventory()
    agent = Agent(MODEL, tools=inventory.tools(), client=ScriptedModel(equipment_script()), telemetry=False)
    result = agent.run(DEMO_TASK)

    assert result.status is RunStatus.DONE and result.ok
    assert result.turns == 4
    assert "EQ-002" in result.final_text
    failed = result.messages[4]["content"][0]
    assert failed["is_error"] is True and "EQ-001 has no stock" in failed["content"]
    assert inventory.items["EQ-002"]["stock"] == 1  # the second reservation really happened
    assert result.usage.input_tokens == 412 + 534 + 611 + 702
    assert result.cost_usd == pytest.approx((2259 * 3 + 186 * 15) / 1e6)


# --- every stop_reason ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stop_reason, status",
    [
        ("end_turn", RunStatus.DONE),
        ("max_tokens", RunStatus.MAX_TOKENS),
        ("stop_sequence", RunStatus.STOP_SEQUENCE),
        ("refusal", RunStatus.REFUSAL),
        ("model_context_window_exceeded", RunStatus.CONTEXT_WINDOW),
    ],
)
def test_each_terminal_stop_reason_has_its_status(stop_reason, status):
    result = agent_for([answer("partial", stop_reason=stop_reason)]).run("task")
    assert result.status is status
    assert result.stop_reason == stop_reason
    assert result.final_text == "partial"


def test_pause_turn_sends_the_response_back_and_continues():
    model = ScriptedModel([answer("searching…", stop_reason="pause_turn"), answer("found it")])
    result = Agent(MODEL, client=model, telemetry=False).run("task")
    assert (result.status, result.turns, result.final_text) == (RunStatus.DONE, 2, "found it")
    second_request = model.requests[1]["messages"]
    assert second_request[-1] == {"role": "assistant", "content": [{"type": "text", "text": "searching…"}]}


def test_an_unknown_stop_reason_ends_the_run_as_an_error_not_a_crash():
    result = agent_for([answer(stop_reason="daydreaming")]).run("task")
    assert result.status is RunStatus.ERROR
    assert "daydreaming" in result.error


# --- tool results -----------------------------------------------------------------------------------------------------


def test_parallel_tool_calls_get_one_result_each_in_order_leading_the_next_message():
    script = [tool_use(("t1", "lookup", {"key": "a"}), ("t2", "explode", {}), ("t3", "lookup", {"key": "b"})),
              answer()]
    model = ScriptedModel(script)
    Agent(MODEL, tools=[lookup, explode], client=model, telemetry=False).run("task")

    results = model.requests[1]["messages"][-1]
    assert results["role"] == "user"
    assert [b["tool_use_id"] for b in results["content"]] == ["t1", "t2", "t3"]
    assert [b.get("is_error", False) for b in results["content"]] == [False, True, False]
    assert results["content"][0]["content"] == "value of a"
    assert results["content"][1]["content"] == "RuntimeError: disk on fire"


def test_bad_calls_become_error_results_the_model_can_act_on():
    script = [tool_use(("t1", "nonexistent", {}), ("t2", "lookup", {"key": 5}), ("t3", "lookup", {}),
                       ("t4", "lookup", {"key": "a", "extra": True})), answer()]
    model = ScriptedModel(script)
    result = Agent(MODEL, tools=[lookup], client=model, telemetry=False).run("task")

    assert result.status is RunStatus.DONE
    errors = [b["content"] for b in model.requests[1]["messages"][-1]["content"]]
    assert errors[0] == "unknown tool 'nonexistent'; the tools available are: lookup"
    assert "key: Input should be a valid string" in errors[1]
    assert "key: Field required" in errors[2]
    assert "extra: not a parameter of lookup" in errors[3]


@pytest.mark.parametrize("value, sent", [(None, "(the tool returned no result)"),
                                         ("", "(the tool returned an empty string)"),
                                         ({"b": 1, "a": [1, 2]}, '{"b": 1, "a": [1, 2]}'),
                                         ({"when": {1, 2}}, '{"when": [1, 2]}')])
def test_return_values_are_sent_as_text(value, sent):
    @tool
    def produce() -> object:
        """Return a value."""
        return value

    model = ScriptedModel([tool_use(("t1", "produce", {})), answer()])
    Agent(MODEL, tools=[produce], client=model, telemetry=False).run("task")
    assert model.requests[1]["messages"][-1]["content"][0]["content"] == sent


def test_a_huge_result_is_truncated_with_a_note():
    @tool
    def dump() -> str:
        """Return a lot."""
        return "x" * 10_000_000

    model = ScriptedModel([tool_use(("t1", "dump", {})), answer()])
    Agent(MODEL, tools=[dump], client=model, telemetry=False, max_tool_result_chars=1000).run("task")
    sent = model.requests[1]["messages"][-1]["content"][0]["content"]
    assert sent.startswith("x" * 1000) and len(sent) < 1300
    assert "10,000,000 characters" in sent


def test_a_tool_raising_a_base_exception_is_a_tool_failure():
    @tool
    def quit_everything() -> str:
        """Calls sys.exit."""
        raise SystemExit(3)

    model = ScriptedModel([tool_use(("t1", "quit_everything", {})), answer()])
    result = Agent(MODEL, tools=[quit_everything], client=model, telemetry=False).run("task")
    assert result.status is RunStatus.DONE
    assert model.requests[1]["messages"][-1]["content"][0] == {
        "type": "tool_result", "tool_use_id": "t1", "content": "SystemExit: 3", "is_error": True}


def test_a_tool_runs_on_the_runs_thread_only_when_no_time_limit_applies_to_it():
    ran_on: list[int] = []

    @tool
    def where() -> str:
        """Notes the thread it ran on."""
        ran_on.append(threading.get_ident())
        return "here"

    for limits in (Limits(tool_timeout_s=None), Limits(tool_timeout_s=30), Limits(tool_timeout_s=None, timeout_s=30)):
        model = ScriptedModel([tool_use(("t1", "where", {})), answer()])
        assert Agent(MODEL, tools=[where], client=model, limits=limits, telemetry=False).run("t").status is RunStatus.DONE
    assert ran_on[0] == threading.get_ident()  # nothing to time out: no thread to hand it to
    assert threading.get_ident() not in ran_on[1:]  # a per-tool or a run's time limit: a tool thread it can leave behind


# --- hard stops -------------------------------------------------------------------------------------------------------


def test_a_hung_tool_times_out_and_the_run_goes_on():
    release = threading.Event()

    @tool
    def hang() -> str:
        """Never returns on its own."""
        release.wait(30)
        return "late"

    model = ScriptedModel([tool_use(("t1", "hang", {})), answer()])
    result = Agent(MODEL, tools=[hang], client=model, limits=Limits(tool_timeout_s=0.2), telemetry=False).run("t")
    release.set()
    assert result.status is RunStatus.DONE  # had the run waited, the tool would have answered "late" below
    sent = model.requests[1]["messages"][-1]["content"][0]
    assert sent["is_error"] is True and "did not finish within 0.2 s" in sent["content"]


def test_the_wall_clock_limit_ends_the_run():
    @tool
    def slow() -> str:
        """Takes a while."""
        time.sleep(0.3)
        return "ok"

    script = [tool_use(("t1", "slow", {}))] * 10
    result = agent_for(script, (slow,), timeout_s=0.5, max_turns=None).run("task")
    assert result.status is RunStatus.TIMEOUT
    assert 1 <= result.turns < 10


def test_the_cost_budget_uses_the_price_table_including_cache_tokens():
    prices = {MODEL: Price(input=3, output=15, cache_read=0.3, cache_write_5m=3.75, cache_write_1h=6)}
    turn = tool_use(LOOKUP, usage=(100_000, 0), )
    turn["usage"]["cache_read_input_tokens"] = 100_000  # 0.30 + 0.03 per turn
    agent = Agent(MODEL, tools=[lookup], client=ScriptedModel([turn] * 5), prices=prices,
                  limits=Limits(max_cost_usd=0.5), telemetry=False)
    result = agent.run("task")
    assert result.status is RunStatus.COST_BUDGET
    assert result.turns == 2
    assert result.cost_usd == pytest.approx(0.66)


def test_a_cost_budget_without_a_price_is_refused_up_front():
    with pytest.raises(ValueError, match="needs a price for 'my-own-model'"):
        Agent("my-own-model", limits=Limits(max_cost_usd=1.0))


def test_an_api_failure_ends_the_run_with_status_error_and_keeps_the_history():
    model = ScriptedModel([tool_use(LOOKUP), ConnectionError("the network is down")])
    result = Agent(MODEL, tools=[lookup], client=model, telemetry=False).run("task")
    assert result.status is RunStatus.ERROR
    assert result.error == "ConnectionError: the network is down"
    assert result.turns == 1
    assert [m["role"] for m in result.messages] == ["user", "assistant", "user"]


def test_ctrl_c_during_a_tool_ends_the_run_as_interrupted_and_re_raises():
    @tool
    def press_ctrl_c() -> str:
        """Simulates the user pressing Ctrl-C while the loop waits for this tool."""
        raise KeyboardInterrupt

    agent = Agent(MODEL, tools=[press_ctrl_c], client=ScriptedModel([tool_use(("t1", "press_ctrl_c", {}))]),
                  telemetry=False)
    # A tool's own KeyboardInterrupt is that tool's failure; a real Ctrl-C arrives in the waiting main thread.
    import looptrace.runtime.tool_threads

    original = looptrace.runtime.tool_threads.run_sync

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    looptrace.runtime.tool_threads.run_sync = interrupted
    try:
        with pytest.raises(RunInterrupted) as caught:
            agent.run("task")
    finally:
        looptrace.runtime.tool_threads.run_sync = original
    assert isinstance(caught.value, KeyboardInterrupt)
    assert caught.value.result.status is RunStatus.INTERRUPTED
    assert caught.value.result.turns == 1


# --- the async driver -------------------------------------------------------------------------------------------------


def test_arun_follows_the_same_rules():
    result = asyncio.run(agent_for([tool_use(LOOKUP), answer("fine")]).arun("task"))
    assert (result.status, result.turns, result.final_text) == (RunStatus.DONE, 2, "fine")


def test_arun_runs_the_parallel_calls_of_a_turn_concurrently():
    arrived = asyncio.Event  # created inside the loop below
    state = {}

    @tool
    async def meet(who: str) -> str:
        """Waits until both callers have arrived: only possible when the two calls run at the same time."""
        state.setdefault("count", 0)
        state["count"] += 1
        if state["count"] == 2:
            state["both"].set()
        await asyncio.wait_for(state["both"].wait(), 2)
        return f"{who} met"

    async def main():
        state["both"] = arrived()
        script = [tool_use(("t1", "meet", {"who": "a"}), ("t2", "meet", {"who": "b"})), answer()]
        model = ScriptedModel(script)
        result = await Agent(MODEL, tools=[meet], client=model, telemetry=False).arun("task")
        return result, model

    result, model = asyncio.run(main())
    assert result.status is RunStatus.DONE
    assert [b["content"] for b in model.requests[1]["messages"][-1]["content"]] == ["a met", "b met"]


def test_an_async_tool_that_ignores_cancellation_still_times_out():
    state = {}

    @tool
    async def stubborn() -> str:
        """Swallows the cancellation and keeps going until the test releases it."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await state["released"].wait()  # if the run waited for this tool, it would never return
        return "never seen"

    model = ScriptedModel([tool_use(("t1", "stubborn", {})), answer()])
    agent = Agent(MODEL, tools=[stubborn], client=model, limits=Limits(tool_timeout_s=0.2), telemetry=False)

    async def main():
        state["released"] = asyncio.Event()
        try:
            return await asyncio.wait_for(agent.arun("task"), 10)
        finally:
            state["released"].set()  # let asyncio.run's clean-up finish the abandoned task

    assert asyncio.run(main()).status is RunStatus.DONE
    assert "did not finish" in model.requests[1]["messages"][-1]["content"][0]["content"]


def test_sync_run_handles_async_tools():
    @tool
    async def fetch(url: str) -> dict:
        """Fetch a URL."""
        await asyncio.sleep(0)
        return {"url": url, "status": 200}

    model = ScriptedModel([tool_use(("t1", "fetch", {"url": "https://example.test"})), answer()])
    Agent(MODEL, tools=[fetch], client=model, telemetry=False).run("task")
    assert model.requests[1]["messages"][-1]["content"][0]["content"] == '{"url": "https://example.test", "status": 200}'


def test_an_observer_that_raises_does_not_break_the_run():
    def broken(event):
        raise ValueError("observer bug")

    agent = Agent(MODEL, tools=[lookup], client=ScriptedModel([tool_use(LOOKUP), answer()]), on_event=broken,
                  telemetry=False)
    assert agent.run("task").status is RunStatus.DONE


def test_an_async_anthropic_client_is_used_by_arun():
    import anthropic
    from fakes.messages_api import FakeMessagesAPI

    with FakeMessagesAPI([answer("from the async client")]) as api:
        client = anthropic.AsyncAnthropic(base_url=api.url, api_key="test-key")
        result = asyncio.run(Agent("claude-sonnet-5-5", client=client, telemetry=False).arun("hi"))
    assert result.final_text == "from the async client"
