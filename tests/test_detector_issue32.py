"""The detector on the shapes real runs take: honest endings stay quiet, a repeat disguised by changing output is
caught, a threshold of 1 stops the second identical call before it runs. Through Agent with a scripted model, with
tools that raise their own errors."""

from __future__ import annotations

import itertools

import pytest

from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import IGNORED_ERROR, REPEATED_CALL, DetectorConfig
from looptrace.runtime import Agent, Limits, RunStatus, ScriptedModel, tool
from looptrace.runtime.tools import ToolError

MODEL = "claude-sonnet-5-5"


def _calls(*calls: tuple[str, dict]) -> dict:
    return {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": f"toolu_{next(_IDS)}", "name": name, "input": arguments}
        for name, arguments in calls]}


def _answer(text: str) -> dict:
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}] if text else []}


_IDS = itertools.count()


def _agent(script: list[dict], tools: list, **options) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    options.setdefault("on_anomaly", "warn")
    options.setdefault("limits", Limits(max_turns=30))
    options.setdefault("telemetry", "tracer_provider" in options)  # spans only where a test reads them
    return Agent(MODEL, tools=tools, client=model, alerts=Alerts(log_warnings=False), **options), model


def _types(result) -> list[tuple[str, int]]:
    return [(a.type, a.turn) for a in result.anomalies]


# --------------------------------------------------------------------------- 1. honest endings are never flagged


def _pytest_tool():
    @tool
    def run_tests(only: str) -> str:
        """Run the test suite (`only`: "all", or "failed" to rerun the last failures)."""
        raise ToolError("FAILED tests/test_cart.py::test_total - assert 9 == 10\n"
                        "1 failed, 4 passed in 0.31s (rerun of the last failed)")
    return run_tests


@tool
def run_command(command: str) -> str:
    """Run a shell command."""
    program = command.split()[0]
    raise ToolError(f"bash: {program}: command not found")


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@pytest.mark.parametrize("answer", [
    "I see the issue, stopping here.",                                          # a terse stop notice
    "",                                                                         # an empty final answer
    "The tests still fail and I could not fix them.",                           # words also in the arguments
])
def test_honest_endings_after_the_same_failure_three_times_are_never_ignored_error(answer):
    retry = ("run_tests", {"only": "failed"})
    script = [_calls(retry), _calls(("read_file", {"path": "src/cart.py"})), _calls(retry), _calls(retry),
              _answer(answer)]
    agent, _ = _agent(script, [_pytest_tool(), read_file])
    result = agent.run("fix the cart total")
    assert result.status is RunStatus.DONE
    assert IGNORED_ERROR not in {a.type for a in result.anomalies}
    assert [e.tool for e in result.unresolved_errors] == ["run_tests"]  # the failure is still recorded as a fact


def test_admitting_that_a_command_does_not_exist_is_never_ignored_error():
    deploy = ("run_command", {"command": "deploy-prod --all"})
    script = [_calls(deploy), _calls(deploy), _calls(deploy),
              _answer("deploy-prod does not exist on this machine, so I could not run the deployment.")]
    agent, _ = _agent(script, [run_command])
    result = agent.run("deploy")
    assert [a.type for a in result.anomalies] == [REPEATED_CALL]


def test_a_user_message_between_failures_then_a_stop_notice_stays_quiet():
    retry = ("run_tests", {"only": "failed"})
    agent, _ = _agent([_calls(retry), _calls(retry), _answer("I see the issue, stopping here."),
                       _calls(retry), _answer("Still failing; stopping here.")], [_pytest_tool()])
    first = agent.run("fix the cart total", session_id="s1")
    second = agent.run("try once more", session_id="s1")
    assert IGNORED_ERROR not in {a.type for a in first.anomalies + second.anomalies}


def test_the_stop_notice_goes_to_the_judge_when_one_is_set():
    asked = []
    retry = ("run_tests", {"only": "failed"})
    agent, _ = _agent([_calls(retry), _calls(retry), _answer("I see the issue, stopping here.")], [_pytest_tool()],
                      detector=DetectorConfig(judge=lambda request: asked.append(request) or False))
    result = agent.run("fix it")
    assert len(asked) == 1 and asked[0].tool == "run_tests" and result.anomalies == []


