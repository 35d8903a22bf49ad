"""Tools from MCP servers: real servers written with the mcp package's own server API (tests/data/mcp_test_server.py),
started as a subprocess over stdio or on a loopback port over streamable HTTP, called by runs on the real anthropic
SDK against the local Messages-API fake.

Every test here starts a server process, so all are marked slow; the pure parts (result conversion, schema
validation, naming, approval) are in test_mcp_units.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fakes.otlp_receiver import OTLPReceiver
from mcp_helpers import (
    MODEL,
    PATIENCE_S,
    SERVER,
    alive,
    final,
    http_server_process,
    quiet_agent,
    results_sent,
    stdio_server,
    until,
    use,
    uses,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanKind

from looptrace import Agent, Limits, RunStatus
from looptrace.instrumentation.alerts import Alerts
from looptrace.runtime.events import ToolFinished
from looptrace.runtime.mcp_servers import MCPServerStdio

pytestmark = pytest.mark.slow


@pytest.fixture
def http_server(tmp_path):
    with http_server_process(tmp_path, headers={"Authorization": "Bearer test-token"}) as server:
        yield server


# --- listed and called --------------------------------------------------------------------------------------------


def test_a_run_lists_and_calls_a_stdio_servers_tools_and_stops_the_server(api, tmp_path, spans):
    server = stdio_server(tmp_path)
    api.add(use("add", {"a": 2, "b": 3}), use("notes_search", {"query": "otel"}), final("5, and one note."))

    result = quiet_agent(mcp_servers=[server.config], tracer_provider=spans.provider).run("add 2 and 3")

    assert result.status is RunStatus.DONE and result.final_text == "5, and one note."
    offered = {t["name"]: t for t in api.requests[0]["tools"]}
    assert {"add", "notes_search", "picture", "hang"} <= set(offered)  # notes.search, renamed for the API
    assert offered["add"]["description"] == "Add two integers."
    assert offered["add"]["input_schema"]["required"] == ["a", "b"]
    assert results_sent(api.requests[1]) == [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "5"}]
    assert results_sent(api.requests[2])[0]["content"] == "found 1 note for otel"
    assert not alive(server.pid)
    tool_spans = spans.named("execute_tool")
    assert [s.attributes["gen_ai.tool.name"] for s in tool_spans] == ["add", "notes_search"]


def test_a_run_calls_a_streamable_http_server_traced_under_its_execute_tool_span(api, http_server, spans):
    reader = InMemoryMetricReader()
    api.add(use("add", {"a": 1, "b": 1}), use("authorized"), final("2"))

    result = quiet_agent(mcp_servers=[http_server.config], tracer_provider=spans.provider,
                         meter_provider=MeterProvider(metric_readers=[reader])).run("1+1")

    assert result.status is RunStatus.DONE
    assert results_sent(api.requests[1])[0]["content"] == "2"
    assert results_sent(api.requests[2])[0]["content"] == "yes"  # the configured headers went with the call
    execute = spans.one("execute_tool add")
    [client] = spans.children_of(execute)
    assert client.name == "tools/call add" and client.context.trace_id == execute.context.trace_id
    assert client.kind is SpanKind.CLIENT
    attributes = dict(client.attributes)
    assert attributes["mcp.method.name"] == "tools/call" and attributes["jsonrpc.request.id"]
    assert attributes["network.transport"] == "tcp"
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["gen_ai.tool.name"] == "add"
    assert attributes["mcp.session.id"] and attributes["mcp.protocol.version"]
    assert "gen_ai.operation.name" not in attributes  # the execute_tool span is the tool call; not counted twice
    points = [p for m in _metrics(reader) if m.name == "mcp.client.operation.duration" for p in m.data.data_points]
    assert sorted((p.attributes["mcp.method.name"], p.attributes.get("gen_ai.tool.name"), p.count) for p in points) == [
        ("initialize", None, 1), ("tools/call", "add", 1), ("tools/call", "authorized", 1), ("tools/list", None, 1)]
    [session] = [p for m in _metrics(reader) if m.name == "mcp.client.session.duration" for p in m.data.data_points]
    assert session.count == 1 and "error.type" not in session.attributes  # closed by the run, not lost
    assert alive(http_server.pid)  # a server the run did not start is left running


def _metrics(reader: InMemoryMetricReader):
    data = reader.get_metrics_data()
    return [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


# --- content ------------------------------------------------------------------------------------------------------


def test_images_resources_and_structured_content_reach_the_model_as_blocks(api, tmp_path, spans):
    server = stdio_server(tmp_path)
    api.add(uses(("picture", {}), ("document", {}), ("forecast", {"city": "Oslo"})), final())

    result = quiet_agent(mcp_servers=[server.config], tracer_provider=spans.provider,
                         capture_content=True).run("show me")

    assert result.status is RunStatus.DONE  # the fake checked the blocks as the API would, and took them
    picture, document, forecast = results_sent(api.requests[1])
    assert [b["type"] for b in picture["content"]] == ["text", "image"]
    assert picture["content"][1]["source"]["media_type"] == "image/png"
    assert document["content"] == "[resource file:///notes/today.md (text/markdown)]\n# Today\nship it"
    assert '"celsius": 21' in forecast["content"]
    # The span shows the image as a placeholder, never its base64.
    recorded = spans.one("execute_tool picture").attributes["gen_ai.tool.call.result"]
    assert "image/png" in recorded and picture["content"][1]["source"]["data"] not in recorded


# --- failures -----------------------------------------------------------------------------------------------------


def test_failures_become_error_results_with_a_warning_and_the_run_goes_on(api, tmp_path, caplog):
    server = stdio_server(tmp_path)
    api.add(use("fail", {"reason": "no"}), use("hang"), use("garble"), use("add", {"a": "x", "b": 1}),
            use("crash"), use("add", {"a": 1, "b": 1}), final("I could not."))

    with caplog.at_level(logging.WARNING, logger="looptrace"):
        result = quiet_agent(mcp_servers=[server.config], limits=Limits(tool_timeout_s=3)).run("try")

    assert result.status is RunStatus.DONE
    sent = [results_sent(request)[0] for request in api.requests[1:]]
    assert all(r.get("is_error") for r in sent)
    failed, hung, garbled, invalid, crashed, after_crash = (r["content"] for r in sent)
    assert failed.endswith("cannot do that: no")  # the server's own isError text
    assert "did not finish within 3 s" in hung and "did not finish within 3 s" in garbled
    assert "a: must be of type integer" in invalid and "'x'" not in invalid  # checked here, against the schema
    assert "closed the connection during crash" in crashed
    # Not sent to a server known to be gone: said at once, until a run starts it again.
    assert after_crash == "MCP server 'tests' is not connected (it exited, or closed the connection)"
    events = [r.message for r in caplog.records]
    assert any("mcp_tool_error" in e and "fail" in e for e in events)
    assert any("mcp_server_garbled" in e for e in events)
    assert any("mcp_call_failed" in e and "crash" in e for e in events)
    assert "test server starting" not in caplog.text  # the server's stderr stays off the terminal
    assert not alive(server.pid)


def test_a_server_that_cannot_start_is_left_out_with_one_warning(api, caplog):
    api.add(final("fine without it"))
    missing = MCPServerStdio("/nonexistent/mcp-server", ["--flag"], name="ghost")
    with caplog.at_level(logging.WARNING, logger="looptrace"):
        result = quiet_agent(mcp_servers=[missing]).run("hello")
    assert result.status is RunStatus.DONE
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("looptrace")]
    assert len(warnings) == 1 and "mcp_server_unavailable" in warnings[0] and "ghost" in warnings[0]
    assert "tools" not in api.requests[0]


def test_a_tool_list_that_changes_is_read_again_before_the_next_turn(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("unlock"), use("secret_door"), final())

    result = quiet_agent(mcp_servers=[server.config]).run("open it")

    assert result.status is RunStatus.DONE
    assert "secret_door" not in {t["name"] for t in api.requests[0]["tools"]}
    assert "secret_door" in {t["name"] for t in api.requests[1]["tools"]}
    assert results_sent(api.requests[2])[0] == {"type": "tool_result", "tool_use_id": "toolu_01",
                                                "content": "treasure"}


# --- the detector -------------------------------------------------------------------------------------------------


def test_a_loop_over_an_mcp_tool_is_flagged_nudged_and_stopped(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(*[use("lookup", {"city": "Osaka"}, f"toolu_{i}") for i in range(10)])

    result = Agent(MODEL, mcp_servers=[server.config], alerts=Alerts(log_warnings=False)).run("weather?")

    assert result.status is RunStatus.STOPPED_BY_DETECTOR and result.turns == 4
    assert [(a.type, a.tool, a.first_turn, a.turn) for a in result.anomalies] == [("repeated_call", "lookup", 3, 4)]
    nudge = api.requests[3]["messages"][-1]["content"][-1]
    assert nudge["type"] == "text" and 'lookup({"city":"Osaka"})' in nudge["text"]


# --- a server never outlives its run ------------------------------------------------------------------------------


def test_the_server_is_stopped_when_the_run_ends_in_an_exception(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("add", {"a": 1, "b": 2}), final())

    def quit_on_result(event):
        if isinstance(event, ToolFinished):
            raise SystemExit("the observer quits")

    with pytest.raises(SystemExit):
        quiet_agent(mcp_servers=[server.config], on_event=quit_on_result).run("add")
    assert not alive(server.pid)


def test_the_server_is_stopped_when_arun_is_cancelled(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("hang"), final())
    agent = quiet_agent(mcp_servers=[server.config])

    async def cancel_while_the_tool_hangs():
        task = asyncio.ensure_future(agent.arun("wait"))
        while not server.started("hang"):
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_while_the_tool_hangs(), PATIENCE_S))
    assert not alive(server.pid)


def test_the_server_is_stopped_by_ctrl_c(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("hang"), final())
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from looptrace import Agent, RunInterrupted
        from looptrace.runtime.mcp_servers import MCPServerStdio
        server = MCPServerStdio({sys.executable!r}, [{str(SERVER)!r}, "stdio"], env={dict(server.config.env)!r})
        try:
            Agent({MODEL!r}, mcp_servers=[server]).run("wait")
        except RunInterrupted:
            sys.exit(130)
    """))
    env = {**os.environ, "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key"}
    agent = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        until(lambda: server.started("hang") or agent.poll() is not None, "the tool call to start")
        assert agent.poll() is None, agent.stderr.read().decode() if agent.stderr else ""
        agent.send_signal(signal.SIGINT)
        assert agent.wait(PATIENCE_S) == 130
    finally:
        agent.kill()
    assert not alive(server.pid)


