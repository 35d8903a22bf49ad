"""Export to Langfuse and to a collector, against local receivers that decode the real wire formats.

What is checked: the Langfuse endpoint, auth and ingestion-version header; every span of a run arriving with its
parent; the Langfuse attributes as Langfuse reads them; the anomaly score; the standard OTLP variables over HTTP and
gRPC; and the faults (refused, 503 then success, a 2 s delay, 401): each export bounded, one warning naming backend and
cause and never a secret, the undelivered list naming exactly the spans a backend did not take, push reading them
back from the trace file and delivering them once.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from fakes.otlp_receiver import Delay, OTLPGrpcReceiver, OTLPReceiver, Reject, langfuse_view, unused_port
from opentelemetry import trace
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans as encode_json
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as encode_proto
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from looptrace.instrumentation.export import delivery
from looptrace.instrumentation.export.delivery import GuardedExporter
from looptrace.instrumentation.export.exporters import network_exporter
from looptrace.instrumentation.export.push import PushInProgress, push
from looptrace.instrumentation.export.setup import configure
from looptrace.instrumentation.langfuse import mapping as langfuse
from looptrace.instrumentation.langfuse import scores as langfuse_scores
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.settings import ConfigurationError, LangfuseSettings, OtlpSettings, Settings
from looptrace.instrumentation.tracefile.undelivered import UndeliveredList
from looptrace.instrumentation.tracefile.write import TraceFileWriter
from looptrace.testing import capture_logs

PUBLIC_KEY, SECRET_KEY = "pk-lf-test-public", "sk-lf-test-secret-do-not-print"
LANGFUSE_PREFIX = "/api/public/otel"
BASIC = "Basic " + base64.b64encode(f"{PUBLIC_KEY}:{SECRET_KEY}".encode()).decode()
ISOLATED_ENV = (
    "LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_BASE_URL", "LANGFUSE_HOST", "LANGFUSE_TIMEOUT",
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED", "LOOPTRACE_EXPORTER", "LOOPTRACE_UNDELIVERED_FILE",
    "LOOPTRACE_PROMETHEUS_PORT", "LOOPTRACE_TRACE_FILE", "TRACEPARENT", "TRACESTATE",
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    for name in ISOLATED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # default trace and undelivered files land in the test's directory
    monkeypatch.setattr(delivery, "RETRY_AFTER_FAILURE_S", 10.0)


class ListedRun:
    """The trace file and the undelivered list as a run leaves them: every span in the trace file (the file processor
    writes each as it ends), and the ones a backend did not take listed by id. Given to a guard as its list."""

    def __init__(self, tmp_path) -> None:
        self.trace_file = tmp_path / "traces.jsonl"
        self.listing = UndeliveredList(tmp_path / "undelivered.jsonl", trace_file=self.trace_file)
        self.path = self.listing.path

    def append(self, backend, spans, *, uncertain=False):
        write_spans(self.trace_file, spans)
        return self.listing.append(backend, spans, uncertain=uncertain)

    def mark_delivered(self, batch):
        self.listing.mark_delivered(batch)

    def pending_spans(self, backend=None):
        return self.listing.pending_spans(backend)

    def pending_ids(self, backend):
        waiting = self.listing.pending().get(backend)
        return {key[32:] for keys in waiting.spans.values() for key in keys} if waiting else set()


def write_spans(path, spans):
    writer = TraceFileWriter(path)
    for span in spans:
        writer.write_span(span)
    writer.close()


@pytest.fixture
def undelivered(tmp_path) -> ListedRun:
    return ListedRun(tmp_path)


@pytest.fixture
def langfuse_rx(monkeypatch):
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix=LANGFUSE_PREFIX) as rx:
        use_langfuse(monkeypatch, rx.base_url)
        yield rx


def use_langfuse(monkeypatch, base_url: str, secret: str = SECRET_KEY, timeout_s: float = 2.0) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC_KEY)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", secret)
    monkeypatch.setenv("LANGFUSE_BASE_URL", base_url)
    monkeypatch.setenv("LANGFUSE_TIMEOUT", str(timeout_s))


def use_collector(monkeypatch, url: str, timeout_ms: int = 2000, **extra: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", str(timeout_ms))
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def finished_run_spans():
    """Spans shaped like one of our runs (root, turn, chat, tool), with the Langfuse attributes spans.py will add."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "looptrace-test"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("looptrace", "0.1.0")
    common = {sc.GEN_AI_PROVIDER_NAME: "anthropic", sc.GEN_AI_AGENT_NAME: "booking", sc.GEN_AI_CONVERSATION_ID: "s-1",
              **langfuse.trace_attributes("booking", session_id="s-1", user_id="u-1", tags=["demo", "nightly"],
                                          metadata={"ticket": "T-9", "attempt": 2})}
    root = tracer.start_span("invoke_agent booking", attributes={
        sc.GEN_AI_OPERATION_NAME: "invoke_agent", **common, **langfuse.observation_attributes("agent")})
    turn = tracer.start_span("turn 1", context=trace.set_span_in_context(root),
                             attributes={**common, **langfuse.observation_attributes("turn")})
    chat = tracer.start_span("chat claude-sonnet-5-5", context=trace.set_span_in_context(turn), kind=SpanKind.CLIENT,
                             attributes={sc.GEN_AI_OPERATION_NAME: "chat", **common,
                                         **langfuse.observation_attributes("chat")})
    chat.set_attributes({sc.GEN_AI_USAGE_INPUT_TOKENS: 1700, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 38,
                         **langfuse.generation_attributes(input_tokens=200, output_tokens=38,
                                                          cache_read_input_tokens=1500, cost_usd=0.0021)})
    chat.end()
    tool = tracer.start_span("execute_tool search", context=trace.set_span_in_context(turn), attributes={
        sc.GEN_AI_OPERATION_NAME: "execute_tool", sc.GEN_AI_TOOL_NAME: "search", **common,
        sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"q":"projector"}', **langfuse.observation_attributes("tool")})
    tool.set_attributes({sc.GEN_AI_TOOL_CALL_RESULT: "[]",
                         **langfuse.anomaly_attributes("repeated_call: search called 3 times with the same arguments")})
    tool.end()
    turn.end()
    root.end()
    return list(memory.get_finished_spans())


def span_ids(spans) -> set[str]:
    return {format(s.context.span_id, "016x") for s in spans}


def warnings_of(logs, event: str = "export_failed"):
    return [entry for entry in logs if entry.get("event") == event]


def assert_no_secret(logs) -> None:
    text = json.dumps(logs, default=str)
    assert SECRET_KEY not in text and BASIC not in text and "Basic " not in text


def assert_parents_arrive(received) -> None:
    ids = {s.span_id for s in received}
    roots = [s for s in received if s.parent_span_id is None]
    assert len(roots) == 1, [s.name for s in roots]
    assert all(s.parent_span_id in ids for s in received if s.parent_span_id is not None)


# --- settings -----------------------------------------------------------------------------------------------------


def test_otlp_settings_follow_the_specification():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_EXPORTER_OTLP_HEADERS": "x-a=1,x-b=two%20words",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    traces = OtlpSettings.from_env("traces", env)
    assert traces.endpoint == "http://collector:4318/v1/traces"  # the generic endpoint gets the signal's path
    assert dict(traces.headers) == {"x-a": "1", "x-b": "two words"}
    assert traces.timeout_s == 2.5  # milliseconds, as the specification says
    assert traces.compression == "gzip" and traces.protocol == "http/protobuf"
    assert OtlpSettings.from_env("metrics", env).endpoint == "http://collector:4318/v1/metrics"

    specific = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://other:9999/custom",
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-c=3", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "100"}
    traces = OtlpSettings.from_env("traces", specific)
    assert (traces.endpoint, dict(traces.headers), traces.timeout_s) == ("http://other:9999/custom", {"x-c": "3"}, 0.1)

    grpc_settings = OtlpSettings.from_env("traces", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                                                     "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    assert (grpc_settings.endpoint, grpc_settings.insecure) == ("http://localhost:4317", True)
    assert OtlpSettings.from_env("traces", {}).endpoint == "http://localhost:4318/v1/traces"
    assert "x-a" not in repr(OtlpSettings.from_env("traces", env))  # headers may carry tokens


@pytest.mark.parametrize("env, message", [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "milliseconds"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}, "OTEL_EXPORTER_OTLP_COMPRESSION is not an OTLP compression"),
])
def test_otlp_settings_that_cannot_work_say_why(env, message):
    with pytest.raises(ConfigurationError, match=message):  # said when the OTLP exporter is built, not before
        OtlpSettings.from_env("traces", env).check()


