"""The detector on real agents (issue 9): the misses and evasions found on recorded runs, as specifications.

Non-adjacent and session-wide repeats, per-target resolution, nonces and whitespace, one alert per streak, the judge,
and anomalies that carry no content when content capture is off.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from fakes.messages_api import FakeMessagesAPI

from looptrace.cli.views import LiveView
from looptrace.instrumentation.alerts import Alerts, webhook_payload
from looptrace.instrumentation.detector import (
    IGNORED_ERROR,
    REPEATED_CALL,
    DetectorConfig,
    LoopDetector,
    SessionDetectors,
    ToolCall,
    canonical_arguments,
    result_digest,
)
from looptrace.instrumentation.offline.trace_detect import detect_spans
from looptrace.instrumentation.tracefile.read import SpanRecord
from looptrace.runtime import Agent, RunStatus, ScriptedModel, tool
from looptrace.runtime.judge import ModelJudge

MODEL = "claude-sonnet-5-5"


def _as_records(finished_spans):
    """SDK spans as the trace reader's records."""
    return [SpanRecord(trace_id=format(s.context.trace_id, "032x"), span_id=format(s.context.span_id, "016x"),
                      parent_span_id=format(s.parent.span_id, "016x") if s.parent else None, name=s.name,
                      start_ns=s.start_time, attributes=dict(s.attributes), status_code=s.status.status_code.value)
            for s in finished_spans]


def call(turn, tool_name, arguments, result, error=False):
    return ToolCall(turn=turn, tool=tool_name, arguments=arguments, call_id=f"t{turn}_{tool_name}",
                    is_error=error, result=result)


def feed_turns(detector, turns, first_turn=1):
    fired = []
    for turn, calls in enumerate(turns, start=first_turn):
        for c in calls:
            detector.observe(call(turn, *c))
        fired += detector.end_turn(turn)
    return fired


BOOK_FAILS = ("book", {"flight": "HAT142"}, "Error: not enough seats", True)
THINK = ("think", {"thought": "maybe another way"}, "ok")


# --------------------------------------------------------------------------- repeats with other calls between


def test_the_same_failing_call_with_other_calls_between_is_a_repeated_call():
    fired = feed_turns(LoopDetector(), [[BOOK_FAILS], [THINK], [BOOK_FAILS], [THINK], [BOOK_FAILS]])
    (anomaly,) = fired
    assert anomaly.type == REPEATED_CALL and anomaly.turn == 5 and anomaly.count == 3
    assert anomaly.tool == "book" and "turns 1, 3, 5" in anomaly.message


def test_failures_spread_wider_than_the_window_are_not_a_loop():
    thinking = [[("think", {"n": i}, "ok")] for i in range(12)]
    spread = [[BOOK_FAILS]] + thinking[:10] + [[BOOK_FAILS]] + thinking[10:] + [[BOOK_FAILS]]
    assert feed_turns(LoopDetector(), spread) == []


def test_successful_rechecks_between_actions_are_troubleshooting_not_a_loop():
    check = ("can_send_mms", {}, "no")
    turns = [[check], [("toggle_wifi", {}, "ok")], [check], [("reset_apn", {}, "ok")], [check]]
    assert feed_turns(LoopDetector(), turns) == []


def test_a_success_in_between_ends_the_failing_streak():
    book_ok = ("book", {"flight": "HAT142"}, "booked")
    assert feed_turns(LoopDetector(), [[BOOK_FAILS], [THINK], [book_ok], [BOOK_FAILS], [THINK], [BOOK_FAILS]]) == []


# --------------------------------------------------------------------------- sessions


def run_of(detector, turns, answer="Sorry, the flight is full."):
    found = feed_turns(detector, turns)
    found += detector.end_run("end_turn", answer, len(turns) + 1)
    return found


def test_a_failing_call_repeated_across_the_user_turns_of_a_session_is_caught():
    sessions = SessionDetectors()
    fired = [run_of(sessions.detector_for("conversation-1"), [[BOOK_FAILS]]) for _ in range(3)]
    assert fired[0] == [] and fired[1] == []
    (anomaly,) = fired[2]
    assert anomaly.type == REPEATED_CALL and anomaly.count == 3


def test_runs_without_a_session_do_not_share_memory():
    assert [run_of(LoopDetector(), [[BOOK_FAILS]]) for _ in range(3)] == [[], [], []]


