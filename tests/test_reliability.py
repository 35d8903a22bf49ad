"""Nothing takes the agent down: hung and hostile tools, a misbehaving API, signals, bad files, many runs at once."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from fakes.messages_api import Delay, DropConnection, Error, FakeMessagesAPI, Trickle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from looptrace.cli.app import main
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.tracefile import OTLPJsonFileExporter
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.runtime import Agent, Limits, RunStatus, ScriptedModel, tool
from looptrace.runtime.tools import InvalidArguments

MODEL = "claude-sonnet-5-5"
CLI = [sys.executable, "-m", "looptrace"]


def tool_use(name, arguments=None, call_id="toolu_1"):
    return {"stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": call_id, "name": name, "input": arguments or {}}]}


def answer(text="done"):
    return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}


# --- tools -----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
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
    # The tool never returns: were interpreter exit to wait for its thread, the process would never end (and
    # subprocess.run's generous timeout would fail the test).
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"


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


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, word", [(signal.SIGINT, 130, "interrupted"),
                                                 (signal.SIGTERM, 143, "terminated")])
def test_a_signal_mid_model_call_saves_a_valid_trace(tmp_path, signum, code, word):
    with FakeMessagesAPI([Delay(30, answer())]) as fake:
        env = {**os.environ, "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key"}
        process = subprocess.Popen([*CLI, "run", "wait for the model"], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: fake.requests, timeout=300)  # a loaded machine may take long to start the process
        assert fake.requests, "the run never called the model"  # the signal must come mid-call, as the name says
        time.sleep(0.3)
        process.send_signal(signum)
        _, err = process.communicate(timeout=30)
    assert process.returncode == code, err
    assert f"{word}; the trace was saved" in err and "0 turns" not in err
    spans = list(read_spans(tmp_path / ".looptrace" / "traces.jsonl", on_bad_line=pytest.fail))
    root = next(s for s in spans if s.name.startswith("invoke_agent"))
    assert root.attributes[sc.RUN_STATUS] == "interrupted"
    chat = next(s for s in spans if s.name.startswith("chat "))
    assert chat.is_error and chat.parent_span_id is not None


def test_an_unwritable_trace_file_costs_one_warning_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions: use a path under a regular file instead
        target = tmp_path / "a-file"
        target.write_text("")
        path = target / "traces.jsonl"
    else:
        path = locked / "traces.jsonl"
    # Set in the environment, as a service's would be (a --trace-file that can never be a file is refused before
    # the run instead: tests/test_cli_refusals.py).
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(path))
    code = main(["demo", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["status"] == "done"
    assert err.count("trace_file_unwritable") == 1
    assert "Traceback" not in err


def test_the_trace_file_survives_a_full_disk_with_one_warning(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    from looptrace.testing import capture_logs

    provider = TracerProvider(shutdown_on_exit=False)  # shut down here, not at the suite's exit: its warning is ours
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter("/dev/full")))
    with capture_logs() as logs:
        for _ in range(2):
            result = Agent(MODEL, client=ScriptedModel([answer()]), tracer_provider=provider).run("x")
            assert result.status is RunStatus.DONE
        provider.shutdown()
    events = [e["event"] for e in logs]
    assert events.count("trace_file_unwritable") == 1 and events.count("trace_file_spans_lost") == 1


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


def test_detect_on_an_empty_file_is_a_usage_error(tmp_path, capsys):
    # Nothing to judge is not "no anomaly": a CI gate pointed at an empty file must not go green (issue 12, item 18).
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["detect", str(tmp_path / "empty.jsonl")]) == 2
    assert "holds no OTLP/JSON spans (it is empty)" in capsys.readouterr().err


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
    import httpx2

    from looptrace.runtime.models import _retry_delay

    api.add(*([Delay(5, answer())] * 3))
    client = anthropic.Anthropic(base_url=api.url, api_key="test-key")
    result = Agent(MODEL, client=client, limits=Limits(timeout_s=1.0), telemetry=False).run("go")
    # Whichever noticed first, the run's own clock or the SDK's timeout of the attempt (given the time left), the
    # run says it ran out of time (a busy machine decides which one does).
    assert result.status is RunStatus.TIMEOUT and "did not finish within" in result.error, result.error
    assert len(api.requests) == 1  # the SDK's retries did not give the call the whole limit again
    # The mechanism: a retry that would not fit in the time left is not made (the SDK's would give each attempt the
    # whole limit again).
    timed_out = anthropic.APITimeoutError(request=httpx2.Request("POST", api.url))
    assert _retry_delay(timed_out, 0, 2, time.monotonic() + 0.01) is None
    assert _retry_delay(timed_out, 0, 2, time.monotonic() + 60) is not None


def test_a_run_whose_sdk_timeout_noticed_the_deadline_first_says_it_ran_out_of_time():
    """The SDK's own read timeout (each attempt is given the time the run has left) reports first, before the run's
    clock does: here for certain, since the transport holds the event loop until the read times out, as a busy
    machine can. The run still says what happened in its own words."""
    import anthropic
    import httpx2

    def read_times_out(request):
        time.sleep(request.extensions["timeout"]["read"])  # blocking: the run's own timer cannot fire first
        raise httpx2.ReadTimeout("timed out", request=request)

    client = anthropic.AsyncAnthropic(api_key="test-key", base_url="http://127.0.0.1:9",
                                      http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(read_times_out)))
    result = asyncio.run(Agent(MODEL, client=client, limits=Limits(timeout_s=0.3), telemetry=False).arun("go"))
    assert result.status is RunStatus.TIMEOUT
    assert result.error.startswith("ModelCallTimeout: the model call did not finish within the ")
    assert "its last attempt: APITimeoutError" in result.error


def test_no_tool_is_started_once_the_runs_clock_has_run_out():
    ran = []

    @tool
    def slow(n: int) -> str:
        """Takes long enough to use up the run's clock."""
        ran.append(n)
        time.sleep(1.2)
        return "ok"

    calls = {"stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": f"t{n}", "name": "slow", "input": {"n": n}} for n in range(3)]}
    model = ScriptedModel([calls, answer()])
    # A second of margin before the first call starts (the model is scripted, so that is the loop's own set-up): a busy
    # machine (parallel test workers) must not make the first call start after the clock ran out.
    result = Agent(MODEL, tools=[slow], client=model, limits=Limits(timeout_s=1.0), telemetry=False).run("go")
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
    def reserve() -> str:
        """Always fails."""
        raise RuntimeError("nope")

    # A failure retried, failed again and left behind for other work, then claimed done: what the ignored_error rule
    # flags on its own.
    model = ScriptedModel([tool_use("reserve", call_id="t1"), tool_use("reserve", call_id="t2"),
                           tool_use("_typed", {"name": "a", "count": 1}, call_id="t3"),
                           answer("All done, it is reserved.")])  # states the operation (reserve) done
    result = Agent(MODEL, tools=[reserve, _typed], client=model, limits=Limits(max_turns=4), telemetry=False,
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


# --- issue 12: hostile values, budgets that hold, leaks ---------------------------------------------------------------


def _nested(depth, leaf=None):
    value = leaf if leaf is not None else {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


def _circular():
    value = {"name": "loop"}
    value["self"] = value
    return value


class _UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("__str__ of the exception fails too")


class _Unprintable:
    def __str__(self):
        raise _UnprintableError()

    __repr__ = __str__


@pytest.mark.parametrize("value, says", [
    (_nested(10_000), "nested too deep"),
    (10 ** 5000, "integer too long"),
    ({("a", 1): "tuple key"}, "keys or values JSON cannot express"),
    (_circular(), "contains itself"),
    (_Unprintable(), "_Unprintable"),
    ([_Unprintable()], "converting it raised"),
], ids=["10000-deep", "5000-digit-int", "tuple-keys", "circular", "str-raises", "str-raises-inside"])
def test_a_return_value_that_cannot_become_text_is_an_error_result_and_the_run_ends_whole(value, says, spans):
    @tool
    def hostile() -> object:
        """Returns something no encoder can write."""
        return value

    model = ScriptedModel([tool_use("hostile"), answer("the tool gave me garbage")])
    result = Agent(MODEL, tools=[hostile], client=model, tracer_provider=spans.provider).run("go")
    assert result.status is RunStatus.DONE and result.turns == 2
    sent = model.requests[1]["messages"][-1]["content"][0]
    assert sent["is_error"] is True and says in sent["content"], sent
    root = spans.one("invoke_agent")  # ended, with the run's status
    assert root.attributes[sc.RUN_STATUS] == "done"
    assert spans.one("execute_tool").attributes[sc.ERROR_TYPE] == "UnreadableResult"


def test_a_tool_whose_exception_cannot_describe_itself_is_still_an_error_result():
    @tool
    def hostile() -> str:
        """Raises an exception whose text fails."""
        raise _UnprintableError()

    model = ScriptedModel([tool_use("hostile"), answer()])
    result = Agent(MODEL, tools=[hostile], client=model, telemetry=False).run("go")
    assert result.status is RunStatus.DONE
    assert model.requests[1]["messages"][-1]["content"][0] == {
        "type": "tool_result", "tool_use_id": "toolu_1", "content": "_UnprintableError", "is_error": True}


def test_arguments_nested_600_deep_do_not_crash_looptrace_run(api, capsys, tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text(textwrap.dedent('''
        from looptrace import tool

        @tool
        def store(document: dict) -> str:
            """Stores a document."""
            return "stored"
    '''))
    api.add(tool_use("store", {"document": _nested(600, {"password": "hunter2"})}), answer("stored it"))
    code, result = run_json(capsys, "store this", "--tools", str(tools))
    assert (code, result["status"], result["turns"]) == (0, "done", 2)
    spans_written = read_spans(tmp_path / ".looptrace" / "traces.jsonl")
    (tool_span,) = [s for s in spans_written if s.name.startswith("execute_tool")]
    arguments = tool_span.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]
    assert "nested deeper than" in arguments and "hunter2" not in arguments
    assert "hunter2" not in json.dumps(result)


def test_a_usage_block_of_strings_and_garbage_is_counted_not_crashed(spans):
    model = ScriptedModel([{**answer(), "usage": {"input_tokens": "120", "output_tokens": "7.5", "cache_read_input_tokens": None,
                                                  "cache_creation_input_tokens": -3,
                                                  "cache_creation": "lots"}}])
    result = Agent(MODEL, client=model, limits=Limits(max_total_tokens=10_000, max_cost_usd=1.0),
                   tracer_provider=spans.provider).run("go")
    assert result.status is RunStatus.DONE
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.total_tokens) == (120, 0, 120)
    assert spans.one("invoke_agent").attributes[sc.RUN_STATUS] == "done"


@pytest.mark.parametrize("arguments", [[{"password": "hunter2"}], [[{"api_key": "hunter2"}]], "password=hunter2"])
def test_non_object_arguments_are_quoted_back_redacted(arguments, spans):
    model = ScriptedModel([tool_use("_typed", arguments), answer()])
    result = Agent(MODEL, tools=[_typed], client=model, tracer_provider=spans.provider).run("go")
    told = model.requests[1]["messages"][-1]["content"][0]
    assert told["is_error"] is True and "takes a JSON object of arguments" in told["content"]
    everything = json.dumps([told] + [dict(s.attributes) for s in spans.all] + [a.to_dict() for a in result.anomalies])
    if not isinstance(arguments, str):  # a bare string has no key to say it is secret
        assert "hunter2" not in everything and "[REDACTED]" in told["content"]


@pytest.mark.parametrize("key", ["pass", "key", "bearer", "Bearer", "db_pass", "license_key", "x-api-key"])
def test_values_under_pass_key_and_bearer_are_redacted(key, spans):
    @tool
    def connect(settings: dict) -> str:
        """Connects."""
        return "ok"

    model = ScriptedModel([tool_use("connect", {"settings": {key: "hunter2", "host": "db"}}), answer()])
    Agent(MODEL, tools=[connect], client=model, tracer_provider=spans.provider).run("go")
    arguments = spans.one("execute_tool").attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]
    assert "hunter2" not in arguments and '"host":"db"' in arguments


