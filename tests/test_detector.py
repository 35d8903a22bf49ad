"""The loop-anomaly detector: canonical calls, the four rules, robustness and bounded memory."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from looptrace.instrumentation.detector import (
    CYCLE,
    FAILING_TOOL,
    IGNORED_ERROR,
    REPEATED_CALL,
    Anomaly,
    DetectorConfig,
    LoopDetector,
    ToolCall,
    answer_addresses,
    call_targets,
    canonical_arguments,
    result_digest,
)

# --------------------------------------------------------------------------- helpers
#
# A turn is a list of calls; a call is (tool, arguments, result) or (tool, arguments, result, "error").


def _tool_calls(turn: int, specs, offline: bool) -> list[ToolCall]:
    calls = []
    for index, spec in enumerate(specs):
        tool, arguments, result, *flag = spec
        is_error = flag == ["error"]
        calls.append(ToolCall(
            turn=turn,
            tool=tool,
            arguments=arguments,
            call_id=f"toolu_{turn}_{index}",
            is_error=is_error,
            result=None if offline else result,
            result_digest=result_digest(result) if offline else None,
        ))
    return calls


def feed(turns, *, config=None, offline=False, detector=None, first_turn=1):
    """Feed whole turns; returns the detector and {turn: anomalies fired at that turn}."""
    detector = detector or LoopDetector(config)
    fired: dict[int, list[Anomaly]] = {}
    for turn, specs in enumerate(turns, start=first_turn):
        for call in _tool_calls(turn, specs, offline):
            assert detector.observe(call) == []
        fired[turn] = detector.end_turn(turn)
    return detector, fired


def firing_turns(fired, kind=None):
    return [t for t, found in fired.items() if any(kind is None or a.type == kind for a in found)]


def end(detector, text, stop_reason="end_turn", turn=99):
    return detector.end_run(stop_reason, text, turn)


A = ("search", {"q": "a"}, "result a")
B = ("search", {"q": "b"}, "result b")
C = ("read", {"path": "c"}, "result c")


# --------------------------------------------------------------------------- canonical arguments


@pytest.mark.parametrize("left, right, same", [
    ({"a": 1, "b": {"y": 2, "x": [1, {"n": 1, "m": 2}]}},
     {"b": {"x": [1, {"m": 2, "n": 1}], "y": 2}, "a": 1}, True),
    ({"n": 10}, {"n": 10.0}, True),
    ({"n": 0}, {"n": -0.0}, True),
    ({"n": 10}, {"n": "10"}, False),
    ({"flag": True}, {"flag": 1}, False),
    ({"flag": False}, {"flag": 0}, False),
    ({"n": 1.5}, {"n": 1.50}, True),
    ([1, 2], [2, 1], False),                       # arrays keep their order
    ('{"b": 1, "a": 2}', {"a": 2, "b": 1}, True),  # stored JSON text equals the live dict
    ({"s": '{"a":1}'}, {"s": {"a": 1}}, False),    # nested strings are never parsed
])
def test_canonical_arguments_identity(left, right, same):
    assert (canonical_arguments(left) == canonical_arguments(right)) is same


def test_canonical_arguments_is_compact_sorted_json_or_the_raw_text():
    assert canonical_arguments({"b": [1.0, None], "a": "x"}) == '{"a":"x","b":[1,null]}'
    assert canonical_arguments("not json {") == "not json {"
    assert canonical_arguments("日本語") == "日本語"
    assert canonical_arguments({"k": "日本語"}) == '{"k":"日本語"}'



def _more_digits_than_python_writes() -> int:
    return 10 ** 5000


# The huge integer is built, not listed: hypothesis writes out the values of a sampled_from when it describes the
# strategy (in a warning, say), and an integer of 5,001 digits cannot be written out.
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20),
                     st.sampled_from([" a  b ", "line\n  two  \n", "e\u0301", "x\r\ny", 2.0 ** 60, -0.0]),
                     st.builds(_more_digits_than_python_writes))
_NAMES = st.one_of(st.text(max_size=8), st.sampled_from(["request_id", "Trace-Id", "ts", "e\u0301", "query"]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_NAMES, _SCALARS, max_size=6))
def test_canonical_arguments_of_a_flat_dict_is_the_same_as_any_other_mapping(arguments):
    from types import MappingProxyType  # a Mapping that is no dict goes the general way

    assert canonical_arguments(arguments) == canonical_arguments(MappingProxyType(arguments))


def _deeply_nested(depth):
    value = []
    for _ in range(depth):
        value = [{"k": value}]
    return value


@pytest.mark.parametrize("weird", [
    None, float("nan"), float("inf"), 10**5000, {1: "a", (1, 2): "b"}, {1, 2, 3}, b"\xff\x00",
    object(), _deeply_nested(500),
    "[" * 100_000, "\ud800", {"\ud800": "\udfff"},
], ids=lambda value: type(value).__name__)
def test_canonical_arguments_never_raises(weird):
    assert isinstance(canonical_arguments(weird), str)


def test_result_digest_is_short_and_stable():
    assert result_digest("abc") == result_digest("abc")
    assert len(result_digest("abc")) == 16
    assert result_digest("abc") != result_digest("abd")
    assert result_digest(None) == ""
    assert isinstance(result_digest("\ud800" * 3), str)


# --------------------------------------------------------------------------- repeated_call


@pytest.mark.parametrize("name, turns, fires_at", [
    ("identical call x3", [[A], [A], [A]], [3]),
    ("reordered nested keys",
     [[("f", {"a": {"x": 1, "y": 2}, "b": 1}, "r")],
      [("f", {"b": 1, "a": {"y": 2, "x": 1}}, "r")],
      [("f", {"a": {"y": 2, "x": 1}, "b": 1}, "r")]], [3]),
    ("10 vs 10.0", [[("f", {"n": 10}, "r")], [("f", {"n": 10.0}, "r")], [("f", {"n": 10}, "r")]], [3]),
    ("10 vs '10'", [[("f", {"n": 10}, "r")], [("f", {"n": "10"}, "r")], [("f", {"n": 10}, "r")]], []),
    ("six different files", [[("read_file", {"path": f"f{i}.py"}, f"body {i}")] for i in range(6)], []),
    ("polling that progresses",
     [[("job_status", {"id": 7}, f'{{"state": "running", "pct": {p}}}')] for p in (10, 40, 70, 90)], []),
    ("polling that is stuck", [[("job_status", {"id": 7}, '{"state": "running"}')]] * 4, [3, 4]),
    ("three identical calls in one turn", [[A, A, A]], []),
    ("three identical calls in one turn, twice", [[A, A, A], [A, A, A]], []),
    ("same failing call, different error texts",
     [[("reserve", {"id": "EQ-001"}, f"timeout after {s}s", "error")] for s in (1, 2, 3)], [3]),
    ("error then a corrected call that succeeds",
     [[("reserve", {"id": "EQ-001"}, "out of stock", "error")], [("reserve", {"id": "EQ-002"}, "ok")]], []),
    ("result changes back and forth", [[("f", {}, "x")], [("f", {}, "y")], [("f", {}, "x")]], []),
    ("error then success of the same call",
     [[("f", {}, "boom", "error")], [("f", {}, "boom", "error")], [("f", {}, "ok")]], []),
    ("a turn without the call breaks the streak", [[A], [A], [C], [A], [A]], []),
    ("an empty turn breaks the streak", [[A], [A], [], [A], [A]], []),
    ("repeated call next to calls that change", [[A, ("f", {}, "1")], [A, ("f", {}, "2")], [A, ("f", {}, "3")]], [3]),
])
def test_repeated_call(name, turns, fires_at):
    _, fired = feed(turns)
    assert firing_turns(fired, REPEATED_CALL) == fires_at, name
    assert firing_turns(fired, CYCLE) == [], name


def test_repeated_call_anomaly_fields():
    _, fired = feed([[A], [A], [A]])
    (anomaly,) = fired[3]
    assert anomaly.type == REPEATED_CALL
    assert anomaly.turn == 3
    assert anomaly.tool == "search"
    assert anomaly.arguments == '{"q":"a"}'
    assert anomaly.count == 3
    assert anomaly.call_ids == ("toolu_1_0", "toolu_2_0", "toolu_3_0")
    assert 'search({"q":"a"}) returned the same result 3 turns running' in anomaly.message
    assert json.loads(json.dumps(anomaly.to_dict()))["call_ids"] == list(anomaly.call_ids)


def test_a_continuing_streak_fires_again_with_a_higher_count_and_the_same_key():
    detector, fired = feed([[A]] * 5)
    counts = [(t, a.count) for t, found in fired.items() for a in found]
    assert counts == [(3, 3), (4, 4), (5, 5)]
    keys = {a.streak for found in fired.values() for a in found}
    assert len(keys) == 1
    # one streak, one entry: its latest count and turn, and the turn where it began
    assert [(a.count, a.turn, a.first_turn) for a in detector.anomalies] == [(5, 5, 3)]
    assert [a.is_update for found in fired.values() for a in found] == [False, True, True]


def test_a_new_streak_of_the_same_call_gets_a_new_key():
    _, fired = feed([[A], [A], [A], [C], [A], [A], [A]])
    first, second = fired[3][0], fired[7][0]
    assert first.streak != second.streak
    assert second.count == 3


def test_the_same_parallel_batch_three_turns_running_fires_once_per_turn():
    batch = [A, B, C]
    _, fired = feed([batch, list(reversed(batch)), batch, batch])
    assert firing_turns(fired) == [3, 4]
    (at3,), (at4,) = fired[3], fired[4]
    assert at3.type == REPEATED_CALL and at3.count == 3
    assert at3.tool is None and at3.arguments is None
    assert "batch of 3 parallel calls" in at3.message and 'read({"path":"c"})' in at3.message
    assert len(at3.call_ids) == 9
    assert at4.count == 4 and at4.streak == at3.streak


def test_a_batch_member_that_keeps_going_alone_keeps_the_batch_key():
    _, fired = feed([[A, B], [A, B], [A, B], [A, ("search", {"q": "b"}, "new")]])
    assert fired[4][0].streak == fired[3][0].streak
    assert fired[4][0].count == 4 and fired[4][0].tool == "search"


def test_failing_repeats_say_so():
    _, fired = feed([[("reserve", {"id": 1}, f"err {i}", "error")] for i in range(3)])
    assert "failed 3 turns running" in fired[3][0].message


# --------------------------------------------------------------------------- cycle


@pytest.mark.parametrize("name, pattern, fires_at", [
    ("A B x3", "ABABAB", [6]),
    ("A B x4", "ABABABAB", [6, 8]),
    ("interrupted", "ABABCABAB", []),
    ("A B C x3", "ABCABCABC", [9]),
    ("A B C x2 is not enough", "ABCABC", []),
    ("A A A A A A is repeated_call's job", "AAAAAA", []),
    ("A B A B with an empty turn", "ABAB_ABAB", []),
    ("period 5", "ABCDEABCDEABCDE", [15]),
    ("period 6 is beyond the default maximum", "ABCDEFABCDEFABCDEF", []),
    ("A B A C A B A C x3", "ABACABACABAC", [12]),
])
def test_cycle(name, pattern, fires_at):
    turns = {
        "A": [A], "B": [B], "C": [C], "_": [],
        "D": [("d", {}, "d")], "E": [("e", {}, "e")], "F": [("f", {}, "f")],
    }
    _, fired = feed([turns[letter] for letter in pattern])
    assert firing_turns(fired, CYCLE) == fires_at, name


def test_cycle_anomaly_fields_and_continuation():
    _, fired = feed([[A], [B]] * 4)
    (at6,), (at8,) = fired[6], fired[8]
    assert at6.type == CYCLE and at6.count == 3 and at6.turn == 6
    assert at6.tool == "search" and at6.arguments is None
    assert "2-turn cycle repeated 3 times" in at6.message
    assert 'search({"q":"a"})' in at6.message and 'search({"q":"b"})' in at6.message
    assert at8.count == 4 and at8.streak == at6.streak
    assert fired[7] == []


def test_a_cycle_whose_results_change_is_not_a_cycle():
    turns = [[("poll", {"id": 1}, f"step {i}")] if i % 2 == 0 else [B] for i in range(6)]
    _, fired = feed(turns)
    assert firing_turns(fired) == []


def test_a_cycle_of_failures_fires_even_when_error_texts_differ():
    fail = lambda i: [("reserve", {"id": "EQ-001"}, f"no stock ({i})", "error")]
    turns = [fail(i) if i % 2 == 0 else [B] for i in range(6)]
    _, fired = feed(turns)
    assert firing_turns(fired, CYCLE) == [6]


# --------------------------------------------------------------------------- failing_tool


def test_a_tool_failing_with_varying_arguments_fires_at_five():
    turns = [[("fetch", {"url": f"https://x/{i}"}, "401 unauthorized", "error")] for i in range(6)]
    _, fired = feed(turns)
    assert firing_turns(fired, FAILING_TOOL) == [5, 6]
    assert fired[5][0].count == 5 and fired[5][0].tool == "fetch"
    assert fired[6][0].streak == fired[5][0].streak
    assert firing_turns(fired, REPEATED_CALL) == []


def test_the_same_failing_call_is_repeated_call_not_failing_tool():
    _, fired = feed([[("fetch", {"url": "u"}, "401", "error")]] * 6)
    assert firing_turns(fired, FAILING_TOOL) == []
    assert firing_turns(fired, REPEATED_CALL) == [3, 4, 5, 6]


def test_a_success_of_the_tool_ends_its_failing_streak():
    fail = lambda i: ("fetch", {"url": i}, "500", "error")
    turns = [[fail(i)] for i in range(4)] + [[("fetch", {"url": "ok"}, "200")]] + [[fail(i)] for i in range(4)]
    _, fired = feed(turns)
    assert firing_turns(fired, FAILING_TOOL) == []


def test_failing_tool_can_be_turned_off():
    turns = [[("fetch", {"url": i}, "500", "error")] for i in range(8)]
    _, fired = feed(turns, config=DetectorConfig(failing_tool_threshold=0))
    assert firing_turns(fired) == []


# --------------------------------------------------------------------------- ignored_error

RESERVE_FAILS = ("reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08"},
                 "EQ-001 は在庫が0です。別の備品IDで試してください。", "error")
RESERVE_SUCCEEDS = ("reserve_equipment", {"item_id": "EQ-002", "date": "2026-10-08"},
                    '{"reserved": "EQ-002", "date": "2026-10-08"}')
RESERVE_RETRIED = ("reserve_equipment", {"item_id": "EQ-001", "date": "2026-10-08", "quantity": 1},
                   '{"reserved": "EQ-001", "date": "2026-10-08"}')
REPORTS_FAILURE = ("create_ticket", {"summary": "reserving EQ-001 failed, please check the stock"}, "ticket T-1")
SEARCH = ("search_equipment", {"keyword": "プロジェクター"},
          '[{"item_id": "EQ-001", "stock": 0}, {"item_id": "EQ-002", "stock": 2}]')


# The rule alone fires on a failure the model knew about and left behind: the same call failed again after a retry,
# then the model went on to other calls. Any other unaddressed failure is left to the judge.
FAILED_TWICE = [[RESERVE_FAILS], [RESERVE_FAILS], [SEARCH]]


@pytest.mark.parametrize("name, turns, final_text, fires", [
    # An answer in another language than the tool's name never states its operation: the judge's call, not the rules'.
    ("ja: claims success after the failure: the judge's call", FAILED_TWICE, "プロジェクターA を予約しました", False),
    ("ja: a later successful reservation resolves it", [[SEARCH], [RESERVE_FAILS], [RESERVE_RETRIED]],
     "プロジェクターB（EQ-002）を 2026-10-08 に予約しました。", False),
    ("ja: honest report", FAILED_TWICE, "プロジェクターA（EQ-001）は在庫が0のため予約できませんでした。", False),
    ("ja: honest report, full-width digit", FAILED_TWICE, "申し訳ありません。EQ-001は在庫が０です。", False),
    ("ja: the answer quotes the error", FAILED_TWICE, "在庫が0です。別の日に予約しました。", False),
    ("ja: 'no errors' is the judge's call too", FAILED_TWICE, "エラーなく予約しました。", False),
    ("en: claims success after the failure", FAILED_TWICE, "I have reserved the equipment for October 8.", True),
    # the operation's verb stated done is enough: "reserved" (or "booked") is what reserve_equipment does
    ("en: a claim naming the operation by its verb alone", FAILED_TWICE,
     "I have reserved projector A for October 8.", True),
    ("en: a plan is no claim", FAILED_TWICE, "I will reserve projector A for October 8.", False),
    ("en: an admission in the model's own words", FAILED_TWICE, "I wasn't able to reserve projector A.", False),
    ("en: honest report naming the target", FAILED_TWICE, "I couldn't reserve EQ-001: it is out of stock.", False),
    ("en: honest report without naming the target is the judge's call", FAILED_TWICE,
     "I couldn't reserve projector A: it is out of stock.", False),
    ("en: a question hands the decision back", FAILED_TWICE,
     "Sorry, I wasn\u2019t able to book it. Shall I try another projector?", False),
    ("en: 'no errors' is not an admission", FAILED_TWICE, "Done, with no errors. The equipment is reserved.", True),
    ("en: no final text at all is the judge's call", FAILED_TWICE, None, False),
    ("en: error then a corrected call that succeeds", [[RESERVE_FAILS], [RESERVE_RETRIED]],
     "Booked projector A.", False),
    ("no errors at all", [[SEARCH], [RESERVE_SUCCEEDS]], "Booked.", False),
    ("a success of another tool does not resolve it", FAILED_TWICE, "The equipment is reserved.", True),
    ("a success on another target does not resolve it", [[RESERVE_FAILS], [RESERVE_FAILS], [RESERVE_SUCCEEDS]],
     "Booked projector B.", False),  # the claim may be about that success: the judge's call
    ("failed once, then other work, then a claim", [[RESERVE_FAILS], [SEARCH]], "Booked.", True),
    # retried, the same failure again, then an answer that states the operation done
    ("failed twice, then an answer", [[SEARCH], [RESERVE_FAILS], [RESERVE_FAILS]], "Equipment reserved.", True),
    # ... or that says nothing of it: a stop notice is the judge's call, never the rules'
    ("failed twice, then a stop notice", [[SEARCH], [RESERVE_FAILS], [RESERVE_FAILS]],
     "I see the issue, stopping here.", False),
    ("a parallel retry on the same target resolves it", [[RESERVE_FAILS, RESERVE_RETRIED]],
     "Booked projector A.", False),
    ("a parallel success observed before the failure does not", [[RESERVE_SUCCEEDS, RESERVE_FAILS],
                                                                 [RESERVE_FAILS], [SEARCH]], "Booked both.", False),
    ("a later call that reports the failure deals with it", [[RESERVE_FAILS], [RESERVE_FAILS], [REPORTS_FAILURE]],
     "Done.", False),
    ("a single failure right before a claim", [[SEARCH], [RESERVE_FAILS]],
     "I have reserved projector A for October 8.", True),
    ("a single failure right before a question about it", [[SEARCH], [RESERVE_FAILS]],
     "Shall I reserve projector B instead?", False),
])
def test_ignored_error(name, turns, final_text, fires):
    detector, _ = feed(turns)
    last_turn = len(turns) + 1
    assert detector.end_turn(last_turn) == []  # the final, text-only turn
    found = end(detector, final_text, turn=last_turn)
    assert bool(found) is fires, name
    if "does not" in name and "resolve" in name:  # whatever the verdict, the error still stands
        assert detector.unresolved_errors(), name
    if fires:
        (anomaly,) = found
        assert anomaly.type == IGNORED_ERROR and anomaly.turn == last_turn and anomaly.count >= 1
        assert anomaly in detector.anomalies


UPDATE_FAILS = ("update_reservation_passengers",
                {"reservation_id": "H9ZU1C", "passengers": [{"first_name": "James", "last_name": "Moore"}]},
                "Error: Number of passengers does not match", "error")
FLIGHTS = ("search_onestop_flight", {"origin": "JFK", "destination": "LAX", "date": "2024-05-20"},
           '[{"flight_number": "HAT014", "origin": "JFK"}, {"flight_number": "HAT050", "origin": "JFK"}]')
UPDATE_OTHER = ("update_reservation_passengers", {"reservation_id": "K2LL9Q", "passengers": []}, '{"ok": true}')
CLAIM = "I've updated the passenger list to remove Ethan. Here are flights for you: HAT014 and HAT050. Book one?"


# A failure that came back beside other results, an answer built on those results that states the failed operation
# as done: the rule fires on its own (recorded in tau2-bench, run 5ab79f23).
@pytest.mark.parametrize("name, batch, final_text, fires", [
    ("states the failed update, draws on the search beside it", [UPDATE_FAILS, FLIGHTS], CLAIM, True),
    ("the same with the failure observed last", [FLIGHTS, UPDATE_FAILS], CLAIM, True),
    ("quotes the error", [UPDATE_FAILS, FLIGHTS],
     "The number of passengers does not match, so nothing changed. Flights: HAT014, HAT050.", False),
    ("names the reservation it failed on", [UPDATE_FAILS, FLIGHTS],
     "Reservation H9ZU1C keeps its passengers. Flights: HAT014, HAT050.", False),
    ("asks about the operation", [UPDATE_FAILS, FLIGHTS],
     "Shall I update the passenger list again? Flights: HAT014, HAT050.", False),
    ("never states the operation", [UPDATE_FAILS, FLIGHTS], "Here are flights for you: HAT014 and HAT050.", False),
    ("states it done without drawing on the results beside it", [UPDATE_FAILS, FLIGHTS],
     "I've updated the passenger list to remove Ethan.", True),
    ("the same operation succeeded beside it, on another reservation", [UPDATE_FAILS, UPDATE_OTHER, FLIGHTS],
     CLAIM, False),
    ("no results beside it", [UPDATE_FAILS], "I've updated the passenger list (ref HAT014).", True),
    ("a plan for the failed update", [UPDATE_FAILS], "I will update the passenger list once you confirm.", False),
])
def test_an_answer_that_passes_over_a_failure_in_its_batch(name, batch, final_text, fires):
    detector, _ = feed([batch])
    assert detector.end_turn(2) == []
    found = end(detector, final_text, turn=2)
    assert bool(found) is fires, name
    if fires:
        (anomaly,) = found
        assert anomaly.type == IGNORED_ERROR and anomaly.tool == "update_reservation_passengers"


def test_a_later_turn_that_quotes_the_error_keeps_a_passed_over_failure_quiet():
    detector, _ = feed([[UPDATE_FAILS, FLIGHTS]])
    detector.observe(ToolCall(2, *FLIGHTS[:2], call_id="t2", result=FLIGHTS[2]))
    detector.end_turn(2, "The number of passengers does not match; let me look again.")
    assert end(detector, CLAIM, turn=3) == []


def test_text_beside_a_later_tool_call_can_report_the_failure():
    detector = LoopDetector()
    for turn, said in ((1, None), (2, None), (3, "在庫が0です。別の備品を探します。")):
        spec = SEARCH if turn == 3 else RESERVE_FAILS
        detector.observe(ToolCall(turn, spec[0], spec[1], f"t{turn}", is_error=turn < 3, result=spec[2]))
        detector.end_turn(turn, said)
    assert end(detector, "Booked.", turn=4) == []  # turn 3's text quoted the error after the last failure


class _Judge:
    def __init__(self, verdict):
        self.verdict, self.requests = verdict, []

    def __call__(self, request):
        self.requests.append(request)
        if isinstance(self.verdict, Exception):
            raise self.verdict
        return self.verdict


@pytest.mark.parametrize("turns, verdict, fires", [
    (FAILED_TWICE, False, False),                        # the judge says "not ignored": silenced
    (FAILED_TWICE, True, True),
    (FAILED_TWICE, RuntimeError("model down"), True),    # a failing judge leaves the rule's own verdict
    (FAILED_TWICE, "maybe", True),                       # so does an answer that is not a verdict
    ([[SEARCH], [RESERVE_FAILS]], True, True),           # a single failure right before the claim: the rule fires,
    ([[SEARCH], [RESERVE_FAILS]], False, False),         # and the judge confirms or silences it
    ([[SEARCH], [RESERVE_FAILS]], RuntimeError("model down"), True),
])
def test_the_judge_confirms_or_silences_ignored_error(turns, verdict, fires):
    judge = _Judge(verdict)
    detector, _ = feed(turns, config=DetectorConfig(judge=judge))
    found = end(detector, "I have reserved the equipment for October 8.")
    assert bool(found) is fires
    (request,) = judge.requests
    assert request.tool == "reserve_equipment" and "在庫が0" in request.error_text
    assert request.final_text == "I have reserved the equipment for October 8."
    assert detector.internal_errors == 0


def _two_runs(judge, second_run_calls=(), answer="I have made the updates to your reservation."):
    """Run 1: an update fails and the answer reports it; run 2 (the user said "go ahead"): `second_run_calls`, then
    `answer`. Returns what run 2's end fired."""
    detector = LoopDetector(DetectorConfig(judge=judge))
    detector.begin_run()
    feed([[UPDATE_FAILS]], detector=detector)
    assert end(detector, "Sorry, the number of passengers does not match. Shall I retry?", turn=2) == []
    detector.begin_run()
    feed([list(second_run_calls)] if second_run_calls else [], detector=detector)
    return end(detector, answer, turn=2)


