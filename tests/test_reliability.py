"""Nothing takes the agent down: hung and hostile tools, a misbehaving API, signals, bad files, many runs at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
from fakes.messages_api import Delay, DropConnection, Error, FakeMessagesAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from looptrace.instrumentation import semconv as sc
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.otlp_file import OTLPJsonFileExporter, read_spans
from looptrace.runtime import Agent, Limits, RunStatus, ScriptedModel, tool
from looptrace.runtime.cli import main
from looptrace.runtime.tools import InvalidArguments

MODEL = "claude-sonnet-5-5"
CLI = [sys.executable, "-m", "looptrace"]


def tool_use(name, arguments=None, call_id="toolu_1"):
    return {"stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments or {}}]}


def answer(text="done"):
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}


# --- tools -----------------------------------------------------------------------------------------------------------


def test_a_process_with_a_hung_sync_tool_still_exits_promptly(tmp_path):
    script = textwrap.dedent("""
        import threading
        from looptrace.runtime import Agent, Limits, ScriptedModel, tool

        @tool
        def hang() -> str:
            '''Never returns.'''
            threading.Event().wait()

        model = ScriptedModel([
            {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "hang", "input": {}}]},
            {"stop_reason": "end_turn", "content": [{"type": "text", "text": "gave up"}]}])
        result = Agent("claude-sonnet-5-5", tools=[hang], client=model, limits=Limits(tool_timeout_s=0.3),
                       telemetry=False).run("go")
        print(result.status.value)
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert time.monotonic() - started < 20  # the abandoned thread is a daemon: interpreter exit does not wait for it


def test_a_result_that_is_not_json_serialisable_is_sent_as_text():
    class Opaque:
        def __str__(self):
            return "<opaque thing>"

    @tool
    def weird() -> object:
        """Returns an object json cannot encode."""
        return {"thing": Opaque(), "when": __import__("datetime").date(2026, 10, 8)}

    model = ScriptedModel([tool_use("weird"), answer()])
    result = Agent(MODEL, tools=[weird], client=model, telemetry=False).run("go")
    assert result.status is RunStatus.DONE
    assert model.requests[1]["messages"][-1]["content"][0]["content"] == (
        '{"thing": "<opaque thing>", "when": "2026-10-08"}')


def test_a_10_mb_result_is_capped_on_the_span_and_truncated_for_the_model(spans):
    @tool
    def dump() -> str:
        """Ten megabytes."""
        return "z" * 10_000_000

    model = ScriptedModel([tool_use("dump"), answer()])
    Agent(MODEL, tools=[dump], client=model, tracer_provider=spans.provider).run("go")
    sent = model.requests[1]["messages"][-1]["content"][0]["content"]
    assert len(sent) < 101_000 and "only the first 100,000 are shown" in sent
    result_attribute = spans.one("execute_tool").attributes[sc.GEN_AI_TOOL_CALL_RESULT]
    assert len(result_attribute) < 33_000 and "truncated" in result_attribute


@pytest.mark.parametrize("exception", [KeyboardInterrupt(), SystemExit(2), GeneratorExit()])
def test_a_tool_raising_a_base_exception_becomes_an_error_result(exception):
    @tool
    def hostile() -> str:
        """Raises something that is not an Exception."""
        raise exception

    model = ScriptedModel([tool_use("hostile"), answer()])
    result = Agent(MODEL, tools=[hostile], client=model, telemetry=False).run("go")
    assert result.status is RunStatus.DONE
    assert model.requests[1]["messages"][-1]["content"][0]["is_error"] is True


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                max_size=3), max_leaves=10)


@tool
def _typed(name: str, count: int, ratio: float = 1.0, tags: list[str] | None = None) -> str:
    """A typed tool for the property test."""
    return "ok"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_JSON, st.dictionaries(st.sampled_from(["name", "count", "ratio", "tags", "other"]), _JSON)))
def test_tool_validation_accepts_exactly_what_the_schema_allows_and_never_crashes(arguments):
    try:
        kwargs = _typed.validate(arguments)
    except InvalidArguments as exc:
        assert str(exc).startswith(("invalid arguments for _typed:", "_typed takes a JSON object"))
        return
    assert isinstance(kwargs["name"], str)
    assert isinstance(kwargs["count"], int) and not isinstance(kwargs["count"], bool)
    assert set(kwargs) <= {"name", "count", "ratio", "tags"}