def test_run_json_prints_arguments_redacted(api, capsys, tmp_path):
    tools = tmp_path / "tools.py"
    tools.write_text(textwrap.dedent('''
        from looptrace import tool

        @tool
        def login(user: str, password: str) -> str:
            """Logs in."""
            return "welcome"
    '''))
    api.add(tool_use("login", {"user": "ana", "password": "hunter2"}), answer("logged in"))
    code, result = run_json(capsys, "log in", "--tools", str(tools))
    assert code == 0
    printed = json.dumps(result)
    assert "hunter2" not in printed
    assert result["messages"][1]["content"][0]["input"] == {"user": "ana", "password": "[REDACTED]"}
    # The model itself was sent the real value: redaction is for what is shown, not for the conversation.
    assert "hunter2" in json.dumps(api.requests[1]["messages"])


def test_each_request_asks_for_no_more_tokens_than_the_budget_leaves():
    model = ScriptedModel([{**tool_use("step"), "usage": {"input_tokens": 300, "output_tokens": 100}},
                           {**answer(), "usage": {"input_tokens": 450, "output_tokens": 20}}])
    result = Agent(MODEL, client=model, max_tokens=4096, limits=Limits(max_total_tokens=1000),
                   telemetry=False).run("go")
    assert [r["max_tokens"] for r in model.requests] == [1000, 600]
    assert result.status is RunStatus.DONE  # 870 tokens of 1000