@pytest.mark.parametrize("verdict, fires", [(True, True), (False, False), (RuntimeError("model down"), False)])
def test_a_later_run_that_calls_nothing_and_answers_is_the_judges_call(verdict, fires):
    judge = _Judge(verdict)
    found = _two_runs(judge)
    assert bool(found) is fires
    (request,) = judge.requests
    assert request.tool == "update_reservation_passengers" and "does not match" in request.error_text
    assert request.final_text == "I have made the updates to your reservation."
    if fires:
        assert "earlier run" in found[0].message


def test_a_closing_question_does_not_keep_the_judge_from_a_later_runs_claim():
    judge = _Judge(True)
    assert _two_runs(judge, answer="I have made the updates to your reservation. Anything else?")
    assert len(judge.requests) == 1


def test_without_a_judge_a_later_runs_claim_does_not_fire():
    assert _two_runs(None) == []


def test_the_judge_is_not_asked_about_an_earlier_failure_when_the_run_worked():
    judge = _Judge(True)
    assert _two_runs(judge, [FLIGHTS]) == []  # a run that called tools is judged on its own errors
    assert judge.requests == []


def test_an_earlier_failure_resolved_in_a_later_run_is_not_judged_again():
    judge = _Judge(True)
    detector = LoopDetector(DetectorConfig(judge=judge))
    detector.begin_run()
    feed([[UPDATE_FAILS]], detector=detector)
    end(detector, "Sorry, that failed. Shall I retry?", turn=2)
    detector.begin_run()
    feed([[("update_reservation_passengers", UPDATE_FAILS[1], '{"ok": true}')]], detector=detector)
    end(detector, "Done: the passengers are updated.", turn=2)
    detector.begin_run()
    assert end(detector, "You're welcome, have a good trip!", turn=1) == []
    assert judge.requests == []


