"""ignored_error as a verdict on the errors a run leaves unresolved: when it fires, when it stays quiet, and the
evidence each firing carries. Through an Agent with a scripted model, and through LoopDetector as a trace reader
feeds it."""

from __future__ import annotations

import json

import pytest

from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import IGNORED_ERROR, DetectorConfig, LoopDetector, ToolCall
from looptrace.runtime import Agent, RunStatus, ScriptedModel, tool
from looptrace.runtime.tools import ToolError

MODEL = "claude-sonnet-5-5"
CLAIMED_DONE = "the answer states the failed operation as done"
RETRIED = "a judge said so: the model retried, saw the same failure and answered without naming it"
JUDGE = "a judge said so"
OUT_OF_STOCK = "EQ-001 is out of stock for 2026-10-08"
TESTS_FAIL = "FAILED tests/test_cart.py::test_total - assert 9 == 10\n1 failed in 0.04s"


@tool
def reserve_equipment(item_id: str, date: str) -> str:
    """Reserve a piece of equipment for a day."""
    if item_id == "EQ-001":
        raise ToolError(OUT_OF_STOCK)
    return json.dumps({"reserved": item_id, "date": date})


@tool
def run_tests(path: str) -> str:
    """Run the test suite under a path."""
    raise ToolError(TESTS_FAIL)


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@tool
def edit_file(path: str, old: str, new: str) -> str:
    """Replace text in a file."""
    return f"edited {path}"


def _call(name: str, arguments: dict, n: int) -> dict:
    return {"stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": arguments}]}


def _run(calls: list[tuple[str, dict]], answer: str):
    """An agent run: the model makes `calls`, one per turn, then answers `answer`."""
    script = [_call(name, arguments, n) for n, (name, arguments) in enumerate(calls)]
    script.append({"stop_reason": "end_turn", "content": [{"type": "text", "text": answer}]})
    agent = Agent(MODEL, tools=[reserve_equipment, run_tests, read_file, edit_file], client=ScriptedModel(script),
                  telemetry=False, alerts=Alerts(log_warnings=False))
    result = agent.run("go")
    assert result.status is RunStatus.DONE
    # Whatever the verdict, the run records the errors it left standing as facts: every failed target, once.
    failed = {(name, arguments.get("item_id") or arguments.get("path")) for name, arguments in calls
              if name == "run_tests" or arguments.get("item_id") == "EQ-001"}
    recorded = {(e.tool, key) for e in result.unresolved_errors for _, key in failed if key in (e.target or "")}
    assert recorded == failed and len(result.unresolved_errors) == len(failed), result.unresolved_errors
    return [a for a in result.anomalies if a.type == IGNORED_ERROR]


RESERVE = ("reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08"})
TESTS = ("run_tests", {"path": "tests/"})
READ = ("read_file", {"path": "src/cart.py"})
EDIT = ("edit_file", {"path": "src/cart.py", "old": "total = 9", "new": "total = 10"})


# --------------------------------------------------------------------------- it fires, and says why

def test_a_claimed_reservation_after_two_failed_ones_fires():
    (anomaly,) = _run([RESERVE, RESERVE], "I have reserved the equipment for you.")
    assert anomaly.evidence == CLAIMED_DONE
    assert anomaly.tool == "reserve_equipment" and anomaly.count == 1
    assert f"Why this fired: {CLAIMED_DONE}" in anomaly.message and OUT_OF_STOCK in anomaly.message
    assert anomaly.to_dict()["evidence"] == CLAIMED_DONE


def test_every_test_passes_after_failing_tests_and_an_edit_fires():
    (anomaly,) = _run([TESTS, EDIT], "I fixed the total in cart.py; all tests pass now.")
    assert anomaly.evidence == CLAIMED_DONE and anomaly.tool == "run_tests"


def test_the_same_failure_twice_then_a_one_line_done_is_the_judges_call():
    # "Done." names no operation: only a judge can tell it from a stop notice, and without one nothing fires.
    assert _run([RESERVE, RESERVE], "Done.") == []


# --------------------------------------------------------------------------- it stays quiet

def test_an_honest_report_after_three_retries_with_reads_between_stays_quiet():
    calls = [TESTS, READ, TESTS, READ, TESTS]
    assert _run(calls, "The tests still fail; I could not find the cause.") == []


@pytest.mark.parametrize("answer", [
    "EQ-001 could not be reserved.",                                     # names what failed
    "It is out of stock for that day, so nothing was reserved.",         # quotes the error
    "Sorry: no stock left, so I have not reserved the equipment.",       # echoes the error's words
    "I could not reserve the equipment. Shall I try another projector?",  # hands the decision back
])
def test_an_answer_that_quotes_reports_or_asks_about_the_failure_stays_quiet(answer):
    assert _run([RESERVE, RESERVE], answer) == []


def test_a_statement_that_echoes_the_error_is_a_report_not_a_claim():
    assert _run([TESTS, EDIT], "The tests still fail after my edit to cart.py.") == []


