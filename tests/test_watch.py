"""`looptrace watch`: an OTLP receiver that flags loops in any agent's traces live, and stays up whatever it gets."""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from fakes.otlp_receiver import OTLPReceiver
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.watch import (
    ListenError,
    RunWatcher,
    WatchMetrics,
    WatchServer,
    WatchSettingError,
    WatchSettings,
)
from looptrace.instrumentation.watch.command import watch_command

AGENTS = Path(__file__).parent / "foreign_agents.py"


class Recorded:
    """Every alert watch raised: (anomaly, context)."""

    def __init__(self) -> None:
        self.alerts: list = []
        self._lock = threading.Lock()

    def __call__(self, anomaly, context) -> None:
        with self._lock:
            self.alerts.append((anomaly, context))

    def types(self) -> list[str]:
        with self._lock:
            return sorted(a.type for a, _ in self.alerts)


def start_watch(**overrides) -> tuple[WatchServer, Recorded]:
    recorded = Recorded()
    settings = WatchSettings(**{"port": 0, "grpc_port": 0, **overrides})
    server = WatchServer(settings, alerts=Alerts(callback=recorded)).start()
    return server, recorded


@pytest.fixture
def watch():
    server, recorded = start_watch()
    yield server, recorded
    server.stop()


def agent_spans(*, failing_repeats: int = 0, ignored_error: bool = False, root: bool = True, service: str = "shop",
                content: bool = True):
    """An agent's spans in the GenAI conventions, made by the SDK: a list of ReadableSpans in end order."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    root_span = tracer.start_span("invoke_agent helper", attributes={sc.GEN_AI_OPERATION_NAME: "invoke_agent",
                                                                      sc.GEN_AI_AGENT_NAME: "helper"})
    from opentelemetry import trace
    with trace.use_span(root_span, end_on_exit=root):
        order = '{"order_id": "secret-order-42"}'
        calls = [("get_order", True, order)] * failing_repeats
        if ignored_error:  # retried, failed again, then other work: a failure the model knew about and left behind
            calls += [("refund", True, order), ("refund", True, order), ("notify", False, '{"text": "handled"}')]
        for n, (tool, fails, arguments) in enumerate(calls, start=1):
            with tracer.start_as_current_span("chat", attributes={sc.GEN_AI_OPERATION_NAME: "chat",
                                                                  sc.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_call"]}):
                pass
            attributes = {sc.GEN_AI_OPERATION_NAME: "execute_tool", sc.GEN_AI_TOOL_NAME: tool,
                          sc.GEN_AI_TOOL_CALL_ID: f"call-{n}"}
            if content:
                attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments
            with tracer.start_as_current_span(f"execute_tool {tool}", attributes=attributes) as span:
                if fails:
                    span.set_status(Status(StatusCode.ERROR))
                    span.set_attribute(sc.ERROR_TYPE, "ToolFailed")
        answer = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "All done, refunded."}]}])
        with tracer.start_as_current_span("chat", attributes={
                sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
                sc.GEN_AI_OUTPUT_MESSAGES: answer}):
            pass
    return list(exporter.get_finished_spans())


def post(server: WatchServer, body: bytes, *, content_type: str = "application/x-protobuf",
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/traces", data=body, method="POST",
                                     headers={"Content-Type": content_type, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def protobuf(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def metrics_text(server: WatchServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
        return response.read().decode()


# --- what it finds ----------------------------------------------------------------------------------------------

def test_a_repeated_failing_call_is_flagged_before_the_run_ends(watch):
    server, recorded = watch
    spans = agent_spans(failing_repeats=4, root=False)  # the agent is still running: no root span yet
    for span in spans:  # one span per request, the way SimpleSpanProcessor sends them
        assert post(server, protobuf([span]))[0] == 200
    assert server.wait_idle()
    assert recorded.types() == ["repeated_call"]
    assert server.watcher.open_runs == 1
    # The agent's name is on the root span, which has not come yet.
    assert 'looptrace_anomalies_total{agent="unknown",anomaly_type="repeated_call",service="shop"} 1.0' in \
        metrics_text(server)


def test_an_ignored_error_is_flagged_when_the_root_span_arrives(watch):
    server, recorded = watch
    assert post(server, protobuf(agent_spans(ignored_error=True)))[0] == 200
    assert server.wait_idle()
    assert recorded.types() == ["ignored_error"]
    assert server.watcher.open_runs == 0


def test_a_clean_run_raises_nothing(watch):
    server, recorded = watch
    assert post(server, protobuf(agent_spans()))[0] == 200
    assert server.wait_idle()
    assert recorded.types() == []


def test_otlp_json_is_read_like_protobuf(watch):
    server, recorded = watch
    from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans as encode_json
    body = json.dumps(encode_json(agent_spans(ignored_error=True)).to_dict()).encode()
    status, answer = post(server, body, content_type="application/json")
    assert status == 200 and json.loads(answer) == {}
    assert server.wait_idle()
    assert recorded.types() == ["ignored_error"]


def test_grpc_senders_are_heard_too(watch):
    server, recorded = watch
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        stub.Export(encode_spans(agent_spans(ignored_error=True)), timeout=10)
    assert server.wait_idle()
    assert recorded.types() == ["ignored_error"]


def test_an_idle_run_is_judged_after_the_timeout():
    recorded = Recorded()
    now = [0.0]
    watcher = RunWatcher(Alerts(callback=recorded), WatchMetrics(), idle_timeout_s=60, max_open_runs=100,
                         capture_content=True, clock=lambda: now[0])
    watcher.ingest(_records(agent_spans(ignored_error=True, root=False)))
    watcher.sweep()
    assert watcher.open_runs == 1 and recorded.types() == []
    now[0] = 61.0
    watcher.sweep()
    assert watcher.open_runs == 0 and recorded.types() == ["ignored_error"]


def _records(spans):
    from looptrace.instrumentation.watch import spans_of_request
    return spans_of_request(encode_spans(spans))


def test_with_langfuse_keys_each_anomaly_becomes_a_score_on_the_trace():
    from looptrace.instrumentation.langfuse.scores import LangfuseScores

    with OTLPReceiver(basic_auth=("pk-lf", "sk-lf"), path_prefix="/api/public/otel") as langfuse:
        scores = LangfuseScores(langfuse.base_url, "pk-lf", "sk-lf")
        server = WatchServer(WatchSettings(port=0, grpc_port=None), scores=scores,
                             alerts=None).start()
        try:
            spans = agent_spans(ignored_error=True)
            assert post(server, protobuf(spans))[0] == 200
            assert server.wait_idle()
        finally:
            server.stop()  # sends what is queued before it returns
        (score,) = langfuse.scores
        assert score["traceId"] == format(spans[0].context.trace_id, "032x")
        assert (score["name"], score["value"]) == ("loop_anomaly", "ignored_error")


# --- what it survives -------------------------------------------------------------------------------------------

def test_malformed_payloads_get_400_and_the_next_sender_is_still_served(watch):
    server, recorded = watch
    assert post(server, b"\xff\x00 definitely not protobuf \x12\x99")[0] == 400
    assert post(server, b"{not json", content_type="application/json")[0] == 400
    assert post(server, b'{"resourceSpans": 3}', content_type="application/json")[0] == 400
    assert post(server, b"plain", content_type="text/plain")[0] == 400
    assert post(server, b"\x1f\x8b broken gzip", headers={"Content-Encoding": "gzip"})[0] == 400
    assert post(server, protobuf(agent_spans(ignored_error=True)))[0] == 200
    assert server.wait_idle()
    assert recorded.types() == ["ignored_error"]


def test_a_gzip_bomb_is_refused_with_413_without_inflating_it():
    server, recorded = start_watch(max_decompressed_bytes=1 << 20)
    try:
        bomb = gzip.compress(b"\x00" * (64 << 20), compresslevel=9)  # 64 MiB of zeros in ~64 KiB
        assert len(bomb) < server.settings.max_request_bytes
        assert post(server, bomb, headers={"Content-Encoding": "gzip"})[0] == 413
        assert post(server, gzip.compress(protobuf(agent_spans(ignored_error=True))),
                    headers={"Content-Encoding": "gzip"})[0] == 200
        assert server.wait_idle() and recorded.types() == ["ignored_error"]
    finally:
        server.stop()


def test_a_body_above_the_request_cap_gets_413():
    server, _ = start_watch(max_request_bytes=1000)
    try:
        assert post(server, b"\x00" * 5000)[0] == 413
        assert post(server, protobuf(agent_spans()[:1]))[0] == 200
    finally:
        server.stop()


def test_a_flood_of_runs_beyond_the_cap_evicts_the_oldest_and_counts_them():
    server, _recorded = start_watch(max_open_runs=5)
    try:
        for _ in range(20):  # twenty agents that never finish
            assert post(server, protobuf(agent_spans(failing_repeats=1, root=False)))[0] == 200
        assert server.wait_idle()
        assert server.watcher.open_runs == 5
        assert "looptrace_watch_runs_evicted_total 15.0" in metrics_text(server)
    finally:
        server.stop()


def test_spans_the_detector_cannot_take_now_are_answered_with_partial_success():
    server, _ = start_watch(queue_batches=1)
    gate, busy = threading.Event(), threading.Event()
    original = server.watcher.ingest
    server.watcher.ingest = lambda spans: (busy.set(), gate.wait(10), original(spans))  # a detector that is busy
    try:
        spans = agent_spans()
        statuses = [post(server, protobuf(spans))]
        assert busy.wait(30)  # the detector holds the first batch: the queue (one batch) is empty again
        statuses += [post(server, protobuf(spans)) for _ in range(2)]  # the second waits in it, the third cannot
        assert all(status == 200 for status, _ in statuses)  # answered at once, never held
        answers = [trace_service_pb2.ExportTraceServiceResponse.FromString(body) for _, body in statuses]
        assert answers[-1].partial_success.rejected_spans == len(spans)
        assert "overloaded" in answers[-1].partial_success.error_message
    finally:
        gate.set()
        server.stop()


def test_spans_without_ids_are_rejected_as_partial_success(watch):
    server, _ = watch
    request = encode_spans(agent_spans())
    request.resource_spans[0].scope_spans[0].spans[0].trace_id = b""
    status, body = post(server, request.SerializeToString())
    assert status == 200
    assert trace_service_pb2.ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 1


# --- who gets in, and what it says ------------------------------------------------------------------------------

def test_a_sender_without_the_configured_token_gets_401():
    server, recorded = start_watch(bearer_token="s3cret-token")
    try:
        body = protobuf(agent_spans(ignored_error=True))
        assert post(server, body)[0] == 401
        assert post(server, body, headers={"Authorization": "Bearer wrong"})[0] == 401
        assert post(server, body, headers={"Authorization": "Basic czNjcmV0LXRva2Vu"})[0] == 401
        assert post(server, body, headers={"Authorization": "Bearer s3cret-token"})[0] == 200
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Export(encode_spans(agent_spans()), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.Export(encode_spans(agent_spans()), metadata=[("authorization", "Bearer s3cret-token")], timeout=10)
        assert server.wait_idle() and recorded.types() == ["ignored_error"]
    finally:
        server.stop()


def test_basic_auth_from_the_environment(monkeypatch):
    monkeypatch.setenv("LOOPTRACE_WATCH_USERNAME", "collector")
    monkeypatch.setenv("LOOPTRACE_WATCH_PASSWORD", "pa:ss")
    settings = WatchSettings.from_settings(Settings.from_env(), port=0, grpc_port=None)
    assert "pa:ss" not in repr(settings)
    server = WatchServer(settings, alerts=Alerts(log_warnings=False)).start()
    try:
        assert server.grpc_port is None  # an explicit "no gRPC" is kept, not replaced by the default 4317
        good = base64.b64encode(b"collector:pa:ss").decode()
        bad = base64.b64encode(b"collector:nope").decode()
        assert post(server, protobuf(agent_spans()), headers={"Authorization": f"Basic {bad}"})[0] == 401
        assert post(server, protobuf(agent_spans()), headers={"Authorization": f"Basic {good}"})[0] == 200
    finally:
        server.stop()


def test_with_content_capture_off_no_argument_reaches_the_log(capsys):
    import structlog

    from looptrace.instrumentation.logs import configure_service_logging
    configure_service_logging()
    server = WatchServer(WatchSettings(port=0, grpc_port=None, capture_content=False, bearer_token="tok-123"),
                         alerts=Alerts()).start()
    try:
        post(server, protobuf(agent_spans(failing_repeats=3, ignored_error=True)),
             headers={"Authorization": "Bearer tok-123"})
        assert server.wait_idle()
    finally:
        server.stop()
        structlog.reset_defaults()
        logging.getLogger("looptrace").setLevel(logging.NOTSET)
    logged = capsys.readouterr().err
    assert "loop_anomaly" in logged and "repeated_call" in logged
    assert "secret-order-42" not in logged and "tok-123" not in logged


def test_metrics_and_health_need_no_token():
    server, _ = start_watch(bearer_token="t")
    try:
        assert "looptrace_watch_spans_received_total" in metrics_text(server)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as response:
            assert response.status == 200
    finally:
        server.stop()


def test_it_listens_on_loopback_unless_told_otherwise():
    assert WatchSettings().host == "127.0.0.1"


# --- settings, flags and ports ----------------------------------------------------------------------------------

# What the CLI passes when every flag is left alone, but on ports that cannot collide with anything.
WATCH_FLAGS = {"host": "127.0.0.1", "port": 0, "grpc_port": -1, "idle_timeout_s": 300.0, "max_open_runs": 10,
               "max_request_bytes": 1000, "max_decompressed_bytes": 1000}


def test_settings_come_from_the_settings_object_and_an_explicit_off_is_kept():
    base = Settings(watch_token="tok-1", capture_content=False, alert_webhook="http://127.0.0.1:9/hook-secret")
    settings = WatchSettings.from_settings(base, port=0, grpc_port=None)
    assert (settings.port, settings.grpc_port) == (0, None)  # None is "no gRPC", not "keep 4317"
    assert (settings.bearer_token, settings.capture_content, settings.alert_webhook) == (
        "tok-1", False, "http://127.0.0.1:9/hook-secret")
    assert "tok-1" not in repr(settings) and "hook-secret" not in repr(settings)


def test_settings_that_cannot_work_are_refused_by_field_name():
    with pytest.raises(WatchSettingError, match=r"^port 99999 is not a port number"):
        WatchSettings(port=99999)
    with pytest.raises(WatchSettingError, match=r"^grpc_port -5 is not a port number .* or None for no gRPC"):
        WatchSettings(grpc_port=-5)
    with pytest.raises(WatchSettingError, match=r"^port and grpc_port are both 5000"):
        WatchSettings(port=5000, grpc_port=5000)
    assert WatchSettings(port=0, grpc_port=0).grpc_port == 0  # two free ports, chosen by the system


@pytest.mark.parametrize("flags, named", [
    ({"port": 99999}, "--port 99999 is not a port number"),
    ({"port": -5}, "--port -5 is not a port number"),
    ({"grpc_port": 99999}, "--grpc-port 99999 is not a port number (0-65535, 0 for any free one, or -1 for no gRPC)"),
    ({"grpc_port": -5}, "--grpc-port -5 is not a port number"),
    ({"port": 5000, "grpc_port": 5000}, "--port and --grpc-port are both 5000"),
    ({"idle_timeout_s": -1.0}, "--idle-timeout -1.0"),
    ({"max_open_runs": 0}, "--max-open-runs 0"),
    ({"max_request_bytes": -1}, "--max-request-bytes -1"),
])
def test_a_flag_that_cannot_work_is_one_line_naming_it_and_exit_2(flags, named, capsys):
    assert watch_command(Settings(), **{**WATCH_FLAGS, **flags}) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("looptrace watch: error: ") and named in line


def test_a_grpc_port_already_held_is_refused_naming_it_and_nothing_stays_half_open():
    http_port = _free_port()
    with socket.create_server(("127.0.0.1", 0)) as holder:
        taken = holder.getsockname()[1]
        with pytest.raises(ListenError) as refused:
            WatchServer(WatchSettings(port=http_port, grpc_port=taken), alerts=Alerts(log_warnings=False))
    assert (refused.value.transport, refused.value.port) == ("OTLP/gRPC", taken)
    assert str(refused.value) == f"cannot listen for OTLP/gRPC on 127.0.0.1:{taken}: Address already in use"
    with socket.create_server(("127.0.0.1", http_port)):  # the HTTP listener it had bound is closed again
        pass


def test_an_http_port_already_held_is_refused_naming_it():
    with socket.create_server(("127.0.0.1", 0)) as holder:
        taken = holder.getsockname()[1]
        with pytest.raises(ListenError) as refused:
            WatchServer(WatchSettings(port=taken, grpc_port=None), alerts=Alerts(log_warnings=False))
    assert (refused.value.transport, refused.value.port) == ("OTLP/HTTP", taken)
    assert "Address already in use" in str(refused.value)


def test_a_grpc_port_is_never_shared_even_with_a_server_that_would_share_it():
    from concurrent import futures

    holder = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # gRPC's defaults: SO_REUSEPORT on
    taken = holder.add_insecure_port("127.0.0.1:0")
    holder.start()
    try:
        with pytest.raises(ListenError, match="Address already in use"):
            WatchServer(WatchSettings(port=0, grpc_port=taken), alerts=Alerts(log_warnings=False))
    finally:
        holder.stop(None)


def test_a_second_watch_on_the_first_ones_grpc_port_is_refused(watch):
    first, _ = watch
    with pytest.raises(ListenError, match=f"127.0.0.1:{first.grpc_port}: Address already in use"):
        WatchServer(WatchSettings(port=0, grpc_port=first.grpc_port), alerts=Alerts(log_warnings=False))


def test_a_taken_port_through_the_command_is_one_line_naming_the_flag_and_exit_2(capsys):
    with socket.create_server(("127.0.0.1", 0)) as holder:
        taken = holder.getsockname()[1]
        assert watch_command(Settings(), **{**WATCH_FLAGS, "grpc_port": taken}) == 2
        assert watch_command(Settings(), **{**WATCH_FLAGS, "port": taken}) == 2
    grpc_line, http_line = capsys.readouterr().err.splitlines()
    assert grpc_line == (f"looptrace watch: error: --grpc-port {taken}: Address already in use "
                         f"(OTLP/gRPC on 127.0.0.1:{taken})")
    assert http_line.startswith(f"looptrace watch: error: --port {taken}: Address already in use")


def test_a_client_resetting_a_kept_alive_connection_leaves_no_traceback(watch, capsys):
    server, _ = watch
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\nHost: watch\r\n\r\n")
        answer = b""
        while not answer.endswith(b"\r\n\r\nok\n"):  # the whole answer; the connection stays open for the next
            chunk = client.recv(4096)
            assert chunk, "watch closed the connection"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset (RST)
    _wait_until(lambda: 'outcome="connection_lost",transport="http"} 1.0' in metrics_text(server))
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and "Exception occurred" not in stderr
    assert post(server, protobuf(agent_spans()))[0] == 200  # and the next sender is served


def test_the_watcher_runs_in_process_without_sockets_reporting_to_the_sink_it_is_given():
    class Sink:
        def __init__(self) -> None:
            self.sent: list = []

        def send(self, anomaly, context) -> None:
            self.sent.append((anomaly.type, context.action))

    sink = Sink()
    watcher = RunWatcher(sink)
    watcher.ingest(_records(agent_spans(failing_repeats=3, ignored_error=True, root=False)))
    assert sink.sent == [("repeated_call", "warn")] and watcher.open_runs == 1
    watcher.close_all()  # judged in full: the error left behind shows now
    assert sorted(sent for sent, _ in sink.sent) == ["ignored_error", "repeated_call"] and watcher.open_runs == 0


def loop_anomaly_lines(records, anomaly_type: str = "repeated_call") -> list[dict]:
    return [r for r in records if r["event"] == "loop_anomaly" and r["anomaly_type"] == anomaly_type]


@pytest.mark.parametrize("repeats", [3, 5, 8])
def test_a_loop_whose_spans_arrive_in_one_request_gets_its_log_line(repeats):
    """What SDKs and collectors send: a run's spans in one request. A loop that went on past its first firing reaches
    watch already an update of its streak; it still gets the one log line docs/watch.md promises."""
    from looptrace.testing import capture_logs

    watcher = RunWatcher(Alerts())
    with capture_logs() as records:
        watcher.ingest(_records(agent_spans(failing_repeats=repeats)))
        watcher.close_all()
    lines = loop_anomaly_lines(records)
    assert [(line["anomaly_type"], line["count"]) for line in lines] == [("repeated_call", repeats)], lines


def test_a_loop_whose_spans_arrive_one_by_one_gets_one_log_line_for_its_whole_streak():
    from looptrace.testing import capture_logs

    watcher = RunWatcher(Alerts())
    spans = agent_spans(failing_repeats=6, root=False)
    with capture_logs() as records:
        for span in spans:
            watcher.ingest(_records([span]))
        watcher.close_all()
    lines = loop_anomaly_lines(records)
    assert [line["anomaly_type"] for line in lines] == ["repeated_call"], lines


# --- the real thing: a process, real producers, real exporters --------------------------------------------------

PRODUCERS = ["semconv", "openllmetry", "openinference", "pydantic-ai"]


@pytest.mark.slow
@pytest.mark.parametrize("producer", PRODUCERS)
def test_watch_flags_real_producers_agents_sent_by_their_otlp_exporter(producer):
    server, recorded = start_watch(bearer_token="tok")
    try:
        for scenario in ("repeat_failing", "ignored_error", "clean"):
            completed = subprocess.run(
                [sys.executable, str(AGENTS), "--producer", producer, "--scenario", scenario, "--service", scenario,
                 "--otlp", f"http://127.0.0.1:{server.port}/v1/traces", "--header", "Authorization=Bearer tok"],
                capture_output=True, text=True, timeout=120)
            assert completed.returncode == 0, completed.stderr[-2000:]
        assert server.wait_idle()
        by_service: dict[str, set[str]] = {}
        for anomaly, context in recorded.alerts:
            by_service.setdefault(context.trace_id, set()).add(anomaly.type)
        assert sorted(recorded.types()) == ["ignored_error", "repeated_call"]
        text = metrics_text(server)
        assert 'anomaly_type="repeated_call",service="repeat_failing"' in text
        assert 'anomaly_type="ignored_error",service="ignored_error"' in text
        assert 'service="clean"' not in text
    finally:
        server.stop()


@pytest.mark.slow
def test_watch_flags_a_bare_openllmetry_loop_and_not_its_clean_variant():
    # The loop as most people instrument it: no agent span, no session id, one trace per model call.
    server, recorded = start_watch()
    try:
        for scenario in ("repeat", "clean"):
            completed = subprocess.run(
                [sys.executable, str(AGENTS), "--producer", "openllmetry", "--bare", "--scenario", scenario,
                 "--service", scenario, "--otlp", f"http://127.0.0.1:{server.port}/v1/traces"],
                capture_output=True, text=True, timeout=120)
            assert completed.returncode == 0, completed.stderr[-2000:]
        assert server.wait_idle()
        assert recorded.types() == ["repeated_call"]
        text = metrics_text(server)
        assert 'anomaly_type="repeated_call",service="repeat"} 1.0' in text
        assert 'service="clean"' not in text
    finally:
        server.stop()


@pytest.mark.slow
def test_watch_reports_what_an_openllmetry_agents_loop_cost():
    # OpenLLMetry records each call's gen_ai.usage.* (the fake API answers 10 input and 5 output tokens) and the
    # model, claude-sonnet-4-6, which the price table has at $3 / $15 per million tokens.
    server, recorded = start_watch()
    try:
        completed = subprocess.run(
            [sys.executable, str(AGENTS), "--producer", "openllmetry", "--scenario", "repeat_failing",
             "--otlp", f"http://127.0.0.1:{server.port}/v1/traces"], capture_output=True, text=True, timeout=120)
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert server.wait_idle()
    finally:
        server.stop()
    [(anomaly, _)] = recorded.alerts
    cost = anomaly.cost
    assert anomaly.type == "repeated_call" and cost is not None and cost.since_turn == 1
    assert cost.turns == anomaly.count  # the streak's turns, from its first
    assert (cost.input_tokens, cost.output_tokens, cost.total_tokens) == (10 * cost.turns, 5 * cost.turns,
                                                                         15 * cost.turns)
    assert cost.usd == pytest.approx(cost.turns * (10 * 3 + 5 * 15) / 1e6, abs=1e-12)
    assert cost.seconds is not None and cost.seconds > 0


@pytest.mark.slow
def test_watch_hears_a_real_grpc_exporter():
    server, recorded = start_watch()
    try:
        completed = subprocess.run(
            [sys.executable, str(AGENTS), "--producer", "semconv-chat", "--scenario", "repeat_failing",
             "--grpc", f"127.0.0.1:{server.grpc_port}"], capture_output=True, text=True, timeout=120)
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert server.wait_idle()
        assert recorded.types() == ["repeated_call"]
    finally:
        server.stop()


@pytest.mark.slow
def test_the_watch_command_stops_cleanly_on_sigterm_judging_open_runs(tmp_path):
    with OTLPReceiver() as webhook_sink:  # any HTTP endpoint that records POSTs will do as a webhook
        port = _free_port()
        env = {**os.environ, "LOOPTRACE_ALERT_WEBHOOK": webhook_sink.base_url + "/v1/traces",
               "LOOPTRACE_WATCH_TOKEN": "tok"}
        process = subprocess.Popen([sys.executable, "-m", "looptrace", "watch", "--port", str(port),
                                    "--grpc-port", "-1"], env=env, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for_port(port)
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/traces", method="POST",
                data=protobuf(agent_spans(ignored_error=True, root=False)),  # an agent still running
                headers={"Content-Type": "application/x-protobuf", "Authorization": "Bearer tok"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:  # a sender that resets
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0
        lines = [json.loads(line) for line in stderr.splitlines()]  # every line a JSON object: no traceback
        events = [line["event"] for line in lines]
        assert events.count("watch_connection_lost") <= 1
        assert events[0] == "watch_listening" and events[-1] == "watch_stopped"
        assert any(line.get("anomaly_type") == "ignored_error" for line in lines)  # judged at shutdown
        assert "tok" not in stderr.replace("token", "")
        assert webhook_sink.wait_for_requests(1)  # the webhook post went out before the process ended


@pytest.mark.slow
def test_the_watch_command_with_grpc_port_minus_one_listens_for_http_only():
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "looptrace", "watch", "--port", str(port), "--grpc-port", "-1"],
                               stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_port(port)
        assert post_to(port, protobuf(agent_spans())) == 200
        if Path(f"/proc/{process.pid}/fd").is_dir():  # Linux: what the process itself listens on
            assert _listening_ports(process.pid) == {port}
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    listening = json.loads(stderr.splitlines()[0])
    assert (listening["event"], listening["http_port"], listening["grpc_port"]) == ("watch_listening", port, None)


@pytest.mark.slow
@pytest.mark.parametrize("flags, says", [
    (["--port", "99999"], "--port 99999 is not a port number"),
    (["--port", "-5"], "--port -5 is not a port number"),
    (["--grpc-port", "99999"], "--grpc-port 99999 is not a port number"),
    (["--port", "{same}", "--grpc-port", "{same}"], "--port and --grpc-port are both {same}"),
    (["--port", "http"], "argument --port: invalid int value: 'http'"),
])
def test_the_watch_command_refuses_a_bad_port_in_one_line(flags, says):
    same = str(_free_port())
    done = _watch_command(*(flag.format(same=same) for flag in flags))
    _one_line_and_exit_2(done, says.format(same=same))


@pytest.mark.slow
def test_the_watch_command_refuses_a_grpc_port_a_plain_socket_holds():
    with socket.create_server(("127.0.0.1", 0)) as holder:
        taken = holder.getsockname()[1]
        done = _watch_command("--port", str(_free_port()), "--grpc-port", str(taken))
    _one_line_and_exit_2(done, f"--grpc-port {taken}: Address already in use")


@pytest.mark.slow
def test_a_second_watch_command_on_the_first_ones_grpc_port_is_refused_and_the_first_keeps_serving():
    http_port, grpc_port, second_http_port = _free_ports(3)
    first = subprocess.Popen([sys.executable, "-m", "looptrace", "watch", "--port", str(http_port),
                              "--grpc-port", str(grpc_port)], stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_port(http_port)
        _wait_for_port(grpc_port)
        done = _watch_command("--port", str(second_http_port), "--grpc-port", str(grpc_port))
        _one_line_and_exit_2(done, f"--grpc-port {grpc_port}: Address already in use")
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:  # the exports still all reach the first
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(encode_spans(agent_spans()), timeout=10)
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0


def post_to(port: int, body: bytes) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout_s: float = 20.0) -> None:
    import socket
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"watch did not listen on {port}")


def _free_ports(count: int) -> list[int]:
    """Ports free a moment ago, all different (each is held until all are found)."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    try:
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        time.sleep(0.02)


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on, from /proc (Linux)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _watch_command(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`looptrace watch FLAGS` in a process of its own, expected to end by itself."""
    return subprocess.run([sys.executable, "-m", "looptrace", "watch", *flags], capture_output=True, text=True,
                          timeout=60, env=env)


def _one_line_and_exit_2(done: subprocess.CompletedProcess, says: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("looptrace watch: error: ") and says in line, line


def test_an_empty_otlp_json_request_is_accepted_like_an_empty_list(watch):
    server, recorded = watch
    assert post(server, b"{}", content_type="application/json")[0] == 200  # proto3 JSON: a field left out is empty
    assert post(server, b'{"resourceSpans": []}', content_type="application/json")[0] == 200
    assert post(server, b'{"hello": 1}', content_type="application/json")[0] == 400  # not a request at all