def test_langfuse_settings_from_the_sdk_variables():
    assert LangfuseSettings.from_env({"LANGFUSE_PUBLIC_KEY": "pk"}) is None
    keys = {"LANGFUSE_PUBLIC_KEY": "pk", "LANGFUSE_SECRET_KEY": "sk-secret"}
    assert LangfuseSettings.from_env(keys).traces_url == "https://cloud.langfuse.com/api/public/otel/v1/traces"
    host = LangfuseSettings.from_env({**keys, "LANGFUSE_HOST": "http://old:3000"})
    assert host.base_url == "http://old:3000"
    both = LangfuseSettings.from_env({**keys, "LANGFUSE_HOST": "http://old:3000", "LANGFUSE_BASE_URL": "http://new/"})
    assert both.traces_url == "http://new/api/public/otel/v1/traces"
    assert "sk-secret" not in repr(both) and "pk" not in repr(both)


# --- Langfuse -----------------------------------------------------------------------------------------------------


def run_agent(provider, task: str = "Reserve a projector for 2026-10-08"):
    from looptrace.cli.demo import Inventory, equipment_script
    from looptrace.runtime import Agent, ScriptedModel

    started = time.monotonic()
    result = Agent("claude-sonnet-5-5", tools=Inventory().tools(), client=ScriptedModel(equipment_script()),
                   tracer_provider=provider).run(task)
    return result, time.monotonic() - started


def configure_with_memory(**kwargs):
    """configure() plus an in-memory copy of every span, to compare what left with what was made."""
    telemetry = configure(set_global=False, **kwargs)
    memory = InMemorySpanExporter()
    telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
    return telemetry, memory


