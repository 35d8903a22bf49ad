"""The detector in use: the scenarios users hit, live through the Agent and `looptrace run`, and offline through
`looptrace detect` over the trace the run left; what each anomaly does (warn, nudge, stop) and where it is reported."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fakes.messages_api import FakeMessagesAPI
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from looptrace.cli.app import main
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import LoopDetector, ToolCall
from looptrace.instrumentation.offline.trace_detect import DetectorSpanProcessor, detect_spans
from looptrace.instrumentation.recording import semconv as sc
from looptrace.runtime import Agent, RunStatus, ScriptedModel, tool

MODEL = "claude-sonnet-5-5"
TOOLS_FILE = Path(__file__).parent / "data" / "scenario_tools.py"


def scenario_tools():
    """Tools whose results make each scenario: files differ, a job progresses or not, a call fails differently."""
    ticks = itertools.count()
    failures = itertools.count()

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return f"contents of {path}"

    @tool
    def poll_job(job: str) -> str:
        """Status of a job that makes progress."""
        return f"{job}: {min(next(ticks) * 10, 100)}% done"

    @tool
    def poll_stuck(job: str) -> str:
        """Status of a job that is stuck."""
        return f"{job}: pending"

    @tool
    def lookup(n: int | str = 0, filters: dict | None = None) -> str:
        """Look something up."""
        return "found it"

    @tool
    def reserve_item(item: str) -> str:
        """Reserve an item: refused upstream with a new request id every time."""
        raise RuntimeError(f"upstream refused (request {next(failures)})")

    @tool
    def flaky(item: str) -> str:
        """Fails with a new request id every time, unless the item is 'ok'."""
        if item != "ok":
            raise RuntimeError(f"upstream refused (request {next(failures)})")
        return "reserved"

    return [read_file, poll_job, poll_stuck, lookup, flaky]


def turn_of(*calls: tuple[str, dict]) -> dict[str, Any]:
    return {"stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": f"toolu_{id(calls)}_{i}", "name": name, "input": args}
                        for i, (name, args) in enumerate(calls)]}


def final(text: str) -> dict[str, Any]:
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}


A = ("read_file", {"path": "a.txt"})
B = ("read_file", {"path": "b.txt"})
C = ("read_file", {"path": "c.txt"})
FAIL = ("flaky", {"item": "EQ-001"})
RESERVE_FAIL = ("reserve_item", {"item": "EQ-001"})

# name: (turns of tool calls, final answer, expected [(type, turn)] with on_anomaly="warn")
SCENARIOS: dict[str, tuple[list[list[tuple[str, dict]]], str, list[tuple[str, int]]]] = {
    "identical call x3": ([[A], [A], [A]], "done", [("repeated_call", 3)]),
    "reordered nested keys": ([[("lookup", {"filters": {"a": 1, "b": {"x": 1, "y": 2}}})],
                               [("lookup", {"filters": {"b": {"y": 2, "x": 1}, "a": 1}})],
                               [("lookup", {"filters": {"a": 1, "b": {"y": 2, "x": 1}}})]], "done",
                              [("repeated_call", 3)]),
    "10 vs 10.0": ([[("lookup", {"n": 10})], [("lookup", {"n": 10.0})], [("lookup", {"n": 10})]], "done",
                   [("repeated_call", 3)]),
    "10 vs '10'": ([[("lookup", {"n": 10})], [("lookup", {"n": "10"})], [("lookup", {"n": 10})]], "done", []),
    "six different files": ([[("read_file", {"path": f"{n}.txt"})] for n in range(6)], "done", []),
    "polling that progresses": ([[("poll_job", {"job": "j1"})]] * 5, "done", []),
    "polling that is stuck": ([[("poll_stuck", {"job": "j1"})]] * 3, "done", [("repeated_call", 3)]),
    "A B A B A B": ([[A], [B]] * 3, "done", [("cycle", 6)]),
    "A B A B C A B A B": ([[A], [B], [A], [B], [C], [A], [B], [A], [B]], "done", []),
    "A B C x3": ([[A], [B], [C]] * 3, "done", [("cycle", 9)]),
    "the same parallel batch three turns running": ([[A, B], [B, A], [A, B]], "done", [("repeated_call", 3)]),
    "three identical calls in one turn": ([[A, A, A]], "done", []),
    # Resolution is per target: a success on another item does not resolve EQ-001, so the answer must name it.
    "error then a success on another target": ([[FAIL], [("flaky", {"item": "ok"})]],
                                               "EQ-001 was refused, so I reserved 'ok' instead.", []),
    # ignored_error by the rule alone: the call was retried, failed again, the model moved on to other work, and the
    # answer states the failed operation (reserve an item) as done.
    "error retried, then end_turn claiming success": ([[RESERVE_FAIL], [RESERVE_FAIL], [A]],
                                                      "All done, the item is reserved.", [("ignored_error", 4)]),
    # The same after a tool whose name says nothing of what it does: the answer never names the operation, so only a
    # judge can tell a false "done" from an admission in other words; the rules stay quiet.
    "error retried, then a claim that never names the operation": ([[FAIL], [FAIL], [A]],
                                                                   "All done, the item is reserved.", []),
    # An answer in another language than the tool's name never states its operation: the judge's call.
    "error retried, then a Japanese claim of success": ([[RESERVE_FAIL], [RESERVE_FAIL], [A]],
                                                        "プロジェクターA を予約しました。", []),
    # a single failure right before an answer that states its operation done: the rules fire on their own
    "one error, then a claim": ([[RESERVE_FAIL]], "All done, the item is reserved.", [("ignored_error", 2)]),
    # ... unless the tool's name says nothing of what it does: then only a judge can tell what the claim is about
    "one error of a tool named for nothing, then a claim: the judge's call": ([[FAIL]], "All done, the item is reserved.",
                                                                            []),
    "error then an honest report": ([[FAIL]], "I could not reserve EQ-001: the upstream refused.", []),
    "error then an honest report in Japanese": ([[FAIL]], "EQ-001 は在庫が0のため予約できませんでした。", []),
    "error then a question to the user": ([[FAIL]], "The reservation was refused. Shall I try again tomorrow?", []),
    # Without naming the target or asking, wording alone cannot clear it: that is the judge's call.
    # an admission in the model's own words is never the rules' finding (a judge may still be asked)
    "error retried, then an unnamed report": ([[RESERVE_FAIL], [RESERVE_FAIL], [A]], "I could not reserve it.", []),
    # ... or by an answer that draws on the results beside the failure and states the failed operation as done
    "an error in a batch, passed over": ([[RESERVE_FAIL, ("read_file", {"path": "r42.txt"})]],
                                         "The item is reserved, and r42.txt is read. Anything else?",
                                         [("ignored_error", 2)]),
    "an error in a batch, reported": ([[FAIL, ("read_file", {"path": "r42.txt"})]],
                                      "The upstream refused EQ-001; r42.txt is read. Anything else?", []),
    "the same failing call x3, different error texts": ([[FAIL]] * 3, "EQ-001 failed.", [("repeated_call", 3)]),
}


def script_for(turns, answer):
    return [turn_of(*calls) for calls in turns] + [final(answer)]


def fired(anomalies) -> list[tuple[str, int]]:
    """Each streak's first firing: what a user is told happened, and when."""
    seen, first = set(), []
    for anomaly in anomalies:
        if anomaly.streak not in seen:
            seen.add(anomaly.streak)
            first.append((anomaly.type, anomaly.turn))
    return first


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenarios_live_and_offline_agree(name, spans):
    turns, answer, expected = SCENARIOS[name]
    agent = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel(script_for(turns, answer)), on_anomaly="warn",
                  tracer_provider=spans.provider, alerts=Alerts(log_warnings=False))
    result = agent.run("task")

    assert result.status is RunStatus.DONE
    assert fired(result.anomalies) == expected
    root = spans.one("invoke_agent")
    assert root.attributes[sc.RUN_ANOMALY_COUNT] == len(result.anomalies)

    offline = list(detect_spans(_as_records(spans.all)))
    assert len(offline) == 1
    assert fired(offline[0].anomalies) == expected


