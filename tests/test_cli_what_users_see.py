"""What a person sees when the CLI meets bad input or a hostile machine: one clear line and the right exit code,
never a hang, a traceback or content that was meant to stay out of sight.

Each test drives the `looptrace` command (in process through ``looptrace.cli.main``, or as a process where the
defect only shows there) and asserts its stdout, stderr and exit code.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import network_guard
import pytest
from fakes.messages_api import Error, NotStreamed

from looptrace.cli import main
from looptrace.cli.demo import equipment_script

ROOT = Path(__file__).resolve().parent.parent
TOOLS_FILE = Path(__file__).parent / "data" / "equipment_tools.py"
CLI = [sys.executable, "-m", "looptrace"]
SUBPROCESS_TIMEOUT_S = 120  # a hang must fail the test, not the suite; generous, since a busy machine is slow


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def process(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], cwd=cwd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)


def demo_trace(capsys, path: Path) -> Path:
    assert cli(capsys, "demo", "--json", "--trace-file", str(path))[0] == 0
    return path


# --- item 6: a device that never ends -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_the_demo_writing_to_a_full_device_finishes_warns_and_exits(tmp_path):
    done = process("demo", "--trace-file", "/dev/full", cwd=tmp_path)  # it used to spin forever reading it back
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("trace_file_unwritable") == 1 and "Traceback" not in done.stderr
    assert "final answer: Projector A" in done.stdout
    assert "(the run's spans are not in /dev/full: they could not be written there)" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["detect", "/dev/zero"], ["traces", "show", "--file", "/dev/zero"],
                                  ["traces", "list", "--file", "/dev/zero"]])
def test_an_endless_line_is_read_up_to_the_limit_and_called_not_trace_data(tmp_path, argv):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this system")
    done = process(*argv, cwd=tmp_path)  # no newline and no end: it used to be read for ever
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("looptrace: error: /dev/zero holds no OTLP/JSON spans (1 line read, none of them "
                                  "trace data; first: line 1: longer than 67,108,864 bytes")
    assert "reading stopped there" in done.stderr and len(done.stderr.splitlines()) == 1


@pytest.mark.slow
def test_traces_push_refuses_an_undelivered_list_that_is_a_device(tmp_path):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this system")
    done = process("traces", "push", "--file", "/dev/zero", cwd=tmp_path)  # it used to read it for ever
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("looptrace: error: undelivered list /dev/zero is not a regular file (a device or a pipe); "
                           "give the list, e.g. .looptrace/undelivered.jsonl\n")


# --- item 8: content capture off keeps content off stderr -----------------------------------------------------------


@pytest.mark.parametrize("variable, value", [("LOOPTRACE_CAPTURE_CONTENT", "false"),
                                             ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "NO_CONTENT")])
def test_with_content_capture_off_the_live_view_shows_no_tool_arguments_or_results(workdir, capsys, monkeypatch,
                                                                                 variable, value):
    monkeypatch.setenv(variable, value)
    code, out, err = cli(capsys, "demo")
    assert code == 0
    for content in ('"keyword"', "projector\"", "EQ-001", "no stock", "Projector B"):
        assert content not in err, content
    assert re.search(r"✓ tool  search_equipment\(1 argument\) -> ok, [\d,]+ characters, digest [0-9a-f]{16}", err)
    assert re.search(r"✗ tool  reserve_equipment\(2 arguments\) -> error, [\d,]+ characters, digest [0-9a-f]{16}",
                     err)
    assert "says    (98 characters)" in err
    assert "execute_tool search_equipment(…)" in out  # the tree holds what the spans hold: no arguments either


def test_with_content_capture_off_run_keeps_tool_content_off_stderr(workdir, api, capsys, monkeypatch):
    monkeypatch.setenv("LOOPTRACE_CAPTURE_CONTENT", "false")
    api.add(*equipment_script())
    code, out, err = cli(capsys, "run", "Reserve a projector", "--tools", str(TOOLS_FILE))
    assert code == 0 and "Projector B" in out  # the answer is the outcome: stdout keeps it
    assert "EQ-001" not in err and "no stock" not in err and '"keyword"' not in err
    assert "reserve_equipment(2 arguments) -> error" in err


def test_with_content_capture_on_the_live_view_still_shows_arguments_and_results(workdir, capsys):
    code, _, err = cli(capsys, "demo")
    assert code == 0
    assert 'search_equipment({"keyword":"projector"}) -> [{"item_id": "EQ-001"' in err


# --- item 10: a file holding no span --------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"2026-10-08 INFO started\n2026-10-08 INFO stopped\n",
                                     bytes(range(256)) * 4])
def test_traces_list_of_a_file_without_spans_is_one_line_and_exit_2(workdir, capsys, content):
    path = workdir / "not-traces.txt"
    path.write_bytes(content)
    code, out, err = cli(capsys, "traces", "list", "--file", str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"looptrace: error: {path} holds no OTLP/JSON spans (") and len(err.splitlines()) == 1
    assert err == cli(capsys, "detect", str(path))[2]  # as detect says it


def test_traces_show_of_a_log_file_is_a_usage_error_not_no_such_trace(workdir, capsys):
    path = workdir / "log.txt"
    path.write_text("INFO started\nINFO stopped\n")
    code, out, err = cli(capsys, "traces", "show", "--file", str(path))
    assert (code, out) == (2, "")
    assert err == (f"looptrace: error: {path} holds no OTLP/JSON spans (2 lines read, none of them trace data; "
                   "first: line 1: not JSON (Expecting value at column 1)); is it a trace file?\n")


# --- item 11: a torn last line --------------------------------------------------------------------------------------


def _skipped_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": skipped: " in line]


def test_a_torn_last_line_is_named_alike_by_show_list_and_detect(workdir, capsys):
    path = demo_trace(capsys, workdir / "t.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    assert b'"name":"invoke_agent' in lines[-1]  # the root is written last: the crash tears it
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    said = {argv[0] + (argv[1] if argv[0] == "traces" else ""): _skipped_lines(cli(capsys, *argv)[2])
            for argv in (["traces", "show", "--file", str(path)], ["traces", "list", "--file", str(path)],
                         ["detect", str(path)])}
    expected = f"looptrace: {path}:{len(lines)}: skipped: truncated/incomplete JSON"
    assert all(len(found) == 1 and found[0].startswith(expected) for found in said.values()), said
    assert said["tracesshow"] == said["traceslist"] == said["detect"]
    assert said["detect"][0].endswith("(torn: the line was never finished)")


def test_a_torn_root_leaves_the_turns_drawn_and_says_their_parent_is_missing(workdir, capsys):
    path = demo_trace(capsys, workdir / "t.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:200])
    code, out, err = cli(capsys, "traces", "show", "--file", str(path))
    assert code == 0 and out.startswith("turn 1  stop_reason=tool_use")
    assert "4 spans of this trace have no parent in the file" in err


def test_a_torn_line_of_a_later_run_leaves_the_finished_run_drawn_with_its_root(workdir, capsys):
    path = demo_trace(capsys, workdir / "t.jsonl")
    complete = path.read_bytes()
    later = demo_trace(capsys, workdir / "later.jsonl").read_bytes().splitlines(keepends=True)[0]
    path.write_bytes(complete + later[: len(later) // 2])  # the next run crashed while writing its first span
    number = complete.count(b"\n") + 1
    code, out, err = cli(capsys, "traces", "show", "--file", str(path))
    assert code == 0 and out.startswith("invoke_agent booking  [done]  4 turns")
    assert _skipped_lines(err) == _skipped_lines(cli(capsys, "detect", str(path))[2])
    assert _skipped_lines(err)[0].startswith(f"looptrace: {path}:{number}: skipped: truncated/incomplete JSON")


# --- item 12: a tools file that exits, or defines nothing -----------------------------------------------------------


@pytest.mark.parametrize("source, message", [
    ("import sys\nsys.exit(3)\n", "exited with code 3 while importing"),
    ("import sys\nsys.exit('no config')\n", "exited saying 'no config' while importing"),
    ("raise SystemExit\n", "exited with code 0 while importing"),
])
def test_a_tools_file_that_exits_while_importing_is_a_usage_error(workdir, api, capsys, source, message):
    path = workdir / "tools.py"
    path.write_text(source)
    code, out, err = cli(capsys, "run", "hello", "--tools", str(path))
    assert (code, out) == (2, "")  # not its own exit code: 3 means "no such trace"
    assert err.startswith(f"looptrace: error: tools file {path} (line ") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_tools_file_that_exists_but_defines_nothing_says_so(workdir, api, capsys):
    code, _, err = cli(capsys, "run", "hello", "--tools", "/dev/null")
    assert code == 2
    assert err == "looptrace: error: /dev/null defines no @tool functions\n"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero on this system")
def test_a_tools_file_that_never_ends_is_refused_within_a_bound(workdir, api, capsys):
    code, _, err = cli(capsys, "run", "hello", "--tools", "/dev/zero")
    assert code == 2 and "is larger than 16 MiB; is it a Python file?" in err


# --- item 13: a failed run, drawn -----------------------------------------------------------------------------------


def test_a_failed_run_says_its_error_once_and_counts_the_turn_it_failed_in(workdir, api, capsys):
    api.add(Error(400, "invalid_request_error", "max_tokens: too large"))
    code, _, err = cli(capsys, "run", "hello")
    assert code == 1
    assert "error: 1 turn, 0 tokens" in err  # the live view showed "turn 1"
    code, out, _ = cli(capsys, "traces", "show")
    assert code == 0
    assert "[error]  1 turn  0 tokens" in out and "\n└─ turn 1  " in out
    assert "BadRequestError: Error code: 400" in out and "BadRequestError: BadRequestError" not in out
    code, out, _ = cli(capsys, "traces", "list")
    assert code == 0 and "error               1 turn, 0 tokens" in out


def test_one_of_anything_is_said_in_the_singular(workdir, api, capsys):
    api.add({"content": [{"type": "tool_use", "id": "toolu_1", "name": "search_equipment",
                          "input": {"keyword": "projector"}}]}, {"content": "Projector B is free."})
    assert cli(capsys, "run", "Find a projector", "--tools", str(TOOLS_FILE))[0] == 0
    everything = "".join(cli(capsys, *argv)[1] + cli(capsys, *argv)[2]
                         for argv in (["traces", "show"], ["traces", "list"], ["detect", "--all"]))
    assert not re.search(r"\b1 (turns|tool calls|tokens|anomalies|lines)\b", everything), everything
    assert "2 turns" in everything and "1 tool call" in everything


# --- item 14: a server that does not stream -------------------------------------------------------------------------


def test_run_stream_against_a_server_that_answers_json_names_the_cause(workdir, api, capsys):
    api.add(NotStreamed({"content": "Hello."}), NotStreamed({"content": "Hello."}))
    code, out, err = cli(capsys, "run", "hello", "--stream", "--json")
    assert code == 1
    result = json.loads(out)
    assert result["status"] == "error"
    assert result["error"].startswith("ServerDidNotStream: the server did not stream: it answered a streaming "
                                      "request (stream=true) with application/json")
    assert "AssertionError" not in out + err
    code, _, err = cli(capsys, "run", "hello", "--stream")
    assert code == 1 and "looptrace: error: ServerDidNotStream: the server did not stream" in err


# --- item 17: a cost budget for a model without a price -------------------------------------------------------------


def test_a_cost_budget_for_an_unpriced_model_says_what_the_cli_can_do(workdir, api, capsys):
    code, out, err = cli(capsys, "run", "hello", "--model", "unpriced", "--max-cost-usd", "0.0001")
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and "prices=" not in err
    assert err.startswith("looptrace: error: --max-cost-usd needs the price of model 'unpriced'")
    assert "--model or LOOPTRACE_MODEL" in err and "drop --max-cost-usd" in err
    assert api.requests == []  # refused before anything was sent


# --- item 19: the CLI page's synopsis and every --help --------------------------------------------------------------


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def _synopsis() -> str:
    """The synopsis that opens docs/cli.md: its first code block."""
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    return page.split("```", 2)[1]


def test_every_flag_of_run_is_in_the_cli_pages_synopsis(capsys):
    synopsis = _synopsis()
    run_lines = synopsis[synopsis.index("looptrace run"):synopsis.index("looptrace traces show")]
    flags = set(re.findall(r"--[a-z][a-z-]+", _help(capsys, "run"))) - {"--help"}
    assert {"--session-id", "--user-id", "--tag", "--name", "--max-tokens", "--traceparent"} <= flags
    assert sorted(flag for flag in flags if flag not in re.findall(r"--[a-z][a-z-]+", run_lines)) == []


def test_every_command_and_flag_is_in_the_cli_pages_synopsis(capsys):
    synopsis = _synopsis()
    for argv in _every_command():
        assert f"looptrace {' '.join(argv)}" in synopsis, f"docs/cli.md's synopsis has no `looptrace {' '.join(argv)}`"
        flags = set(re.findall(r"--[a-z][a-z-]+", _help(capsys, *argv))) - {"--help"}
        missing = sorted(flag for flag in flags if flag not in synopsis)
        assert missing == [], f"docs/cli.md's synopsis lacks {missing} of `looptrace {' '.join(argv)}`"


def _every_command() -> list[list[str]]:
    """Each command and subcommand the parser offers, so that a command added later is held to the same rule."""
    import argparse

    from looptrace.cli.app import build_parser

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append([*prefix, name])
                    walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return found


def test_the_command_list_is_complete():
    assert {"demo", "run", "watch", "detect", "traces", "traces show", "traces list", "traces push"} <= {
        " ".join(argv) for argv in _every_command()}


@pytest.mark.parametrize("argv", _every_command(), ids=" ".join)
def test_every_commands_help_lists_its_exit_codes(capsys, argv):
    shown = _help(capsys, *argv)
    assert "exit codes:" in shown
    if argv[0] != "traces" or len(argv) > 1:
        assert re.search(r"^  0 ", shown, re.MULTILINE) and re.search(r"^  2 ", shown, re.MULTILINE)


@pytest.mark.parametrize("argv", [["traces", "show"], ["traces", "list"]])
def test_traces_show_and_list_have_a_description(capsys, argv):
    usage, rest = _help(capsys, *argv).split("\n\n", 1)
    assert not rest.startswith("options:")  # a paragraph saying what the command does comes first


# --- tests that stay on this machine --------------------------------------------------------------------------------


def test_the_guard_refuses_a_connection_beyond_loopback_and_records_it():
    with pytest.raises(OSError, match="tests may not reach outside the machine"):
        socket.create_connection(("192.0.2.1", 9), timeout=1)  # TEST-NET-1: documentation only, never routed
    with pytest.raises(OSError, match="tests may not reach outside the machine"):
        socket.getaddrinfo("cloud.langfuse.com", 443)
    assert len(network_guard.take_attempts()) == 2  # taken: this test meant them; the guard fixture sees none
    with socket.socket() as listener:  # loopback stays open
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        socket.create_connection(listener.getsockname(), timeout=5).close()
        socket.create_connection(("localhost", listener.getsockname()[1]), timeout=5).close()


@pytest.mark.slow
def test_the_guard_holds_in_the_processes_tests_start(tmp_path):
    probe = ("import urllib.request\ntry:\n    urllib.request.urlopen('https://cloud.langfuse.com', timeout=5)\n"
             "except OSError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                          timeout=SUBPROCESS_TIMEOUT_S)
    assert "tests may not reach outside the machine: name look-up of cloud.langfuse.com" in done.stdout