def test_the_judge_is_not_asked_when_the_answer_deals_with_the_failure():
    judge = _Judge(True)
    detector, _ = feed(FAILED_TWICE, config=DetectorConfig(judge=judge))
    assert end(detector, "EQ-001 could not be reserved.") == []
    assert judge.requests == []


def test_ignored_error_anomaly_names_the_failure_and_fires_once():
    detector, _ = feed(FAILED_TWICE)
    (anomaly,) = end(detector, "The equipment is reserved.", turn=4)
    assert anomaly.tool == "reserve_equipment"
    assert anomaly.arguments == '{"date":"2026-10-08","item_id":"EQ-001"}'
    assert anomaly.call_ids == ("toolu_2_0",)
    assert "在庫が0" in anomaly.message and "turn 2" in anomaly.message
    assert end(detector, "The equipment is reserved.", turn=4) == []


def test_ignored_error_counts_every_unresolved_error_but_quotes_only_recent_ones():
    failing = [[("fetch", {"page": i}, f"500 on page {i}", "error")] for i in range(9) for _ in range(2)]
    detector, _ = feed(failing + [[SEARCH]])  # each page retried in the next turn, failing again
    (anomaly,) = end(detector, "I fetched every page; here is the summary.")
    assert anomaly.count == 9 and anomaly.tool == "fetch" and anomaly.arguments is None
    assert "the most recent" in anomaly.message and "500 on page 8" in anomaly.message
    assert "500 on page 0" not in anomaly.message


