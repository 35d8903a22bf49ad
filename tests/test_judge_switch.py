"""The detector's judge one switch away: LOOPTRACE_JUDGE and `looptrace run --judge`, against the local Messages-API
fake with the real anthropic SDK; the per-run cap on judge calls, the judge's cost beside the run's, the errors left
unjudged, and a judge whose requests fail leaving the rule's own verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest
from fakes.messages_api import Delay, Error, FakeMessagesAPI, verdict_answer

from looptrace.cli.views import judge_lines
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.detector import IGNORED_ERROR, DetectorConfig
from looptrace.instrumentation.settings import Settings
from looptrace.runtime import Agent, RunStatus, tool
from looptrace.runtime.judge import ModelJudge
from looptrace.runtime.models import AnthropicModel

MODEL = "claude-sonnet-5-5"
JUDGE = "claude-haiku-4-5"
# The fake's verdict: 120 tokens in, 15 out, at claude-haiku-4-5's $1 / $5 per million.
VERDICT_COST = (120 * 1 + 15 * 5) / 1_000_000


@tool
def reserve(item: str) -> str:
    """Reserve an item."""
    raise RuntimeError(f"{item} is out of stock")


@tool
def note(text: str) -> str:
    """Take a note."""
    return "noted"


def _call(call_id: str, name: str, **arguments: str) -> dict:
    return {"stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}]}


# The rule fires on its own here (retried, failed again, moved on); a judge confirms or silences it.
RETRIED_AND_MOVED_ON = [_call("toolu_1", "reserve", item="EQ-001"), _call("toolu_2", "reserve", item="EQ-001"),
                        _call("toolu_3", "note", text="x"), {"content": "All reserved!"}]


def _several_failures(count: int) -> list[dict]:
    """``count`` reservations of different items, each failing once, then an answer naming none of them: every one
    is a question for the judge (the rule alone leaves them open)."""
    return [_call(f"toolu_{n}", "reserve", item=f"EQ-00{n}") for n in range(1, count + 1)] + [{"content": "Done."}]


@pytest.fixture
def no_judge_in_env(monkeypatch):
    for name in ("LOOPTRACE_JUDGE", "LOOPTRACE_JUDGE_MAX_CALLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")  # nothing written beside the tests; the judge needs no spans
    return monkeypatch


def _agent(api: FakeMessagesAPI, **options) -> Agent:
    """An Agent built without a detector config or settings of its own: the environment decides the judge."""
    client = anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
    return Agent(MODEL, tools=[reserve, note], client=client, on_anomaly="warn", alerts=Alerts(log_warnings=False),
                 **options)


# --------------------------------------------------------------------------- the settings


def test_the_settings_read_the_judge_and_its_cap():
    settings = Settings.from_env({"LOOPTRACE_JUDGE": f" {JUDGE} ", "LOOPTRACE_JUDGE_MAX_CALLS": "5"})
    assert (settings.judge, settings.judge_max_calls) == (JUDGE, 5)
    assert (Settings.from_env({}).judge, Settings.from_env({}).judge_max_calls) == (None, None)


def test_a_cap_that_is_no_positive_number_is_ignored_and_said():
    settings = Settings.from_env({"LOOPTRACE_JUDGE_MAX_CALLS": "0"})
    assert settings.judge_max_calls is None
    assert any("LOOPTRACE_JUDGE_MAX_CALLS" in sentence for sentence in settings.ignored)


def test_the_detector_config_refuses_a_cap_below_one():
    with pytest.raises(ValueError, match="judge_max_calls"):
        DetectorConfig(judge_max_calls=0)
    assert DetectorConfig().judge_cap == 3


# --------------------------------------------------------------------------- the environment variable


@pytest.mark.parametrize("ignored, fires", [(False, False), (True, True)])
def test_the_environment_variable_switches_the_judge_on(no_judge_in_env, ignored, fires):
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", JUDGE)
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON, forced={"verdict": verdict_answer(ignored)}) as api:
        result = _agent(api).run("reserve EQ-001")
        (judged,) = api.forced_requests("verdict")
    assert result.status is RunStatus.DONE
    assert judged["model"] == JUDGE and "All reserved!" in json.dumps(judged)
    assert [a.type for a in result.anomalies] == ([IGNORED_ERROR] if fires else [])
    # Its cost is reported beside the run's, and is none of the run's.
    assert result.judge_calls == 1 and result.judge_cost_usd == pytest.approx(VERDICT_COST)
    assert (result.judge.input_tokens, result.judge.output_tokens) == (120, 15)
    assert result.usage.input_tokens == 4 * 10 and result.judge.unjudged == 0  # four run responses of 10 tokens
    assert result.to_dict()["judge"]["cost_usd"] == pytest.approx(VERDICT_COST)


def test_with_telemetry_on_the_judge_is_traced_and_priced_the_same(spans, no_judge_in_env):
    # spans first: the SDK's provider reads OTEL_SDK_DISABLED when it is made
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", JUDGE)
    no_judge_in_env.delenv("OTEL_SDK_DISABLED")
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON, forced={"verdict": verdict_answer(True)}) as api:
        result = _agent(api, tracer_provider=spans.provider).run("reserve EQ-001")
    (judge_span,) = [s for s in spans.all if s.attributes.get("looptrace.judge")]
    assert judge_span.attributes["looptrace.judge.cost_usd"] == pytest.approx(result.judge_cost_usd)
    assert result.judge_cost_usd == pytest.approx(VERDICT_COST)


def test_without_a_judge_the_run_says_how_many_errors_were_left_unjudged(no_judge_in_env):
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON) as api:
        result = _agent(api).run("reserve EQ-001")
        assert api.forced_requests("verdict") == []
    assert [a.type for a in result.anomalies] == [IGNORED_ERROR]  # the rule's own verdict
    assert (result.judge_calls, result.judge.unjudged_no_judge, result.judge.configured) == (0, 1, False)
    assert judge_lines(result) == ["1 tool error left unjudged (no judge: set LOOPTRACE_JUDGE or pass --judge MODEL)"]


def test_an_explicit_judge_wins_over_the_environment(no_judge_in_env):
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", "claude-opus-4-1")
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON, forced={"verdict": verdict_answer(True)}) as api:
        _agent(api, detector=DetectorConfig(judge=JUDGE)).run("reserve EQ-001")
        (judged,) = api.forced_requests("verdict")
    assert judged["model"] == JUDGE


# --------------------------------------------------------------------------- the cap


@pytest.mark.parametrize("cap", [1, 2])
def test_the_cap_holds_and_the_rest_are_left_unjudged(no_judge_in_env, cap):
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", JUDGE)
    no_judge_in_env.setenv("LOOPTRACE_JUDGE_MAX_CALLS", str(cap))
    with FakeMessagesAPI(_several_failures(cap + 1), forced={"verdict": verdict_answer(False)}) as api:
        result = _agent(api).run("reserve them all")
        asked = api.forced_requests("verdict")
    assert len(asked) == cap  # N + 1 questions, N requests
    assert "EQ-00" + str(cap + 1) in json.dumps(asked[0])  # the most recent failure is asked about first
    assert (result.judge_calls, result.judge.unjudged_over_cap, result.judge.max_calls) == (cap, 1, cap)
    assert result.judge_cost_usd == pytest.approx(cap * VERDICT_COST)
    assert result.anomalies == []  # an open case fires only on a clear "ignored"
    assert judge_lines(result)[-1] == (f"1 tool error left unjudged (judge cap of {cap} call{'s' if cap > 1 else ''} "
                                       "reached; LOOPTRACE_JUDGE_MAX_CALLS raises it)")


def test_the_cap_is_per_run_not_per_agent(no_judge_in_env):
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", JUDGE)
    no_judge_in_env.setenv("LOOPTRACE_JUDGE_MAX_CALLS", "1")
    with FakeMessagesAPI(_several_failures(1) * 2, forced={"verdict": verdict_answer(True)}) as api:
        agent = _agent(api)
        first, second = agent.run("reserve it"), agent.run("reserve it", session_id="s")
        assert len(api.forced_requests("verdict")) == 2
    assert first.judge_calls == second.judge_calls == 1
    assert first.judge.unjudged == second.judge.unjudged == 0


def test_a_judge_answering_ignored_stops_asking(no_judge_in_env):
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", JUDGE)
    with FakeMessagesAPI(_several_failures(3), forced={"verdict": verdict_answer(True)}) as api:
        result = _agent(api).run("reserve them all")
        assert len(api.forced_requests("verdict")) == 1  # one error ignored is enough to fire
    assert [a.type for a in result.anomalies] == [IGNORED_ERROR] and result.judge.unjudged == 0


# --------------------------------------------------------------------------- a failing judge


@pytest.mark.parametrize("failure", [
    Error(500, "api_error", "judge down", headers={"x-should-retry": "false"}),
    Error(529, "overloaded_error", "overloaded", headers={"x-should-retry": "false"}),
])
def test_a_judge_whose_requests_fail_leaves_the_rules_verdict(no_judge_in_env, failure):
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", JUDGE)
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON, forced={"verdict": failure}) as api:
        result = _agent(api).run("reserve EQ-001")
        assert len(api.forced_requests("verdict")) == 1
    assert result.status is RunStatus.DONE and result.final_text == "All reserved!"
    assert [a.type for a in result.anomalies] == [IGNORED_ERROR]
    assert (result.judge_calls, result.judge.failures, result.judge_cost_usd) == (1, 1, 0.0)
    assert judge_lines(result) == ["judge: 1 call, 1 failed, 0 tokens  $0.0000 (not charged to the run)"]


def test_a_judge_that_times_out_leaves_the_rules_verdict(no_judge_in_env):
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON, forced={"verdict": Delay(1.0, verdict_answer(False))}) as api:
        model = AnthropicModel(client=anthropic.Anthropic(base_url=api.url, api_key="test-key", max_retries=0))
        agent = Agent(MODEL, tools=[reserve, note], client=model, on_anomaly="warn",
                      alerts=Alerts(log_warnings=False),
                      detector=DetectorConfig(judge=ModelJudge(model, JUDGE, timeout_s=0.05)))
        result = agent.run("reserve EQ-001")
    assert result.status is RunStatus.DONE
    assert [a.type for a in result.anomalies] == [IGNORED_ERROR]  # "not ignored" came too late to count
    assert result.judge.failures == 1


# --------------------------------------------------------------------------- the CLI


def _tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "tools.py"
    path.write_text("from looptrace.runtime import tool\n\n\n"
                    "@tool\ndef reserve(item: str) -> str:\n    \"\"\"Reserve an item.\"\"\"\n"
                    "    raise RuntimeError(item + ' is out of stock')\n\n\n"
                    "@tool\ndef note(text: str) -> str:\n    \"\"\"Take a note.\"\"\"\n    return 'noted'\n")
    return path


def _cli_run(monkeypatch, api: FakeMessagesAPI, tmp_path: Path, *flags: str) -> int:
    from looptrace.cli.app import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("LOOPTRACE_EXPORTER", "none")
    return main(["run", "reserve EQ-001", "--tools", str(_tools_file(tmp_path)), *flags])


def test_looptrace_run_judge_switches_the_judge_on_and_reports_its_cost(no_judge_in_env, tmp_path, capsys):
    no_judge_in_env.delenv("OTEL_SDK_DISABLED")
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON, forced={"verdict": verdict_answer(False)}) as api:
        code = _cli_run(no_judge_in_env, api, tmp_path, "--judge", JUDGE, "--json")
        (judged,) = api.forced_requests("verdict")
    assert code == 0 and judged["model"] == JUDGE
    shown = json.loads(capsys.readouterr().out)
    assert shown["anomalies"] == [] and shown["judge"]["calls"] == 1
    assert shown["judge"]["cost_usd"] == pytest.approx(VERDICT_COST)


def test_the_flag_wins_over_the_variable_and_the_summary_shows_the_judge(no_judge_in_env, tmp_path, capsys):
    no_judge_in_env.delenv("OTEL_SDK_DISABLED")
    no_judge_in_env.setenv("LOOPTRACE_JUDGE", "claude-opus-4-1")
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON, forced={"verdict": verdict_answer(True)}) as api:
        code = _cli_run(no_judge_in_env, api, tmp_path, "--judge", JUDGE)
        (judged,) = api.forced_requests("verdict")
    err = capsys.readouterr().err
    assert code == 0 and judged["model"] == JUDGE
    assert "judge: 1 call, 135 tokens  $0.0002 (not charged to the run)" in err
    assert "left unjudged" not in err


def test_looptrace_run_without_a_judge_says_what_was_left_unjudged(no_judge_in_env, tmp_path, capsys):
    no_judge_in_env.delenv("OTEL_SDK_DISABLED")
    with FakeMessagesAPI(RETRIED_AND_MOVED_ON) as api:
        code = _cli_run(no_judge_in_env, api, tmp_path)
    err = capsys.readouterr().err
    assert code == 0
    assert "1 tool error left unjudged (no judge: set LOOPTRACE_JUDGE or pass --judge MODEL)" in err


# --------------------------------------------------------------------------- the evaluation with a judge

ROOT = Path(__file__).resolve().parents[1]


def _corpus(tmp_path: Path) -> Path:
    """One recorded conversation in the corpus's shape: a reservation that fails twice, a note, "All reserved!"."""
    def use(call_id: str, name: str, **arguments: str) -> dict:
        return {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}]}

    def result(call_id: str, text: str, is_error: bool) -> dict:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text,
                                             "is_error": is_error}]}

    messages = [{"role": "user", "content": [{"type": "text", "text": "reserve EQ-001"}]},
                use("t1", "reserve", item="EQ-001"), result("t1", "EQ-001 is out of stock", True),
                use("t2", "reserve", item="EQ-001"), result("t2", "EQ-001 is out of stock", True),
                use("t3", "note", text="x"), result("t3", "noted", False),
                {"role": "assistant", "content": [{"type": "text", "text": "All reserved!"}]}]
    directory = tmp_path / "trajectories"
    directory.mkdir()
    (directory / "one.jsonl").write_text(json.dumps({"id": "test:one", "messages": messages, "meta": {}}) + "\n")
    return directory