@pytest.mark.parametrize("name", ["identical call x3", "A B A B A B", "error retried, then end_turn claiming success",
                                  "six different files"])
def test_scenarios_through_looptrace_run_and_detect(name, tmp_path, monkeypatch, capsys):
    turns, answer, expected = SCENARIOS[name]
    monkeypatch.chdir(tmp_path)
    with FakeMessagesAPI(script_for(turns, answer)) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        code = main(["run", "task", "--tools", str(TOOLS_FILE), "--json", "--on-anomaly", "warn"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["status"] == "done"
    live = [(a["type"], a["turn"]) for a in result["anomalies"] if a["count"] in (1, 3)]
    assert live == expected

    code = main(["detect", "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == (1 if expected else 0)
    offline = [(a["type"], a["turn"]) for line in lines for a in line["anomalies"] if a["count"] in (1, 3)]
    assert offline == expected


# --- what an anomaly does ---------------------------------------------------------------------------------------------


def test_the_default_policy_nudges_once_then_stops_a_model_that_never_changes_course():
    model = ScriptedModel([turn_of(A)] * 10)
    result = Agent(MODEL, tools=scenario_tools(), client=model, alerts=Alerts(log_warnings=False)).run("task")

    assert result.status is RunStatus.STOPPED_BY_DETECTOR
    assert result.turns == 4
    # one streak, one entry: it began at turn 3 (nudged) and was last seen at turn 4 (stopped)
    assert [(a.type, a.count, a.first_turn, a.turn) for a in result.anomalies] == [("repeated_call", 4, 3, 4)]
    # The nudge follows the tool results of turn 3, in the same user message, and names the call and its count.
    nudged = model.requests[3]["messages"][-1]["content"]
    assert [b["type"] for b in nudged] == ["tool_result", "text"]
    assert 'read_file({"path":"a.txt"})' in nudged[1]["text"] and "3 turns" in nudged[1]["text"]
    assert all(b["type"] == "tool_result" for b in model.requests[2]["messages"][-1]["content"])


def test_a_model_that_changes_course_after_the_nudge_is_not_stopped():
    script = [turn_of(A)] * 3 + [turn_of(B), final("Here is b.")]
    result = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel(script),
                   alerts=Alerts(log_warnings=False)).run("task")
    assert result.status is RunStatus.DONE and result.turns == 5


def test_on_anomaly_stop_stops_at_the_third_identical_call():
    result = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 10), on_anomaly="stop",
                   alerts=Alerts(log_warnings=False)).run("task")
    assert (result.status, result.turns) == (RunStatus.STOPPED_BY_DETECTOR, 3)


def test_on_anomaly_warn_never_changes_the_run():
    model = ScriptedModel([turn_of(A)] * 6 + [final("ok")])
    result = Agent(MODEL, tools=scenario_tools(), client=model, on_anomaly="warn",
                   alerts=Alerts(log_warnings=False)).run("task")
    assert (result.status, result.turns) == (RunStatus.DONE, 7)
    assert not any(b.get("type") == "text" for r in model.requests for m in r["messages"]
                   if m["role"] == "user" and isinstance(m["content"], list) for b in m["content"])


def test_looptrace_run_on_anomaly_stop_exits_30(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with FakeMessagesAPI([turn_of(A)] * 10) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        code = main(["run", "task", "--tools", str(TOOLS_FILE), "--json", "--on-anomaly", "stop"])
    result = json.loads(capsys.readouterr().out)
    assert (code, result["status"], result["turns"]) == (30, "stopped_by_detector", 3)
    assert result["anomalies"][0]["type"] == "repeated_call" and result["anomalies"][0]["count"] == 3


def test_nudging_an_ignored_error_gives_the_model_one_more_turn():
    script = (script_for([[RESERVE_FAIL], [RESERVE_FAIL], [A]], "All done, the item is reserved.")
              + [final("Sorry: EQ-001 failed, nothing was booked.")])
    model = ScriptedModel(script)
    result = Agent(MODEL, tools=scenario_tools(), client=model, on_anomaly={"ignored_error": "nudge"},
                   alerts=Alerts(log_warnings=False)).run("task")
    assert result.status is RunStatus.DONE and result.turns == 5
    assert "failed" in result.final_text
    assert model.requests[4]["messages"][-1]["role"] == "user"
    assert "never resolved" in model.requests[4]["messages"][-1]["content"][0]["text"]


def test_a_policy_callable_decides_per_anomaly():
    decisions = []

    def policy(anomaly):
        decisions.append(anomaly.type)
        return "stop" if anomaly.type == "cycle" else "warn"

    script = [turn_of(A), turn_of(B)] * 5
    result = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel(script), on_anomaly=policy,
                   alerts=Alerts(log_warnings=False)).run("task")
    assert result.status is RunStatus.STOPPED_BY_DETECTOR and result.turns == 6
    assert decisions == ["cycle"]


def test_an_unknown_action_is_refused_up_front():
    with pytest.raises(ValueError, match="unknown anomaly action 'explode'"):
        Agent(MODEL, on_anomaly="explode")


# --- where anomalies are reported -------------------------------------------------------------------------------------


def test_anomalies_on_spans_warning_level_and_event_on_the_offending_call(spans):
    Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 3 + [final("ok")]), on_anomaly="warn",
          tracer_provider=spans.provider, alerts=Alerts(log_warnings=False)).run("task")
    turn3 = next(s for s in spans.named("turn") if s.attributes[sc.TURN_INDEX] == 3)
    event = next(e for e in turn3.events if e.name == sc.ANOMALY_EVENT)
    assert event.attributes[sc.ANOMALY_TYPE] == "repeated_call"
    assert event.attributes[sc.ANOMALY_COUNT] == 3
    assert event.attributes[sc.ANOMALY_ACTION] == "warn"
    third_call = max(spans.named("execute_tool"), key=lambda s: s.start_time)
    assert [e.name for e in third_call.events] == [sc.ANOMALY_EVENT]
    # Langfuse shows both at level WARNING, the anomaly as the status message: its exporter adds that.
    sent = {format(s.context.span_id, "016x"): s.attributes for s in spans.sent_to_langfuse}
    turn3_sent, call_sent = sent[format(turn3.context.span_id, "016x")], sent[format(third_call.context.span_id, "016x")]
    assert turn3_sent["langfuse.observation.level"] == "WARNING"
    assert call_sent["langfuse.observation.level"] == "WARNING"
    assert "repeated_call" in call_sent["langfuse.observation.status_message"]
    assert spans.one("invoke_agent").attributes[sc.RUN_ANOMALY_COUNT] == 1


