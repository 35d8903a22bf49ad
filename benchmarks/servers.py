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


def serve_sink() -> None:
    """An OTLP/HTTP endpoint that accepts every POST (any path: /v1/traces, Langfuse's /api/public/otel/v1/traces)
    and discards it, answering 200 with an empty (valid) protobuf response as soon as the body is read.

    ``GET /count`` switches counting on: until the next ``GET /count``, which answers ``{"spans", "attributes"}``,
    every body is decoded to count its spans and span attributes. Decoding is kept out of the timed samples.
    """
    import gzip
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    state = {"counting": False, "spans": 0, "attributes": 0}
    lock = threading.Lock()

    def count(body: bytes, encoding: str) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(gzip.decompress(body) if encoding == "gzip" else body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    state["spans"] += 1
                    state["attributes"] += len(span.attributes)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector does
        disable_nagle_algorithm = True

        def log_message(self, *args) -> None:
            pass

        def _reply(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                if state["counting"]:
                    count(body, self.headers.get("Content-Encoding", ""))
            self._reply(b"", "application/x-protobuf")

        def do_GET(self) -> None:
            with lock:
                answer = {"spans": state["spans"], "attributes": state["attributes"]}
                state.update(counting=not state["counting"], spans=0, attributes=0)
            self._reply(json.dumps(answer).encode(), "application/json")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        sys.stdin.read()
    finally:
        server.shutdown()


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


class OTLPSink(_ServerProcess):
    """Accepts and discards OTLP/HTTP; ``count_start()`` / ``count_stop()`` count what arrives in between."""

    def __init__(self) -> None:
        super().__init__("sink")

    def _get(self) -> dict:
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/count", timeout=10) as response:
            return json.loads(response.read())

    def count_start(self) -> None:
        self._get()

    def count_stop(self) -> dict:
        return self._get()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.servers")
    commands = parser.add_subparsers(dest="command", required=True)
    messages = commands.add_parser("messages")
    messages.add_argument("--turns", type=int, required=True)
    messages.add_argument("--delay", type=float, default=0.0)
    otlp = commands.add_parser("otlp")
    otlp.add_argument("--delay", type=float, default=0.0)
    commands.add_parser("sink")
    args = parser.parse_args()
    if args.command == "sink":
        serve_sink()
    elif args.command == "messages":
        serve_messages_api(args.turns, args.delay)
    else:
        serve_otlp(args.delay)


if __name__ == "__main__":
    main()