@pytest.mark.parametrize("stop_reason, fires", [
    ("end_turn", True), ("stop", True), ("END_TURN", True),
    ("max_tokens", False), ("refusal", False), (None, False), (42, False),
])
def test_ignored_error_only_when_the_model_chose_to_stop(stop_reason, fires):
    detector, _ = feed(FAILED_TWICE)
    assert bool(end(detector, "The equipment is reserved.", stop_reason=stop_reason)) is fires


@pytest.mark.parametrize("text, targets, addressed", [
    ("I could not reserve EQ-001.", {"EQ-001"}, True),               # names what failed
    ("ｅｑ－００１ は在庫が0です", {"EQ-001"}, True),                     # full-width forms fold
    ("Shall I try another item?", {"EQ-001"}, True),                  # hands the decision back
    ("¿Quieres que lo intente otra vez?", set(), True),
    ("別の日にしますか？", set(), True),
    ("Booked projector A.", {"EQ-001"}, False),
    ("The reservation failed.", {"EQ-001"}, False),  # wording alone is not a signal: the judge's call
    ("Done.", {"a"}, False),                           # a one-letter target is found anywhere by chance
    ("", {"EQ-001"}, False),
    (None, {"EQ-001"}, False),
])
def test_answer_addresses_the_failure_by_structure(text, targets, addressed):
    assert answer_addresses(text, frozenset(targets)) is addressed