def test_a_run_reaches_langfuse_with_its_keys_the_ingestion_version_and_every_parent(langfuse_rx, tmp_path):
    telemetry, memory = configure_with_memory(exporters="langfuse", undelivered_file=tmp_path / "undelivered.jsonl")
    result, _ = run_agent(telemetry.tracer_provider)
    telemetry.shutdown()

    made = memory.get_finished_spans()
    received = langfuse_rx.wait_for_spans(len(made))
    assert result.status.value == "done"
    assert {s.span_id for s in received} == span_ids(made) and len(received) == len(made)
    assert_parents_arrive(received)
    for request in langfuse_rx.requests:
        if request.path == "/api/public/scores":  # the run's `looped` score
            continue
        assert request.path == LANGFUSE_PREFIX + "/v1/traces" and request.accepted
        assert request.headers["authorization"] == BASIC
        assert request.headers["x-langfuse-ingestion-version"] == "4"
        assert request.headers["content-encoding"] == "gzip"
    assert not (tmp_path / "undelivered.jsonl").exists()


def test_langfuse_never_receives_the_collectors_headers(langfuse_rx, monkeypatch, undelivered):
    # OTEL_EXPORTER_OTLP_HEADERS is for the collector; the HTTP exporter would merge it into every request.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer collector-token,x-tenant=acme")
    exporter = network_exporter("langfuse", Settings.from_env(), undelivered=undelivered)
    assert exporter.export(finished_run_spans()) == SpanExportResult.SUCCESS
    headers = langfuse_rx.requests[0].headers
    assert headers["authorization"] == BASIC and "x-tenant" not in headers
    assert "collector-token" not in json.dumps(headers)


def test_langfuse_attributes_arrive_as_langfuse_reads_them(langfuse_rx, undelivered):
    assert network_exporter("langfuse", Settings.from_env(), undelivered=undelivered).export(finished_run_spans()) == SpanExportResult.SUCCESS
    by_name = {s.name: s for s in langfuse_rx.wait_for_spans(4)}
    for span in by_name.values():  # Langfuse v4 reads trace attributes per observation: all of them carry them
        a = span.attributes
        # The session as Langfuse reads it: session.id, else gen_ai.conversation.id (extractSessionId).
        assert a["langfuse.trace.name"] == "booking" and a[sc.GEN_AI_CONVERSATION_ID] == "s-1" and a["user.id"] == "u-1"
        assert a["langfuse.trace.tags"] == ["demo", "nightly"]
        assert a["langfuse.trace.metadata.ticket"] == "T-9" and a["langfuse.trace.metadata.attempt"] == "2"
    types = {name: s.attributes["langfuse.observation.type"] for name, s in by_name.items()}
    assert types == {"invoke_agent booking": "agent", "turn 1": "span", "chat claude-sonnet-5-5": "generation",
                     "execute_tool search": "tool"}
    chat = by_name["chat claude-sonnet-5-5"].attributes
    assert json.loads(chat["langfuse.observation.usage_details"]) == {"input": 200, "output": 38,
                                                                      "input_cache_read": 1500}
    assert json.loads(chat["langfuse.observation.cost_details"]) == {"total": 0.0021}
    assert not any(k.startswith("langfuse.observation.usage") for n, s in by_name.items() if n != "chat claude-sonnet-5-5"
                   for k in s.attributes)
    tool = by_name["execute_tool search"].attributes
    assert tool["langfuse.observation.level"] == "WARNING"
    assert tool["langfuse.observation.status_message"].startswith("repeated_call")
    assert tool[sc.GEN_AI_TOOL_NAME] == "search" and tool[sc.GEN_AI_TOOL_CALL_ARGUMENTS] == '{"q":"projector"}'


def test_a_scripted_run_looks_right_in_langfuse(langfuse_rx, undelivered):
    """The real loop's spans, as Langfuse's ingestion maps them (observation types, trace name, usage)."""
    telemetry = configure(exporters="langfuse", set_global=False, undelivered_file=undelivered.path)
    run_agent(telemetry.tracer_provider)
    telemetry.shutdown()
    received = langfuse_rx.wait_for_spans(1)
    root = next(s for s in received if s.parent_span_id is None)
    assert langfuse_view(root).type == "AGENT"
    assert all(s.attributes.get("langfuse.trace.name") == root.attributes[sc.GEN_AI_AGENT_NAME] for s in received)
    for span in received:
        kind = langfuse_view(span).type
        has_usage = "langfuse.observation.usage_details" in span.attributes
        assert has_usage == (kind == "GENERATION"), span.name
        if kind == "TOOL":
            assert span.attributes[sc.GEN_AI_TOOL_NAME] in span.name


# --- the attribute functions --------------------------------------------------------------------------------------


def test_trace_attributes_refuse_what_langfuse_would_drop():
    assert langfuse.trace_attributes("a") == {"langfuse.trace.name": "a"}
    assert langfuse.trace_attributes("a", tags=["x", "x", "y"])["langfuse.trace.tags"] == ("x", "y")
    # Over 200 characters: cut and marked, never an exception in a run.
    assert langfuse.trace_attributes("a", user_id="u" * 300)["user.id"] == "u" * 199 + "…"
    with pytest.raises(ValueError, match="letters, digits"):
        langfuse.trace_attributes("a", metadata={"bad key": 1})
    with pytest.raises(ValueError, match="non-empty"):
        langfuse.trace_attributes("a", user_id="")


