"""OTLP/HTTP: POST /v1/traces (protobuf or JSON, gzip or deflate), GET /metrics and /healthz, one thread per client.

The request's size is checked before its body is read, its decompression is capped (decoding.py), and the sender
is answered at once: the spans go to the intake's queue, and what it cannot take comes back as OTLP partial success.
A connection the client drops or resets is one structured log line and a counter, never a traceback.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..logs import log
from .auth import authorized
from .decoding import BadRequest, RequestTooLarge, decompress, export_response, parse_request
from .intake import HTTP, Intake, ListenError


class WatchHTTPServer(ThreadingHTTPServer):
    """The OTLP/HTTP listener of one intake, bound on construction (`ListenError` when it cannot be)."""

    daemon_threads = True

    def __init__(self, intake: Intake) -> None:
        self.intake = intake
        settings = intake.settings
        try:
            super().__init__((settings.host, settings.port), _handler_for(intake))
        except OSError as exc:  # the socket is closed already: TCPServer closes it when binding fails
            raise ListenError(HTTP, settings.host, settings.port, exc) from None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line instead of socketserver's traceback on stderr: a client that resets a kept-alive
        connection (exporters do, when they shut down) is routine, and anything else is said by its type."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            self.intake.metrics.requests.labels(transport="http", outcome="connection_lost").inc()
            log.info("watch_connection_lost", transport="http", error=type(error).__name__)
        else:
            log.error("watch_request_failed", transport="http", error=type(error).__name__)


def _handler_for(intake: Intake) -> type[BaseHTTPRequestHandler]:
    class Handler(_WatchHTTPHandler):
        watch = intake
    return Handler


class _WatchHTTPHandler(BaseHTTPRequestHandler):
    watch: Intake
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "looptrace-watch"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._reply(200, CONTENT_TYPE_LATEST, self.watch.metrics.render())
        elif path in ("/healthz", "/"):
            self._reply(200, "text/plain", b"ok\n")
        else:
            self._reply(404, "text/plain", b"not found\n")

    def do_POST(self) -> None:
        settings = self.watch.settings
        metrics = self.watch.metrics
        if self.path.split("?", 1)[0] != "/v1/traces":
            self._refuse(404, "only /v1/traces is served", "not_found")
            return
        if not authorized(self.headers.get("Authorization"), settings):
            # Said before the body is read: no one without the token gets to make watch decompress anything.
            self._refuse(401, "authentication required", "unauthorized",
                         {"WWW-Authenticate": 'Bearer realm="looptrace-watch"' if settings.bearer_token
                          else 'Basic realm="looptrace-watch"'})
            return
        try:
            raw = self._read_body(settings.max_request_bytes)
            body = decompress(raw, self.headers.get("Content-Encoding", ""), settings.max_decompressed_bytes)
            content_type = self.headers.get("Content-Type", "")
            spans = parse_request(body, content_type)
        except RequestTooLarge as exc:
            self._refuse(413, str(exc), "too_large")
            return
        except BadRequest as exc:
            self._refuse(400, str(exc), "bad_request")
            return
        rejected, reason = self.watch.submit(spans)
        metrics.requests.labels(transport="http", outcome="partial" if rejected else "ok").inc()
        as_json = "json" in content_type.lower()
        self._reply(200, "application/json" if as_json else "application/x-protobuf",
                    export_response(rejected, reason, as_json))

    def _read_body(self, limit: int) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked(limit)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length > limit:
            self.close_connection = True  # the body stays unread: this connection cannot be reused
            raise RequestTooLarge(f"the body is {length} bytes; the limit is {limit}")
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                size = int(self.rfile.readline(64).split(b";", 1)[0].strip() or b"0", 16)
            except ValueError:
                self.close_connection = True
                raise BadRequest("malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > limit:
                self.close_connection = True
                raise RequestTooLarge(f"the chunked body exceeds the limit of {limit} bytes")
            chunks.append(self.rfile.read(size))
            self.rfile.readline(8)

    def _refuse(self, status: int, message: str, outcome: str, headers: dict[str, str] | None = None) -> None:
        self.watch.metrics.requests.labels(transport="http", outcome=outcome).inc()
        if status in (401, 404):
            self.close_connection = True  # the body was never read
        self._reply(status, "application/json", json.dumps({"code": status, "message": message}).encode(), headers)

    def _reply(self, status: int, content_type: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            if self.close_connection:
                self.send_header("Connection", "close")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # request lines would show paths and peers on every export; the counters on /metrics say enough
