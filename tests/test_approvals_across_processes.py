"""A run paused in one process and finished in another: the state file carries the budgets and the detector's
streaks, and the two traces share a session, the resumed one linked to the paused one."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import anthropic
import pytest
from fakes.messages_api import FakeMessagesAPI

from looptrace import Agent, DetectorConfig, Limits, RunStatus
from looptrace.instrumentation.recording import semconv as sc

TOOLS = '''
from looptrace import tool

@tool
def search(query: str) -> str:
    """Search the catalogue."""
    return "no results"

@tool(needs_approval=True)
def pay(to: str, amount: int) -> str:
    """Send money."""
    with open("payments.log", "a") as log:
        log.write(f"{to} {amount}\\n")
    return "paid"
'''

# Each fake response uses 15 tokens. The budget is crossed by the 4th response only if the 2 before the pause count.
LIMITS = "Limits(max_total_tokens=50)"

RESUME = '''
import json, sys
import anthropic
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from looptrace import Agent, DetectorConfig, Limits
import shop_tools

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
agent = Agent("claude-sonnet-4-5", tools=[shop_tools.search, shop_tools.pay], limits={limits},
              on_anomaly="warn", client=anthropic.Anthropic(base_url=sys.argv[1], api_key="test-key", max_retries=0),
              tracer_provider=provider)
result = agent.resume("paused.json", approve=["t2"])
root = next(s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent"))
print(json.dumps({{
    "status": result.status.value, "total_tokens": result.usage.total_tokens, "turns": result.turns,
    "anomalies": [[a.type, a.count] for a in result.anomalies],
    "trace_id": root.context.trace_id, "session": root.attributes.get("gen_ai.conversation.id"),
    "links": [[link.context.trace_id, link.context.span_id] for link in root.links],
}}))
'''


@pytest.mark.slow
def test_a_run_paused_here_finishes_in_another_process(tmp_path, spans, monkeypatch):
    (tmp_path / "shop_tools.py").write_text(TOOLS)
    spec = importlib.util.spec_from_file_location("shop_tools_here", tmp_path / "shop_tools.py")
    assert spec is not None and spec.loader is not None
    shop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shop)
    monkeypatch.chdir(tmp_path)

    def search(call_id):
        return {"type": "tool_use", "id": call_id, "name": "search", "input": {"query": "red shoes"}}

    with FakeMessagesAPI([
        {"stop_reason": "tool_use", "content": [search("t0")]},
        {"stop_reason": "tool_use", "content": [search("t1"), {"type": "tool_use", "id": "t2", "name": "pay",
                                                               "input": {"to": "Ann", "amount": 500}}]},
    ]) as api:
        agent = Agent("claude-sonnet-4-5", tools=[shop.search, shop.pay], limits=Limits(max_total_tokens=50),
                      on_anomaly="warn", detector=DetectorConfig(),
                      client=anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0),
                      tracer_provider=spans.provider)
        paused = agent.run("find red shoes and pay Ann")
        assert paused.status is RunStatus.AWAITING_APPROVAL and paused.anomalies == []
        assert paused.usage.total_tokens == 30
        paused.state.save(tmp_path / "paused.json")

        api.add({"stop_reason": "tool_use", "content": [search("t3")]},
                {"stop_reason": "end_turn", "content": "No red shoes."})
        script = textwrap.dedent(RESUME).format(limits=LIMITS)
        done = subprocess.run([sys.executable, "-c", script, api.url], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr
    resumed = json.loads(done.stdout.strip().splitlines()[-1])
    # the budget counted the tokens spent before the pause: 4 responses of 15 tokens cross 50
    assert (resumed["status"], resumed["total_tokens"], resumed["turns"]) == ("token_budget", 60, 4)
    # search, search (before the pause), search (after it): one streak of three identical calls
    assert resumed["anomalies"] == [["repeated_call", 3]]
    assert (tmp_path / "payments.log").read_text() == "Ann 500\n"
    root = spans.one("invoke_agent")
    assert root.attributes[sc.RUN_STATUS] == "awaiting_approval"
    assert resumed["trace_id"] != root.context.trace_id
    assert resumed["session"] == root.attributes[sc.GEN_AI_CONVERSATION_ID]
    assert resumed["links"] == [[root.context.trace_id, root.context.span_id]]
