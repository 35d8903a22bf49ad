"""python benchmarks/langfuse_client_cost.py: what the ``langfuse`` package's API client would cost looptrace.

Compares, in fresh processes, the import of the package's ``LangfuseAPI`` with the import of ``requests`` and of
looptrace's own client (``instrumentation.langfuse_api``), then times the two calls looptrace makes (the project
behind a trace link, one anomaly score) against a loopback stand-in, each client on a kept-alive connection. The
figures decided that looptrace keeps one client of its own (see ``instrumentation/langfuse/api.py``).
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CALLS = 300
PUBLIC, SECRET = "pk-lf-bench", "sk-lf-bench"
PROJECTS = {"data": [{"id": "p1", "name": "bench", "metadata": {}, "organization": {"id": "o1", "name": "o"}}]}


def import_ms(statement: str, runs: int = 5) -> float:
    """The fastest of ``runs`` fresh interpreters doing ``statement``, in milliseconds."""
    code = f"import time\nstart = time.perf_counter()\n{statement}\nprint(time.perf_counter() - start)"
    return min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout) * 1000 for _ in range(runs))


class _StandIn(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as both clients use it

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no delayed-ACK stall per call

    def _reply(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(PROJECTS)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._reply({"id": "score"})

    def log_message(self, *args: object) -> None:
        pass


def per_call_us(call: Callable[[], object]) -> float:
    """The median of three timings of CALLS calls, per call, in microseconds (after a warm-up)."""
    for _ in range(20):
        call()
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        timings.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(timings)


def main() -> None:
    print(f"import langfuse.api.LangfuseAPI     {import_ms('from langfuse.api.client import LangfuseAPI'):7.1f} ms")
    print(f"import requests                     {import_ms('import requests'):7.1f} ms")
    print(f"import looptrace's langfuse_api     "
          f"{import_ms('import looptrace.instrumentation.langfuse.api'):7.1f} ms (requests included)")

    from langfuse.api.client import LangfuseAPI as PackageClient
    from langfuse.api.scores.types.create_score_request import CreateScoreRequest

    from looptrace.instrumentation.langfuse.api import PROJECTS_PATH, LangfuseAPI
    from looptrace.instrumentation.langfuse.scores import anomaly_score_body

    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    package = PackageClient(base_url=url, username=PUBLIC, password=SECRET)
    ours = LangfuseAPI(url, PUBLIC, SECRET)
    body = anomaly_score_body("0af7651916cd43dd8448eb211c80319c", "repeated_call", "search called 3 times")
    score = CreateScoreRequest(id=body["id"], trace_id=body["traceId"], name=body["name"], value=body["value"],
                               data_type="CATEGORICAL", comment=body["comment"])
    print(f"GET projects   package {per_call_us(package.projects.get):7.0f} us   "
          f"looptrace {per_call_us(lambda: ours.get(PROJECTS_PATH, {})):7.0f} us")
    print(f"POST a score   package {per_call_us(lambda: package.scores.create(request=[score])):7.0f} us   "
          f"looptrace {per_call_us(lambda: ours.post_score(body)):7.0f} us   "
          "(the package posts a JSON list: its batch endpoint)")
    server.shutdown()


if __name__ == "__main__":
    main()
