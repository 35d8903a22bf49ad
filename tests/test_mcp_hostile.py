"""MCP servers that misbehave, against the public interfaces (Agent, the CLI): a redacted argument quoted back in a
JSON-RPC error, an isError text or a malformed result; a server's own errors in the server-error range; a server that
never answers ``initialize``; bytes that are not UTF-8 and lines that are not MCP; tool lists MCP does not allow;
names built to act on a terminal. The servers are real ones written with the mcp package (tests/data/
mcp_hostile_server.py and mcp_test_server.py), over stdio and streamable HTTP.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mcp_helpers import (
    HOSTILE,
    PATIENCE_S,
    SERVER,
    alive,
    final,
    http_server_process,
    quiet_agent,
    results_sent,
    stdio_server,
    use,
    uses,
)

from looptrace import Limits, RunStatus
from looptrace.runtime.mcp_servers import MCPServerHTTP, MCPServerStdio

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _runs_write_their_trace_file_here(monkeypatch, tmp_path):
    """An Agent given no provider writes the trace file the environment names: this test's, not the checkout's."""
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(tmp_path / "traces.jsonl"))

SECRET = "hunter2-planted-secret-7731"
PLANTED = {"password": SECRET, "note": "for the sweep"}
QUOTING_CALLS = (("quote_error", PLANTED), ("quote_tool_error", PLANTED), ("malformed", PLANTED), ("echo", PLANTED))


def everything_recorded(spans) -> str:
    """Every text a span carries: names, attributes, events, links, status; and its resource."""
    parts = []
    for span in spans.all:
        parts += [span.name, json.dumps(dict(span.attributes or {}), default=str), str(span.status.description),
                  json.dumps(dict(span.resource.attributes), default=str)]
        parts += [f"{e.name} {json.dumps(dict(e.attributes or {}), default=str)}" for e in span.events]
        parts += [json.dumps(dict(link.attributes or {}), default=str) for link in span.links]
    return "\n".join(parts)


# --- 44.3, 44.7 and the sweep: no redacted argument reaches a span or a log line -------------------------------------


@pytest.mark.parametrize("capture", [True, False], ids=["capture-on", "capture-off"])
def test_a_planted_secret_reaches_no_span_and_no_log_line_over_stdio(api, tmp_path, spans, caplog, capture):
    server = stdio_server(tmp_path, name="h", script=HOSTILE)
    api.add(uses(*QUOTING_CALLS), final("done"))

    with caplog.at_level(logging.DEBUG, logger="looptrace"), caplog.at_level(logging.DEBUG, logger="mcp"):
        result = quiet_agent(mcp_servers=[server.config], tracer_provider=spans.provider,
                             capture_content=capture).run("try them all")

    assert result.status is RunStatus.DONE
    quote_error, quote_tool_error, malformed, echo = results_sent(api.requests[1])
    assert quote_error["is_error"] and 'cannot handle {"password": "[REDACTED]"' in quote_error["content"]
    assert malformed["is_error"] and "not a valid MCP result" in malformed["content"]
    assert SECRET not in malformed["content"]  # the validation error is said without the input it quotes
    assert {s.name for s in spans.all} >= {"tools/call quote_error", "tools/call malformed", "mcp connect h"}
    recorded = everything_recorded(spans)
    assert SECRET not in recorded
    assert SECRET not in caplog.text
    assert "mcp_call_failed" in caplog.text  # the warnings were there to sweep


def test_a_planted_secret_reaches_no_span_over_streamable_http(api, tmp_path, spans, caplog):
    with http_server_process(tmp_path, script=HOSTILE, name="h") as server:
        api.add(uses(("quote_error", PLANTED), ("quote_tool_error", PLANTED), ("echo", PLANTED)), final("done"))
        with caplog.at_level(logging.DEBUG, logger="looptrace"):
            result = quiet_agent(mcp_servers=[server.config], tracer_provider=spans.provider,
                                 capture_content=True).run("try them")
    assert result.status is RunStatus.DONE
    error = spans.one("tools/call quote_error")
    assert error.attributes["error.type"] == "-32602" and error.attributes["rpc.response.status_code"] == "-32602"
    assert error.status.description == 'cannot handle {"password": "[REDACTED]", "note": "for the sweep"}'
    assert SECRET not in everything_recorded(spans) and SECRET not in caplog.text


@pytest.mark.parametrize("capture", ["true", "false"], ids=["capture-on", "capture-off"])
def test_the_cli_trace_file_holds_no_planted_secret_not_even_in_the_mcp_packages_own_spans(workdir, api, capture):
    api.add(uses(*QUOTING_CALLS), final("done"))
    env = {**os.environ, "LOOPTRACE_CAPTURE_CONTENT": capture, "LOOPTRACE_EXPORTER": "file"}
    done = subprocess.run([sys.executable, "-m", "looptrace", "run", "try them all", "--mcp",
                           f"{sys.executable} {HOSTILE} stdio"], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=PATIENCE_S * 2)
    assert done.returncode == 0, done.stderr
    written = (workdir / ".looptrace" / "traces.jsonl").read_text()
    # The CLI makes its provider the global one, so the package's own span of each call is in the file too.
    assert '"MCP send tools/call quote_error"' in written and '"tools/call quote_error"' in written
    assert SECRET not in written
    assert SECRET not in done.stderr
    assert "Traceback" not in done.stderr


# --- 44.4: a server's own -32000 and -32001 ---------------------------------------------------------------------


@pytest.mark.parametrize("code", [-32000, -32001])
def test_a_servers_own_error_in_the_server_error_range_is_reported_as_its_error(api, tmp_path, code):
    server = stdio_server(tmp_path, name="h", script=HOSTILE)
    api.add(use("own_error", {"code": code}), use("echo", {"note": "after"}), final())

    result = quiet_agent(mcp_servers=[server.config]).run("go")

    assert result.status is RunStatus.DONE
    [error] = results_sent(api.requests[1])
    assert error["is_error"]
    assert error["content"] == (f"MCP server 'h' answered own_error with error {code}: the server's own error {code}: "
                                "the backend is busy")
    assert results_sent(api.requests[2])[0]["content"] == 'got {"note": "after"}'  # the server is still used


# --- 44.5: connecting is inside the run's timeout, and has a flag -----------------------------------------------


def test_looptrace_run_bounds_connecting_by_timeout_and_by_mcp_connect_timeout(workdir, api, tmp_path, capsys):
    from looptrace.cli.app import main

    silent, pid_file = tmp_path / "silent.py", tmp_path / "silent.pid"
    silent.write_text(f"import os, pathlib, time\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
                      "time.sleep(3600)\n")
    code = main(["run", "hello", "--timeout", "1", "--mcp", f"{sys.executable} {silent}"])
    said = capsys.readouterr().err
    assert code == 2 and api.requests == []
    assert "MCP server 'silent' cannot start: it did not answer within 1 s (what was left of the run's timeout_s)" in said
    assert not alive(int(pid_file.read_text()))

    code = main(["run", "hello", "--mcp-connect-timeout", "0.5", "--mcp", f"{sys.executable} {silent}"])
    assert code == 2
    assert "MCP server 'silent' cannot start: it did not answer within 0.5 s\n" in capsys.readouterr().err
    assert not alive(int(pid_file.read_text()))


def test_mcp_connect_timeout_is_checked_and_documented(workdir, capsys):
    from looptrace.cli.app import main

    with pytest.raises(SystemExit) as refused:
        main(["run", "hello", "--mcp-connect-timeout", "0", "--mcp", "x"])
    assert refused.value.code == 2
    assert "--mcp-connect-timeout: must be a positive number of seconds, got 0" in capsys.readouterr().err
    cli_doc = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    assert "--mcp-connect-timeout S" in cli_doc


# --- 44.12, 44.14: bytes that are not UTF-8, lines that are not MCP -----------------------------------------------


def test_a_byte_that_is_not_utf8_costs_one_line_not_the_connection(api, tmp_path, caplog):
    server = stdio_server(tmp_path, name="h", script=HOSTILE, env={"HOSTILE_GARBAGE_FIRST": "1"})
    api.add(use("bad_byte"), use("echo", {"note": "later"}), final())

    with caplog.at_level(logging.WARNING, logger="looptrace"):
        result = quiet_agent(mcp_servers=[server.config], limits=Limits(tool_timeout_s=PATIENCE_S)).run("go")

    assert result.status is RunStatus.DONE
    assert "echo" in {t["name"] for t in api.requests[0]["tools"]}  # connected, despite the garbage before
    assert results_sent(api.requests[1])[0]["content"] == "still here"
    assert results_sent(api.requests[2])[0]["content"] == 'got {"note": "later"}'
    garbled = [r for r in caplog.records if "mcp_server_garbled" in r.getMessage()]
    assert len(garbled) == 1  # said once a connection, however many lines


def test_lines_that_are_not_mcp_put_no_traceback_on_the_terminal(workdir, api):
    api.add(use("noise"), use("bad_byte"), final("done"))
    env = {**os.environ, "LOOPTRACE_EXPORTER": "none"}
    done = subprocess.run([sys.executable, "-m", "looptrace", "run", "go", "--mcp", f"{sys.executable} {HOSTILE} stdio"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=PATIENCE_S * 2)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Failed to parse" not in done.stderr
    assert done.stderr.count("mcp_server_garbled") == 1


# --- 44.13: a tool list with tools MCP does not allow -------------------------------------------------------------


def test_tools_with_schemas_mcp_does_not_allow_are_left_out_and_the_rest_are_kept(api, tmp_path, caplog):
    server = stdio_server(tmp_path, name="h", script=HOSTILE, env={"HOSTILE_LIST": "bad"})
    api.add(use("echo", {"note": "fine"}), final())

    with caplog.at_level(logging.WARNING, logger="looptrace"):
        result = quiet_agent(mcp_servers=[server.config]).run("go")

    assert result.status is RunStatus.DONE
    offered = {t["name"] for t in api.requests[0]["tools"]}
    assert {"echo", "quote_error", "own_error"} <= offered
    assert not offered & {"root_string", "properties_number", "deep"}
    skipped = [r.getMessage() for r in caplog.records if "mcp_tool_skipped" in r.getMessage()]
    assert len(skipped) == 3
    assert any("root_string" in s and "inputSchema.type" in s for s in skipped)
    assert any("deep" in s and "nests deeper than" in s for s in skipped)
    assert results_sent(api.requests[1])[0]["content"] == 'got {"note": "fine"}'


# --- 44.16: mcp list and what a server calls its tools ------------------------------------------------------------


def test_mcp_list_shows_control_characters_escaped_and_names_duplicates_rightly(workdir, capsys):
    from looptrace.cli.app import main

    code = main(["mcp", "list", "--mcp", f"{sys.executable} {HOSTILE} stdio --list names"])
    out = capsys.readouterr().out
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b[31mred\\x07\\nforged  line  (offered to the model as evil__31mred__forged__line)" in out
    assert "arguments: a\\x1b[1mb?: string" in out
    lines = out.splitlines()
    assert "mcp_hostile_server  echo" in lines  # the first echo keeps its name ...
    assert "mcp_hostile_server  echo  (offered to the model as mcp_hostile_server_echo)" in lines  # ... the second not


def test_mcp_list_says_which_tools_were_left_out_and_why(workdir, capsys):
    from looptrace.cli.app import main

    assert main(["mcp", "list", "--mcp", f"{sys.executable} {HOSTILE} stdio --list bad"]) == 0
    out = capsys.readouterr().out
    assert "mcp_hostile_server  deep  (not offered: its input schema nests deeper than 64 levels)" in out


# --- 44.17: a hung call is said in the log, however the run ends --------------------------------------------------


def test_a_call_still_hanging_when_run_ends_is_logged(api, tmp_path, caplog):
    server = stdio_server(tmp_path)
    api.add(use("hang"), final("gave up"))

    with caplog.at_level(logging.WARNING, logger="looptrace"):
        result = quiet_agent(mcp_servers=[server.config], limits=Limits(tool_timeout_s=0.5)).run("wait")

    assert result.status is RunStatus.DONE
    assert "did not finish within 0.5 s" in results_sent(api.requests[1])[0]["content"]
    assert any("mcp_call_abandoned" in r.getMessage() and "hang" in r.getMessage() for r in caplog.records)


# --- 43.25: names and what a wrong URL is called --------------------------------------------------------------------


def test_a_server_run_as_inline_code_is_named_after_its_launcher():
    assert MCPServerStdio.parse("python -c 'import sys; sys.exit(3)'").label == "python"
    assert MCPServerStdio.parse("node -e 'require(\"x\")'").label == "node"
    assert MCPServerStdio.parse("python -m my_server --db x").label == "my_server"
    assert MCPServerStdio.parse("python -m looptrace.example_mcp_server").label == "example_mcp_server"


def test_an_http_server_at_a_wrong_path_or_port_cannot_be_reached_rather_than_started(workdir, tmp_path, capsys):
    from looptrace.cli.app import main

    with http_server_process(tmp_path) as server:
        wrong = server.config.url.replace("/mcp", "/nope")
        assert main(["mcp", "list", "--mcp-url", wrong]) == 2
        said = capsys.readouterr().err
    assert "cannot start" not in said
    assert (f"MCP server '127.0.0.1' cannot be reached: {wrong} answered 404 Not Found: is it the server's MCP "
            "endpoint (often ending in /mcp)?") in said


# --- 43.14: the live view and the trace agree on an MCP call's duration ----------------------------------------


def test_the_first_mcp_calls_span_takes_no_longer_than_the_call_it_records(tmp_path):
    """The first call used to compile its input schema's validator (importing jsonschema) inside its execute_tool
    span, after the live view's clock had stopped: 21 ms on the live line, 728 ms on the trace. A fresh process, so
    nothing was imported before; the second call of the same tool is the baseline."""
    script = tmp_path / "first_call.py"
    script.write_text(f"""
