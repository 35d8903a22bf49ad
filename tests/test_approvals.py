"""A person in the loop: tools that wait for approval, runs that pause, serialise and resume, and anomalies that ask.

Every run here goes through the real anthropic SDK to the local Messages-API fake: what the model was sent is read
from the fake's request log.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import anthropic
import pytest
from fakes.messages_api import FakeMessagesAPI

from looptrace import Agent, Limits, RunState, RunStatus, StateError, Tool, approve, reject, tool
from looptrace.instrumentation.recording import semconv as sc

MODEL = "claude-sonnet-4-5"
paid: list[tuple[str, int]] = []


@tool(needs_approval=lambda arguments: arguments["amount"] > 100)
def pay(to: str, amount: int) -> str:
    """Send money.

    Args:
        to: who gets it
        amount: how much, in euros
    """
    paid.append((to, amount))
    return f"paid {amount} to {to}"


@tool
def balance() -> str:
    """The account's balance."""
    return "1200 EUR"


@pytest.fixture(autouse=True)
def _nothing_paid_yet():
    paid.clear()


def use(name: str, call_id: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def asks(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"stop_reason": "tool_use", "content": list(blocks)}


def says(text: str) -> dict[str, Any]:
    return {"stop_reason": "end_turn", "content": text}


def agent_on(api: FakeMessagesAPI, spans: Any = None, *, asynchronous: bool = False, **options: Any) -> Agent:
    options.setdefault("tools", [pay, balance])
    client = (anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic)(
        base_url=api.url, api_key="test-key", max_retries=0)
    return Agent(MODEL, client=client,
                 tracer_provider=spans.provider if spans is not None else None,
                 telemetry=spans is not None, **options)


def tool_results(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tool_result blocks of a request's last message, by call id."""
    content = request["messages"][-1]["content"]
    return {b["tool_use_id"]: b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"}


# --- deciding in process ---------------------------------------------------------------------------------------------


def test_an_approver_approves_and_the_call_runs(spans):
    seen = []

    def approver(request):
        seen.append((request.tool.name, request.arguments, request.call_id, request.turn))
        return approve()

    with FakeMessagesAPI([asks(use("pay", "t1", to="Ann", amount=500)), says("Paid.")]) as api:
        result = agent_on(api, spans, approver=approver).run("pay Ann 500")
    assert result.status is RunStatus.DONE
    assert paid == [("Ann", 500)]
    assert seen == [("pay", {"to": "Ann", "amount": 500}, "t1", 1)]
    tool_span = spans.one("execute_tool pay")
    assert tool_span.attributes[sc.TOOL_APPROVAL] == "approved"
    assert tool_span.attributes[sc.TOOL_APPROVAL_BY] == "approver"
    assert tool_span.attributes[sc.TOOL_APPROVAL_WAIT_S] >= 0


def test_a_rejection_reaches_the_model_with_the_reason_and_the_call_does_not_run(spans):
    with FakeMessagesAPI([asks(use("pay", "t1", to="Ann", amount=500)), says("I did not pay.")]) as api:
        result = agent_on(api, spans, approver=lambda request: reject("over the weekly limit")).run("pay Ann 500")
    assert result.status is RunStatus.DONE
    assert paid == []
    sent = tool_results(api.requests[1])["t1"]
    assert sent["is_error"] is True
    assert "over the weekly limit" in sent["content"]
    tool_span = spans.one("execute_tool pay")
    assert tool_span.attributes[sc.TOOL_APPROVAL] == "rejected"
    assert tool_span.attributes[sc.TOOL_APPROVAL_REASON] == "over the weekly limit"
    assert tool_span.attributes[sc.TOOL_OUTCOME] == "rejected"


def test_the_predicate_decides_which_calls_need_approval():
    asked = []
    with FakeMessagesAPI([asks(use("pay", "t1", to="Ann", amount=20), use("pay", "t2", to="Bob", amount=900)),
                          says("done")]) as api:
        agent_on(api, approver=lambda request: asked.append(request.call_id) or approve()).run("pay both")
    assert asked == ["t2"]
    assert paid == [("Ann", 20), ("Bob", 900)]


def test_async_predicate_and_async_approver_under_arun_and_a_hand_built_tool():
    async def large(arguments: dict[str, Any]) -> bool:
        await asyncio.sleep(0)
        return arguments["amount"] > 100

    async def approver(request):
        await asyncio.sleep(0)
        return reject("ask finance first") if request.tool.name == "wire" else approve()

    def wire_money(amount: int) -> str:
        paid.append(("wire", amount))
        return "sent"

    wire = Tool(name="wire", description="Wire money.", fn=wire_money, needs_approval=large,
                input_schema={"type": "object", "properties": {"amount": {"type": "integer"}}})
    with FakeMessagesAPI([asks(use("wire", "t1", amount=5), use("wire", "t2", amount=5000)), says("ok")]) as api:
        result = asyncio.run(agent_on(api, tools=[wire], approver=approver, asynchronous=True).arun("wire it"))
    assert result.status is RunStatus.DONE
    assert paid == [("wire", 5)]
    assert "ask finance first" in tool_results(api.requests[1])["t2"]["content"]


def test_a_failing_approver_rejects_the_call():
    def broken(request):
        raise RuntimeError("approval service down")

    with FakeMessagesAPI([asks(use("pay", "t1", to="Ann", amount=500)), says("ok")]) as api:
        agent_on(api, approver=broken).run("pay")
    assert paid == []
    assert "approval service down" in tool_results(api.requests[1])["t1"]["content"]


# --- pausing and resuming ------------------------------------------------------------------------------------------


def paused_run(api: FakeMessagesAPI, spans: Any = None, **options: Any) -> tuple[Agent, Any]:
    api.add(asks(use("balance", "t1"), use("pay", "t2", to="Ann", amount=500)))
    agent = agent_on(api, spans, **options)
    return agent, agent.run("check the balance and pay Ann 500")


def test_without_an_approver_the_run_pauses_after_the_calls_that_need_none(spans):
    with FakeMessagesAPI() as api:
        _, result = paused_run(api, spans)
    assert result.status is RunStatus.AWAITING_APPROVAL
    assert [(p.call_id, p.tool, p.arguments, p.turn) for p in result.pending] == [
        ("t2", "pay", {"to": "Ann", "amount": 500}, 1)]
    assert paid == []
    assert json.loads(result.state.to_json())["pending"][0]["call_id"] == "t2"
    assert spans.one("execute_tool balance").attributes[sc.TOOL_OUTCOME] == "ok"
    assert spans.one("execute_tool pay").attributes[sc.TOOL_APPROVAL] == "pending"
    assert spans.one("invoke_agent").attributes[sc.RUN_STATUS] == "awaiting_approval"


def test_resume_rejecting_sends_every_result_in_order_with_the_reason(spans):
    with FakeMessagesAPI() as api:
        agent, result = paused_run(api, spans)
        api.add(says("I did not pay Ann."))
        state = RunState.from_json(result.state.to_json())
        finished = agent.resume(state, reject={"t2": "Ann was paid yesterday"})
    assert finished.status is RunStatus.DONE
    assert paid == []
    sent = api.requests[-1]["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in sent] == ["t1", "t2"]
    assert sent[0]["content"] == "1200 EUR"
    assert sent[1]["is_error"] is True and "Ann was paid yesterday" in sent[1]["content"]
    assert finished.turns == 2


def test_resume_approving_runs_the_call_in_a_new_trace_of_the_same_session_linked_to_the_paused_one(spans):
    with FakeMessagesAPI() as api:
        agent, result = paused_run(api, spans)
        api.add(says("Paid."))
        finished = agent.resume(result.state, approve=["t2"])
    assert paid == [("Ann", 500)]
    paused, resumed = spans.named("invoke_agent")
    assert paused.context.trace_id != resumed.context.trace_id
    session = paused.attributes[sc.GEN_AI_CONVERSATION_ID]
    assert resumed.attributes[sc.GEN_AI_CONVERSATION_ID] == session
    assert [(link.context.trace_id, link.context.span_id) for link in resumed.links] == [
        (paused.context.trace_id, paused.context.span_id)]
    pay_spans = spans.named("execute_tool pay")
    assert [s.attributes[sc.TOOL_APPROVAL] for s in pay_spans] == ["pending", "approved"]
    assert pay_spans[1].attributes[sc.TOOL_APPROVAL_BY] == "person"
    assert finished.trace_id == format(resumed.context.trace_id, "032x")


def test_resume_in_asyncio():
    with FakeMessagesAPI() as api:
        _, result = paused_run(api)
        api.add(says("Paid."))
        finished = asyncio.run(agent_on(api, asynchronous=True).aresume(result.state, approve=["t2"]))
    assert finished.status is RunStatus.DONE and paid == [("Ann", 500)]


def test_the_timeout_counts_running_time_not_the_pause():
    with FakeMessagesAPI() as api:
        agent, result = paused_run(api, limits=Limits(timeout_s=30))
        result.state.paused_at -= 3600  # an hour waiting for a person is not an hour of running
        api.add(says("Paid."))
        finished = agent.resume(result.state, approve=["t2"])
    assert finished.status is RunStatus.DONE
    assert result.state.running_s < 30


# --- what cannot be resumed ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spoil, decisions, says_", [
    (lambda agent, state: agent.resume(state, approve=["t2"]), {"approve": ["t2"]}, "resumed already"),
    (None, {"approve": ["t9"]}, "call 't9' is not pending"),
    (None, {}, "waits for a decision"),
    (None, {"approve": ["t2"], "reject": {"t2": "no"}}, "both approved and rejected"),
    (None, {"approve": ["t2"], "go_on": True}, "no anomaly waits"),
])
def test_bad_decisions_are_refused_before_anything_runs(spoil, decisions, says_):
    with FakeMessagesAPI() as api:
        agent, result = paused_run(api)
        api.add(says("Paid."))
        if spoil is not None:
            spoil(agent, result.state)
            paid.clear()
        requests = len(api.requests)
        with pytest.raises(StateError, match=says_):
            agent.resume(result.state, **decisions)
        assert len(api.requests) == requests and paid == []


def test_a_state_from_another_agent_or_format_version_or_a_corrupt_file_is_refused(tmp_path):
    with FakeMessagesAPI() as api:
        agent, result = paused_run(api)
        other = agent_on(api, tools=[pay])
        with pytest.raises(StateError, match="belongs to agent"):
            other.resume(result.state, approve=["t2"])
        data = result.state.to_dict() | {"version": 99}
        with pytest.raises(StateError, match="format version 99"):
            agent.resume(data, approve=["t2"])
        broken = tmp_path / "broken.json"
        broken.write_text(result.state.to_json()[:200])
        with pytest.raises(StateError, match="not valid JSON"):
            agent.resume(broken, approve=["t2"])
        missing = result.state.to_dict()
        del missing["messages"]
        with pytest.raises(StateError, match="damaged"):
            agent.resume(missing, approve=["t2"])
        assert paid == [] and len(api.requests) == 1
        # and the state itself is intact: it still resumes
        api.add(says("Paid."))
        assert agent.resume(result.state, approve=["t2"]).status is RunStatus.DONE


def test_a_state_file_resumes_once(tmp_path):
    with FakeMessagesAPI() as api:
        agent, result = paused_run(api)
        path = result.state.save(tmp_path / "run.json")
        api.add(says("Paid."))
        assert agent_on(api).resume(path, approve=["t2"]).status is RunStatus.DONE
        with pytest.raises(StateError, match="resumed already"):
            agent_on(api).resume(path, approve=["t2"])
    assert paid == [("Ann", 500)]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_resume_that_fails_before_its_run_begins_leaves_the_state_file_resumable(tmp_path):
    with FakeMessagesAPI() as api:
        agent, result = paused_run(api)
        path = result.state.save(tmp_path / "run.json")
        data = json.loads(path.read_text())
        good = json.dumps(data)
        data["detector_feed"] = [{"call": {"tool": "balance"}}]  # an entry without its turn: hand-edited, or damaged
        path.write_text(json.dumps(data))
        with pytest.raises(StateError, match="detector record is damaged"):
            agent_on(api).resume(path, approve=["t2"])
        assert paid == [] and len(api.requests) == 1  # nothing ran, nothing was asked of the model
        path.write_text(good)  # mended: the failed attempt did not use the state up
        api.add(says("Paid."))
        assert agent_on(api).resume(path, approve=["t2"]).status is RunStatus.DONE
    assert paid == [("Ann", 500)]


# --- an anomaly that asks a person ---------------------------------------------------------------------------------


@tool
def search(query: str) -> str:
    """Search the catalogue."""
    return "no results"


def looping(api: FakeMessagesAPI, spans: Any = None):
    api.add(*[asks(use("search", f"s{n}", query="red shoes")) for n in range(1, 4)])
    agent = agent_on(api, spans, tools=[search], on_anomaly={"repeated_call": "ask"})
    return agent, agent.run("find red shoes")


def test_ask_pauses_the_run_with_the_anomaly_and_go_on_sends_the_persons_message(spans):
    with FakeMessagesAPI() as api:
        agent, result = looping(api, spans)
        assert result.status is RunStatus.AWAITING_APPROVAL
        assert result.pending == [] and result.pending_anomaly.type == "repeated_call"
        assert len(api.requests) == 3
        api.add(says("There are no red shoes."))
        finished = agent.resume(result.state, go_on=True, message="try 'crimson sneakers' instead")
    assert finished.status is RunStatus.DONE
    last = api.requests[-1]["messages"][-1]["content"]
    assert last[-1] == {"type": "text", "text": "try 'crimson sneakers' instead"}
    assert [b["tool_use_id"] for b in last if b.get("type") == "tool_result"] == ["s3"]


def test_ask_resumed_with_stop_ends_the_run_without_another_model_call():
    with FakeMessagesAPI() as api:
        agent, result = looping(api)
        finished = agent.resume(result.state, go_on=False)
    assert finished.status is RunStatus.STOPPED_BY_DETECTOR
    assert len(api.requests) == 3
    assert [a.type for a in finished.anomalies] == ["repeated_call"]


def test_a_streak_spanning_the_pause_is_one_streak():
    with FakeMessagesAPI([asks(use("search", "s1", query="red shoes")),
                          asks(use("search", "s2", query="red shoes"), use("pay", "t1", to="Ann", amount=500))
                          ]) as api:
        agent = agent_on(api, tools=[search, pay], on_anomaly="warn")
        result = agent.run("find red shoes, then pay")
        assert result.status is RunStatus.AWAITING_APPROVAL and result.anomalies == []
        api.add(asks(use("search", "s3", query="red shoes")), says("none"))
        finished = agent.resume(RunState.from_json(result.state.to_json()), approve=["t1"])
    assert [(a.type, a.count) for a in finished.anomalies] == [("repeated_call", 3)]


# --- the documentation's examples run ---------------------------------------------------------------------------------


def documented_examples():
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8").split("## A person in the loop", 1)[1]
    readme = readme.split("\n## ", 1)[0]
    page = (root / "docs" / "approvals.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S) + re.findall(r"```python\n(.*?)```", page, re.S)
    return [pytest.param(block, id=f"example-{n}") for n, block in enumerate(blocks)]


@pytest.mark.parametrize("example", documented_examples())
def test_the_documented_examples_run(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "example", "exec"), {"__name__": "example"})  # the docs' own code, as a reader runs it


def test_approvals_pending_and_decided_are_metrics(spans):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    with FakeMessagesAPI() as api:
        api.add(asks(use("balance", "t1"), use("pay", "t2", to="Ann", amount=500)), says("ok"))
        agent = Agent(MODEL, tools=[pay, balance], tracer_provider=spans.provider,
                      meter_provider=MeterProvider(metric_readers=[reader]),
                      client=anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0))
        result = agent.run("pay Ann")
        agent.resume(result.state, reject={"t2": "no"})
    metrics = {m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics}
    counted = {(p.attributes[sc.TOOL_APPROVAL], p.attributes.get(sc.TOOL_APPROVAL_BY)): p.value
               for p in metrics[sc.METRIC_APPROVALS].data.data_points}
    assert counted == {("pending", None): 1, ("rejected", "person"): 1}
    (waited,) = metrics[sc.METRIC_APPROVAL_WAIT].data.data_points
    assert waited.count == 1 and waited.attributes[sc.TOOL_APPROVAL] == "rejected"
