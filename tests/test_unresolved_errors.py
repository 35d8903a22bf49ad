"""The tool errors a run leaves unresolved, recorded as facts: on the RunResult, on the root span, in the CLI's
end-of-run summary, under `looptrace traces show` and in `looptrace detect` - whatever the detector makes of them.

Scripted models and the local fake Messages API drive real runs; what is asserted is what a user gets back.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from looptrace.cli.app import main
from looptrace.cli.demo import Inventory
from looptrace.cli.views import LiveView
from looptrace.instrumentation.detector import LoopDetector, ToolCall, UnresolvedToolError
from looptrace.instrumentation.recording import semconv as sc
from looptrace.runtime import Agent, ScriptedModel, tool
from looptrace.testing import CapturedSpans, final_answer, tool_use

TOOLS_FILE = Path(__file__).parent / "data" / "equipment_tools.py"
RESERVE = {"item_id": "EQ-001", "date": "2026-10-08"}
NO_STOCK = "RuntimeError: EQ-001 has no stock left; try another item id"


def two_failed_reservations() -> list[dict[str, Any]]:
    return [tool_use("reserve_equipment", RESERVE, call_id="toolu_1"),
            tool_use("reserve_equipment", RESERVE, call_id="toolu_2"),
            final_answer("I have reserved the equipment for you.")]


def agent_for(script: list[dict[str, Any]], *, spans: CapturedSpans | None = None, inventory: Inventory | None = None,
              **options: Any) -> Agent:
    return Agent("claude-sonnet-5-5", tools=(inventory or Inventory()).tools(), client=ScriptedModel(script),
                 tracer_provider=spans.provider if spans is not None else None, **options)


def root_of(spans: CapturedSpans) -> Any:
    return spans.one("invoke_agent")


# --- the record ---------------------------------------------------------------------------------------------------


def test_two_failed_reservations_then_a_claim_of_success_record_one_unresolved_error():
    spans = CapturedSpans()
    out = io.StringIO()
    result = agent_for(two_failed_reservations(), spans=spans, on_event=LiveView(out)).run("Reserve EQ-001")

    assert result.unresolved_errors == [UnresolvedToolError(
        tool="reserve_equipment", target="2026-10-08, EQ-001", error=NO_STOCK, turn=2, call_id="toolu_2",
        failures=2)]
    assert result.to_dict()["unresolved_errors"] == [
        {"tool": "reserve_equipment", "target": "2026-10-08, EQ-001", "error": NO_STOCK, "turn": 2,
         "call_id": "toolu_2", "failures": 2, "reported": None}]
    root = root_of(spans).attributes
    assert root[sc.RUN_UNRESOLVED_TOOL_ERRORS] == 1
    # What Langfuse's traces table filters on, added by its exporter.
    assert spans.sent("invoke_agent").attributes["langfuse.trace.metadata.unresolved_tool_errors"] == "1"
    assert root[sc.RUN_UNRESOLVED_TOOLS] == ("reserve_equipment",)
    [event] = [e for e in root_of(spans).events if e.name == sc.UNRESOLVED_TOOL_ERROR_EVENT]
    assert event.attributes[sc.UNRESOLVED_TARGET] == "2026-10-08, EQ-001"
    assert event.attributes[sc.UNRESOLVED_ERROR] == NO_STOCK
    assert (f"1 tool error left unresolved: reserve_equipment(2026-10-08, EQ-001) at turn 2 (failed 2 times): "
            f"{NO_STOCK!r}") in out.getvalue()


def test_a_retry_that_succeeds_records_none():
    spans = CapturedSpans()
    out = io.StringIO()
    agent = Agent("claude-sonnet-5-5", tools=[_flaky_reservation()], tracer_provider=spans.provider,
                  on_event=LiveView(out), client=ScriptedModel(two_failed_reservations()))
    result = agent.run("Reserve EQ-001")

    assert result.unresolved_errors == []
    assert result.to_dict()["unresolved_errors"] == []
    root = root_of(spans).attributes
    assert root[sc.RUN_UNRESOLVED_TOOL_ERRORS] == 0
    assert spans.sent("invoke_agent").attributes["langfuse.trace.metadata.unresolved_tool_errors"] == "0"
    assert sc.RUN_UNRESOLVED_TOOLS not in root
    assert "left unresolved" not in out.getvalue()


def _flaky_reservation() -> Any:
    attempts = []

    @tool
    def reserve_equipment(item_id: str, date: str) -> dict[str, Any]:
        """Reserve one item for a date: out of stock at the first attempt, restocked by the second."""
        attempts.append(item_id)
        if len(attempts) == 1:
            raise RuntimeError(f"{item_id} has no stock left; try another item id")
        return {"reserved": item_id, "date": date}

    return reserve_equipment


def test_with_content_capture_off_the_record_keeps_tool_and_target_and_the_span_only_the_count():
    spans = CapturedSpans()
    out = io.StringIO()
    result = agent_for(two_failed_reservations(), spans=spans, capture_content=False,
                       on_event=LiveView(out, capture_content=False)).run("Reserve EQ-001")

    [fact] = result.unresolved_errors
    assert (fact.tool, fact.target, fact.error, fact.turn) == ("reserve_equipment", "2026-10-08, EQ-001", None, 2)
    root = root_of(spans).attributes
    assert root[sc.RUN_UNRESOLVED_TOOL_ERRORS] == 1
    encoded = json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in root.items()})
    assert "EQ-001" not in encoded and "no stock" not in encoded
    [event] = [e for e in root_of(spans).events if e.name == sc.UNRESOLVED_TOOL_ERROR_EVENT]
    assert dict(event.attributes) == {sc.GEN_AI_TOOL_NAME: "reserve_equipment", sc.UNRESOLVED_TURN: 2,
                                      sc.UNRESOLVED_FAILURES: 2, sc.GEN_AI_TOOL_CALL_ID: "toolu_2"}
    said = out.getvalue()
    assert "1 tool error left unresolved: reserve_equipment at turn 2 (failed 2 times)" in said
    assert "EQ-001" not in said and "no stock" not in said


def test_with_the_detector_off_the_facts_are_still_recorded():
    spans = CapturedSpans()
    result = agent_for(two_failed_reservations(), spans=spans, detector=False).run("Reserve EQ-001")

    assert result.anomalies == []  # no verdict: the detector is off
    assert [(e.tool, e.target, e.error, e.failures) for e in result.unresolved_errors] == [
        ("reserve_equipment", "2026-10-08, EQ-001", NO_STOCK, 2)]
    assert root_of(spans).attributes[sc.RUN_UNRESOLVED_TOOL_ERRORS] == 1


def test_with_the_detector_off_a_retry_that_succeeds_still_resolves_the_error():
    agent = Agent("claude-sonnet-5-5", tools=[_flaky_reservation()], detector=False,
                  client=ScriptedModel(two_failed_reservations()))
    assert agent.run("Reserve EQ-001").unresolved_errors == []


def test_with_telemetry_off_the_run_still_returns_its_facts():
    result = agent_for(two_failed_reservations(), telemetry=False).run("Reserve EQ-001")
    assert [e.tool for e in result.unresolved_errors] == ["reserve_equipment"]


def test_a_secret_the_error_quotes_never_reaches_the_record():
    @tool
    def fetch_report(report_id: str, api_key: str) -> str:
        """Fetch a report."""
        raise PermissionError(f"key {api_key} is not allowed to read {report_id}")

    script = [tool_use("fetch_report", {"report_id": "R-7", "api_key": "sk-live-0123456789abcdef"}),
              final_answer("Here is your report.")]
    spans = CapturedSpans()
    result = Agent("claude-sonnet-5-5", tools=[fetch_report], client=ScriptedModel(script),
                   tracer_provider=spans.provider).run("Get report R-7")

    [fact] = result.unresolved_errors
    assert fact.target == "[REDACTED], R-7"  # the secret argument stays a marker
    assert fact.error is not None and "R-7" in fact.error
    assert "sk-live-0123456789abcdef" not in json.dumps(result.to_dict()["unresolved_errors"])
    for span in spans.all:
        assert "sk-live-0123456789abcdef" not in json.dumps({k: str(v) for k, v in span.attributes.items()})


def test_each_run_of_a_session_records_its_own_errors():
    script = [*two_failed_reservations(),
              tool_use("search_equipment", {"keyword": "projector"}), final_answer("Projector B is in stock.")]
    agent = agent_for(script)
    first = agent.run("Reserve EQ-001", session_id="conversation-1")
    second = agent.run("What else is there?", session_id="conversation-1")
    assert [e.tool for e in first.unresolved_errors] == ["reserve_equipment"]
    assert second.unresolved_errors == []  # the first run's failure was the first run's fact


def test_the_detectors_accessor_gives_plain_frozen_records():
    detector = LoopDetector()
    detector.observe(ToolCall(turn=1, tool="deploy", arguments={"service": "billing"}, call_id="c1", is_error=True,
                              result="quota exceeded"))
    detector.observe(ToolCall(turn=2, tool="deploy", arguments={"service": "search"}, call_id="c2", result="ok"))
    detector.end_run("end_turn", "Deployed.", 2)
    [fact] = detector.unresolved_errors()
    assert fact == UnresolvedToolError("deploy", "billing", "quota exceeded", 1, "c1")
    with pytest.raises(AttributeError):
        fact.tool = "other"  # type: ignore[misc]
    assert fact.describe() == "deploy(billing) at turn 1: 'quota exceeded'"


# --- the CLI: run --json, traces show, detect ---------------------------------------------------------------------


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


LINE = f"1 tool error left unresolved: reserve_equipment(2026-10-08, EQ-001) at turn 2 (failed 2 times): {NO_STOCK!r}"


def test_run_prints_the_line_and_json_carries_the_facts(workdir, api, capsys):
    api.add(*two_failed_reservations())
    code, out, err = cli(capsys, "run", "Reserve EQ-001", "--tools", str(TOOLS_FILE), "--trace-file", "t.jsonl")
    assert code == 0 and LINE in err

    api.add(*two_failed_reservations())
    code, out, _ = cli(capsys, "run", "Reserve EQ-001", "--tools", str(TOOLS_FILE), "--json",
                       "--trace-file", "t.jsonl")
    assert [e["target"] for e in json.loads(out)["unresolved_errors"]] == ["2026-10-08, EQ-001"]


def test_traces_show_and_detect_print_it_for_a_stored_trace(workdir, api, capsys):
    api.add(*two_failed_reservations())
    assert cli(capsys, "run", "Reserve EQ-001", "--tools", str(TOOLS_FILE), "--trace-file", "t.jsonl")[0] == 0

    code, out, _ = cli(capsys, "traces", "show", "--file", "t.jsonl")
    assert code == 0 and out.rstrip().endswith(LINE)

    code, out, err = cli(capsys, "detect", "t.jsonl")
    header, *details = out.splitlines()
    assert header.endswith(", 1 unresolved tool error")
    assert f"  {LINE}" in details
    assert err.rstrip().endswith("; 1 tool error left unresolved in 1 run")

    _, out, _ = cli(capsys, "detect", "--json", "t.jsonl")
    [verdict] = [json.loads(line) for line in out.splitlines()]
    assert verdict["unresolved_errors"] == [
        {"tool": "reserve_equipment", "target": "2026-10-08, EQ-001", "error": NO_STOCK, "turn": 2,
         "call_id": "toolu_2", "failures": 2, "reported": None}]


def test_detect_of_a_clean_run_says_nothing_about_unresolved_errors(workdir, api, capsys):
    api.add(tool_use("search_equipment", {"keyword": "projector"}), final_answer("Projector B is in stock."))
    assert cli(capsys, "run", "Find a projector", "--tools", str(TOOLS_FILE), "--trace-file", "t.jsonl")[0] == 0
    code, out, err = cli(capsys, "detect", "t.jsonl")
    assert code == 0 and out == "" and "unresolved" not in err
    assert "left unresolved" not in cli(capsys, "traces", "show", "--file", "t.jsonl")[1]


def test_another_producers_trace_gets_its_facts_from_its_tool_spans(workdir, capsys):
    """A trace without looptrace's attribute (any GenAI-instrumented agent): rebuilt from its execute_tool spans."""
    trace_id = "ab" * 16

    def span(span_id: str, parent: str, name: str, start: int, attributes: dict[str, str],
             error: bool = False) -> dict[str, Any]:
        return {"traceId": trace_id, "spanId": span_id, "parentSpanId": parent, "name": name,
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 5),
                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
                "status": {"code": 2} if error else {}}

    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "reserve_equipment",
            "gen_ai.tool.call.arguments": json.dumps({"item_id": "EQ-001"}),
            "gen_ai.tool.call.result": "EQ-001 is out of stock"}
    spans = [
        span("0000000000000002", "0000000000000001", "chat m", 10, {"gen_ai.operation.name": "chat"}),
        span("0000000000000003", "0000000000000001", "execute_tool reserve_equipment", 20,
             {**tool, "gen_ai.tool.call.id": "call_1"}, error=True),
        span("0000000000000004", "0000000000000001", "chat m", 30, {"gen_ai.operation.name": "chat"}),
        span("0000000000000001", "", "invoke_agent other", 0, {"gen_ai.operation.name": "invoke_agent"}),
    ]
    path = workdir / "other.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [
        {"scope": {"name": "another.agent.framework"}, "spans": [s]}]}]}) + "\n" for s in spans))

    expected = "1 tool error left unresolved: reserve_equipment(EQ-001) at turn 1: 'EQ-001 is out of stock'"
    code, out, _ = cli(capsys, "traces", "show", "--file", str(path))
    assert code == 0 and out.rstrip().endswith(expected)
    _, out, _ = cli(capsys, "detect", str(path))
    assert f"  {expected}" in out.splitlines()