import json, sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from looptrace import Agent
from looptrace.runtime.events import ToolFinished
from looptrace.runtime.mcp_servers import MCPServerStdio
from looptrace.runtime.models import ScriptedModel
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
events = []
model = ScriptedModel(json.loads({json.dumps([use("add", {"a": 1, "b": 2}), use("add", {"a": 2, "b": 2}), final()])!r}))
agent = Agent("claude-sonnet-4-5", client=model, tracer_provider=provider,
              on_event=lambda e: events.append(e.duration_s) if isinstance(e, ToolFinished) else None,
              mcp_servers=[MCPServerStdio(sys.executable, [{str(SERVER)!r}, "stdio"])])
agent.run("add twice")
spans = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]
print(json.dumps([[(s.end_time - s.start_time) / 1e9 for s in spans], events]))
""")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=PATIENCE_S * 2,
                          env={**os.environ, "LOOPTRACE_EXPORTER": "none"})
    assert done.returncode == 0, done.stderr
    (first_span, second_span), (first_call, second_call) = json.loads(done.stdout)
    overhead_first, overhead_second = first_span - first_call, second_span - second_call
    # What the span adds to the call (validation, bookkeeping) is the same for the first call as for the second.
    assert overhead_first < overhead_second + max(first_call, 0.05)


def test_http_server_config_keeps_its_connect_timeout_positive():
    with pytest.raises(ValueError, match="connect_timeout_s"):
        MCPServerHTTP("http://127.0.0.1:1/mcp", connect_timeout_s=float("nan"))


# --- 43.23: the example server without the extra ---------------------------------------------------------------------


def test_the_example_server_without_the_mcp_package_says_what_to_install(tmp_path):
    hide_mcp = textwrap.dedent("""
        import runpy, sys

        class NotInstalled:  # as in an environment without the extra
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("mcp", "mcp_types"):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NotInstalled())
        runpy.run_module("looptrace.example_mcp_server", run_name="__main__")
    """)
    done = subprocess.run([sys.executable, "-c", hide_mcp], cwd=tmp_path, capture_output=True, text=True,
                          timeout=PATIENCE_S)
    assert done.returncode == 2
    assert done.stderr == "looptrace.example_mcp_server needs the mcp package: pip install 'looptrace[mcp]'\n"