def test_each_request_asks_for_no_more_output_than_the_cost_budget_leaves():
    from looptrace.runtime import Price

    prices = {"m": Price(input=1.0, output=10.0, cache_read=0.1, cache_write_5m=1.25, cache_write_1h=2.0)}
    model = ScriptedModel([{**tool_use("step"), "usage": {"input_tokens": 1000, "output_tokens": 500}},
                           answer()])
    Agent("m", client=model, max_tokens=4096, prices=prices, limits=Limits(max_cost_usd=0.01),
          telemetry=False).run("go")
    # $0.01 buys 1,000 output tokens at $10/MTok; the first turn spent $0.001 + $0.005, leaving $0.004: 400 tokens.
    assert [r["max_tokens"] for r in model.requests] == [1000, 400]


def test_a_lowered_max_tokens_keeps_extended_thinking_valid():
    model = ScriptedModel([{**tool_use("step"), "usage": {"input_tokens": 100, "output_tokens": 100}},
                           {**tool_use("step"), "usage": {"input_tokens": 2000, "output_tokens": 1000}}, answer()])
    Agent(MODEL, client=model, max_tokens=8000, model_params={"thinking": {"type": "enabled", "budget_tokens": 4000}},
          limits=Limits(max_total_tokens=4200), telemetry=False).run("go")
    first, second, third = model.requests
    assert first["max_tokens"] == 4200 and first["thinking"]["budget_tokens"] == 4000
    assert second["max_tokens"] == 4000 and second["thinking"]["budget_tokens"] == 3999
    assert third["max_tokens"] == 1000 and third["thinking"] == {"type": "disabled"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("driver", ["run", "arun"])
def test_the_runs_deadline_bounds_a_response_that_trickles_in(api, stream, driver):
    import anthropic

    from looptrace.runtime import AnthropicModel

    slow = Trickle(interval=0.5, item=answer("too late"), pieces=40)  # 20 s, a few bytes every half second
    api.add(slow)
    model = AnthropicModel(client=anthropic.Anthropic(base_url=api.url, api_key="test-key"),
                           async_client=anthropic.AsyncAnthropic(base_url=api.url, api_key="test-key"), stream=stream)
    agent = Agent(MODEL, client=model, limits=Limits(timeout_s=1.0), telemetry=False)
    result = agent.run("go") if driver == "run" else asyncio.run(agent.arun("go"))
    assert result.status is RunStatus.TIMEOUT
    assert "did not finish within" in result.error
    assert not slow.finished.is_set()  # the run ended while the answer was still arriving


class _StuckFlush(SpanProcessor):
    """A span processor whose flush hangs, like a batch processor waiting on a backend that does not answer."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.flushed_on: list[str] = []

    def shutdown(self):
        self.release.set()

    def force_flush(self, timeout_millis=30_000):
        self.flushed_on.append(threading.current_thread().name)
        self.release.wait(timeout_millis / 1000)
        return True


def test_cancelling_arun_never_blocks_the_event_loop_on_a_flush():
    stuck = _StuckFlush()
    provider = TracerProvider()
    provider.add_span_processor(stuck)
    started = asyncio.Event()

    @tool
    async def wait() -> str:
        """Waits until cancelled."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    async def main():
        agent = Agent(MODEL, tools=[wait], client=ScriptedModel([tool_use("wait"), answer()]),
                      tracer_provider=provider)
        task = asyncio.ensure_future(agent.arun("go"))
        await asyncio.wait_for(started.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Back on the loop while the flush is still stuck: it was never the loop's to wait for.
        return threading.current_thread().name, stuck.release.is_set()

    try:
        loop_thread, released = asyncio.run(main())
        assert not released
        _wait_for(lambda: stuck.flushed_on)  # the flush was asked for, on a thread of its own
        assert stuck.flushed_on and loop_thread not in stuck.flushed_on
    finally:
        stuck.release.set()


# --- issue 12: the CLI under pipes and at the terminal -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("argv, status", [(["demo"], 0), (["demo", "runaway"], 30), (["demo", "--json"], 0)])
def test_a_closed_stdout_ends_the_demo_quietly_and_keeps_its_trace(tmp_path, argv, status):
    process = subprocess.Popen([*CLI, *argv], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # the reader is gone before anything is written, as `| head -0` would leave it
    err = process.stderr.read()
    process.wait(timeout=60)
    assert process.returncode == status, err  # the run's status, not the pipe's: the run was over
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    assert "observer_failed" not in err
    spans_written = list(read_spans(tmp_path / ".looptrace" / "traces.jsonl", on_bad_line=pytest.fail))
    assert any(s.name.startswith("invoke_agent") for s in spans_written)


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["leaves at once", "reads three lines", "reads everything"])
def test_demo_piped_to_head_exits_with_the_runs_status_whenever_the_reader_leaves(tmp_path, reader):
    """`looptrace demo | head -3`: the same exit code whether head left before the demo wrote, in the middle, or after
    (which a pipe decides by timing alone). docs/cli.md and docs/exit-codes.md say so."""
    process = subprocess.Popen([*CLI, "demo"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if reader == "leaves at once":
        process.stdout.close()
    elif reader == "reads three lines":
        for _ in range(3):
            process.stdout.readline()
        process.stdout.close()
    else:
        process.stdout.read()
        process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.mark.slow
def test_a_listing_cut_short_by_its_reader_exits_141(tmp_path):
    assert main(["demo", "--json", "--trace-file", str(tmp_path / "t.jsonl")]) == 0
    process = subprocess.Popen([*CLI, "traces", "show", "--file", str(tmp_path / "t.jsonl")], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, err
    assert "Traceback" not in err


def test_demo_and_run_keep_the_live_view_on_stderr_and_the_outcome_on_stdout(api, capsys):
    code = main(["demo"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "\nturn 1\n" in err and "\nturn 1\n" not in out and "task: " in err
    assert out.startswith("final answer: ")
    api.add(answer("hello there"))
    code = main(["run", "say hello"])
    out, err = capsys.readouterr()
    assert (code, out) == (0, "hello there\n")
    assert "turn 1" in err


class _ClosedPipe:
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self):
        return False


def test_a_live_view_whose_reader_went_away_goes_quiet_and_the_run_goes_on():
    from looptrace.cli.views import LiveView
    from looptrace.testing import capture_logs

    with capture_logs() as logs:
        result = Agent(MODEL, tools=[_typed], client=ScriptedModel([tool_use("_typed", {"name": "a", "count": 1}),
                                                                   answer()]),
                       on_event=LiveView(_ClosedPipe()), telemetry=False).run("go")
    assert result.status is RunStatus.DONE and result.turns == 2
    assert [entry["event"] for entry in logs] == []  # no observer_failed warning per event


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _until(condition, what):
    _wait_for(condition)
    assert condition(), f"never saw {what}"


def test_a_slow_model_call_and_a_slow_tool_show_elapsed_time_on_a_live_line_at_a_terminal():
    from looptrace.cli.views import LiveView

    screen = _Terminal()

    def slow_model(params):  # answers once the screen has shown the wait ticking
        _until(lambda: "waiting for the model  " in screen.getvalue(), "the model's live line")
        return tool_use("crawl")

    @tool
    def crawl() -> str:
        """A slow tool."""
        _until(lambda: "running crawl  " in screen.getvalue(), "the tool's live line")
        return "crawled"

    result = Agent(MODEL, tools=[crawl], client=ScriptedModel([slow_model, answer()]),
                   on_event=LiveView(screen, tick_s=0.02), telemetry=False).run("go")
    assert result.status is RunStatus.DONE
    shown = screen.getvalue()
    assert re.search(r"\r\x1b\[K  … waiting for the model  \d+\.\d s", shown)
    assert re.search(r"\r\x1b\[K  … running crawl  \d+\.\d s\r\x1b\[K  ✓ tool  crawl\(\{\}\)", shown)
    # Each live line is erased before the next permanent line, so without them the record reads as when piped.
    lines = re.sub(r"\r\x1b\[K(  … [^\r]*)?", "", shown).splitlines()
    assert lines[0] == "turn 1" and lines[1].startswith("  model   stop_reason=tool_use")
    assert lines[2].startswith("  ✓ tool  crawl({}) -> crawled") and lines[3] == "turn 2"


def test_piped_the_live_view_is_plain_lines_only():
    import io

    from looptrace.cli.views import LiveView

    piped = io.StringIO()
    slow_done = threading.Event()

    @tool
    def crawl() -> str:
        """A tool slow enough for several ticks, were there a terminal."""
        slow_done.wait(0.3)
        return "crawled"

    Agent(MODEL, tools=[crawl], client=ScriptedModel([tool_use("crawl"), answer()]),
          on_event=LiveView(piped, tick_s=0.01), telemetry=False).run("go")
    shown = piped.getvalue()
    assert "\r" not in shown and "\x1b" not in shown and "…" not in shown.replace("…  ", "")
    assert shown.splitlines()[0] == "turn 1"


@pytest.mark.parametrize("argv, says", [
    (["run", "x", "--max-turns", "abc"], "argument --max-turns: must be a positive whole number, got 'abc'"),
    (["run", "x", "--timeout", "soon"], "argument --timeout: must be a positive number, got 'soon'"),
    (["run", "x", "--bogus"], "looptrace run: error: unrecognized arguments: --bogus (see looptrace run --help)"),
    (["demo", "nope"], "looptrace demo: error: argument story: invalid choice: 'nope'"),
    (["frobnicate"], "looptrace: error: argument COMMAND: invalid choice: 'frobnicate'"),
])
def test_a_bad_flag_is_one_line_in_the_users_terms(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert "_positive" not in err and "usage:" not in err


def test_tools_that_is_a_directory_says_so(api, capsys, tmp_path):
    code = main(["run", "x", "--tools", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "is a directory" in err and len(err.strip().splitlines()) == 1


def test_an_exception_while_importing_the_tools_file_names_its_file_and_line(api, capsys, tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text("import os\n\nSETTINGS = {}\nTIMEOUT = SETTINGS['timeout']\n")
    code = main(["run", "x", "--tools", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{path} (line 4): KeyError: 'timeout'" in err


def test_run_without_tools_says_it_runs_with_none(api, capsys):
    api.add(answer("hi"))
    code = main(["run", "say hi"])
    err = capsys.readouterr().err
    assert code == 0 and "the model runs with no tools" in err
    assert "tools" not in api.requests[0]


@pytest.mark.parametrize("task", ["", "   \n"])
def test_an_empty_task_is_refused(api, capsys, task):
    code = main(["run", task])
    err = capsys.readouterr().err
    assert code == 2 and "the task is empty" in err and len(err.strip().splitlines()) == 1
    assert api.requests == []