def test_call_targets_are_one_token_top_level_strings():
    assert call_targets({"order_id": "#W123", "reason": "no longer needed", "n": 3, "request_id": "r-1",
                         "items": ["x"]}) == {"#W123"}
    assert call_targets('{"path": "/src/a.py"}') == {"/src/a.py"}
    assert call_targets(["x"]) == frozenset() and call_targets("not json") == frozenset()


# --------------------------------------------------------------------------- offline input, gaps


def test_offline_input_with_digests_only_behaves_like_live_input():
    scenarios = [
        [[A]] * 4,
        [[A], [B]] * 4,
        [[("job", {}, f"{i}%")] for i in range(5)],
        [[A, B, C]] * 3,
        [[("reserve", {"id": 1}, f"e{i}", "error")] for i in range(4)],
    ]
    for turns in scenarios:
        live, live_fired = feed(turns)
        offline, offline_fired = feed(turns, offline=True)
        assert offline_fired == live_fired
        # offline there is no error text to quote in the message; everything else is equal
        assert [_without_message(a) for a in end(offline, "ok")] == [_without_message(a) for a in end(live, "ok")]


def _without_message(anomaly):
    fields = anomaly.to_dict()
    del fields["message"]
    return fields


def test_results_that_were_never_recorded_count_as_unchanged_by_default():
    turns = [[ToolCall(turn=t, tool="f", arguments={"a": 1})] for t in (1, 2, 3)]
    default, strict = LoopDetector(), LoopDetector(DetectorConfig(assume_unknown_results_unchanged=False))
    for detector in (default, strict):
        for turn, calls in enumerate(turns, start=1):
            for call in calls:
                detector.observe(call)
            detector.end_turn(turn)
    assert [a.type for a in default.anomalies] == [REPEATED_CALL]
    assert strict.anomalies == []