# --- tracing into an instrumented server --------------------------------------------------------------------------


_TRACED_RUN = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from looptrace import Agent
from looptrace.runtime.mcp_servers import MCPServerStdio

def provider():
    exporter = InMemorySpanExporter()
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made, exporter

application, application_spans = provider()
if sys.argv[1] == "global":  # the application made its own SDK provider the global one
    trace.set_tracer_provider(application)
runs, run_spans = provider()
server = MCPServerStdio(sys.executable, [sys.argv[2], "stdio"], env=json.loads(sys.argv[3]))
result = Agent("claude-sonnet-4-5", mcp_servers=[server], tracer_provider=runs).run("4+4")
[client] = [s for s in run_spans.get_finished_spans() if s.name == "tools/call add"]
package = [s for s in application_spans.get_finished_spans() if s.name == "MCP send tools/call add"]
print(json.dumps({"status": result.status.value, "trace": result.trace_id,
                  "client": format(client.context.span_id, "016x"),
                  "package": [[format(s.context.span_id, "016x"), format(s.parent.span_id, "016x")]
                              for s in package]}))
"""


@pytest.mark.parametrize("application", ["none", "global"])
def test_an_instrumented_server_puts_its_spans_under_the_runs_mcp_client_span(api, tmp_path, application):
    """The server is sent the run's trace: the run's own MCP client span as the parent when the application set no
    global provider, or the mcp package's span under it (on the application's global provider) when it did."""
    with OTLPReceiver() as receiver:
        server = stdio_server(tmp_path, env={"MCP_TEST_OTLP": receiver.traces_url})
        api.add(use("add", {"a": 4, "b": 4}), final("8"))
        env = {**os.environ, "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key",
               "LOOPTRACE_EXPORTER": "none"}
        done = subprocess.run([sys.executable, "-c", _TRACED_RUN, application, str(SERVER),
                               json.dumps(dict(server.config.env))], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=PATIENCE_S * 2)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        until(lambda: any(s.name == "tools/call add" for s in receiver.spans), "the server's span")
        [served] = [s for s in receiver.spans if s.name == "tools/call add"]
    assert seen["status"] == "done" and served.trace_id == seen["trace"]
    if application == "none":
        assert seen["package"] == [] and served.parent_span_id == seen["client"]
    else:
        [[package_span, package_parent]] = seen["package"]
        assert package_parent == seen["client"] and served.parent_span_id == package_span


# --- the command line ---------------------------------------------------------------------------------------------


def test_looptrace_mcp_list_shows_what_a_server_offers_and_stops_it(workdir, capsys, tmp_path):
    from looptrace.cli.app import main

    pid_file = tmp_path / "listed.pid"
    code = main(["mcp", "list", "--mcp", f"{sys.executable} {SERVER} stdio --pid-file {pid_file}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "mcp_test_server  add\n    Add two integers.\n    arguments: a: integer, b: integer\n" in out
    assert "mcp_test_server  notes.search  (offered to the model as notes_search)" in out
    assert not alive(int(pid_file.read_text()))


def test_looptrace_run_with_mcp_calls_the_servers_tools(workdir, api, capsys):
    from looptrace.cli.app import main

    api.add(use("add", {"a": 20, "b": 22}), final("42"))
    code = main(["run", "add 20 and 22", "--mcp", f"{sys.executable} {SERVER} stdio", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert results_sent(api.requests[1])[0]["content"] == "42"
    assert "no --tools" not in captured.err
    # The MCP client span went where the CLI's run records (its trace file), under execute_tool.
    from looptrace.instrumentation.tracefile.read import read_spans

    spans = list(read_spans(workdir / ".looptrace" / "traces.jsonl"))
    execute = next(s for s in spans if s.name == "execute_tool add")
    client = next(s for s in spans if s.name == "tools/call add")
    assert client.parent_span_id == execute.span_id and client.trace_id == execute.trace_id
    assert client.attributes["network.transport"] == "pipe"


# --- the README's example ---------------------------------------------------------------------------------------------


def test_the_readme_mcp_example_runs_with_the_shipped_server(api, tmp_path):
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## MCP servers", 1)[1].split("\n## ", 1)[0]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    api.add(use("add_note", {"title": "groceries", "text": "eggs"}), use("search_notes", {"query": "eggs"}),
            final("groceries: eggs"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_", "LANGFUSE_"))}
    env.update(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key", LOOPTRACE_EXPORTER="none")
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=PATIENCE_S * 2)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done groceries: eggs"
    assert results_sent(api.requests[1])[0]["content"] == "saved 'groceries'"
    assert results_sent(api.requests[2])[0]["content"] == "groceries: eggs"


def test_a_run_cancelled_while_its_server_is_still_starting_stops_it(api, tmp_path):
    slow_start = tmp_path / "slow_server.py"
    slow_start.write_text(textwrap.dedent(f"""
        import os, pathlib, sys, time
        pathlib.Path({str(tmp_path / "slow.pid")!r}).write_text(str(os.getpid()))
        time.sleep(3600)  # never answers initialize
    """))
    agent = quiet_agent(mcp_servers=[MCPServerStdio(sys.executable, [str(slow_start)], name="slow")])

    async def cancel_while_starting():
        task = asyncio.ensure_future(agent.arun("hello"))
        while not (tmp_path / "slow.pid").exists():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_while_starting(), PATIENCE_S))
    assert not alive(int((tmp_path / "slow.pid").read_text()))
    assert api.requests == []
