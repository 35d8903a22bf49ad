"""MCP servers held by the application: connected once (``with agent:`` / ``async with agent:``), reused by every
run and resume of the agent, started again when they died, closed when the application says so or exits.

Real servers written with the mcp package (tests/data/mcp_test_server.py, which notes each ``initialize`` it answers),
over stdio and streamable HTTP; the runs go through the real anthropic SDK to the local Messages-API fake.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
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
)

from looptrace import Limits, RunStatus
from looptrace.runtime.mcp_servers import MCPServerStdio, MCPServerUnavailable

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _runs_write_their_trace_file_here(monkeypatch, tmp_path):
    """An Agent given no provider writes the trace file the environment names: this test's, not the checkout's."""
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(tmp_path / "traces.jsonl"))


def pid_from(api, request_index: int) -> int:
    return int(results_sent(api.requests[request_index])[0]["content"])


def test_two_runs_of_a_held_agent_share_one_stdio_server_process_and_one_initialize(api, tmp_path, spans):
    server = stdio_server(tmp_path)
    api.add(use("pid"), final("first"), use("pid"), final("second"))
    agent = quiet_agent(mcp_servers=[server.config], tracer_provider=spans.provider)

    with agent:
        first = agent.run("which process?")
        second = agent.run("and now?")
        assert alive(server.pid)  # held between runs

    assert first.status is second.status is RunStatus.DONE
    assert pid_from(api, 1) == pid_from(api, 3) == server.pid
    assert server.initializations() == [server.pid]  # the second run made no initialize
    assert not alive(server.pid)  # closed with the block
    # Connecting was traced once, in a trace of its own; each run's trace holds only its own calls.
    [connect] = spans.named("mcp connect tests")
    assert connect.parent is None
    assert {s.name for s in spans.children_of(connect)} == {"initialize", "tools/list"}
    run_traces = {first.trace_id, second.trace_id}
    assert format(connect.context.trace_id, "032x") not in run_traces
    calls = spans.named("tools/call pid")
    assert sorted(format(s.context.trace_id, "032x") for s in calls) == sorted(run_traces)
    assert not [s for s in spans.all if s.name in ("initialize", "tools/list")
                and format(s.context.trace_id, "032x") in run_traces]


def test_a_held_server_that_was_killed_between_runs_is_started_again_by_the_next_run(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("pid"), final(), use("pid"), final())
    agent = quiet_agent(mcp_servers=[server.config])

    with agent:
        agent.run("first")
        killed = server.pid
        os.kill(killed, signal.SIGKILL)
        until(lambda: not alive(killed), "the server to die")
        second = agent.run("second")
        restarted = server.pid

    assert second.status is RunStatus.DONE
    assert restarted != killed and pid_from(api, 3) == restarted
    assert server.initializations() == [killed, restarted]
    assert not alive(restarted)


def test_async_with_holds_the_servers_for_every_arun_and_resume(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("pid"), use("add", {"a": 1, "b": 2}), final("3"), use("pid"), final())
    agent = quiet_agent(mcp_servers=[dataclasses.replace(server.config, needs_approval={"add"})])

    async def conversation():
        async with agent:
            paused = await agent.arun("add")
            pending = paused.state.pending[0]
            resumed = await agent.aresume(paused.state, approve=[pending.call_id])
            again = await agent.arun("once more")
            return paused, resumed, again

    paused, resumed, again = asyncio.run(asyncio.wait_for(conversation(), PATIENCE_S * 2))
    assert paused.status is RunStatus.AWAITING_APPROVAL
    assert resumed.status is again.status is RunStatus.DONE
    assert results_sent(api.requests[2])[0]["content"] == "3"  # the resumed run called the held server
    assert pid_from(api, 1) == pid_from(api, 4) == server.pid
    assert server.initializations() == [server.pid]
    assert not alive(server.pid)


def test_two_runs_of_a_held_agent_share_one_streamable_http_session(api, tmp_path, spans):
    with http_server_process(tmp_path) as server:
        api.add(use("add", {"a": 1, "b": 1}), final(), use("add", {"a": 2, "b": 2}), final())
        agent = quiet_agent(mcp_servers=[server.config], tracer_provider=spans.provider)
        with agent:
            agent.run("1+1")
            agent.run("2+2")
        assert server.initializations() == [server.pid]
        sessions = {s.attributes["mcp.session.id"] for s in spans.named("tools/call add")}
        assert len(sessions) == 1 and None not in sessions
        assert results_sent(api.requests[3])[0]["content"] == "4"


def test_a_held_http_session_the_server_lost_is_renewed_and_the_call_sent_again(api, tmp_path):
    api.add(use("add", {"a": 1, "b": 1}), final(), use("add", {"a": 2, "b": 2}), final())
    with http_server_process(tmp_path) as first:
        port = int(first.config.url.split(":")[2].split("/")[0])
        agent = quiet_agent(mcp_servers=[first.config])
        agent.__enter__()
        agent.run("1+1")
        first_pid = first.pid
    try:  # the server restarts where it was, and knows nothing of the session
        with http_server_process(tmp_path, port=port) as second:
            result = agent.run("2+2")
            second_pid = second.pid
    finally:
        agent.close()
    assert result.status is RunStatus.DONE and second_pid != first_pid
    assert results_sent(api.requests[3])[0] == {"type": "tool_result", "tool_use_id": "toolu_01", "content": "4"}
    assert second.initializations() == [first_pid, second_pid]


def test_without_a_with_block_every_run_connects_and_stops_its_own_server(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("pid"), final(), use("pid"), final())
    agent = quiet_agent(mcp_servers=[server.config])

    agent.run("first")
    agent.run("second")

    first, second = server.initializations()
    assert first != second and pid_from(api, 1) == first and pid_from(api, 3) == second
    assert not alive(first) and not alive(second)


def test_holding_an_agent_whose_required_server_cannot_start_raises_and_holds_nothing(tmp_path, spans):
    missing = MCPServerStdio("/nonexistent/mcp-server", name="ghost", required=True)
    agent = quiet_agent(mcp_servers=[missing], tracer_provider=spans.provider)
    with pytest.raises(MCPServerUnavailable, match="ghost"), agent:
        pass
    connect = spans.one("mcp connect ghost")
    assert connect.attributes["error.type"] == "FileNotFoundError" and connect.parent is None


def test_a_held_agent_never_closed_stops_its_servers_when_the_application_exits(api, tmp_path):
    server = stdio_server(tmp_path)
    api.add(use("pid"), final())
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from looptrace import Agent
        from looptrace.runtime.mcp_servers import MCPServerStdio
        agent = Agent({MODEL!r}, mcp_servers=[MCPServerStdio({sys.executable!r}, [{str(SERVER)!r}, "stdio"],
                                                             env={dict(server.config.env)!r})])
        agent.__enter__()  # held, and never closed: the interpreter's exit must stop the server
        print(agent.run("which process?").status.value)
    """))
    env = {**os.environ, "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key", "LOOPTRACE_EXPORTER": "none"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=PATIENCE_S * 2)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert not alive(server.pid)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_held_server_does_not_outlive_an_application_killed_between_runs(api, tmp_path, how):
    """No close runs at all here (no atexit after SIGKILL, none after Python's default SIGTERM): the server sees its
    stdin end with the application, and stops."""
    server = stdio_server(tmp_path)
    api.add(use("pid"), final())
    ready = tmp_path / "ran"
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(f"""
        import pathlib, sys, time
        from looptrace import Agent
        from looptrace.runtime.mcp_servers import MCPServerStdio
        agent = Agent({MODEL!r}, mcp_servers=[MCPServerStdio({sys.executable!r}, [{str(SERVER)!r}, "stdio"],
                                                             env={dict(server.config.env)!r})])
        with agent:
            agent.run("which process?")
            pathlib.Path({str(ready)!r}).write_text("ran")
            time.sleep(3600)  # between two messages of a chat, when the application is killed
    """))
    env = {**os.environ, "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key", "LOOPTRACE_EXPORTER": "none"}
    app = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        until(lambda: ready.exists() or app.poll() is not None, "the first run")
        assert app.poll() is None and alive(server.pid)
        app.send_signal(getattr(signal, how))
        app.wait(PATIENCE_S)
    finally:
        app.kill()
    until(lambda: not alive(server.pid), "the server to stop with the application")


