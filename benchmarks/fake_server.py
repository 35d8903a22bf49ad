"""A FakeMessagesAPI in a process of its own, answering any number of runs of the benchmark scenario.

The server is a separate process so that its work (HTTP parsing, request validation, JSON) does not compete with the
client for the GIL: a real Messages API is not in the agent's process either. It answers every request with
``scenario.respond``: tool_use until the run's last turn, then end_turn, decided from the request itself, so any
number of runs can share one server in any order and interleaving.

    with FakeServer(turns=20, delay_s=0.05) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key=server.api_key)
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

API_KEY = "bench-key"
_ROOT = Path(__file__).resolve().parent.parent


def _answer(request: dict, turns: int, delay_s: float):
    from tests.fakes.messages_api import Delay

    from . import scenario

    item = scenario.respond(request, turns)
    return Delay(delay_s, item) if delay_s > 0 else item


def serve(turns: int, delay_s: float) -> None:
    import socketserver
    import threading

    from tests.fakes.messages_api import FakeMessagesAPI

    # 200 clients connecting at once overflow the default listen backlog of 5, and a dropped SYN costs the client a
    # one-second retransmit: that would measure the kernel, not the agents.
    socketserver.TCPServer.request_queue_size = 1024
    # The fake writes a response's headers and its body in two sends; with Nagle's algorithm on, the body waits for
    # the client's delayed ACK of the headers, about 40 ms per request on Linux. A real API server sets TCP_NODELAY.
    socketserver.StreamRequestHandler.disable_nagle_algorithm = True
    answer = functools.partial(_answer, turns=turns, delay_s=delay_s)
    fake = FakeMessagesAPI(api_key=API_KEY)
    fake.add(*[answer] * _TOP_UP)

    def top_up() -> None:  # the fake takes one script item per request; keep it from running dry
        while True:
            time.sleep(0.05)
            if fake.remaining < _TOP_UP:
                fake.add(*[answer] * _TOP_UP)

    fake.start()
    threading.Thread(target=top_up, daemon=True).start()
    print(fake.url, flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin (or dies)
    finally:
        fake.stop()


_TOP_UP = 20_000


class FakeServer:
    def __init__(self, turns: int, delay_s: float = 0.0) -> None:
        self.turns = turns
        self.delay_s = delay_s
        self.api_key = API_KEY
        self.url = ""
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> FakeServer:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.fake_server", "--turns", str(self.turns), "--delay", str(self.delay_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT,
        )
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.__exit__()
            raise RuntimeError("the fake Messages API did not start")
        return self

    def __exit__(self, *exc_info) -> None:
        process = self._process
        if process is None:
            return
        self._process = None
        try:
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    serve(args.turns, args.delay)


if __name__ == "__main__":
    main()