# --------------------------------------------------------------------------- 2. a repeat disguised by its output


def _hook_commit():
    """A git commit whose pre-commit hook rejects it with different files, counts and timings every time."""
    attempts = itertools.count(1)

    @tool
    def git_commit(message: str, no_verify: bool = False) -> str:
        """Commit the staged changes."""
        n = next(attempts)
        files = "\n".join(f"reformatted src/module_{n}_{i}.py" for i in range(n % 3 + 1))
        raise ToolError(f"black....................................................................Failed\n"
                        f"- hook id: black\n- duration: {0.17 * n:.2f}s\n- files were modified by this hook\n\n"
                        f"{files}\n\nAll done!\n{n % 3 + 1} files reformatted, {10 + n} files left unchanged.\n"
                        f"commit {n:07x}abc aborted")
    return git_commit


@tool
def format_code(path: str) -> str:
    """Format the code under a path."""
    return f"formatted {path}"


def test_a_commit_rejected_by_a_hook_with_varying_output_is_a_repeated_call_and_the_claim_ignored_error():
    commit = ("git_commit", {"message": "fix parser"})
    script = []
    for n in range(5):  # commit, format, commit, format ... the hook rejects every one, each time in other words
        script += [_calls(commit), _calls(("format_code", {"path": f"src/part{n}"}))]
    script += [_calls(("git_commit", {"message": "fix parser", "no_verify": True})),
               _answer("I committed the parser fix and have successfully completed all tasks.")]
    agent, _ = _agent(script, [_hook_commit(), format_code])
    result = agent.run("commit the fix")
    kinds = [a.type for a in result.anomalies]
    assert kinds == [REPEATED_CALL, IGNORED_ERROR], result.anomalies
    # the retry with no_verify is the same commit tried again: its failure extends the streak to turn 11 (5 failures
    # within the last 10 turns; the first has left the window)
    assert result.anomalies[0].count == 5 and result.anomalies[0].turn == 11
    assert result.anomalies[1].evidence == "the answer states the failed operation as done"


def test_the_disguised_repeat_across_user_messages_is_one_streak():
    commit = ("git_commit", {"message": "fix parser"})
    fmt = ("format_code", {"path": "src"})
    agent, _ = _agent([_calls(commit), _calls(fmt), _answer("The hook rejected it; I formatted the code."),
                       _calls(commit), _calls(fmt), _answer("Rejected again."),
                       _calls(commit), _answer("Still rejected.")], [_hook_commit(), format_code])
    results = [agent.run(task, session_id="c1") for task in ("commit it", "try again", "once more")]
    assert [(a.type, a.count) for a in results[2].anomalies] == [(REPEATED_CALL, 3)]


def test_the_bare_success_claim_after_the_disguised_repeat_goes_to_the_judge():
    commit = ("git_commit", {"message": "fix parser"})
    script = [_calls(commit), _calls(("format_code", {"path": "src"})), _calls(commit),
              _answer("I have successfully completed all tasks.")]
    agent, _ = _agent(script, [_hook_commit(), format_code],
                      detector=DetectorConfig(judge=lambda request: True))
    result = agent.run("commit the fix")
    (anomaly,) = [a for a in result.anomalies if a.type == IGNORED_ERROR]
    assert anomaly.evidence.startswith("a judge said so")


def test_edit_and_retest_with_genuinely_different_failures_stays_quiet():
    failures = iter([
        "FAILED tests/test_cart.py::test_total - AssertionError: assert 9 == 10\n1 failed in 0.21s",
        "FAILED tests/test_cart.py::test_total - TypeError: unsupported operand type(s)\n1 failed in 0.19s",
        "FAILED tests/test_cart.py::test_discount - AssertionError: assert 0 == 5\n1 failed in 0.25s",
    ])

    @tool
    def run_tests(only: str) -> str:
        """Run the tests."""
        failure = next(failures, None)
        if failure is not None:
            raise ToolError(failure)
        return "5 passed in 0.30s"

    @tool
    def edit_file(path: str, text: str) -> str:
        """Edit a file."""
        return f"edited {path}"

    test = ("run_tests", {"only": "all"})
    script = []
    for n in range(3):
        script += [_calls(test), _calls(("edit_file", {"path": "src/cart.py", "text": f"fix {n}"}))]
    script += [_calls(test), _answer("All tests pass now.")]
    agent, _ = _agent(script, [run_tests, edit_file])
    result = agent.run("fix the cart")
    assert result.anomalies == [] and result.unresolved_errors == []