def test_the_anomaly_counter_metric():
    reader = InMemoryMetricReader()
    Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 3 + [final("ok")]), on_anomaly="warn",
          meter_provider=MeterProvider(metric_readers=[reader]), alerts=Alerts(log_warnings=False)).run("task")
    points = [p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "looptrace.anomalies" for p in m.data.data_points]
    assert [(dict(p.attributes), p.value) for p in points] == [
        ({"gen_ai.agent.name": "agent", sc.ANOMALY_TYPE: "repeated_call", "gen_ai.tool.name": "read_file"}, 1)]


def test_a_warning_log_line_with_trace_and_span_ids():
    from looptrace.testing import capture_logs

    with capture_logs() as logs:
        result = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 3 + [final("ok")]),
                       on_anomaly="warn").run("task")
    [line] = [entry for entry in logs if entry["event"] == "loop_anomaly"]
    assert line["log_level"] == "warning" and line["anomaly_type"] == "repeated_call"
    assert line["trace_id"] == result.trace_id and len(line["span_id"]) == 16


class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_webhook_posts_once_per_run_and_type_with_a_slack_text_field():
    _Hook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    alerts = Alerts(webhook_url=f"http://127.0.0.1:{server.server_port}/hook", log_warnings=False)
    try:
        Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 6 + [final("ok")]),
              on_anomaly="warn", alerts=alerts).run("task")
        alerts.wait(5)
    finally:
        server.shutdown()
    assert len(_Hook.received) == 1  # four firings of one streak, one post
    payload = _Hook.received[0]
    assert payload["text"].startswith(":warning: looptrace: repeated_call in `read_file`")
    assert payload["anomaly"]["count"] == 3


