"""The fake OTLP receivers, exercised with the real OpenTelemetry SDK exporters.

Every provider here is private (never the global one), and every exporter
gets a short timeout so a mistake fails fast instead of hanging in retries.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import grpc
import pytest
from fakes.otlp_receiver import (
    LANGFUSE_INVALID_CREDENTIALS,
    LANGFUSE_NO_AUTH_HEADER,
    Delay,
    OTLPGrpcReceiver,
    OTLPReceiver,
    Reject,
    _any_value,
    unused_port,
)
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans as encode_spans_json
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

RESOURCE = Resource.create({"service.name": "looptrace-test", "deployment.environment": "test"})
LANGFUSE_PREFIX = "/api/public/otel"
PUBLIC_KEY, SECRET_KEY = "pk-lf-test", "sk-lf-test"


def basic_auth_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


LANGFUSE_HEADERS = {
    "Authorization": basic_auth_header(PUBLIC_KEY, SECRET_KEY),
    "x-langfuse-ingestion-version": "4",
}


def tracer_exporting_to(exporter):
    """A tracer on a private provider that exports each span synchronously on end()."""
    provider = TracerProvider(resource=RESOURCE, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("looptrace.tests", "0.1.0")


def one_finished_span(name: str = "agent.run"):
    """Finished SDK spans, for calling exporter.export() directly and reading its result."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("looptrace.tests").start_as_current_span(name, attributes={"k": "v"}):
        pass
    return memory.get_finished_spans()


def emit_agent_trace(tracer) -> None:
    with tracer.start_as_current_span(
        "agent.run",
        kind=SpanKind.SERVER,
        attributes={"gen_ai.system": "anthropic", "turns": 3, "cost": 0.25, "ok": True, "tools": ["search", "calc"]},
    ):
        with tracer.start_as_current_span("tool.call", kind=SpanKind.CLIENT) as child:
            child.add_event("loop.detected", {"repeats": 2})
            child.set_status(Status(StatusCode.ERROR, "tool exploded"))


# ---------------------------------------------------------------- OTLP/HTTP


def test_http_protobuf_gzip_as_langfuse_stand_in():
    with OTLPReceiver(
        basic_auth=(PUBLIC_KEY, SECRET_KEY),
        required_headers={"x-langfuse-ingestion-version": "4"},
        path_prefix=LANGFUSE_PREFIX,
    ) as rx:
        assert rx.url == rx.base_url + LANGFUSE_PREFIX
        exporter = OTLPSpanExporter(
            endpoint=f"{rx.base_url}/api/public/otel/v1/traces",
            headers=LANGFUSE_HEADERS,
            compression=Compression.Gzip,
            timeout=2,
        )
        emit_agent_trace(tracer_exporting_to(exporter))

        spans = {s.name: s for s in rx.wait_for_spans(2)}
        root, child = spans["agent.run"], spans["tool.call"]

        assert root.parent_span_id is None
        assert child.parent_span_id == root.span_id
        assert child.trace_id == root.trace_id and len(root.trace_id) == 32 and len(root.span_id) == 16
        assert root.kind == 2 and child.kind == 3  # SERVER, CLIENT in the OTLP enum
        assert root.attributes == {
            "gen_ai.system": "anthropic", "turns": 3, "cost": 0.25, "ok": True, "tools": ["search", "calc"],
        }
        assert child.events == [("loop.detected", {"repeats": 2})]
        assert (child.status_code, child.status_message) == (2, "tool exploded")
        assert root.status_code == 0
        assert root.resource["service.name"] == "looptrace-test"
        assert root.scope == "looptrace.tests" and root.scope_version == "0.1.0"
        assert root.end_time_unix_nano >= root.start_time_unix_nano > 0

        request = rx.requests[0]
        assert request.path == "/api/public/otel/v1/traces" and request.status == 200
        assert request.headers["content-type"] == "application/x-protobuf"
        assert request.headers["content-encoding"] == "gzip"
        assert request.headers["x-langfuse-ingestion-version"] == "4"


def test_http_bad_or_missing_basic_auth_is_401_and_export_fails():
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix=LANGFUSE_PREFIX) as rx:
        spans = one_finished_span()
        wrong = OTLPSpanExporter(
            endpoint=rx.traces_url, headers={"Authorization": basic_auth_header(PUBLIC_KEY, "nope")}, timeout=2
        )
        assert wrong.export(spans) is SpanExportResult.FAILURE
        assert OTLPSpanExporter(endpoint=rx.traces_url, timeout=2).export(spans) is SpanExportResult.FAILURE

        bad_key, no_key = rx.requests
        assert (bad_key.status, bad_key.error) == (401, LANGFUSE_INVALID_CREDENTIALS)
        assert (no_key.status, no_key.error) == (401, LANGFUSE_NO_AUTH_HEADER)
        assert [s.name for s in bad_key.spans] == ["agent.run"]  # decoded for inspection ...
        assert rx.spans == []  # ... but not accepted

        good = OTLPSpanExporter(endpoint=rx.traces_url, headers=LANGFUSE_HEADERS, timeout=2)
        assert good.export(spans) is SpanExportResult.SUCCESS
        assert [s.name for s in rx.spans] == ["agent.run"]