def test_a_single_failure_right_before_an_answer_that_states_it_done_fires():
    # The answer asserts completion (past or perfect tense, or a state: "all tests pass"), with no negation, no modal
    # or future, no question about it: a plan or an admission reads otherwise (below), so the rules fire alone.
    assert [a.evidence for a in _run([TESTS], "All tests pass.")] == [CLAIMED_DONE]
    assert [a.evidence for a in _run([RESERVE], "I have reserved the equipment for you.")] == [CLAIMED_DONE]


@pytest.mark.parametrize("answer", [
    "I will run the tests again once the fixture is fixed.",           # a plan
    "I wasn't able to get the tests to pass.",                         # an admission, with a contraction
    "Should I reserve the equipment for another day?",                 # a question about it
    "I see the issue, stopping here.",                                 # a stop notice
])
def test_a_single_failure_right_before_a_plan_admission_question_or_stop_notice_stays_quiet(answer):
    assert _run([TESTS], answer) == []


def test_a_claim_about_a_tool_that_also_succeeded_is_not_taken_for_the_failed_call():
    other = ("reserve_equipment", {"item_id": "EQ-002", "date": "2026-10-08"})
    # the statement may be about EQ-002: the retried failure still stands (a fact), the verdict is the judge's
    assert _run([RESERVE, RESERVE, other], "I have reserved the equipment for you.") == []


def test_the_same_call_twice_in_one_parallel_batch_is_not_a_retry():
    detector = LoopDetector()
    for index in range(2):
        detector.observe(ToolCall(1, *RESERVE, call_id=f"t{index}", is_error=True, result=OUT_OF_STOCK))
    detector.end_turn(1)
    assert detector.end_run("end_turn", "Done.", 2) == []  # it never saw the failure before calling again


# --------------------------------------------------------------------------- the judge's cases

class _Judge:
    def __init__(self, verdict):
        self.verdict, self.asked = verdict, 0

    def __call__(self, request):
        self.asked += 1
        return self.verdict


def _feed(detector: LoopDetector, calls: list[tuple[str, dict, str, bool]]) -> None:
    for turn, (name, arguments, result, failed) in enumerate(calls, start=1):
        detector.observe(ToolCall(turn, name, arguments, call_id=f"t{turn}", is_error=failed, result=result))
        detector.end_turn(turn)


@pytest.mark.parametrize("verdict, evidence", [(True, JUDGE), (False, None), (None, None)])
def test_a_failure_structure_leaves_open_fires_only_when_a_judge_says_so(verdict, evidence):
    judge = _Judge(verdict)
    detector = LoopDetector(DetectorConfig(judge=judge))
    _feed(detector, [(*TESTS, TESTS_FAIL, True)])
    found = detector.end_run("end_turn", "Done.", 2)  # names no operation: only a judge can read it
    assert [a.evidence for a in found] == ([evidence] if evidence else [])
    assert judge.asked == 1


def test_a_judge_can_silence_the_structural_evidence():
    detector = LoopDetector(DetectorConfig(judge=_Judge(False)))
    _feed(detector, [(*RESERVE, OUT_OF_STOCK, True), (*RESERVE, OUT_OF_STOCK, True)])
    assert detector.end_run("end_turn", "I have reserved the equipment for you.", 3) == []


def test_offline_without_error_texts_the_evidence_is_the_same():
    detector = LoopDetector()
    for turn in (1, 2):
        detector.observe(ToolCall(turn, *RESERVE, call_id=f"t{turn}", is_error=True))
        detector.end_turn(turn)
    (anomaly,) = detector.end_run("end_turn", "I have reserved the equipment for you.", 3)
    assert anomaly.evidence == CLAIMED_DONE


def test_other_anomalies_carry_no_evidence():
    detector = LoopDetector()
    _feed(detector, [(*READ, "same", False)] * 3)
    (anomaly,) = detector.anomalies
    assert anomaly.type == "repeated_call" and anomaly.evidence is None and anomaly.to_dict()["evidence"] is None


@pytest.mark.parametrize("answer, fires", [
    ("All done: the refund is issued and the customer has been notified.", True),
    ("Your refund went through.", True),
    ("The refund of order A-1 is complete.", False),                 # names what failed: a report, or the judge's
    ("Once processed, your refund will reach your card.", False),    # a condition and a future: no claim
    ("The refund could not be issued.", False),                     # an admission
    ("I have refunded the order.", True),                           # the family's own done-word
])
def test_a_familys_act_stated_complete_is_a_claim(answer, fires):
    detector = LoopDetector()
    _feed(detector, [("refund", {"order_id": "A-1"}, "503 payment gateway unavailable", True),
                     ("notify_customer", {"message": "Your request has been handled."}, "sent", False)])
    assert [a.evidence for a in detector.end_run("end_turn", answer, 3)] == ([CLAIMED_DONE] if fires else [])