@pytest.fixture
def detector_eval(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("LOOPTRACE_TRAJECTORIES", str(_corpus(tmp_path)))
    from benchmarks import detector_eval

    return detector_eval


def test_the_evaluation_with_a_judge_is_skipped_without_a_key(detector_eval, monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    assert detector_eval.main(["--judge", JUDGE]) == 0
    assert capsys.readouterr().out.startswith(f"skipped: --judge {JUDGE} needs ANTHROPIC_API_KEY")


@pytest.mark.parametrize("ignored, flags", [(True, 1), (False, 0)])
def test_the_evaluation_with_a_judge_asks_it_and_prints_its_calls_and_cost(detector_eval, monkeypatch, capsys,
                                                                           ignored, flags):
    with FakeMessagesAPI(forced={"verdict": verdict_answer(ignored)}) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        assert detector_eval.main(["--judge", JUDGE]) == 0
        (asked,) = api.forced_requests("verdict")
    out = capsys.readouterr().out
    assert asked["model"] == JUDGE and "All reserved!" in json.dumps(asked)
    assert f"| `ignored_error` | {flags} | 0 |" in out  # flagged (or silenced) by the judge; the run is unlabelled
    assert f"judge {JUDGE}: 1 call (0 failed) in 1 run, 135 tokens, cost $0.0002; 0 questions left unjudged" in out


def test_the_environments_judge_leaves_a_scripted_model_alone(no_judge_in_env):
    # A test suite's ScriptedModel holds the agent's answers only: a judge from the environment would take them.
    from looptrace.runtime import ScriptedModel

    no_judge_in_env.setenv("LOOPTRACE_JUDGE", JUDGE)
    # the answer as a text block, as a Messages response holds it: it states the failed reservation as done
    answer = {"stop_reason": "end_turn", "content": [{"type": "text", "text": "All reserved!"}]}
    model = ScriptedModel(RETRIED_AND_MOVED_ON[:3] + [answer, {"content": "the next run's answer"}])
    result = Agent(MODEL, tools=[reserve, note], client=model, on_anomaly="warn",
                   alerts=Alerts(log_warnings=False)).run("reserve EQ-001")
    assert [a.type for a in result.anomalies] == [IGNORED_ERROR] and result.judge.unjudged_no_judge == 1
    assert len(model.requests) == 4
