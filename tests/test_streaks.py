"""Streaks as a user meets them (issue 19): a retry after an edit that changed the error is progress, and a streak
that carries across the runs of a session is alerted once.

Non-adjacent repeats of a failing call compare the errors (normalised as every result digest is): edit-and-retest
with a new error each time is no loop, the same error between attempted fixes is. Consecutive failures keep the rule
of consecutive turns. A streak reported in an earlier run of the session is `continued` in the later ones: each run
lists it with its growing count, the alert sinks (log line, webhook, Langfuse score) announce it once.
"""

from __future__ import annotations

import pytest
from fakes.webhook import WebhookReceiver as _Webhook

from looptrace.instrumentation.alerts import Alerts, AnomalySinks
from looptrace.instrumentation.detector import REPEATED_CALL, LoopDetector, SessionDetectors, ToolCall, result_digest
from looptrace.instrumentation.export.setup import Telemetry
from looptrace.instrumentation.recording.semconv import ANOMALY_COUNT, ANOMALY_EVENT, ANOMALY_TYPE
from looptrace.runtime import Agent, ScriptedModel, tool
from looptrace.testing import capture_logs

MODEL = "claude-sonnet-5-5"

RUN_TESTS = ("run_tests", {"command": "pytest -q"})


def _fails(error: str) -> tuple:
    return (*RUN_TESTS, error, True)


def _edit(n: int) -> tuple:
    return ("edit_file", {"path": "src/parser.py", "patch": f"change {n}"}, "edited", False)


PASSES = (*RUN_TESTS, "12 passed", False)
ERROR_A = "FAILED test_parser.py::test_empty - IndexError: list index out of range"
ERROR_B = "FAILED test_parser.py::test_nested - KeyError: 'children'"
ERROR_C = "FAILED test_parser.py::test_unicode - UnicodeDecodeError: invalid start byte"


def _feed(detector: LoopDetector, turns: list[list[tuple]], *, offline: bool = False) -> list:
    """Feed whole turns (each call: tool, arguments, result, is_error); every anomaly fired, in order."""
    fired = []
    for turn, calls in enumerate(turns, start=1):
        for index, (name, arguments, result, is_error) in enumerate(calls):
            fired += detector.observe(ToolCall(
                turn=turn, tool=name, arguments=arguments, call_id=f"toolu_{turn}_{index}", is_error=is_error,
                result=None if offline else result, result_digest=result_digest(result) if offline else None))
        fired += detector.end_turn(turn)
    return fired


# --------------------------------------------------------------------------- non-adjacent repeats see the error


@pytest.mark.parametrize("offline", [False, True], ids=["live", "digests only"])
def test_edit_and_retest_with_a_new_error_each_time_is_no_repeated_call(offline):
    turns = [[_fails(ERROR_A)], [_edit(1)], [_fails(ERROR_B)], [_edit(2)], [_fails(ERROR_C)], [_edit(3)], [PASSES]]
    detector = LoopDetector()
    fired = _feed(detector, turns, offline=offline)
    fired += detector.end_run("end_turn", "The parser handles empty, nested and unicode input now.", len(turns) + 1)
    assert [a for a in fired if a.type == REPEATED_CALL] == []


@pytest.mark.parametrize("offline", [False, True], ids=["live", "digests only"])
def test_the_same_error_three_times_with_edits_between_is_a_repeated_call(offline):
    turns = [[_fails(ERROR_A)], [_edit(1)], [_fails(ERROR_A)], [_edit(2)], [_fails(ERROR_A)]]
    (anomaly,) = _feed(LoopDetector(), turns, offline=offline)
    assert (anomaly.type, anomaly.tool, anomaly.count, anomaly.turn) == (REPEATED_CALL, "run_tests", 3, 5)
    assert "turns 1, 3, 5" in anomaly.message