# --- the model API, through the real SDK ------------------------------------------------------------------------------


@pytest.fixture
def api(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with FakeMessagesAPI() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        yield fake


def run_json(capsys, *argv):
    code = main(["run", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_500_then_success_is_retried(api, capsys):
    api.add(Error(500, "api_error", "oops", retry_after=0.01), answer("fine"))
    code, result = run_json(capsys, "hello")
    assert (code, result["status"], result["final_text"]) == (0, "done", "fine")
    assert len(api.requests) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_connection_that_drops_ends_the_run_with_error_not_a_crash(api, capsys, stream):
    api.add(*([DropConnection(after_events=3)] * 3))
    code, result = run_json(capsys, "hello", *(["--stream"] if stream else []))
    assert code == 1 and result["status"] == "error"
    assert result["error"]


def test_an_unknown_block_type_and_stop_reason_from_the_api_are_handled(api, capsys):
    api.add({"stop_reason": "quantum_pause", "content": [{"type": "hologram", "payload": 1},
                                                          {"type": "text", "text": "hi"}]})
    code, result = run_json(capsys, "hello")
    assert code == 1 and result["status"] == "error" and "quantum_pause" in result["error"]
    assert result["messages"][-1]["content"][0] == {"type": "hologram", "payload": 1}  # kept as it came


def test_an_unknown_block_beside_a_tool_call_does_not_stop_the_loop(api, capsys):
    api.add({"stop_reason": "tool_use", "content": [{"type": "hologram"},
                                                    {"type": "tool_use", "id": "toolu_9", "name": "x", "input": {}}]},
            answer("ok"))
    code, result = run_json(capsys, "hello")
    assert (code, result["turns"]) == (0, 2)


# --- the process ------------------------------------------------------------------------------------------------------


def _wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, 130, "interrupted"),
                                                 (signal.SIGTERM, 143, "terminated")])
def test_a_signal_mid_model_call_saves_a_valid_trace(tmp_path, signum, code, word):
    with FakeMessagesAPI([Delay(30, answer())]) as fake:
        env = {**os.environ, "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key"}
        process = subprocess.Popen([*CLI, "run", "wait for the model"], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: fake.requests)
        time.sleep(0.3)
        process.send_signal(signum)
        _, err = process.communicate(timeout=30)
    assert process.returncode == code, err
    assert f"{word} after 0 turns" in err
    spans = list(read_spans(tmp_path / ".looptrace" / "traces.jsonl", on_bad_line=pytest.fail))
    root = next(s for s in spans if s.name.startswith("invoke_agent"))
    assert root.attributes[sc.RUN_STATUS] == "interrupted"
    chat = next(s for s in spans if s.name.startswith("chat "))
    assert chat.is_error and chat.parent_span_id is not None


def test_an_unwritable_trace_file_costs_one_warning_and_the_run_goes_on(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions: use a path under a regular file instead
        target = tmp_path / "a-file"
        target.write_text("")
        path = target / "traces.jsonl"
    else:
        path = locked / "traces.jsonl"
    code = main(["demo", "--json", "--trace-file", str(path)])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["status"] == "done"
    assert err.count("trace_file_unwritable") == 1
    assert "Traceback" not in err


def test_the_trace_file_survives_a_full_disk_with_one_warning(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    from looptrace.testing import capture_logs

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter("/dev/full")))
    with capture_logs() as logs:
        for _ in range(2):
            result = Agent(MODEL, client=ScriptedModel([answer()]), tracer_provider=provider).run("x")
            assert result.status is RunStatus.DONE
    assert [e["event"] for e in logs].count("trace_file_unwritable") == 1


# --- input files --------------------------------------------------------------------------------------------------


def _demo_file(tmp_path, capsys) -> Path:
    path = tmp_path / "t.jsonl"
    main(["demo", "runaway", "--json", "--trace-file", str(path)])
    capsys.readouterr()
    return path