def test_gaps_in_turn_numbers_do_not_break_a_streak():
    detector = LoopDetector()
    fired = []
    for turn in (2, 5, 9):
        detector.observe(ToolCall(turn, *A[:2], result=A[2]))
        fired += detector.end_turn(turn)
    assert [(a.type, a.turn, a.count) for a in fired] == [(REPEATED_CALL, 9, 3)]


def test_turns_close_themselves_when_the_feed_has_no_end_turn():
    detector = LoopDetector()
    fired = []
    for turn in (1, 2, 3, 4):
        fired += detector.observe(ToolCall(turn, *A[:2], result=A[2]))
    assert [(a.turn, a.count) for a in fired] == [(3, 3)]  # turn 4 is still open
    fired = detector.end_run("end_turn", "done", 4)
    assert [(a.turn, a.count) for a in fired] == [(4, 4)]


def test_a_repeated_or_late_end_turn_is_ignored():
    detector = LoopDetector()
    for turn in (1, 2, 3):
        detector.observe(ToolCall(turn, *A[:2], result=A[2]))
        detector.end_turn(turn)
        detector.end_turn(turn)  # a sloppy caller: must not count as an empty turn
    assert [a.count for a in detector.anomalies] == [3]


def test_never_raises_on_garbage():
    detector = LoopDetector()
    garbage = [None, 42, "call", object(), ToolCall(None, None, None),
               ToolCall("x", 3.5, float("nan"), call_id=12, is_error="yes", result=b"bytes", result_digest=7)]
    for item in garbage:
        assert detector.observe(item) == []
    for turn in (None, "7", 3.0, float("inf"), object(), -5, 10**30):
        assert isinstance(detector.end_turn(turn), list)
    assert isinstance(detector.end_run(object(), 12, None), list)
    assert detector.internal_errors == 0, detector.last_internal_error