def test_generation_attributes_never_count_cache_tokens_twice():
    usage = json.loads(langfuse.generation_attributes(input_tokens=3, output_tokens=5, cache_read_input_tokens=100,
                                                      cache_creation_input_tokens=40)
                       ["langfuse.observation.usage_details"])
    # Langfuse adds every type with "input" in its name: 3 + 100 + 40 is the whole input, once.
    assert usage == {"input": 3, "output": 5, "input_cache_read": 100, "input_cache_creation_5m": 40}
    assert "langfuse.observation.cost_details" not in langfuse.generation_attributes(input_tokens=1, output_tokens=1)


def test_observation_and_anomaly_attributes():
    assert langfuse.observation_attributes("chat") == {"langfuse.observation.type": "generation"}
    with pytest.raises(ValueError):
        langfuse.observation_attributes("retriever")
    assert langfuse.anomaly_attributes("x" * 5000)["langfuse.observation.status_message"] == "x" * 1024
    assert langfuse.anomaly_attributes("m", level="ERROR")["langfuse.observation.level"] == "ERROR"
    with pytest.raises(ValueError):
        langfuse.anomaly_attributes("m", level="FATAL")


# --- scores -------------------------------------------------------------------------------------------------------


class ScoreReceiver:
    """Langfuse's POST /api/public/scores, enough of it: Basic auth, one JSON object per request."""

    def __init__(self, status: int = 200, delay_s: float = 0.0) -> None:
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.status, self.delay_s = status, delay_s
        self.release = threading.Event()  # ends a delay early
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                receiver.release.wait(receiver.delay_s)
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                ok = self.path == "/api/public/scores" and self.headers.get("authorization") == BASIC
                status = receiver.status if ok else 401
                if status == 200:
                    receiver.bodies.append(body)
                payload = json.dumps({"id": body.get("id")} if status == 200 else {"message": "no"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_anomaly_score_lands_on_the_trace_once():
    rx = ScoreReceiver()
    try:
        scores = langfuse_scores.LangfuseScores(rx.base_url, PUBLIC_KEY, SECRET_KEY, timeout_s=1)
        trace_id = "0af7651916cd43dd8448eb211c80319c"
        first = scores.anomaly(trace_id, "repeated_call", "search called 3 times", span_id="b7ad6b7169203331")
        again = scores.anomaly(trace_id, "repeated_call", "search called 3 times", span_id="b7ad6b7169203331")
        assert scores.close(2.0)
    finally:
        rx.close()
    assert first == again  # the same score again is an update in Langfuse, not a second score
    body = rx.bodies[0]
    assert body["traceId"] == trace_id and body["name"] == "loop_anomaly" and body["value"] == "repeated_call"
    assert body["dataType"] == "CATEGORICAL" and body["comment"] == "search called 3 times"
    assert body["metadata"] == {"span_id": "b7ad6b7169203331"} and "observationId" not in body
    assert rx.headers[0]["authorization"] == BASIC


def test_a_failing_score_is_one_warning_and_never_blocks_the_caller():
    rx = ScoreReceiver(status=401, delay_s=60)  # holds each request until released
    try:
        scores = langfuse_scores.LangfuseScores(rx.base_url, PUBLIC_KEY, "wrong-" + SECRET_KEY, timeout_s=120)
        with capture_logs() as logs:
            for n in range(3):
                scores.send("0af7651916cd43dd8448eb211c80319c", name="quality", value=n)
            # The sends returned while the server still holds the first request: they only queued.
            assert rx.headers == []
            assert not scores.flush(0.1)  # bounded: the server is still holding the first one
            rx.release.set()
            scores.close(60.0)
    finally:
        rx.release.set()
        rx.close()
    failed = warnings_of(logs, "langfuse_score_failed")
    assert [(w["cause"], w["detail"]) for w in failed] == [("unauthorized", "HTTP 401")]
    assert SECRET_KEY not in json.dumps(logs)


# --- the collector ------------------------------------------------------------------------------------------------


def test_collector_over_http_gets_the_headers_and_compression_from_the_environment(monkeypatch, undelivered):
    with OTLPReceiver(required_headers={"x-api-key": "k 1"}) as rx:
        use_collector(monkeypatch, rx.url, OTEL_EXPORTER_OTLP_HEADERS="x-api-key=k%201",
                      OTEL_EXPORTER_OTLP_COMPRESSION="gzip")
        spans = finished_run_spans()
        assert network_exporter("otlp", Settings.from_env(), undelivered=undelivered).export(spans) == SpanExportResult.SUCCESS
        assert {s.span_id for s in rx.wait_for_spans(4)} == span_ids(spans)
        request = rx.requests[0]
    assert request.path == "/v1/traces" and request.headers["content-encoding"] == "gzip"


def test_collector_over_grpc(monkeypatch, undelivered):
    with OTLPGrpcReceiver(required_metadata={"x-api-key": "k1"}) as rx:
        use_collector(monkeypatch, rx.url, OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_HEADERS="x-api-key=k1",
                      OTEL_EXPORTER_OTLP_COMPRESSION="gzip")
        spans = finished_run_spans()
        assert network_exporter("otlp", Settings.from_env(), undelivered=undelivered).export(spans) == SpanExportResult.SUCCESS
        received = rx.wait_for_spans(4)
    assert {s.span_id for s in received} == span_ids(spans)
    assert_parents_arrive(received)
    assert rx.requests[0].headers["x-api-key"] == "k1"


@pytest.mark.parametrize("fault, cause", [
    (None, "refused"),
    (Reject(grpc.StatusCode.UNAUTHENTICATED), "unauthorized"),
    (Reject(grpc.StatusCode.INTERNAL), "server_error"),
])
def test_grpc_failures_are_classified(monkeypatch, undelivered, fault, cause):
    with OTLPGrpcReceiver() as rx:
        url = rx.url if fault else f"http://127.0.0.1:{unused_port()}"
        if fault:
            rx.fail_next(fault)
        use_collector(monkeypatch, url, timeout_ms=60_000, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
        exporter = network_exporter("otlp", Settings.from_env(), undelivered=undelivered)
        with capture_logs() as logs:
            result, _ = exported_within(exporter, finished_run_spans(), 60)  # not retried until the timeout
            assert result == SpanExportResult.FAILURE
    assert [w["cause"] for w in warnings_of(logs)] == [cause]
    assert undelivered.pending_spans("otlp") == 4


# --- faults -------------------------------------------------------------------------------------------------------


def exported_within(exporter, spans, slow_path_s: float):
    """Export, checking it ended well before ``slow_path_s``: what the behaviour under test avoids (a timeout or a
    server's delay, which the test sets large). A check of the mechanism with a margin no busy machine eats, not a
    speed limit."""
    started = time.monotonic()
    result = exporter.export(spans)
    elapsed = time.monotonic() - started
    assert elapsed < slow_path_s / 2, f"export took {elapsed:.2f} s, as if it had waited for {slow_path_s} s"
    return result, elapsed


def test_refused_is_bounded_warned_once_listed_and_pushed_once(monkeypatch, undelivered):
    port = unused_port()
    use_langfuse(monkeypatch, f"http://127.0.0.1:{port}", timeout_s=60)
    exporter = network_exporter("langfuse", Settings.from_env(), undelivered=undelivered)
    batches = [finished_run_spans() for _ in range(3)]
    with capture_logs() as logs:
        for batch in batches:
            # The exporter would retry a refused connection for 60 s; the guard stops at the first refusal.
            result, _ = exported_within(exporter, batch, 60)
            assert result == SpanExportResult.FAILURE
    (warning,) = warnings_of(logs)
    assert (warning["backend"], warning["cause"]) == ("langfuse", "refused")
    assert warning["endpoint"] == f"http://127.0.0.1:{port}/api/public/otel/v1/traces"
    assert warning["undelivered_listed_in"] == str(undelivered.path)
    assert_no_secret(logs)
    expected = set().union(*(span_ids(b) for b in batches))
    assert undelivered.pending_ids("langfuse") == expected and exporter.undelivered_spans == 12
    assert_no_secret([undelivered.path.read_text()])  # ids and paths only

    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix=LANGFUSE_PREFIX) as rx:
        use_langfuse(monkeypatch, rx.base_url)
        report = push(undelivered.path, settings=Settings.from_env())
        received = rx.wait_for_spans(12)
        assert report.sent == {"langfuse": 12} and report.ok
        assert sorted(s.span_id for s in received) == sorted(expected)  # each exactly once
        rx.clear()
        assert push(undelivered.path, settings=Settings.from_env()).summary().startswith("nothing to push")
        assert rx.requests == []
    assert not undelivered.path.exists()


def test_503_then_success_is_delivered_without_a_warning(langfuse_rx, undelivered):
    langfuse_rx.fail_next(Reject(503, retry_after=0.1))
    exporter = network_exporter("langfuse", Settings.from_env(), undelivered=undelivered)
    spans = finished_run_spans()
    with capture_logs() as logs:
        result = exporter.export(spans)
    assert result == SpanExportResult.SUCCESS and warnings_of(logs) == []
    assert [r.status for r in langfuse_rx.requests] == [503, 200]
    assert {s.span_id for s in langfuse_rx.spans} == span_ids(spans) and not undelivered.path.exists()


def test_a_slow_backend_costs_the_timeout_then_the_batch_is_listed_as_undelivered(monkeypatch, undelivered):
    with OTLPReceiver() as rx:
        rx.fail_next(Delay(60))  # ended when the receiver stops
        use_collector(monkeypatch, rx.url, timeout_ms=400)
        exporter = network_exporter("otlp", Settings.from_env(), undelivered=undelivered)
        spans = finished_run_spans()
        with capture_logs() as logs:
            result, elapsed = exported_within(exporter, spans, 60)
            assert result == SpanExportResult.FAILURE
            # Paused after the failure: the next batch goes straight to the undelivered file, with no second warning and
            # without waiting out a timeout as the first did (the baseline, measured here).
            result, paused_s = exported_within(exporter, finished_run_spans(), 60)
            assert result == SpanExportResult.FAILURE and paused_s < elapsed
    (warning,) = warnings_of(logs)
    assert (warning["backend"], warning["cause"]) == ("otlp", "timeout")
    assert elapsed >= 0.35
    assert set(undelivered.listing.pending()) == {"otlp"} and undelivered.pending_spans() == 8
    # The first batch timed out: it may have arrived. The second was never sent.
    assert len(undelivered.listing.pending()["otlp"].uncertain) == 4


def test_401_names_the_keys_and_never_prints_them(monkeypatch, undelivered):
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix=LANGFUSE_PREFIX) as rx:
        use_langfuse(monkeypatch, rx.base_url, secret="sk-lf-wrong-and-secret", timeout_s=60)
        exporter = network_exporter("langfuse", Settings.from_env(), undelivered=undelivered)
        with capture_logs() as logs:
            result, _ = exported_within(exporter, finished_run_spans(), 60)  # rejected keys end the wait at once
        assert rx.requests[0].status == 401
    (warning,) = warnings_of(logs)
    assert result == SpanExportResult.FAILURE
    assert (warning["cause"], warning["detail"]) == ("unauthorized", "HTTP 401")
    assert "LANGFUSE_SECRET_KEY" in warning["hint"]
    assert "sk-lf-wrong-and-secret" not in json.dumps(logs) and "Basic" not in json.dumps(logs)
    assert undelivered.pending_spans("langfuse") == 4


def test_a_success_resets_the_warnings(monkeypatch, undelivered):
    monkeypatch.setattr(delivery, "RETRY_AFTER_FAILURE_S", 0.0)
    with OTLPReceiver() as rx:
        use_collector(monkeypatch, rx.url)
        exporter = network_exporter("otlp", Settings.from_env(), undelivered=undelivered)
        with capture_logs() as logs:
            for fault in (500, 500, None, 500):  # 500 is not retried by the exporter; 503 would be
                if fault:
                    rx.fail_next(fault)
                exporter.export(finished_run_spans())
    assert [w["cause"] for w in warnings_of(logs)] == ["server_error", "server_error"]  # once, then again after a success


def test_an_answer_arriving_after_the_deadline_marks_the_batch_delivered(monkeypatch, undelivered):
    with OTLPReceiver() as rx:
        rx.fail_next(Delay(1.5))
        use_collector(monkeypatch, rx.url, timeout_ms=30_000)
        exporter = network_exporter("otlp", Settings.from_env(), undelivered=undelivered)
        exporter.set_deadline(time.monotonic() + 0.1)  # a flush with 0.1 s left
        result = exporter.export(finished_run_spans())
        # Still pending: the export gave up at the deadline, before the answer came (which would mark it delivered).
        assert result == SpanExportResult.FAILURE and undelivered.pending_spans() == 4
        rx.wait_for_spans(4)
        deadline = time.monotonic() + 30
        while undelivered.pending_spans() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert undelivered.pending_spans() == 0 and exporter.undelivered_spans == 0  # so push will not send it a second time
        rx.clear()
        assert push(undelivered.path, settings=Settings.from_env()).sent == {}
        assert rx.requests == []


def test_a_batch_a_collector_stored_after_the_timeout_is_not_pushed_a_second_time(monkeypatch, undelivered):
    with OTLPReceiver() as rx:
        rx.fail_next(Delay(1.5))  # stored, answered too late
        use_collector(monkeypatch, rx.url, timeout_ms=300)
        exporter = network_exporter("otlp", Settings.from_env(), undelivered=undelivered)
        spans = finished_run_spans()
        assert exporter.export(spans) == SpanExportResult.FAILURE
        rx.wait_for_spans(4)  # the collector has them after all
        report = push(undelivered.path, settings=Settings.from_env())
        assert report.held == {"otlp": 4} and report.sent == {} and "--resend-interrupted" in report.summary()
        assert sorted(s.span_id for s in rx.spans) == sorted(span_ids(spans))  # once


def test_a_score_that_failed_while_langfuse_was_down_is_delivered_by_push_once(monkeypatch, tmp_path):
    from looptrace.cli.demo import Inventory, runaway_script
    from looptrace.runtime import Agent, ScriptedModel

    use_langfuse(monkeypatch, f"http://127.0.0.1:{unused_port()}")
    telemetry = configure(exporters="file,langfuse", set_global=False, trace_file=tmp_path / "traces.jsonl",
                          undelivered_file=tmp_path / "undelivered.jsonl")
    with capture_logs() as logs:
        Agent("claude-sonnet-5-5", tools=Inventory().tools(), client=ScriptedModel(runaway_script()),
              telemetry=telemetry, on_anomaly="warn").run("find a projector")
        telemetry.shutdown(timeout_ms=2000)
    assert "looptrace traces push" in warnings_of(logs, "langfuse_score_failed")[0]["hint"]
    assert_no_secret([(tmp_path / "undelivered.jsonl").read_text()])
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix=LANGFUSE_PREFIX) as rx:
        use_langfuse(monkeypatch, rx.base_url)
        report = push(tmp_path / "undelivered.jsonl", settings=Settings.from_env())
        again = push(tmp_path / "undelivered.jsonl", settings=Settings.from_env())
        scores = list(rx.scores)
    # the anomaly's score, and the two every run ends with: whether it looped, and what its loop cost
    assert report.ok and report.scores_sent == {"langfuse": 3} and "sent 3 scores to langfuse" in report.summary()
    named = {score["name"]: score["value"] for score in scores}
    assert (named[langfuse.ANOMALY_SCORE], named["looped"]) == ("repeated_call", 1) and named["loop_cost_usd"] > 0
    assert again.summary().startswith("nothing to push")