def test_consecutive_streaks_do_not_cross_a_user_message():
    lookup = ("get_line", {"id": "L1002"}, "line active")
    sessions = SessionDetectors()
    assert [run_of(sessions.detector_for("c"), [[lookup]], "Try a reboot.") for _ in range(4)] == [[]] * 4


def test_session_memory_is_bounded_and_forgets_idle_sessions():
    now = [0.0]
    sessions = SessionDetectors(max_sessions=2, ttl_s=60, clock=lambda: now[0])
    first = sessions.detector_for("a")
    sessions.detector_for("b")
    sessions.detector_for("c")  # over capacity: the least recently used ("a") goes
    assert len(sessions) == 2 and sessions.detector_for("a") is not first
    now[0] = 1000.0
    sessions.detector_for("d")  # everything else idled past the TTL
    assert len(sessions) == 1


def test_the_agent_shares_memory_between_runs_with_the_same_session_id():
    @tool
    def book(flight: str) -> str:
        """Book a flight."""
        raise RuntimeError("not enough seats")

    def conversation_turn():
        return [{"stop_reason": "tool_use", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "book", "input": {"flight": "HAT142"}}]},
                {"stop_reason": "end_turn", "content": [{"type": "text", "text": "HAT142 is full, sorry."}]}]

    agent = Agent(MODEL, tools=[book], client=ScriptedModel(conversation_turn() * 6), on_anomaly="warn",
                  alerts=Alerts(log_warnings=False), telemetry=False)
    shared = [agent.run("book it", session_id="s-1").anomalies for _ in range(3)]
    alone = [agent.run("book it").anomalies for _ in range(3)]
    assert [[a.type for a in found] for found in shared] == [[], [], [REPEATED_CALL]]
    assert alone == [[], [], []]


def test_looptrace_detect_reads_a_conversation_as_one_session(spans):
    @tool
    def book(flight: str) -> str:
        """Book a flight."""
        raise RuntimeError("not enough seats")

    one_turn = [{"stop_reason": "tool_use", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "book", "input": {"flight": "HAT142"}}]},
                {"stop_reason": "end_turn", "content": [{"type": "text", "text": "HAT142 is full, sorry."}]}]
    agent = Agent(MODEL, tools=[book], client=ScriptedModel(one_turn * 3), on_anomaly="warn",
                  alerts=Alerts(log_warnings=False), tracer_provider=spans.provider)
    live = [agent.run("book it", session_id="s-9").anomalies for _ in range(3)]
    verdicts = list(detect_spans(_as_records(spans.all)))
    assert [[a.type for a in v.anomalies] for v in verdicts] == [[a.type for a in found] for found in live] \
        == [[], [], [REPEATED_CALL]]


# --------------------------------------------------------------------------- per-target resolution


def test_a_command_failing_until_the_end_is_not_resolved_by_other_commands():
    commit = ("execute_bash", {"command": "git commit -m 'fix parser'"}, "hook rejected the commit", True)
    other = [("execute_bash", {"command": f"ls src/{i}"}, f"files {i}") for i in range(3)]
    # The answer names no operation: the rules hand it to the judge (here one that says "ignored").
    asked = []
    detector = LoopDetector(DetectorConfig(judge=lambda request: asked.append(request) or True))
    feed_turns(detector, [[commit], [other[0]], [commit], [other[1]], [commit], [other[2]]])
    found = detector.end_run("end_turn", "I have successfully completed the fix.", 7)
    assert [a.type for a in found] == [IGNORED_ERROR] and len(asked) == 1
    assert "git commit" in found[0].message and found[0].evidence.startswith("a judge said so")


def test_a_retry_on_the_same_target_with_a_corrected_argument_resolves_the_error():
    failed = ("update_flights", {"reservation_id": "NM1VX1", "cabin": "business", "payment_id": "gift_card_1"},
              "Gift card balance is not enough", True)
    retried = ("update_flights", {"reservation_id": "NM1VX1", "cabin": "business", "payment_id": "visa_7"}, "ok")
    detector = LoopDetector()
    feed_turns(detector, [[failed], [failed], [("get_user", {"id": "u1"}, "user")], [retried]])
    assert detector.end_run("end_turn", "Upgraded to business.", 5) == []


# --------------------------------------------------------------------------- nonces and whitespace