def silent_server(tmp_path) -> tuple[MCPServerStdio, Path]:
    """A server that never answers initialize (nor stops when its stdin closes): only SIGTERM ends it."""
    pid_file = tmp_path / "silent.pid"
    script = tmp_path / "silent.py"
    script.write_text(f"import os, pathlib, time\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
                      "time.sleep(3600)\n")
    return MCPServerStdio(sys.executable, [str(script)], name="silent"), pid_file


def test_connecting_counts_on_the_runs_clock_and_the_server_given_up_on_is_stopped(api, tmp_path, caplog):
    silent, pid_file = silent_server(tmp_path)
    agent = quiet_agent(mcp_servers=[silent], limits=Limits(timeout_s=1))

    with caplog.at_level(logging.WARNING, logger="looptrace"):
        result = agent.run("hello")

    assert result.status is RunStatus.TIMEOUT and api.requests == []  # the run's time went on connecting
    assert "did not answer within 1 s (what was left of the run's timeout_s)" in caplog.text
    assert "mcp_close_failed" not in caplog.text
    assert not alive(int(pid_file.read_text()))


def test_a_held_server_that_never_answers_is_stopped_when_the_hold_ends(tmp_path, caplog):
    silent, pid_file = silent_server(tmp_path)
    agent = quiet_agent(mcp_servers=[dataclasses.replace(silent, connect_timeout_s=0.5)])
    with caplog.at_level(logging.WARNING, logger="looptrace"), agent:
        assert "did not answer within 0.5 s" in caplog.text
    assert "mcp_close_failed" not in caplog.text
    assert not alive(int(pid_file.read_text()))