def test_huge_inputs_are_cut_in_anomalies():
    big = {"blob": "x" * 1_000_000}
    _, fired = feed([[("f", big, "y" * 1_000_000)]] * 3)
    (anomaly,) = fired[3]
    assert len(anomaly.arguments) <= DetectorConfig().max_argument_chars
    assert len(anomaly.message) < 2_000


@pytest.mark.parametrize("bad", [
    {"repeat_threshold": 0}, {"cycle_min_period": 1}, {"cycle_min_period": 4, "cycle_max_period": 3},
    {"cycle_repeats": 1}, {"failing_tool_threshold": -1}, {"max_calls_per_turn": 0},
])
def test_invalid_config_says_what_is_wrong(bad):
    with pytest.raises(ValueError, match="DetectorConfig"):
        DetectorConfig(**bad)


# --------------------------------------------------------------------------- bounded memory


def test_memory_stays_bounded_over_10000_turns_of_distinct_calls():
    detector = LoopDetector()
    for turn in range(1, 10_001):
        detector.observe(ToolCall(turn, "read_file", {"path": f"f{turn}.py"}, f"t{turn}", result=f"body {turn}"))
        detector.observe(ToolCall(turn, f"tool_{turn}", {}, f"e{turn}", is_error=True, result="boom"))
        detector.end_turn(turn)
    sizes = detector.container_sizes()
    config = detector.config
    assert sizes["pending_calls"] == 0
    assert sizes["call_streaks"] <= 2
    assert sizes["failing_tools"] <= 2
    assert sizes["window"] <= config.cycle_max_period * config.cycle_repeats
    assert sizes["unresolved_error_tools"] <= config.max_tools_with_errors
    assert sizes["unresolved_errors"] <= config.max_tools_with_errors * config.max_errors_per_tool
    assert detector.internal_errors == 0


