"""The `looptrace` command: demo, run against a local Messages API server, traces show; exit codes; bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.messages_api import Delay, Error, FakeMessagesAPI

from looptrace.cli.app import main
from looptrace.cli.demo import equipment_script
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.tracefile.read import read_spans

TOOLS_FILE = Path(__file__).parent / "data" / "equipment_tools.py"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_of_the_equipment_story_against_the_messages_api(workdir, api, capsys):
    api.add(*equipment_script())
    code, out, err = run_cli(capsys, "run", "Reserve a projector for 2026-10-08", "--tools", str(TOOLS_FILE),
                             "--json")

    assert code == 0
    result = json.loads(out)  # --json: one object and nothing else on stdout
    assert result["status"] == "done" and result["turns"] == 4
    assert len(api.requests) == 4

    # The failed reservation went back to the model as an is_error result, leading the next user message.
    third_request = api.requests[2]["messages"]
    assert third_request[-1]["content"][0]["is_error"] is True
    assert "EQ-001 has no stock" in third_request[-1]["content"][0]["content"]

    spans = list(read_spans(workdir / ".looptrace" / "traces.jsonl"))
    names = [s.name.split(" ")[0] for s in spans]
    assert (names.count("invoke_agent"), names.count("turn"), names.count("chat"), names.count("execute_tool")) == (
        1, 4, 4, 3)
    assert {s.trace_id for s in spans} == {result["trace_id"]}
    # Our chat span is the model call: the SDK's own span for it would be a second generation with the same usage.
    assert len(spans) == 12
    failed = [s for s in spans if s.name == "execute_tool reserve_equipment" and s.is_error]
    assert len(failed) == 1 and failed[0].attributes[sc.ERROR_TYPE] == "RuntimeError"
    chat = next(s for s in spans if s.name.startswith("chat "))
    assert chat.attributes[sc.SERVER_ADDRESS] == "127.0.0.1"
    assert chat.attributes[sc.GEN_AI_RESPONSE_ID].startswith("msg_")


def test_run_with_streaming_gives_the_same_result(workdir, api, capsys):
    api.add(*equipment_script())
    code, out, _ = run_cli(capsys, "run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json", "--stream")
    assert code == 0
    assert json.loads(out)["turns"] == 4
    assert all(r.get("stream") is True for r in api.requests)


def test_api_errors_are_retried_by_the_sdk(workdir, api, capsys):
    api.add(Error(429, "rate_limit_error", "slow down", retry_after=0.01),
            Error(529, "overloaded_error", "busy", retry_after=0.01), *equipment_script())
    code, out, _ = run_cli(capsys, "run", "Reserve a projector", "--tools", str(TOOLS_FILE), "--json")
    assert code == 0 and json.loads(out)["status"] == "done"
    assert len(api.requests) == 6


def test_a_400_ends_the_run_with_status_error_and_the_apis_message(workdir, api, capsys):
    api.add(Error(400, "invalid_request_error", "max_tokens: too large"))
    code, out, _ = run_cli(capsys, "run", "hello", "--json")
    assert code == 1
    result = json.loads(out)
    assert result["status"] == "error"
    assert "BadRequestError" in result["error"] and "max_tokens: too large" in result["error"]
    root = next(s for s in read_spans(workdir / ".looptrace" / "traces.jsonl") if s.name.startswith("invoke_agent"))
    assert root.is_error and root.attributes[sc.RUN_STATUS] == "error"


def test_the_real_api_rule_on_tool_results_holds_for_every_request(workdir, api, capsys):
    # The fake rejects, as the real API does, a request whose tool_results do not lead the next user message.
    api.add({"content": [{"type": "tool_use", "id": "toolu_a", "name": "search_equipment", "input": {"keyword": "x"}},
                         {"type": "tool_use", "id": "toolu_b", "name": "no_such_tool", "input": {}}]},
            {"content": "ok"})
    code, out, _ = run_cli(capsys, "run", "go", "--tools", str(TOOLS_FILE), "--json")
    assert code == 0, out
    assert [b["tool_use_id"] for b in api.requests[1]["messages"][-1]["content"]] == ["toolu_a", "toolu_b"]


@pytest.mark.parametrize("limit_flags, status, code", [
    (["--max-turns", "2"], "max_turns", 10),
    (["--max-total-tokens", "20"], "token_budget", 11),
    (["--max-cost-usd", "0.0000001"], "cost_budget", 12),
])
def test_limits_have_their_own_exit_codes(workdir, api, capsys, limit_flags, status, code):
    api.add(*equipment_script())
    exit_code, out, _ = run_cli(capsys, "run", "go", "--tools", str(TOOLS_FILE), "--json", *limit_flags)
    assert (exit_code, json.loads(out)["status"]) == (code, status)


def test_a_refusal_exits_22(workdir, api, capsys):
    api.add({"stop_reason": "refusal", "content": []})
    code, out, _ = run_cli(capsys, "run", "something bad", "--json")
    assert (code, json.loads(out)["status"]) == (22, "refusal")


def test_a_missing_key_is_one_clear_line(workdir, monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    code, out, err = run_cli(capsys, "run", "hello")
    assert code == 2 and out == ""
    assert err.strip() == ("looptrace: error: ANTHROPIC_API_KEY is not set; export it (and ANTHROPIC_BASE_URL for a "
                           "proxy or a local server), or try the offline model: --model scripted:equipment "
                           "(docs/cli.md)")


@pytest.mark.parametrize("content, message", [
    ("import no_such_module_anywhere\n", "cannot import tools file"),
    ("def broken(:\n", "(line 1): SyntaxError"),
    ("x = 1\n", "defines no @tool functions"),
])
def test_a_bad_tools_file_is_one_clear_line(workdir, api, capsys, content, message):
    path = workdir / "tools.py"
    path.write_text(content)
    code, out, err = run_cli(capsys, "run", "hello", "--tools", str(path))
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_missing_tools_file(workdir, api, capsys):
    code, _, err = run_cli(capsys, "run", "hello", "--tools", "nowhere.py")
    assert code == 2 and "tools file nowhere.py does not exist" in err


def test_a_bad_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["run", "hello", "--max-turns", "-3"])
    assert exited.value.code == 2
    assert "must be positive" in capsys.readouterr().err


def test_an_unknown_exporter_is_a_usage_error(workdir, capsys):
    code, _, err = run_cli(capsys, "demo", "--exporter", "file,carrier-pigeon")
    assert code == 2 and "unknown exporter 'carrier-pigeon'" in err


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["detect"], ["traces", "list"], ["traces", "show"]])
def test_a_bad_setting_read_for_the_default_trace_file_is_one_line(workdir, argv):
    # The trace commands start without the full CLI, and read the settings only for the default file: a value the
    # settings refuse is still one line and exit 2, as in every other command.
    env = {**os.environ, "LOOPTRACE_EXPORTER": "carrier-pigeon"}
    done = subprocess.run([sys.executable, "-m", "looptrace", *argv], capture_output=True, text=True, env=env,
                          timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("looptrace: error: unknown exporter 'carrier-pigeon'")
    assert len(done.stderr.splitlines()) == 1


def test_demo_shows_turns_the_tree_and_the_trace_file(workdir, capsys):
    code, out, err = run_cli(capsys, "demo")
    assert code == 0
    assert "\nturn 4\n" in err and "\nturn 4\n" not in out  # the live view is progress: stderr, as for `run`
    assert "✗ tool  reserve_equipment" in err
    assert "invoke_agent booking  [done]  4 turns" in out
    assert "trace file: .looptrace/traces.jsonl" in out
    assert (workdir / ".looptrace" / "traces.jsonl").exists()


def test_demo_json(workdir, capsys):
    code, out, _ = run_cli(capsys, "demo", "--json")
    result = json.loads(out)
    assert code == 0 and result["status"] == "done" and result["turns"] == 4 and len(result["trace_id"]) == 32


def test_trace_file_flag_and_env(workdir, capsys, monkeypatch):
    run_cli(capsys, "demo", "--trace-file", "custom/t.jsonl")
    assert (workdir / "custom" / "t.jsonl").exists()
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(workdir / "env.jsonl"))
    run_cli(capsys, "demo")
    assert (workdir / "env.jsonl").exists()


def test_traces_show_renders_the_latest_run_or_a_chosen_one(workdir, capsys):
    run_cli(capsys, "demo", "--json")
    first = json.loads(run_cli(capsys, "demo", "--json")[1])["trace_id"]
    second = json.loads(run_cli(capsys, "demo", "--json")[1])["trace_id"]
    code, out, _ = run_cli(capsys, "traces", "show")
    assert code == 0 and f"trace {second}" in out
    code, out, _ = run_cli(capsys, "traces", "show", "--trace-id", first[:10])
    assert code == 0 and f"trace {first}" in out
    assert "execute_tool reserve_equipment" in out and "ERROR RuntimeError" in out
    code, _, err = run_cli(capsys, "traces", "show", "--trace-id", "ffffffffff")
    assert code == 3 and "no trace" in err


def test_traces_show_skips_malformed_lines_and_says_so(workdir, capsys):
    run_cli(capsys, "demo", "--json")
    path = workdir / ".looptrace" / "traces.jsonl"
    good = path.read_text()
    path.write_text('{"truncated": \n' + good + "not json at all\n" + '{"resourceSpans": [{"scopeSpans": [{"spans": '
                    '[{"name": "no ids"}]}]}]}\n' + good[: len(good) // 2])
    code, out, err = run_cli(capsys, "traces", "show")
    assert code == 0
    assert "invoke_agent booking" in out
    assert ":1: skipped: truncated/incomplete JSON" in err and "skipped: not OTLP/JSON" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "cannot read trace file"),
    (lambda d: (d / "t.jsonl").mkdir(), "is a directory"),
])
def test_traces_show_on_an_unreadable_file(workdir, capsys, setup, message):
    setup(workdir)
    code, _, err = run_cli(capsys, "traces", "show", "--file", str(workdir / "t.jsonl"))
    assert code == 2 and message in err


def test_traces_show_on_an_empty_file(workdir, capsys):
    (workdir / "empty.jsonl").write_text("")
    code, _, err = run_cli(capsys, "traces", "show", "--file", str(workdir / "empty.jsonl"))
    assert code == 2 and "holds no OTLP/JSON spans (it is empty)" in err  # as detect, list and replay say


def test_help_lists_the_commands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    for word in ("demo", "run", "traces", "exit codes", "stopped_by_detector"):
        assert word in out


# --- as a real process ------------------------------------------------------------------------------------------------


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "looptrace"
    return [str(script)] if script.exists() else [sys.executable, "-m", "looptrace"]


@pytest.mark.slow
def test_the_installed_command_runs_the_demo(tmp_path):
    done = subprocess.run([*_console_script(), "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "final answer: Projector A (EQ-001) is out of stock" in done.stdout


@pytest.mark.slow
def test_ctrl_c_mid_tool_exits_130_with_a_valid_trace(tmp_path):
    tools = tmp_path / "slow_tools.py"
    tools.write_text("import pathlib, time\nfrom looptrace import tool\n\n@tool\ndef wait_forever() -> str:\n"
                     "    \"\"\"Sleeps.\"\"\"\n    pathlib.Path('tool-started').touch()\n    time.sleep(60)\n"
                     "    return 'late'\n")
    with FakeMessagesAPI([{"content": [{"type": "tool_use", "id": "toolu_1", "name": "wait_forever", "input": {}}]}]) \
            as fake:
        env = {**os.environ, "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key"}
        process = subprocess.Popen([*_console_script(), "run", "wait", "--tools", str(tools)], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (tmp_path / "tool-started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the tool says it is running: a fixed sleep would race a busy machine
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "interrupted; the trace was saved" in err
    spans = list(read_spans(tmp_path / ".looptrace" / "traces.jsonl", on_bad_line=pytest.fail))
    root = next(s for s in spans if s.name.startswith("invoke_agent"))
    assert root.attributes[sc.RUN_STATUS] == "interrupted"
    assert any(s.name == "execute_tool wait_forever" for s in spans)


@pytest.mark.slow
def test_ctrl_c_during_the_model_call_says_one_count_of_turns(tmp_path):
    import re

    with FakeMessagesAPI([Delay(60, {"content": [{"type": "text", "text": "late"}]})]) as fake:
        env = {**os.environ, "ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key"}
        process = subprocess.Popen([*_console_script(), "run", "wait"], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not fake.requests and time.monotonic() < deadline:
            time.sleep(0.05)  # until the model call is under way
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    counts = set(re.findall(r"(\d+) turns?\b", out + err))
    assert counts == {"1"}, out + err  # the live view's "interrupted: 1 turn" and the last line agree
    assert "interrupted" in err.splitlines()[-1] and "the trace was saved" in err