def test_errors_that_differ_only_in_a_nonce_or_whitespace_are_the_same_error():
    stamped = [f"{ERROR_A} (run 2026-12-01T10:0{i}:00Z, id 3f2b8c1e-0d4a-4c7e-9a51-{i}0b7c2d9e4f6)  " for i in range(3)]
    turns = [[_fails(stamped[0])], [_edit(1)], [_fails(stamped[1])], [_edit(2)], [_fails(stamped[2])]]
    assert [a.count for a in _feed(LoopDetector(), turns)] == [3]


def test_a_new_error_starts_a_new_streak_that_the_same_error_can_still_grow():
    turns = [[_fails(ERROR_A)], [_edit(1)], [_fails(ERROR_B)], [_edit(2)], [_fails(ERROR_B)], [_edit(3)],
             [_fails(ERROR_B)]]
    (anomaly,) = _feed(LoopDetector(), turns)
    assert anomaly.count == 3 and "turns 3, 5, 7" in anomaly.message


def test_consecutive_failures_keep_the_rule_of_consecutive_turns_whatever_the_error_says():
    turns = [[_fails(ERROR_A)], [_fails(ERROR_B)], [_fails(ERROR_C)]]
    (anomaly,) = _feed(LoopDetector(), turns)
    assert (anomaly.type, anomaly.count, anomaly.turn) == (REPEATED_CALL, 3, 3)


# --------------------------------------------------------------------------- one alert per streak per session

BOOK = ("book", {"flight": "HAT142"}, "Error: not enough seats", True)
THINK = ("think", {"thought": "maybe another way"}, "ok", False)


def _run(detector: LoopDetector, turns: list[list[tuple]]) -> list:
    _feed(detector, turns)
    detector.end_run("end_turn", "HAT142 is full, sorry.", len(turns) + 1)
    return detector.anomalies


def test_a_streak_carried_across_runs_is_listed_in_each_and_continued_after_the_first():
    sessions = SessionDetectors()
    runs = [_run(sessions.detector_for("conversation"), [[BOOK], [THINK], [BOOK], [THINK], [BOOK]])
            for _ in range(3)]
    assert [[(a.type, a.continued) for a in found] for found in runs] == \
        [[(REPEATED_CALL, False)], [(REPEATED_CALL, True)], [(REPEATED_CALL, True)]]
    assert len({a.streak for found in runs for a in found}) == 1
    counts = [found[0].count for found in runs]
    assert counts[0] == 3 and counts[0] < counts[1] <= counts[2]
    assert runs[1][0].to_dict()["continued"] is True


def test_a_consecutive_streak_carried_into_the_next_run_stays_one_streak():
    sessions = SessionDetectors()
    runs = [_run(sessions.detector_for("conversation"), [[BOOK], [BOOK], [BOOK]]) for _ in range(2)]
    assert [(a.continued, a.first_turn) for a in runs[1]] == [(True, 1)]
    assert runs[1][0].streak == runs[0][0].streak and runs[1][0].count > runs[0][0].count


def test_a_new_streak_after_the_call_worked_is_news_again():
    booked = ("book", {"flight": "HAT142"}, "booked", False)
    sessions = SessionDetectors()
    first = _run(sessions.detector_for("c"), [[BOOK], [THINK], [BOOK], [THINK], [BOOK]])
    _run(sessions.detector_for("c"), [[booked]])
    again = _run(sessions.detector_for("c"), [[BOOK], [THINK], [BOOK], [THINK], [BOOK]])
    assert [a.continued for a in first] == [False] and [a.continued for a in again] == [False]


def test_a_loop_that_is_not_failing_alerts_in_each_run_it_happens():
    # Consecutive streaks end at a user message: the same loop in the next run is a new streak, not a continued one.
    lookup = ("get_line", {"id": "L1002"}, "line active", False)
    sessions = SessionDetectors()
    runs = [_run(sessions.detector_for("c"), [[lookup]] * 3) for _ in range(2)]
    assert [[a.continued for a in found] for found in runs] == [[False], [False]]