@pytest.mark.parametrize("results", [
    ["status: pending (checked 2026-11-30T01:00:00Z)", "status: pending (checked 2026-11-30T01:00:05Z)",
     "status: pending (checked 2026-11-30T01:00:09.123+00:00)"],
    ['{"state": "queued", "request_id": "7c9e6679-7425-40de-944b-e07fc1f90ae7"}',
     '{"state": "queued", "request_id": "0e4f0a2c-1b6d-4f0e-9a57-3c2d7e1b9f11"}',
     '{"state": "queued", "request_id": "a1b2c3d4-e5f6-4711-8899-aabbccddeeff"}'],
    ["queued  ", "queued\n", "queued"],
])
def test_results_that_differ_only_in_a_nonce_or_whitespace_are_no_progress(results):
    turns = [[("job_status", {"id": 7}, text)] for text in results]
    assert [a.type for a in feed_turns(LoopDetector(), turns)] == [REPEATED_CALL]


def test_real_progress_still_counts_as_progress():
    turns = [[("job_status", {"id": 7}, f"status: running, {pct}% at 2026-11-30T01:00:0{pct // 10}Z")]
             for pct in (10, 40, 70)]
    assert feed_turns(LoopDetector(), turns) == []


@pytest.mark.parametrize("variants", [
    [{"q": "flights to  Osaka"}, {"q": " flights to Osaka"}, {"q": "flights to Osaka\t"}],
    [{"city": "Zu\u0308rich"}, {"city": "Z\u00fcrich"}, {"city": "Zu\u0308rich"}],  # NFD vs NFC
    [{"q": "x", "request_id": "r-1"}, {"q": "x", "request_id": "r-2"}, {"q": "x", "requestId": "r-3"}],
    [{"q": "x", "timestamp": 1764464400}, {"q": "x", "timestamp": 1764464405}, {"q": "x", "ts": "now"}],
])
def test_arguments_that_differ_only_in_whitespace_normal_form_or_a_nonce_are_the_same_call(variants):
    turns = [[("search", args, "no results")] for args in variants]
    assert [a.type for a in feed_turns(LoopDetector(), turns)] == [REPEATED_CALL]


def test_indentation_in_multi_line_strings_still_matters():
    assert canonical_arguments({"code": "if x:\n    y()"}) != canonical_arguments({"code": "if x:\ny()"})
    assert canonical_arguments({"code": "if x:\n    y()   \n"}) == canonical_arguments({"code": "if x:\n    y()"})
    assert result_digest("2026-11-30") != result_digest("2026-12-01")  # dates alone are data


# --------------------------------------------------------------------------- one alert per streak


def _looping_agent(turns: int, **options: Any) -> tuple[Agent, list]:
    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return "same contents"

    script = [{"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": "a.txt"}}]}
        for i in range(turns)] + [{"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]}]
    seen: list = []
    alerts = Alerts(callback=lambda anomaly, context: seen.append(anomaly), log_warnings=False)
    return Agent(MODEL, tools=[read_file], client=ScriptedModel(script), alerts=alerts, **options), seen


def test_a_long_loop_alerts_once_and_reports_one_updated_anomaly(spans, capsys):
    import sys

    agent, seen = _looping_agent(8, on_anomaly="warn", tracer_provider=spans.provider, on_event=LiveView(sys.stdout))
    result = agent.run("task")
    assert result.status is RunStatus.DONE
    assert [(a.type, a.count) for a in seen] == [(REPEATED_CALL, 3)]  # one alert, at the first firing
    (anomaly,) = result.anomalies  # summarised at the end: the latest count and turn of the streak
    assert (anomaly.count, anomaly.first_turn, anomaly.turn) == (8, 3, 8)
    assert capsys.readouterr().out.count("⚠") == 1
    offline = list(detect_spans(_as_records(spans.all)))
    assert [(a.type, a.count, a.first_turn, a.turn) for a in offline[0].anomalies] == \
        [(a.type, a.count, a.first_turn, a.turn) for a in result.anomalies]


def test_the_stop_of_an_escalated_streak_is_still_reported():
    agent, seen = _looping_agent(10)
    result = agent.run("task")
    assert result.status is RunStatus.STOPPED_BY_DETECTOR
    assert [a.count for a in seen] == [3, 4]  # nudged at 3, stopped at 4: the stop is news, not noise


# --------------------------------------------------------------------------- no content leaves with capture off


def test_with_content_capture_off_anomalies_carry_no_arguments_or_error_text(monkeypatch, spans):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "NO_CONTENT")
    monkeypatch.setenv("LOOPTRACE_CAPTURE_CONTENT", "false")
    secret_argument, secret_error = "ACME-ORDER-9911", "card 4111 declined for ACME-ORDER-9911"

    @tool
    def pay(order: str) -> str:
        """Pay an order."""
        raise RuntimeError(secret_error)

    @tool
    def note(text: str) -> str:
        """Take a note."""
        return "noted"

    turn = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "pay", "input": {"order": secret_argument}}]}
    other = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_2", "name": "note", "input": {"text": "thinking"}}]}
    script = [turn, other, turn, other, turn, {"stop_reason": "end_turn", "content": [
        {"type": "text", "text": "Paid."}]}, {"stop_reason": "end_turn", "content": [{"type": "text", "text": "ok"}]}]
    seen: list = []
    model = ScriptedModel(script)
    from looptrace.testing import capture_logs

    with capture_logs() as logs:
        result = Agent(MODEL, tools=[pay, note], client=model, on_anomaly="nudge", tracer_provider=spans.provider,
                       detector=DetectorConfig(judge=lambda request: True),  # "Paid." names no operation: judged
                       alerts=Alerts(callback=lambda a, c: seen.append(webhook_payload(a, c)))).run("task")
    assert {a.type for a in result.anomalies} == {REPEATED_CALL, IGNORED_ERROR}
    from looptrace.instrumentation.recording.semconv import ANOMALY_EVENT

    anomaly_events = [dict(e.attributes) for span in spans.all for e in span.events if e.name == ANOMALY_EVENT]
    statuses = [span.status.description or "" for span in spans.all]
    everything = json.dumps([a.to_dict() for a in result.anomalies] + seen + anomaly_events + statuses
                            + [str(entry) for entry in logs], ensure_ascii=False)
    nudges = [b["text"] for r in model.requests for m in r["messages"] if m["role"] == "user"
              and isinstance(m["content"], list) for b in m["content"] if b.get("type") == "text"]
    assert nudges and "pay" in everything and anomaly_events
    assert any(entry.get("event") == "loop_anomaly" for entry in logs)
    for leaked in (secret_argument, "declined", "4111"):
        assert leaked not in everything and not any(leaked in n for n in nudges)