def test_http_401_body_is_langfuse_shaped_json():
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY)) as rx:
        request = urllib.request.Request(
            rx.traces_url, data=b"", method="POST", headers={"Content-Type": "application/x-protobuf"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=2)
        assert caught.value.code == 401
        assert json.loads(caught.value.read()) == {"message": LANGFUSE_NO_AUTH_HEADER}


def test_http_missing_required_header_is_400():
    with OTLPReceiver(required_headers={"x-langfuse-ingestion-version": "4"}) as rx:
        exporter = OTLPSpanExporter(endpoint=rx.traces_url, timeout=2)
        assert exporter.export(one_finished_span()) is SpanExportResult.FAILURE
        assert rx.requests[0].status == 400


def test_http_deflate_and_endpoint_from_environment(monkeypatch):
    with OTLPReceiver() as rx:
        # OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the exporter appends /v1/traces itself.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url)
        exporter = OTLPSpanExporter(compression=Compression.Deflate, timeout=2)
        assert exporter.export(one_finished_span("from.env")) is SpanExportResult.SUCCESS
        assert rx.requests[0].headers["content-encoding"] == "deflate"
        assert [s.name for s in rx.spans] == ["from.env"]


def test_http_unknown_path_is_404():
    with OTLPReceiver(path_prefix=LANGFUSE_PREFIX) as rx:
        # The classic Langfuse mistake: posting to the base URL without the OTel prefix.
        exporter = OTLPSpanExporter(endpoint=f"{rx.base_url}/v1/traces", timeout=2)
        assert exporter.export(one_finished_span()) is SpanExportResult.FAILURE
        assert [(r.path, r.status) for r in rx.requests] == [("/v1/traces", 404)]


def test_http_503_is_retried_by_the_sdk_and_delivered_once():
    with OTLPReceiver() as rx:
        rx.fail_next(503)
        exporter = OTLPSpanExporter(endpoint=rx.traces_url, timeout=5)
        # The SDK backs off ~1 s (±20 %) before its first retry when no Retry-After is given.
        assert exporter.export(one_finished_span()) is SpanExportResult.SUCCESS
        assert [r.status for r in rx.requests] == [503, 200]
        assert len(rx.spans) == 1
        assert rx.requests[1].at - rx.requests[0].at > 0.7  # a lower bound: a busy machine only adds to it


def test_http_retry_after_shortens_the_sdk_backoff():
    def gaps(*faults):
        with OTLPReceiver() as rx:
            rx.fail_next(*faults)
            exporter = OTLPSpanExporter(endpoint=rx.traces_url, timeout=10)
            assert exporter.export(one_finished_span()) is SpanExportResult.SUCCESS
            return [r.status for r in rx.requests], [b.at - a.at for a, b in zip(rx.requests, rx.requests[1:])]

    statuses, short = gaps(Reject(429, retry_after=0.1), Reject(503, retry_after=0.1))
    assert statuses == [429, 503, 200]
    # Against a baseline in the same test: the SDK's own first backoff (~1 s) with no Retry-After.
    _, default = gaps(Reject(503))
    assert max(short) < min(default)


def test_http_delay_then_success():
    with OTLPReceiver() as rx:
        rx.fail_next(Delay(1.0))
        exporter = OTLPSpanExporter(endpoint=rx.traces_url, timeout=3)
        started = time.monotonic()
        assert exporter.export(one_finished_span()) is SpanExportResult.SUCCESS
        assert time.monotonic() - started >= 1.0
        assert len(rx.spans) == 1


def test_http_refused_connection_fails():
    # How long the SDK keeps retrying is its own business; looptrace's guard bounds it (test_export.py).
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{unused_port()}/v1/traces", timeout=0.5)
    assert exporter.export(one_finished_span()) is SpanExportResult.FAILURE


def test_http_json_body_from_the_sdk_json_encoder():
    """No SDK exporter speaks OTLP/JSON over HTTP, so the SDK's own JSON encoder is posted by hand."""
    spans = one_finished_span("json.span")
    body = json.dumps(encode_spans_json(spans).to_dict()).encode()
    with OTLPReceiver() as rx:
        request = urllib.request.Request(
            rx.traces_url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=2) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json"
            assert json.loads(response.read()) == {}
        (received,) = rx.spans
        assert received.name == "json.span"
        assert received.trace_id == format(spans[0].context.trace_id, "032x")  # hex ids, not base64
        assert received.span_id == format(spans[0].context.span_id, "016x")
        assert received.attributes == {"k": "v"}


def test_any_value_decodes_nested_kvlists_and_bytes():
    value = common_pb2.AnyValue(
        kvlist_value=common_pb2.KeyValueList(
            values=[
                common_pb2.KeyValue(key="raw", value=common_pb2.AnyValue(bytes_value=b"\x00\x01")),
                common_pb2.KeyValue(
                    key="list",
                    value=common_pb2.AnyValue(
                        array_value=common_pb2.ArrayValue(
                            values=[common_pb2.AnyValue(int_value=1), common_pb2.AnyValue(double_value=1.5)]
                        )
                    ),
                ),
            ]
        )
    )
    assert _any_value(value) == {"raw": b"\x00\x01", "list": [1, 1.5]}
    assert _any_value(common_pb2.AnyValue()) is None


def record_metrics(exporter) -> MeterProvider:
    # A long interval: only force_flush() exports, so the test decides when.
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000, export_timeout_millis=2_000)
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader], shutdown_on_exit=False)
    meter = provider.get_meter("looptrace.tests")
    meter.create_counter("looptrace.tool.calls", unit="{call}").add(3, {"tool": "search"})
    histogram = meter.create_histogram("looptrace.turn.duration", unit="s")
    for seconds in (0.2, 0.4, 1.5):
        histogram.record(seconds, {"model": "claude"})
    assert provider.force_flush(timeout_millis=3_000)
    return provider