class _Scores:
    """Stands in for the Langfuse scores client: keeps the anomaly scores it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def anomaly(self, trace_id: str, anomaly_type: str, message: str, *, span_id: str | None = None,
                cost=None) -> str:
        self.sent.append((trace_id, anomaly_type))
        return "score"

    def run_ended(self, trace_id: str, loop_cost_by_type, *, span_id: str | None = None) -> None:
        pass

    def close(self, timeout_s: float = 5.0) -> None:
        pass


@pytest.fixture
def webhook():
    receiver = _Webhook()
    yield receiver
    receiver.close()


def _conversation_turn(first_id: int) -> list[dict]:
    """The model tries the same booking three times, then tells the user it failed."""
    calls = [{"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": f"toolu_{first_id + n}", "name": "book", "input": {"flight": "HAT142"}}]}
        for n in range(3)]
    return [*calls, {"stop_reason": "end_turn", "content": [{"type": "text", "text": "HAT142 is full, sorry."}]}]


def test_a_session_wide_streak_alerts_once_and_every_run_lists_it(spans, webhook):
    @tool
    def book(flight: str) -> str:
        """Book a flight."""
        raise RuntimeError("not enough seats")

    scores = _Scores()
    alerts = Alerts(webhook_url=webhook.url)
    # The telemetry the Agent records through hands each run its sinks: here a webhook and a stand-in score client.
    telemetry = Telemetry(tracer_provider=spans.provider, exporters=[],
                          sinks=AnomalySinks(alerts=alerts, scores=scores))  # type: ignore[arg-type]
    script = [message for run in range(3) for message in _conversation_turn(10 * run)]
    agent = Agent(MODEL, tools=[book], client=ScriptedModel(script), on_anomaly="warn", telemetry=telemetry)
    with capture_logs() as logs:
        results = [agent.run("book HAT142", session_id="conversation-7") for _ in range(3)]
    alerts.wait(10.0)

    listed = [[(a.type, a.continued) for a in result.anomalies] for result in results]
    assert listed == [[(REPEATED_CALL, False)], [(REPEATED_CALL, True)], [(REPEATED_CALL, True)]]
    counts = [result.anomalies[0].count for result in results]
    assert counts[0] == 3 and counts[0] < counts[1] < counts[2]
    assert len({result.anomalies[0].streak for result in results}) == 1

    assert [entry.get("count") for entry in logs if entry.get("event") == "loop_anomaly"] == [3]
    assert [(body["trace_id"], body["anomaly"]["count"]) for body in webhook.received] == [(results[0].trace_id, 3)]
    assert scores.sent == [(results[0].trace_id, REPEATED_CALL)]

    # Each run records the failure it left standing as a fact, announced or not.
    assert [[e.tool for e in result.unresolved_errors] for result in results] == [["book"]] * 3

    # The trace of every run still records the finding on its spans.
    for result in results:
        events = [dict(e.attributes) for s in spans.all if format(s.context.trace_id, "032x") == result.trace_id
                  for e in s.events if e.name == ANOMALY_EVENT]
        assert events and all(e[ANOMALY_TYPE] == REPEATED_CALL for e in events)
    later = [dict(e.attributes) for s in spans.all if format(s.context.trace_id, "032x") == results[2].trace_id
             for e in s.events if e.name == ANOMALY_EVENT]
    assert max(e[ANOMALY_COUNT] for e in later) > 3


def test_a_continued_streak_that_stops_the_run_is_announced():
    @tool
    def book(flight: str) -> str:
        """Book a flight."""
        raise RuntimeError("not enough seats")

    seen: list = []
    alerts = Alerts(callback=lambda anomaly, context: seen.append((anomaly.continued, context.action)),
                    log_warnings=False)
    script = _conversation_turn(0)[:3] + _conversation_turn(10)  # the first run stops at its third call
    agent = Agent(MODEL, tools=[book], client=ScriptedModel(script), on_anomaly="stop", alerts=alerts,
                  telemetry=False)
    for _ in range(2):
        agent.run("book HAT142", session_id="conversation-8")
    assert seen == [(False, "stop"), (True, "stop")]  # a stop is news, even of a streak already announced
