"""MCP overhead per run: the shipped example server (``looptrace.example_mcp_server``) over stdio and over streamable
HTTP, connected per run (the form before issue 41) and held across runs (``with agent:``), against a run whose tool is
a Python function doing the same work.

Every variant runs the same scripted conversation (``ScriptedModel``: one ``search_notes`` call, then the answer)
through an ``Agent`` with telemetry on (a private SDK ``TracerProvider``, no exporter) and the detector on, so the
difference between two variants is what MCP costs a run. Samples are interleaved (``common.interleave``) with the
no-MCP run beside every MCP one, and an overhead is the median of the paired differences. The HTTP server runs in a
process of its own (``python -m benchmarks.b15_mcp serve PORT_FILE``), as a stdio server does.

    first run   connecting (start the process or open the session, initialize, tools/list) + the run
    second run  a run on connections already up: held, a ping per server, then the call

Goal (issue 41): a held server's second-run overhead under 50 ms over stdio and streamable HTTP.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import Row, fmt_s, interleave, median, paired_median_difference, say

GOAL_S = 0.050
QUERY = {"query": "eggs"}
SCRIPT = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "toolu_1", "name": "search_notes",
                                                   "input": QUERY}]},
          {"stop_reason": "end_turn", "content": "no note mentions eggs"}]


def _agent(servers: list[Any]) -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    from looptrace import Agent, tool
    from looptrace.runtime.models import ScriptedModel

    notes: dict[str, str] = {}

    @tool
    def search_notes(query: str) -> str:
        """Notes whose title or text contains the query."""
        found = [f"{t}: {x}" for t, x in notes.items() if query.lower() in f"{t} {x}".lower()]
        return "\n".join(found) or f"no note mentions {query!r}"

    class Script(ScriptedModel):  # the same two responses for every run of the agent
        def create(self, params: dict[str, Any], *, timeout: float | None) -> Any:
            if self._position >= len(self._responses):
                self._position = 0
            return super().create(params, timeout=timeout)

    return Agent("claude-sonnet-4-5", client=Script(SCRIPT), tools=[] if servers else [search_notes],
                 mcp_servers=servers, tracer_provider=TracerProvider())


def _timed_run(agent: Any) -> float:
    started = time.perf_counter()
    result = agent.run("any note about eggs?")
    elapsed = time.perf_counter() - started
    if result.status.value != "done":
        raise RuntimeError(f"a benchmark run ended {result.status.value}: {result.error}")
    return elapsed


def _first_held_run(config: Any) -> float:
    """Connect (``with agent:``) and run once: what the first run of a held agent costs."""
    agent = _agent([config])
    started = time.perf_counter()
    with agent:
        _timed_run(agent)
        return time.perf_counter() - started


@contextlib.contextmanager
def _http_server() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        port_file = Path(folder) / "port"
        process = subprocess.Popen([sys.executable, "-m", "benchmarks.b15_mcp", "serve", str(port_file)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   cwd=Path(__file__).resolve().parent.parent)
        try:
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text()):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the example MCP server did not start over HTTP")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port_file.read_text()}/mcp"
        finally:
            process.kill()
            process.wait()


def _measure(transport: str, config: Any, reps: int, per_run_reps: int) -> list[Row]:
    plain = _agent([])
    held = _agent([config])
    per_run = _agent([config])
    with held:
        _timed_run(held)  # the first run of the held agent; later ones are the "second run"
        steady = interleave({"none": lambda: _timed_run(plain), "held": lambda: _timed_run(held)}, reps)
        slow = interleave({"none": lambda: _timed_run(plain), "per run": lambda: _timed_run(per_run),
                           "held, first run": lambda: _first_held_run(config)}, per_run_reps, warmup=0)
    second = paired_median_difference(steady["held"], steady["none"])
    per_run_overhead = paired_median_difference(slow["per run"], slow["none"])
    first = paired_median_difference(slow["held, first run"], slow["none"])
    base = median(steady["none"])
    name = f"13 MCP {transport}"
    return [
        Row(name, "2nd run's MCP overhead, held (`with agent:`) vs no MCP tools", fmt_s(second),
            goal=f"< {fmt_s(GOAL_S)}", met=second < GOAL_S,
            context=f"{second / per_run_overhead:.4f}x the per-run form's; a run without MCP: {fmt_s(base)}; "
                    f"{reps} interleaved pairs"),
        Row(name, "before: every run's MCP overhead, per-run form (1st = 2nd)", fmt_s(per_run_overhead),
            context=f"{per_run_overhead / base:.0f}x a run without MCP; {per_run_reps} interleaved samples"),
        Row(name, "1st run's MCP overhead, held (connect + run)", fmt_s(first),
            context=f"{first / per_run_overhead:.2f}x the per-run form's (it does not wait for the close)"),
    ]


def run(quick: bool = False) -> list[Row]:
    from looptrace.runtime.mcp_servers import MCPServerHTTP, MCPServerStdio

    reps, per_run_reps = (10, 2) if quick else (60, 6)
    rows: list[Row] = []
    say(f"  stdio: {reps} held runs and {per_run_reps} per-run runs, each beside a run without MCP")
    rows += _measure("stdio", MCPServerStdio(sys.executable, ["-m", "looptrace.example_mcp_server"], name="notes"),
                     reps, per_run_reps)
    say("  streamable HTTP: the same, the server in a process of its own")
    with _http_server() as url:
        rows += _measure("HTTP", MCPServerHTTP(url, name="notes"), reps, per_run_reps)
    return rows


def _serve(port_file: Path) -> None:
    """The example server over streamable HTTP on 127.0.0.1, port 0; the port goes to ``port_file``."""
    import uvicorn

    from looptrace.example_mcp_server import server

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    port_file.write_text(str(sock.getsockname()[1]))
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        _serve(Path(sys.argv[2]))