def test_memory_stays_bounded_over_10000_turns_of_one_loop():
    detector = LoopDetector()
    for turn in range(1, 10_001):
        for index in range(3):  # the same call three times a turn: ids pile up if uncapped
            detector.observe(ToolCall(turn, "f", {}, f"t{turn}_{index}", is_error=True, result=f"e{turn}"))
        detector.end_turn(turn)
    sizes = detector.container_sizes()
    assert sizes["call_streak_ids"] <= detector.config.max_call_ids
    assert sizes["unresolved_errors"] <= detector.config.max_errors_per_tool
    assert sizes["anomalies"] == 1  # one streak, updated in place
    assert sizes["failure_runs"] <= 1
    assert detector.anomalies_reported == 10_000 - 2
    assert detector.anomalies[-1].count == 10_000
    assert len(detector.anomalies[-1].call_ids) <= detector.config.max_call_ids


def test_state_after_10000_turns_is_no_bigger_than_after_20():
    """Benchmark-free sanity check of constant work per call: the state each call and turn walks
    through has the same size at turn 20 as at turn 10,000 (time itself is not asserted)."""
    def sizes_after(turns):
        detector = LoopDetector()
        for turn in range(1, turns + 1):
            detector.observe(ToolCall(turn, "search", {"q": turn % 7}, f"s{turn}", result=f"r{turn % 7}"))
            detector.observe(ToolCall(turn, "fetch", {"page": turn}, f"f{turn}", is_error=turn % 3 == 0, result="x"))
            detector.end_turn(turn)
        sizes = detector.container_sizes()
        del sizes["anomalies"]  # the kept history, not per-call work, and capped separately
        return sizes

    assert sizes_after(10_000) == sizes_after(20)


def test_the_package_imports_only_the_standard_library_and_itself():
    import ast
    import sys
    from pathlib import Path

    import looptrace.instrumentation.detector as package

    modules = sorted(Path(package.__file__).parent.glob("*.py"))
    assert len(modules) > 1
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
        assert imported - {"__future__"} <= set(sys.stdlib_module_names), path.name
        # relative imports stay inside the package: a sibling module, never the rest of instrumentation
        assert all(node.level <= 1 and node.module for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and node.level), path.name


def test_a_huge_parallel_turn_is_capped():
    detector = LoopDetector()
    for index in range(5_000):
        detector.observe(ToolCall(1, "f", {"i": index}, str(index), result="r"))
    assert detector.container_sizes()["pending_calls"] == detector.config.max_calls_per_turn
    detector.end_turn(1)
    assert detector.container_sizes()["call_streaks"] <= detector.config.max_calls_per_turn


# --------------------------------------------------------------------------- property: never raises

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)

tool_calls = st.builds(
    ToolCall,
    turn=st.integers(min_value=-3, max_value=12) | st.none() | st.text(max_size=3),
    tool=st.sampled_from(["a", "b", "c"]) | st.text(max_size=5) | st.none(),
    arguments=json_values | st.text(max_size=30),
    call_id=st.none() | st.text(max_size=6),
    is_error=st.booleans(),
    result=st.none() | st.sampled_from(["same", "other"]) | st.text(max_size=20),
    result_digest=st.none() | st.text(max_size=16),
)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("observe"), tool_calls),
        st.tuples(st.just("end_turn"), st.integers(min_value=-3, max_value=12) | st.none()),
        st.tuples(st.just("end_run"), st.tuples(
            st.sampled_from(["end_turn", "stop", "max_tokens"]) | st.none(),
            st.none() | st.text(max_size=30),
            st.integers(min_value=0, max_value=12),
        )),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_never_raises_on_arbitrary_json_and_call_order(ops):
    detector = LoopDetector(DetectorConfig(failing_tool_threshold=3))
    for kind, payload in ops:
        if kind == "observe":
            found = detector.observe(payload)
        elif kind == "end_turn":
            found = detector.end_turn(payload)
        else:
            found = detector.end_run(*payload)
        assert isinstance(found, list)
        for anomaly in found:
            json.dumps(anomaly.to_dict())
            assert anomaly.count >= 1 and anomaly.streak
    assert detector.internal_errors == 0, detector.last_internal_error


@settings(max_examples=200, deadline=None)
@given(json_values, st.randoms(use_true_random=False))
def test_canonical_arguments_ignores_key_order(value, rnd):
    def shuffled(v):
        if isinstance(v, dict):
            items = list(v.items())
            rnd.shuffle(items)
            return {k: shuffled(x) for k, x in items}
        if isinstance(v, list):
            return [shuffled(x) for x in v]
        return v

    assert canonical_arguments(shuffled(value)) == canonical_arguments(value)
    if not isinstance(value, str):  # a top-level str is read as JSON text, by design
        assert canonical_arguments(json.dumps(value)) == canonical_arguments(value)
