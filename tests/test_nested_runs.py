"""Agents that call agents (issue 22): a tool that runs another `Agent` makes one trace with two runs in it, and
every reader of the trace keeps them apart: `looptrace detect`, `looptrace traces show` (the latest run) and `watch`
judge each run as the live run judged itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from looptrace.cli.app import main
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.export.setup import configure
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.instrumentation.watch.metrics import WatchMetrics
from looptrace.instrumentation.watch.watcher import RunWatcher
from looptrace.runtime import Agent, RunResult, ScriptedModel, tool

MODEL = "claude-sonnet-4-5"
SUB_ANOMALIES = ["repeated_call"]


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": call_id, "name": name,
                                                     "input": arguments}],
            "usage": {"input_tokens": 10, "output_tokens": 5}}


def answer(text: str) -> dict[str, Any]:
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}],
            "usage": {"input_tokens": 20, "output_tokens": 5}}


@tool
def fetch_inventory(item: str) -> str:
    """Look an item up in the inventory."""
    raise ConnectionError(f"inventory service unreachable while looking up {item}")


def run_lead_with_a_sub_agent(trace_file: Path) -> tuple[RunResult, RunResult]:
    """A 2-turn lead whose tool runs a 4-turn sub-agent, which repeats a failing call three times."""
    telemetry = configure(exporters="file", trace_file=trace_file, set_global=False)
    provider = telemetry.tracer_provider
    sub_results: list[RunResult] = []
    researcher = Agent(MODEL, name="researcher", tools=[fetch_inventory], tracer_provider=provider,
                       client=ScriptedModel([*(tool_use(f"toolu_s{n}", "fetch_inventory", {"item": "projector"})
                                               for n in range(1, 4)),
                                             answer("All done: the projector is in stock.")]))

    @tool
    def ask_researcher(question: str) -> str:
        """Ask the research agent a question."""
        result = researcher.run(question)
        sub_results.append(result)
        return result.output or ""

    lead = Agent(MODEL, name="lead", tools=[ask_researcher], tracer_provider=provider,
                 client=ScriptedModel([tool_use("toolu_l1", "ask_researcher", {"question": "is a projector free?"}),
                                       answer("Yes, a projector is free.")]))
    try:
        lead_result = lead.run("Book a projector")
    finally:
        telemetry.shutdown()
    assert len(sub_results) == 1
    return lead_result, sub_results[0]


@pytest.fixture
def nested(tmp_path) -> tuple[Path, RunResult, RunResult]:
    path = tmp_path / "traces.jsonl"
    lead, sub = run_lead_with_a_sub_agent(path)
    return path, lead, sub


def anomaly_types(anomalies: list[Any]) -> list[str]:
    return sorted(a.type if hasattr(a, "type") else a["type"] for a in anomalies)


def test_the_runs_are_one_trace_and_two_runs_that_judged_themselves(nested):
    path, lead, sub = nested
    assert lead.trace_id == sub.trace_id  # one tree
    assert (lead.turns, sub.turns) == (2, 4)
    assert anomaly_types(lead.anomalies) == [] and anomaly_types(sub.anomalies) == SUB_ANOMALIES


def test_detect_judges_each_nested_run_as_the_live_run_did(nested, capsys):
    path, lead, sub = nested
    code = main(["detect", "--json", "--all", str(path)])
    out = capsys.readouterr().out
    verdicts = {verdict["name"]: verdict for verdict in map(json.loads, out.splitlines())}
    assert code == 1 and set(verdicts) == {"invoke_agent lead", "invoke_agent researcher"}
    for live, name in ((lead, "invoke_agent lead"), (sub, "invoke_agent researcher")):
        offline = verdicts[name]
        assert offline["trace_id"] == live.trace_id
        assert (offline["turns"], anomaly_types(offline["anomalies"])) == (live.turns, anomaly_types(live.anomalies))
    assert (verdicts["invoke_agent lead"]["tool_calls"], verdicts["invoke_agent researcher"]["tool_calls"]) == (1, 3)


def test_traces_show_draws_the_latest_run_whole_with_its_sub_agent(nested, capsys):
    path, lead, sub = nested
    assert main(["traces", "show", "--file", str(path)]) == 0
    shown = capsys.readouterr().out
    everything = [span.name for span in read_spans(path)]
    assert shown.count("chat") == everything.count(f"chat {MODEL}") == 6  # the lead's two, the sub-agent's four
    assert "invoke_agent lead" in shown and "invoke_agent researcher" in shown
    assert "execute_tool ask_researcher" in shown and "execute_tool fetch_inventory" in shown


class _Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    def send(self, anomaly: Any, context: Any) -> None:
        self.sent.append((context.agent, context.trace_id, anomaly.type))


def test_watch_judges_each_nested_run_as_the_live_run_did(nested):
    path, lead, sub = nested
    sink = _Sink()
    metrics = WatchMetrics()
    watcher = RunWatcher(sink, metrics)
    watcher.ingest(list(read_spans(path)))  # the spans as an exporter sends them: in the order they ended
    watcher.close_all()
    expected = sorted([(sub.trace_id, a.type) for a in sub.anomalies] + [(lead.trace_id, a.type) for a in lead.anomalies])
    assert sorted((trace_id, kind) for _, trace_id, kind in sink.sent) == expected and expected
    assert watcher.open_runs == 0 and metrics.runs_judged.labels(reason="root")._value.get() == 2  # two runs


def test_an_alerts_object_is_a_sink_too(nested):
    # The watcher's sink in production is an Alerts fan-out; the nested run's anomaly reaches it once.
    path, _, sub = nested
    seen: list[Any] = []
    watcher = RunWatcher(Alerts(callback=lambda anomaly, context=None: seen.append(anomaly)), WatchMetrics())
    watcher.ingest(list(read_spans(path)))
    watcher.close_all()
    assert anomaly_types(seen) == anomaly_types(sub.anomalies)