def test_a_dead_backend_changes_neither_the_run_nor_its_duration(monkeypatch, tmp_path):
    baseline, _ = run_agent(TracerProvider())
    run_agent(TracerProvider())  # warm-up, so the timed runs compare like with like
    _, baseline_s = run_agent(TracerProvider())
    use_langfuse(monkeypatch, f"http://127.0.0.1:{unused_port()}", timeout_s=60)
    use_collector(monkeypatch, f"http://127.0.0.1:{unused_port()}", timeout_ms=60_000)
    telemetry, memory = configure_with_memory(exporters="file,langfuse,otlp", undelivered_file=tmp_path / "undelivered.jsonl")
    with capture_logs() as logs:
        result, run_s = run_agent(telemetry.tracer_provider)
        started = time.monotonic()
        telemetry.shutdown(timeout_ms=1000)
        shutdown_s = time.monotonic() - started
    assert (result.status, result.turns, result.final_text) == (baseline.status, baseline.turns, baseline.final_text)
    # Against the baseline run measured above (export happens on another thread), and against the 60 s a shutdown
    # that ignored its deadline would wait for the exporters: margins a busy machine does not eat.
    assert run_s < 2 * baseline_s + 1.0, (run_s, baseline_s)
    assert shutdown_s < 30
    assert sorted((w["backend"], w["cause"]) for w in warnings_of(logs)) == [("langfuse", "refused"),
                                                                             ("otlp", "refused")]
    undelivered = UndeliveredList(tmp_path / "undelivered.jsonl")
    made = span_ids(memory.get_finished_spans())
    for backend in ("langfuse", "otlp"):
        assert {key[32:] for keys in undelivered.pending()[backend].spans.values() for key in keys} == made
    assert telemetry.undelivered_spans == 2 * len(made)
    assert "looptrace traces push" in telemetry.undelivered_notice() and str(undelivered.path) in telemetry.undelivered_notice()

    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix=LANGFUSE_PREFIX) as rx:
        use_langfuse(monkeypatch, rx.base_url)
        report = push(undelivered.path, to=["langfuse"], settings=Settings.from_env())  # the collector's copy stays
        assert report.sent == {"langfuse": len(made)} and report.skipped == {"otlp": len(made)}
        assert {s.span_id for s in rx.wait_for_spans(len(made))} == made
    assert undelivered.pending_spans("otlp") == len(made) and undelivered.pending_spans("langfuse") == 0