# --------------------------------------------------------------------------- the judge


def _verdict(ignored: bool) -> dict:
    return {"stop_reason": "tool_use", "usage": {"input_tokens": 120, "output_tokens": 15},
            "content": [{"type": "tool_use", "id": "toolu_v", "name": "verdict",
                         "input": {"ignored": ignored, "reason": "test"}}]}


def _judged_script(final_text: str) -> list:
    fail = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_f", "name": "reserve", "input": {"item": "EQ-001"}}]}
    return [fail, {"stop_reason": "end_turn", "content": [{"type": "text", "text": final_text}]}]


@tool
def reserve(item: str) -> str:
    """Reserve an item."""
    raise RuntimeError("out of stock")


@pytest.mark.parametrize("ignored, fires", [(True, True), (False, False)])
def test_a_model_judge_decides_offline_with_a_scripted_model(spans, ignored, fires):
    judge_model = ScriptedModel([_verdict(ignored)])
    judge = ModelJudge(judge_model, "claude-haiku-4-5")
    agent = Agent(MODEL, tools=[reserve], client=ScriptedModel(_judged_script("Reserved it for you.")),
                  on_anomaly="warn", detector=DetectorConfig(judge=judge), alerts=Alerts(log_warnings=False),
                  tracer_provider=spans.provider)
    result = agent.run("reserve EQ-001")
    assert bool(result.anomalies) is fires
    (request,) = judge_model.requests
    assert request["tool_choice"] == {"type": "tool", "name": "verdict"}
    assert "Reserved it for you." in request["messages"][0]["content"]
    judged = [s for s in spans.all if s.attributes.get("looptrace.judge")]
    assert len(judged) == 1 and judged[0].attributes["gen_ai.usage.input_tokens"] == 120
    assert judged[0].attributes["looptrace.judge.cost_usd"] > 0
    assert result.usage.input_tokens == 0  # the judge's tokens are not the run's