# --------------------------------------------------------------------------- 5. a threshold of 1


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def test_threshold_one_stops_the_second_identical_call_before_it_runs():
    runs = []

    @tool
    def charge(order: str) -> str:
        """Charge an order."""
        runs.append(order)
        raise ToolError(f"card declined for {order}")

    again = ("charge", {"order": "A-1"})
    agent, model = _agent([_calls(again), _calls(again), _answer("unreached")], [charge],
                          detector=DetectorConfig(repeat_threshold=1), on_anomaly="stop")
    result = agent.run("charge A-1")
    assert result.status is RunStatus.STOPPED_BY_DETECTOR
    assert runs == ["A-1"]  # the second, identical call never ran
    assert [(a.type, a.turn, a.count) for a in result.anomalies] == [(REPEATED_CALL, 2, 2)]


def test_threshold_one_warns_once_and_lets_other_calls_run():
    agent, _ = _agent([_calls(("lookup", {"order": "A-1"})), _calls(("lookup", {"order": "A-1"})),
                       _calls(("lookup", {"order": "B-2"})), _answer("A-1 and B-2 are shipped.")], [lookup],
                      detector=DetectorConfig(repeat_threshold=1))
    result = agent.run("status")
    assert result.status is RunStatus.DONE
    assert [(a.type, a.turn, a.count) for a in result.anomalies] == [(REPEATED_CALL, 2, 2)]


def test_threshold_two_still_lets_the_second_call_run():
    agent, _ = _agent([_calls(("lookup", {"order": "A-1"}))] * 2 + [_answer("shipped")], [lookup],
                      detector=DetectorConfig(repeat_threshold=2), on_anomaly="stop")
    result = agent.run("status")
    assert result.status is RunStatus.STOPPED_BY_DETECTOR and result.turns == 2


# --------------------------------------------------------------------------- 3. detect agrees with the live run


def _stored_and_detected(spans) -> list:
    """The spans written as a trace file and read back as `looptrace detect` reads one."""
    import tempfile
    from pathlib import Path

    from looptrace.cli.detect_command import detection_spans
    from looptrace.cli.trace_reading import LineReporter
    from looptrace.instrumentation.offline.trace_detect import detect_spans
    from looptrace.instrumentation.tracefile.encode import encode_traces_data

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "traces.jsonl"
        path.write_text("".join(encode_traces_data([s]) + "\n" for s in spans.all), encoding="utf-8")
        with LineReporter(path, 1 << 26) as report:
            return list(detect_spans(detection_spans(path, report)))


def test_a_failing_call_across_a_user_message_is_found_live_and_by_detect_at_the_same_turn(spans):
    worded = iter(["quota exceeded for project p-1", "quota exceeded for project p-1",
                   "upstream: too many requests, retry later", "upstream: too many requests, retry later"])

    @tool
    def export_report(report: str) -> str:
        """Export a report."""
        raise ToolError(next(worded))

    export = ("export_report", {"report": "q3"})
    model = ScriptedModel([_calls(export), _calls(export), _answer("The export keeps failing on quota."),
                           _calls(export), _calls(export), _answer("It still fails.")])
    agent = Agent(MODEL, tools=[export_report], client=model, tracer_provider=spans.provider, on_anomaly="warn",
                  alerts=Alerts(log_warnings=False))
    first = agent.run("export q3", session_id="conv-1")
    second = agent.run("Done", session_id="conv-1")  # the user's answer, then two more failures, worded otherwise
    assert first.anomalies == []
    live = [(a.type, a.turn, a.count) for a in second.anomalies]
    assert live == [(REPEATED_CALL, 2, 4)], live  # fired at the third failure (turn 1), 4 at the fourth
    by_trace = {v.trace_id: v for v in _stored_and_detected(spans)}
    assert [(a.type, a.turn, a.count) for a in by_trace[second.trace_id].anomalies] == live
    assert by_trace[first.trace_id].anomalies == []


