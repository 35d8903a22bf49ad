"""The test fakes as servers in processes of their own: a Messages API and an OTLP/HTTP backend.

They run in separate processes so that their work (HTTP parsing, request validation, protobuf decoding) does not
compete with the process being measured for the GIL: a real API or collector is not in the agent's process either.

    with MessagesAPIServer(turns=20, delay_s=0.05) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key=api.api_key)
    with OTLPBackend(delay_s=2.0) as backend:           # answers every export after 2 s
        endpoint = backend.url                          # OTEL_EXPORTER_OTLP_ENDPOINT
"""

from __future__ import annotations

import argparse
import functools
import os
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

API_KEY = "bench-key"
_ROOT = Path(__file__).resolve().parent.parent
_TOP_UP = 20_000


def _tune_socketserver() -> None:
    # 200 clients connecting at once overflow the default listen backlog of 5, and a dropped SYN costs the client a
    # one-second retransmit: that would measure the kernel, not the agents.
    socketserver.TCPServer.request_queue_size = 1024
    # The fakes write a response's headers and its body in two sends; with Nagle's algorithm on, the body waits for
    # the client's delayed ACK of the headers, about 40 ms per request on Linux. A real server sets TCP_NODELAY.
    socketserver.StreamRequestHandler.disable_nagle_algorithm = True


def _answer(request: dict, turns: int, delay_s: float):
    from tests.fakes.messages_api import Delay

    from . import scenario

    item = scenario.respond(request, turns)
    return Delay(delay_s, item) if delay_s > 0 else item


def serve_messages_api(turns: int, delay_s: float) -> None:
    """FakeMessagesAPI answering every request with scenario.respond (after ``delay_s``), for ever."""
    from tests.fakes.messages_api import FakeMessagesAPI

    _tune_socketserver()
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


def serve_otlp(delay_s: float) -> None:
    """OTLPReceiver (HTTP), answering every request after ``delay_s`` when it is > 0."""
    from tests.fakes.otlp_receiver import Delay, OTLPReceiver

    _tune_socketserver()
    receiver = OTLPReceiver()
    if delay_s > 0:
        receiver.fail_next(*[Delay(delay_s)] * 100_000)  # one per request; far more than a benchmark sends
    print(receiver.url, flush=True)
    try:
        sys.stdin.read()
        print(f"{len(receiver.requests)} {len(receiver.spans)}", flush=True)
    finally:
        receiver.stop()


class _ServerProcess:
    """Starts ``python -m benchmarks.servers ARGS``, reads the URL it prints, stops it by closing its stdin."""

    def __init__(self, *args: str) -> None:
        self._args = args
        self.url = ""
        self._process: subprocess.Popen | None = None

    def __enter__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.servers", *self._args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT,
        )
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.stop()
            raise RuntimeError(f"the server {' '.join(self._args)} did not start")
        return self

    def stop(self) -> str:
        """Stop the server; returns what it printed on the way out."""
        process, self._process = self._process, None
        if process is None:
            return ""
        try:
            out, _ = process.communicate(input="", timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        return out or ""

    def __exit__(self, *exc_info) -> None:
        self.stop()


class MessagesAPIServer(_ServerProcess):
    def __init__(self, turns: int, delay_s: float = 0.0) -> None:
        super().__init__("messages", "--turns", str(turns), "--delay", str(delay_s))
        self.api_key = API_KEY


class OTLPBackend(_ServerProcess):
    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__("otlp", "--delay", str(delay_s))

    def stop_and_count(self) -> tuple[int, int]:
        """Stop the backend; returns (requests it received, spans it accepted)."""
        words = self.stop().split()
        return (int(words[0]), int(words[1])) if len(words) == 2 else (0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.servers")
    commands = parser.add_subparsers(dest="command", required=True)
    messages = commands.add_parser("messages")
    messages.add_argument("--turns", type=int, required=True)
    messages.add_argument("--delay", type=float, default=0.0)
    otlp = commands.add_parser("otlp")
    otlp.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    if args.command == "messages":
        serve_messages_api(args.turns, args.delay)
    else:
        serve_otlp(args.delay)


if __name__ == "__main__":
    main()