@pytest.mark.parametrize("judge_answer, fires", [
    (_verdict(False), False),                                   # "not ignored": silenced
    (_verdict(True), True),
    ({"stop_reason": "end_turn", "content": "no idea"}, True),   # no verdict: the rule's own verdict stands
])
def test_the_judge_end_to_end_against_the_messages_api_fake(judge_answer, fires):
    # The rule alone fires here (retried, failed again, moved on); the judge, asked through the agent's own client,
    # confirms or silences it.
    fail = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_f1", "name": "reserve", "input": {"item": "EQ-001"}}]}
    again = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_f2", "name": "reserve", "input": {"item": "EQ-001"}}]}
    other = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_n", "name": "note", "input": {"text": "x"}}]}

    @tool
    def note(text: str) -> str:
        """Take a note."""
        return "noted"

    script = [fail, again, other, {"content": "All reserved!"}, judge_answer]
    with FakeMessagesAPI(script) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
        agent = Agent(MODEL, tools=[reserve, note], client=client, on_anomaly="warn",
                      detector=DetectorConfig(judge="claude-haiku-4-5"), alerts=Alerts(log_warnings=False),
                      telemetry=False)
        result = agent.run("reserve EQ-001")
        judge_request = api.requests[-1]
    assert result.status is RunStatus.DONE
    assert judge_request["model"] == "claude-haiku-4-5" and judge_request["tools"][0]["name"] == "verdict"
    assert [a.type for a in result.anomalies] == ([IGNORED_ERROR] if fires else [])


def test_a_later_turn_that_claims_an_earlier_failure_done_is_caught_by_the_judge_against_the_fake_api():
    # Turn 1 of a conversation: the reservation fails and the answer says so. Turn 2, the user says "go ahead": the
    # model calls nothing and answers that it is done. Only the judge can tell that from a goodbye; it is asked once.
    fail = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_f1", "name": "reserve", "input": {"item": "EQ-001"}}]}
    script = [fail, {"content": "EQ-001 is out of stock, sorry. Shall I try again?"},
              {"content": "Done! Your item is reserved."}, _verdict(True)]
    with FakeMessagesAPI(script) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
        agent = Agent(MODEL, tools=[reserve], client=client, on_anomaly="warn", telemetry=False,
                      detector=DetectorConfig(judge="claude-haiku-4-5"), alerts=Alerts(log_warnings=False))
        first = agent.run("reserve EQ-001", session_id="conversation-7")
        second = agent.run("yes, go ahead", session_id="conversation-7")
        judge_request = api.requests[-1]
    assert first.anomalies == [] and first.status is RunStatus.DONE
    assert [a.type for a in second.anomalies] == [IGNORED_ERROR]
    assert judge_request["model"] == "claude-haiku-4-5" and "Done! Your item is reserved." in json.dumps(judge_request)


def test_a_judge_that_errors_leaves_the_rule_and_never_breaks_the_run():
    broken = ModelJudge(ScriptedModel([]), "claude-haiku-4-5")  # raises: no response left
    detector = LoopDetector(DetectorConfig(judge=broken))
    feed_turns(detector, [[BOOK_FAILS], [BOOK_FAILS], [THINK]])
    found = detector.end_run("end_turn", "Booked!", 4)
    assert [a.type for a in found] == [IGNORED_ERROR] and detector.judge_failures == 1


def test_a_judge_that_errors_against_the_fake_api_leaves_the_rule():
    from fakes.messages_api import Error

    fail = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "toolu_f1", "name": "reserve", "input": {"item": "EQ-001"}}]}
    script = [fail, dict(fail, content=[dict(fail["content"][0], id="toolu_f2")]),
              {"stop_reason": "tool_use", "content": [
                  {"type": "tool_use", "id": "toolu_n", "name": "look_around", "input": {}}]},
              {"content": "All reserved!"}, Error(500, "api_error", "judge down")]

    @tool
    def look_around() -> str:
        """Look at something else (another tool of the reserve family succeeding could be what "reserved" is about)."""
        return "ok"

    with FakeMessagesAPI(script) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
        result = Agent(MODEL, tools=[reserve, look_around], client=client, on_anomaly="warn", telemetry=False,
                       detector=DetectorConfig(judge="claude-haiku-4-5"), alerts=Alerts(log_warnings=False)
                       ).run("reserve EQ-001")
    assert result.status is RunStatus.DONE
    assert [a.type for a in result.anomalies] == [IGNORED_ERROR]


# --------------------------------------------------------------------------- the CLI prints each anomaly once


@pytest.mark.slow
def test_looptrace_run_prints_each_anomaly_once(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from looptrace.cli.app import main

    tools_file = Path(__file__).parent / "data" / "scenario_tools.py"
    loop = [{"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": "a.txt"}}]} for i in range(8)]
    monkeypatch.chdir(tmp_path)
    with FakeMessagesAPI(loop + [{"content": "done"}]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        code = main(["run", "task", "--tools", str(tools_file), "--on-anomaly", "warn"])
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("⚠") == 1 and "loop_anomaly" not in err