def test_detect_skips_truncated_and_corrupted_lines_and_still_judges_the_rest(tmp_path, capsys):
    path = _demo_file(tmp_path, capsys)
    good = path.read_text()
    path.write_text("\x00\x01garbage\n" + good + '{"resourceSpans": "nope"}\n' + good[: len(good) // 3])
    code = main(["detect", str(path)])
    out, err = capsys.readouterr()
    assert code == 1 and "repeated_call" in out
    assert ":1: skipped" in err and "Traceback" not in err


def test_detect_on_an_empty_file_finds_nothing(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["detect", str(tmp_path / "empty.jsonl")]) == 0
    assert "0 anomalies" in capsys.readouterr().err


def test_detect_on_a_missing_file_is_a_usage_error(tmp_path, capsys):
    assert main(["detect", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read trace file" in capsys.readouterr().err


def test_reading_a_large_file_streams_in_constant_memory(tmp_path, capsys):
    one_run = _demo_file(tmp_path, capsys).read_text()
    big = tmp_path / "big.jsonl"
    with open(big, "w") as handle:
        for _ in range(400):
            handle.write(one_run)
    size = big.stat().st_size
    tracemalloc.start()
    count = sum(1 for _ in read_spans(big))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 400 * 13
    assert peak < size / 10, f"peak {peak:,} bytes for a {size:,}-byte file"


# --- many runs at once --------------------------------------------------------------------------------------------


def test_200_concurrent_runs_keep_their_spans_apart_and_one_failure_touches_no_other(spans):
    @tool
    async def step(n: int) -> str:
        """Yields to the other runs, then answers."""
        await asyncio.sleep(0)
        return f"step {n}"

    def script(index: int):
        if index == 7:
            return [tool_use("step", {"n": 1}), RuntimeError("the API fell over for this run only")]
        return [tool_use("step", {"n": 1}), tool_use("step", {"n": 2}, "toolu_2"), answer(f"run {index}")]

    agents = [Agent(MODEL, tools=[step], client=ScriptedModel(script(i)), name=f"agent-{i}",
                    tracer_provider=spans.provider, alerts=Alerts(log_warnings=False)) for i in range(200)]

    async def all_runs():
        return await asyncio.gather(*(agent.arun(f"task {i}") for i, agent in enumerate(agents)))

    results = asyncio.run(all_runs())
    assert [r.status for r in results].count(RunStatus.DONE) == 199
    assert results[7].status is RunStatus.ERROR
    assert len({r.trace_id for r in results}) == 200

    by_trace: dict[str, list] = {}
    for span in spans.all:
        by_trace.setdefault(format(span.context.trace_id, "032x"), []).append(span)
    for index, result in enumerate(results):
        trace_spans = by_trace[result.trace_id]
        ids = {s.context.span_id for s in trace_spans}
        assert all(s.parent is None or s.parent.span_id in ids for s in trace_spans)  # parented inside its trace
        agent_names = {s.attributes.get(sc.GEN_AI_AGENT_NAME) for s in trace_spans}
        assert agent_names == {f"agent-{index}"}  # no span of another run
        expected = 1 + 3 + 3 + 2 if index != 7 else 1 + 2 + 2 + 1
        assert len(trace_spans) == expected


# --- edges found in review ----------------------------------------------------------------------------------------


def test_tool_use_without_a_tool_use_block_is_answered_not_crashed():
    model = ScriptedModel([{"stop_reason": "tool_use", "content": [{"type": "text", "text": "let me check"}]},
                           answer()])
    result = Agent(MODEL, client=model, telemetry=False).run("go")
    assert result.status is RunStatus.DONE and result.turns == 2


def test_the_wall_clock_limit_holds_through_the_sdks_retries(api):
    import anthropic

    api.add(*([Delay(5, answer())] * 3))
    client = anthropic.Anthropic(base_url=api.url, api_key="test-key")
    started = time.monotonic()
    result = Agent(MODEL, client=client, limits=Limits(timeout_s=1.0), telemetry=False).run("go")
    assert result.status is RunStatus.TIMEOUT
    assert time.monotonic() - started < 3  # without a deadline-aware retry: three attempts of a full second each


def test_no_tool_is_started_once_the_runs_clock_has_run_out():
    ran = []

    @tool
    def slow(n: int) -> str:
        """Takes long enough to use up the run's clock."""
        ran.append(n)
        time.sleep(0.4)
        return "ok"

    calls = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": f"t{n}", "name": "slow", "input": {"n": n}} for n in range(3)]}
    model = ScriptedModel([calls, answer()])
    result = Agent(MODEL, tools=[slow], client=model, limits=Limits(timeout_s=0.3), telemetry=False).run("go")
    assert result.status is RunStatus.TIMEOUT
    assert ran == [0]
    assert "was not run: the run's time limit was reached" in result.messages[-1]["content"][2]["content"]


def test_a_budget_reached_on_a_tool_use_turn_leaves_a_history_that_can_be_continued():
    from fakes.messages_api import check_tool_results_follow_tool_uses

    model = ScriptedModel([{**tool_use("step"), "usage": {"input_tokens": 100, "output_tokens": 1}}])
    result = Agent(MODEL, client=model, limits=Limits(max_total_tokens=50), telemetry=False).run("go")
    assert result.status is RunStatus.TOKEN_BUDGET
    # The history ends with the unanswered call's result, so it is a valid request as it stands (the API's rule)...
    assert check_tool_results_follow_tool_uses({"messages": result.messages}) is None
    # ...where without it the API would refuse it.
    assert "without `tool_result`" in check_tool_results_follow_tool_uses(
        {"messages": result.messages[:-1] + [{"role": "user", "content": "go on"}]})
    assert result.messages[-1]["content"][0]["tool_use_id"] == "toolu_1"
    assert result.messages[-1]["content"][0]["is_error"] is True


def test_a_nudge_is_not_sent_when_no_turn_is_left_to_read_it():
    @tool
    def fails() -> str:
        """Always fails."""
        raise RuntimeError("nope")

    model = ScriptedModel([tool_use("fails"), answer("All done, it worked.")])
    result = Agent(MODEL, tools=[fails], client=model, limits=Limits(max_turns=2), telemetry=False,
                   on_anomaly={"ignored_error": "nudge"}, alerts=Alerts(log_warnings=False)).run("go")
    assert result.status is RunStatus.DONE
    assert [a.type for a in result.anomalies] == ["ignored_error"]


def test_secrets_in_arguments_never_reach_anomaly_messages_spans_or_webhooks(spans):
    from looptrace.testing import capture_logs

    @tool
    def login(user: str, password: str) -> str:
        """Logs in."""
        return "denied"

    sent = []
    script = [tool_use("login", {"user": "ana", "password": "hunter2"}, f"t{n}") for n in range(3)] + [answer("no")]
    with capture_logs() as logs:
        result = Agent(MODEL, tools=[login], client=ScriptedModel(script), on_anomaly="warn",
                       tracer_provider=spans.provider, alerts=Alerts(callback=lambda a, c: sent.append(a))).run("go")
    assert [a.type for a in result.anomalies] == ["repeated_call"]
    everything = json.dumps([[dict(s.attributes), [dict(e.attributes) for e in s.events]] for s in spans.all]
                            + [a.to_dict() for a in sent] + logs, default=str)
    assert "hunter2" not in everything and "[REDACTED]" in everything


def test_a_policy_that_raises_is_treated_as_warn():
    def broken_policy(anomaly):
        raise KeyError("oops")

    result = Agent(MODEL, tools=[_typed], client=ScriptedModel(
        [tool_use("_typed", {"name": "a", "count": 1}, f"t{n}") for n in range(4)] + [answer()]),
        on_anomaly=broken_policy, alerts=Alerts(log_warnings=False), telemetry=False).run("go")
    assert result.status is RunStatus.DONE and result.anomalies


def test_an_async_tool_that_cancels_itself_is_a_tool_failure_under_arun():
    @tool
    async def cancels() -> str:
        """Raises CancelledError from inside."""
        raise asyncio.CancelledError()

    model = ScriptedModel([tool_use("cancels"), answer()])
    result = asyncio.run(Agent(MODEL, tools=[cancels], client=model, telemetry=False).arun("go"))
    assert result.status is RunStatus.DONE
    assert "was cancelled" in model.requests[1]["messages"][-1]["content"][0]["content"]