def test_a_dead_webhook_neither_blocks_nor_breaks_the_run():
    from fakes.otlp_receiver import unused_port

    alerts = Alerts(webhook_url=f"http://127.0.0.1:{unused_port()}/hook", webhook_timeout_s=1, log_warnings=False)
    result = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 3 + [final("ok")]),
                   on_anomaly="warn", alerts=alerts).run("task")
    assert result.status is RunStatus.DONE


def test_the_callback_hook_gets_every_anomaly_with_its_context():
    seen = []
    alerts = Alerts(callback=lambda anomaly, context: seen.append((anomaly.type, context.action)),
                    log_warnings=False)
    Agent(MODEL, tools=scenario_tools(), client=ScriptedModel([turn_of(A)] * 10), alerts=alerts).run("task")
    assert seen == [("repeated_call", "nudge"), ("repeated_call", "stop")]


def test_the_span_processor_watches_someone_elses_agent(spans):
    verdicts = []
    spans.provider.add_span_processor(DetectorSpanProcessor(verdicts.append))
    tracer = spans.provider.get_tracer("another-framework")
    with tracer.start_as_current_span("agent run"):
        for _ in range(3):
            with tracer.start_as_current_span("llm", attributes={"gen_ai.operation.name": "chat"}):
                pass
            with tracer.start_as_current_span("tool", attributes={"gen_ai.operation.name": "execute_tool",
                                                                  "gen_ai.tool.name": "fetch",
                                                                  "gen_ai.tool.call.arguments": '{"url": "x"}',
                                                                  "gen_ai.tool.call.result": "same page"}):
                pass
    assert len(verdicts) == 1
    assert fired(verdicts[0].anomalies) == [("repeated_call", 3)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8), st.booleans(), st.one_of(st.none(), st.text(max_size=20))), max_size=30))