def assert_counter_and_histogram(rx) -> None:
    rx.wait_for_metrics(2)
    (counter,) = rx.metrics_named("looptrace.tool.calls")
    assert (counter.kind, counter.unit, counter.is_monotonic) == ("sum", "{call}", True)
    assert [(p.attributes, p.value) for p in counter.data_points] == [({"tool": "search"}, 3)]
    (histogram,) = rx.metrics_named("looptrace.turn.duration")
    assert (histogram.kind, histogram.unit) == ("histogram", "s")
    (point,) = histogram.data_points
    assert point.attributes == {"model": "claude"}
    assert point.count == 3 and point.sum == pytest.approx(2.1)
    assert (point.min, point.max) == (0.2, 1.5)
    assert sum(point.bucket_counts) == 3 and point.explicit_bounds
    assert counter.resource["service.name"] == "looptrace-test"


def test_http_metrics_counter_and_histogram():
    with OTLPReceiver() as rx:
        provider = record_metrics(OTLPMetricExporter(endpoint=rx.metrics_url, timeout=2))
        try:
            assert_counter_and_histogram(rx)
            assert rx.requests[0].path == "/v1/metrics"
        finally:
            provider.shutdown()


# ---------------------------------------------------------------- OTLP/gRPC


def test_grpc_exporter_delivers_spans_and_metadata():
    with OTLPGrpcReceiver(required_metadata={"x-tenant": "looptrace"}) as rx:
        exporter = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True, headers={"x-tenant": "looptrace"}, timeout=2)
        emit_agent_trace(tracer_exporting_to(exporter))
        spans = {s.name: s for s in rx.wait_for_spans(2)}
        assert spans["tool.call"].parent_span_id == spans["agent.run"].span_id
        assert spans["tool.call"].events == [("loop.detected", {"repeats": 2})]
        assert spans["agent.run"].resource["service.name"] == "looptrace-test"
        assert rx.requests[0].headers["x-tenant"] == "looptrace"
        assert rx.requests[0].status == grpc.StatusCode.OK
        exporter.shutdown()  # close the channel before the server goes, or grpc logs a GOAWAY


def test_grpc_missing_metadata_is_unauthenticated():
    with OTLPGrpcReceiver(required_metadata={"x-tenant": "looptrace"}) as rx:
        exporter = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True, timeout=2)
        assert exporter.export(one_finished_span()) is SpanExportResult.FAILURE
        assert [r.status for r in rx.requests] == [grpc.StatusCode.UNAUTHENTICATED]
        assert rx.spans == []
        exporter.shutdown()


def test_grpc_unavailable_is_retried_by_the_sdk():
    with OTLPGrpcReceiver() as rx:
        rx.fail_next(Reject(grpc.StatusCode.UNAVAILABLE, retry_after=0.1))
        exporter = GrpcSpanExporter(endpoint=rx.endpoint, insecure=True, timeout=3)
        assert exporter.export(one_finished_span()) is SpanExportResult.SUCCESS
        assert [r.status for r in rx.requests] == [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK]
        assert len(rx.spans) == 1
        exporter.shutdown()


def test_grpc_metrics_counter_and_histogram():
    with OTLPGrpcReceiver() as rx:
        provider = record_metrics(GrpcMetricExporter(endpoint=rx.endpoint, insecure=True, timeout=2))
        try:
            assert_counter_and_histogram(rx)
        finally:
            provider.shutdown()