def test_an_agents_own_pipeline_writes_the_same_root_attributes(monkeypatch, tmp_path):
    """An agent given nothing writes its trace file through a pipeline of its own: its root carries the facts too
    (and no Langfuse attribute: those are added by Langfuse's exporter)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from looptrace.instrumentation.tracefile.read import read_spans

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    for name in [n for n in __import__("os").environ if n.startswith(("OTEL_", "LANGFUSE_", "LOOPTRACE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(tmp_path / "traces.jsonl"))
    agent = agent_for(two_failed_reservations())
    agent.run("Reserve EQ-001")
    assert isinstance(agent._tracing.providers[0], TracerProvider)  # the SDK's, never installed globally
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    [root] = [s for s in read_spans(tmp_path / "traces.jsonl") if s.name.startswith("invoke_agent")]
    assert root.attributes[sc.RUN_UNRESOLVED_TOOL_ERRORS] == 1
    assert not any(key.startswith("langfuse.") for key in root.attributes)
    assert list(root.attributes[sc.RUN_UNRESOLVED_TOOLS]) == ["reserve_equipment"]


# --- a person's rejection is a decision, not an error ---------------------------------------------------------------


def test_a_rejected_call_is_no_unresolved_error_live_nor_in_detect(workdir, capsys):
    """docs/approvals.md: a rejection is a decision, not a tool failure. The live run does not count it, and
    `looptrace detect` reading the run's trace file must not either."""
    from looptrace import reject
    from looptrace.instrumentation.tracefile.encode import encode_traces_data

    @tool(needs_approval=True)
    def pay(to: str, amount: int) -> str:
        """Send money."""
        return f"paid {amount} to {to}"

    spans = CapturedSpans()
    script = [tool_use("pay", {"to": "Ann", "amount": 500}), final_answer("I did not pay Ann: the payment was refused.")]
    result = Agent("claude-sonnet-5-5", tools=[pay], client=ScriptedModel(script), tracer_provider=spans.provider,
                   approver=lambda request: reject("over the weekly limit")).run("pay Ann 500")
    assert result.unresolved_errors == []
    assert root_of(spans).attributes[sc.RUN_UNRESOLVED_TOOL_ERRORS] == 0

    path = Path("rejected.jsonl")
    path.write_text("".join(encode_traces_data([span]) + "\n" for span in spans.all), encoding="utf-8")
    code, out, err = cli(capsys, "detect", "--all", str(path))
    assert code == 0 and "unresolved" not in out + err, out + err
    _, out, _ = cli(capsys, "detect", "--json", "--all", str(path))
    [verdict] = [json.loads(line) for line in out.splitlines()]
    assert verdict["unresolved_errors"] == [] and verdict["anomalies"] == []
