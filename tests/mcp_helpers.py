"""What the MCP tests share: the test servers (tests/data/, written with the mcp package) started over stdio or on a
loopback port over streamable HTTP, scripted model turns for the Messages-API fake, and process checks."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from looptrace import Agent
from looptrace.instrumentation.alerts import Alerts
from looptrace.runtime.mcp_servers import MCPServerHTTP, MCPServerStdio

DATA = Path(__file__).parent / "data"
SERVER = DATA / "mcp_test_server.py"
HOSTILE = DATA / "mcp_hostile_server.py"
MODEL = "claude-sonnet-4-5"
PATIENCE_S = 60  # how long a test waits for something that must happen; never a bound on how fast


@dataclass
class Server:
    config: MCPServerStdio | MCPServerHTTP
    pid_file: Path
    marks: Path

    @property
    def pid(self) -> int:
        return int(self.pid_file.read_text())

    def started(self, tool: str) -> bool:
        return (self.marks / f"{tool}.started").exists()

    def initializations(self) -> list[int]:
        """The process id behind each initialize request the server answered, in order."""
        log = self.marks / "initialize.log"
        return [int(line) for line in log.read_text().split()] if log.exists() else []


def stdio_server(tmp_path: Path, *, name: str = "tests", script: Path = SERVER, **options) -> Server:
    pid_file, marks = tmp_path / f"{name}.pid", tmp_path / f"{name}-marks"
    marks.mkdir(exist_ok=True)
    env = {"MCP_TEST_PID_FILE": str(pid_file), "MCP_TEST_MARKS": str(marks), **options.pop("env", {})}
    return Server(MCPServerStdio(sys.executable, [str(script), "stdio"], env=env, name=name, **options),
                  pid_file, marks)


@contextlib.contextmanager
def http_server_process(tmp_path: Path, *, script: Path = SERVER, name: str = "web", port: int = 0,
                        env: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Iterator[Server]:
    """A test server on 127.0.0.1, port 0 (or ``port``: one a killed server left), over streamable HTTP, in a process
    of its own."""
    port_file, pid_file, marks = tmp_path / f"{name}.port", tmp_path / f"{name}.pid", tmp_path / f"{name}-marks"
    marks.mkdir(exist_ok=True)
    port_file.unlink(missing_ok=True)
    environment = {**os.environ, "MCP_TEST_PID_FILE": str(pid_file), "MCP_TEST_MARKS": str(marks), **(env or {})}
    process = subprocess.Popen([sys.executable, str(script), "http", str(port_file), str(port)], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: port_file.exists() and port_file.read_text() and _accepts(int(port_file.read_text())),
              "the HTTP server to listen")
        url = f"http://127.0.0.1:{port_file.read_text()}/mcp"
        yield Server(MCPServerHTTP(url, headers=headers, name=name), pid_file, marks)
    finally:
        process.kill()
        process.wait()


def _accepts(port: int) -> bool:
    """Whether something listens on the loopback port (the port file is written before the server listens)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def until(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def use(name: str, arguments: dict | None = None, call_id: str = "toolu_01") -> dict:
    return {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": call_id, "name": name,
                                                    "input": arguments or {}}]}


def uses(*calls: tuple[str, dict]) -> dict:
    return {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": f"toolu_{i:02d}", "name": name,
                                                    "input": arguments} for i, (name, arguments) in enumerate(calls)]}


def final(text: str = "Done.") -> dict:
    return {"stop_reason": "end_turn", "content": text}


def results_sent(request: dict) -> list[dict]:
    return [b for b in request["messages"][-1]["content"] if b.get("type") == "tool_result"]


def quiet_agent(**options) -> Agent:
    return Agent(MODEL, alerts=Alerts(log_warnings=False), **options)