def test_without_the_trace_file_an_undelivered_batch_is_said_to_be_lost(monkeypatch, tmp_path):
    use_langfuse(monkeypatch, f"http://127.0.0.1:{unused_port()}", timeout_s=60)
    telemetry, memory = configure_with_memory(exporters="langfuse", undelivered_file=tmp_path / "undelivered.jsonl")
    with capture_logs() as logs:
        run_agent(telemetry.tracer_provider)
        telemetry.shutdown(timeout_ms=1000)
    (warning,) = warnings_of(logs)
    assert "lost" in warning["lost"] and "trace file is off" in warning["lost"]
    made = len(memory.get_finished_spans())
    assert f"{made} spans could not be delivered (" in telemetry.undelivered_notice()
    assert "are lost" in telemetry.undelivered_notice() and not (tmp_path / "undelivered.jsonl").exists()


# --- the undelivered list and push --------------------------------------------------------------------------------


def test_undelivered_spans_come_back_as_they_were_sent(undelivered):
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "deployment.environment": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("looptrace", "1.2.3")
    remote = trace.SpanContext(0x5AB, 0xC0FFEE, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    with tracer.start_as_current_span("root", context=trace.set_span_in_context(trace.NonRecordingSpan(remote)),
                                      kind=SpanKind.SERVER, links=[Link(remote, {"why": "caller"})],
                                      attributes={"s": "x", "i": 7, "f": 1.5, "b": True, "l": ["a", "b"]}) as root:
        root.add_event("looptrace.anomaly", {"type": "cycle"})
        root.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("child", kind=SpanKind.CLIENT):
            pass
    original = memory.get_finished_spans()
    assert len(original) == 2
    undelivered.append("otlp", original)
    backend = ScriptedExporter()
    push(undelivered.path, {"otlp": backend})
    (sent,) = backend.batches
    assert encode_proto(sent) == encode_proto(original)  # what the SDK's exporter puts on the wire, byte for byte
    assert encode_json(sent).to_dict() == encode_json(original).to_dict()


class ScriptedExporter:
    """A stand-in backend for push: records what it was sent, fails or raises on given calls."""

    def __init__(self, fail_on=(), raise_on=()):
        self.calls, self.fail_on, self.raise_on = [], set(fail_on), set(raise_on)
        self.batches = []

    def export(self, spans):
        self.calls.append([format(s.context.span_id, "016x") for s in spans])
        self.batches.append(list(spans))
        if len(self.calls) in self.raise_on:
            raise KeyboardInterrupt  # the user pressed Ctrl-C in the middle of a push
        return SpanExportResult.FAILURE if len(self.calls) in self.fail_on else SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def test_an_interrupted_push_never_sends_a_batch_twice_to_a_collector(undelivered, monkeypatch):
    from looptrace.instrumentation.export import push as push_module

    monkeypatch.setattr(push_module, "BATCH_SPANS", 4)  # one run's spans per request
    batches = [finished_run_spans() for _ in range(3)]
    for batch in batches:
        undelivered.append("otlp", batch)
    first = ScriptedExporter(raise_on={2})
    with pytest.raises(KeyboardInterrupt):
        push(undelivered.path, {"otlp": first})
    second = ScriptedExporter()
    report = push(undelivered.path, {"otlp": second})
    # The interrupted call never got its answer: it may have arrived, so it is held back, reported, not resent.
    assert second.calls == [span_ids_in_order(batches[2])]
    assert report.held == {"otlp": 4} and not report.ok and "--resend-interrupted" in report.summary()
    third = ScriptedExporter()
    assert push(undelivered.path, {"otlp": third}).held == {"otlp": 4} and third.calls == []
    fourth = ScriptedExporter()
    push(undelivered.path, {"otlp": fourth}, resend_interrupted=True)  # the user's explicit choice
    assert fourth.calls == [span_ids_in_order(batches[1])] and not undelivered.path.exists()


def test_langfuse_gets_an_uncertain_batch_again_because_it_keeps_one_observation_per_span_id(undelivered):
    # A batch Langfuse may have stored although its answer never came (a timeout). Langfuse's OTel ingestion makes
    # the span id the observation id and merges events with the same id, so a second copy adds nothing there.
    spans = finished_run_spans()
    undelivered.append("langfuse", spans, uncertain=True)
    backend = ScriptedExporter()
    report = push(undelivered.path, {"langfuse": backend})
    assert backend.calls == [span_ids_in_order(spans)] and report.ok and report.held == {}
    assert push(undelivered.path, {"langfuse": ScriptedExporter()}).summary().startswith("nothing to push")


def span_ids_in_order(spans):
    return [format(s.context.span_id, "016x") for s in spans]


def test_a_failing_backend_keeps_its_batches_and_others_go_on(undelivered):
    for backend in ("langfuse", "langfuse", "otlp"):
        undelivered.append(backend, finished_run_spans())
    langfuse_exporter, otlp_exporter = ScriptedExporter(fail_on={1}), ScriptedExporter()
    report = push(undelivered.path, {"langfuse": langfuse_exporter, "otlp": otlp_exporter})
    assert len(langfuse_exporter.calls) == 1  # not tried again in the same push
    assert (report.sent, report.failed, report.ok) == ({"otlp": 4}, {"langfuse": 8}, False)
    assert undelivered.pending_spans("langfuse") == 8 and undelivered.pending_spans("otlp") == 0
    with pytest.raises(ConfigurationError, match="not configured"):
        push(undelivered.path, {"otlp": otlp_exporter}, to=["langfuse"])


def test_two_pushes_at_once_are_refused(undelivered):
    undelivered.append("otlp", finished_run_spans())
    exporter = ScriptedExporter()
    with undelivered.listing.pushing(), pytest.raises(PushInProgress):
        push(undelivered.path, {"otlp": exporter})
    assert exporter.calls == []


def test_a_torn_line_in_the_trace_file_or_the_list_costs_only_itself(undelivered):
    undelivered.append("otlp", finished_run_spans())
    for path in (undelivered.path, undelivered.trace_file):
        with open(path, "a") as handle:
            handle.write('{"truncated": ')  # a writer killed mid-line
    undelivered.append("otlp", finished_run_spans())  # written on a line of its own, after the torn one
    report = push(undelivered.path, {"otlp": ScriptedExporter()})
    assert report.sent == {"otlp": 8} and not undelivered.path.exists()
    # The torn line of the list named spans no push can know: said once (exit 1), then left out of the list.
    assert not report.ok and "1 line of" in report.summary() and "line 2: truncated" in report.summary()
    assert push(undelivered.path, {"otlp": ScriptedExporter()}).summary().startswith("nothing to push")


def test_spans_no_longer_in_any_trace_file_are_reported_lost_once(undelivered):
    undelivered.append("otlp", finished_run_spans())
    undelivered.trace_file.unlink()
    report = push(undelivered.path, {"otlp": ScriptedExporter()})
    assert report.missing == {"otlp": 4} and not report.ok and "lost" in report.summary()
    assert push(undelivered.path, {"otlp": ScriptedExporter()}).summary().startswith("nothing to push")


def test_guarded_exporter_survives_an_exporter_that_raises(undelivered):
    class Broken:
        def export(self, spans):
            raise RuntimeError("boom")

        def shutdown(self):
            pass

    exporter = GuardedExporter("otlp", Broken(), endpoint="http://user:pw@collector:4318/v1/traces?token=t",
                               undelivered=undelivered)
    with capture_logs() as logs:
        assert exporter.export(finished_run_spans()) == SpanExportResult.FAILURE
    (warning,) = warnings_of(logs)
    assert (warning["cause"], warning["detail"]) == ("failed", "RuntimeError")
    assert warning["endpoint"] == "http://collector:4318/v1/traces"  # no user info, no query
    assert undelivered.pending_spans() == 4