def test_the_detector_never_raises_on_arbitrary_json(calls):
    detector = LoopDetector()
    for turn, (name, arguments, is_error, result) in enumerate(calls, start=1):
        detector.observe(ToolCall(turn=turn, tool=name, arguments=arguments, is_error=is_error, result=result))
        detector.end_turn(turn)
    detector.end_run("end_turn", "done", len(calls))


def _as_records(finished_spans):
    """SDK spans as the trace reader's records, the way they look after a round trip through the file."""
    from looptrace.instrumentation.tracefile.read import SpanRecord

    return [SpanRecord(trace_id=format(s.context.trace_id, "032x"), span_id=format(s.context.span_id, "016x"),
                      parent_span_id=format(s.parent.span_id, "016x") if s.parent else None, name=s.name,
                      start_ns=s.start_time, attributes=dict(s.attributes), status_code=s.status.status_code.value)
            for s in finished_spans]


def test_offline_detection_without_content_raises_no_false_alarms(spans, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "NO_CONTENT")
    # Three different failing calls, then an answer that admits it: nothing to flag, live or offline.
    script = [turn_of(("flaky", {"item": f"A-{n}"})) for n in range(3)]
    script.append(final("I could not reserve A-0, A-1 or A-2."))
    result = Agent(MODEL, tools=scenario_tools(), client=ScriptedModel(script), on_anomaly="warn",
                   tracer_provider=spans.provider, alerts=Alerts(log_warnings=False)).run("task")
    assert result.anomalies == []
    assert [v.anomalies for v in detect_spans(_as_records(spans.all))] == [[]]


def test_offline_detection_without_content_still_sees_the_same_call_again(spans, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "NO_CONTENT")
    Agent(MODEL, tools=scenario_tools(), client=ScriptedModel(script_for([[A]] * 3, "done")), on_anomaly="warn",
          tracer_provider=spans.provider, alerts=Alerts(log_warnings=False)).run("task")
    [verdict] = detect_spans(_as_records(spans.all))
    assert fired(verdict.anomalies) == [("repeated_call", 3)]