# --------------------------------------------------------------------------- 4. text loops


_PARAGRAPH = ("I will look at the configuration again to understand why the build keeps failing on this machine "
              "before changing anything else.")


@tool
def read_config(section: str) -> str:
    """Read a section of the build configuration."""
    return f"[{section}]\nenabled = true"


def _thinking_aloud(turns: int, text: str) -> list[dict]:
    """Turns that each read another section, with the same paragraph beside the call."""
    script = []
    for n in range(turns):
        response = _calls(("read_config", {"section": f"part{n}"}))
        response["content"].insert(0, {"type": "text", "text": text})
        script.append(response)
    return script


def test_the_same_paragraph_in_consecutive_turns_is_repeated_text_and_a_nudge_reaches_the_model(spans):
    agent, model = _agent(_thinking_aloud(4, _PARAGRAPH) + [_answer("The build needs the cache enabled.")],
                          [read_config], on_anomaly={"repeated_text": "nudge"}, tracer_provider=spans.provider)
    result = agent.run("why does the build fail?")
    assert [(a.type, a.turn, a.count) for a in result.anomalies] == [("repeated_text", 4, 4)]
    nudged = [b["text"] for m in model.requests[3]["messages"] if m["role"] == "user" and isinstance(m["content"], list)
              for b in m["content"] if b.get("type") == "text"]
    assert any("same paragraph in 3 consecutive turns" in text for text in nudged)
    [verdict] = [v for v in _stored_and_detected(spans) if v.trace_id == result.trace_id]
    assert [(a.type, a.turn, a.count) for a in verdict.anomalies] == [("repeated_text", 4, 4)]


def test_repeated_text_can_stop_the_run():
    agent, _ = _agent(_thinking_aloud(5, _PARAGRAPH) + [_answer("unreached")], [read_config],
                      on_anomaly={"repeated_text": "stop"})
    result = agent.run("why does the build fail?")
    assert result.status is RunStatus.STOPPED_BY_DETECTOR and result.turns == 3


def test_a_sentence_chanted_inside_one_answer_is_repeated_text():
    chant = " ".join(["I am checking the configuration file once more now."] * 8)
    agent, _ = _agent([_calls(("read_config", {"section": "cache"})), _answer(f"Let me see. {chant}")],
                      [read_config])
    result = agent.run("why does the build fail?")
    [(kind, turn, count)] = [(a.type, a.turn, a.count) for a in result.anomalies]
    assert (kind, turn, count) == ("repeated_text", 2, 8)


def test_code_tables_and_lists_that_repeat_are_not_text_loops():
    structured = ("```python\nconfig = load('build.toml')\nconfig = load('build.toml')\n```\n"
                  "| setting | value |\n| --- | --- |\n| cache | enabled, as configured in build.toml |\n"
                  "- the cache setting is enabled in the configuration file\n"
                  "- the cache setting is enabled in the configuration file\n")
    rows = "\n".join(["| cache | enabled in the configuration file for every build |"] * 8)
    agent, _ = _agent(_thinking_aloud(4, structured) + [_answer(f"Summary:\n{rows}")], [read_config])
    result = agent.run("why does the build fail?")
    assert result.anomalies == []


def test_repeated_text_is_found_by_watch_too():
    import urllib.request

    from conftest import Spans
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from looptrace.instrumentation.watch import WatchServer, WatchSettings

    recorded_spans = Spans()
    agent, _ = _agent(_thinking_aloud(3, _PARAGRAPH) + [_answer("Cache it is.")], [read_config],
                      tracer_provider=recorded_spans.provider)
    agent.run("why does the build fail?")
    seen = []
    server = WatchServer(WatchSettings(port=0, grpc_port=0),
                         alerts=Alerts(callback=lambda anomaly, context: seen.append(anomaly.type))).start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/traces", method="POST",
                                         data=encode_spans(recorded_spans.all).SerializeToString(),
                                         headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        assert server.wait_idle()
    finally:
        server.stop()
    assert seen == ["repeated_text"]
