"""The direct path for the network exporters (issue 23): ``configure(exporters="otlp" | "langfuse")`` on looptrace's
own provider makes API spans that its guarded BatchSpanProcessors export as they are, no SDK span in between. What the
backend decodes is what the SDK path sends, span for span, over OTLP/HTTP, gRPC and to Langfuse; whatever only the SDK
gives (an application's provider, a sampler or span limits in the environment, the console) keeps the SDK."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fakes.otlp_receiver import OTLPGrpcReceiver, OTLPReceiver
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import TracerProvider
from test_direct_spans import run_story

from looptrace.instrumentation.direct_spans import DirectTracerProvider
from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.setup import configure

PUBLIC_KEY, SECRET_KEY = "pk-lf-direct", "sk-lf-direct"


@pytest.fixture(autouse=True)
def _quiet_environment(monkeypatch, tmp_path):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                 "OTEL_TRACES_EXPORTER", "LOOPTRACE_EXPORTER", "LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")  # spans only: the receiver's requests are trace exports
    monkeypatch.setenv("LOOPTRACE_SPILL_FILE", str(tmp_path / "spill.jsonl"))
    monkeypatch.setenv("OTEL_SERVICE_NAME", "booking-service")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=ops")


def _sent(receiver: Any, exporters: str, sdk: bool) -> list[dict[str, Any]]:
    """The story's spans as the receiver decoded them, through the direct path or (``sdk``) the SDK's."""
    settings = Settings.from_env()
    if sdk:  # as when the environment asks for something only the SDK does
        settings = dataclasses.replace(settings, sdk_span_settings=("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",))
    receiver.clear()
    telemetry = configure(settings, exporters=exporters, set_global=False)
    assert isinstance(telemetry.tracer_provider, TracerProvider if sdk else DirectTracerProvider)
    run_story(tracer_provider=telemetry.tracer_provider)
    assert telemetry.flush()
    telemetry.shutdown()
    assert telemetry.spilled_spans == 0
    return _normalised([request.body for request in receiver.requests if "trace" in request.path.lower()])


def _normalised(bodies: list[bytes]) -> list[dict[str, Any]]:
    """Each span with its resource and scope, ids replaced by their order of appearance, times (and a loop's wall
    time) left out."""
    labels: dict[str, str] = {}

    def label(value: str) -> str:
        return labels.setdefault(value, f"id{len(labels)}")

    spans = []
    for body in bodies:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in json_format.MessageToDict(request)["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = label(span[key])
                    for key in ("startTimeUnixNano", "endTimeUnixNano"):
                        assert int(span.pop(key)) > 0
                    for event in span.get("events", ()):
                        assert int(event.pop("timeUnixNano")) > 0
                        # a loop's wall time, measured by the clock like the times above
                        event["attributes"] = [a for a in event.get("attributes", ())
                                               if a["key"] != "looptrace.anomaly.duration_s"]
                    spans.append({"resource": resource_spans["resource"], "scope": scope_spans["scope"],
                                  "span": span})
    return sorted(spans, key=lambda s: s["span"]["spanId"])


def _same(direct: list[dict[str, Any]], sdk: list[dict[str, Any]]) -> None:
    assert len(direct) == len(sdk) == 16  # the agent, 5 turns, 5 chats, 5 tool calls
    for mine, theirs in zip(direct, sdk, strict=True):
        assert mine == theirs  # resource, scope, ids and parents, kind, name, attributes in order, events, status


def test_otlp_http_receives_from_the_direct_path_what_the_sdk_path_sends(monkeypatch):
    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        _same(_sent(receiver, "otlp", sdk=False), _sent(receiver, "otlp", sdk=True))


def test_otlp_grpc_receives_from_the_direct_path_what_the_sdk_path_sends(monkeypatch):
    with OTLPGrpcReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        _same(_sent(receiver, "otlp", sdk=False), _sent(receiver, "otlp", sdk=True))


def test_langfuse_receives_from_the_direct_path_what_the_sdk_path_sends(monkeypatch):
    with OTLPReceiver(basic_auth=(PUBLIC_KEY, SECRET_KEY), path_prefix="/api/public/otel") as receiver:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC_KEY)
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET_KEY)
        monkeypatch.setenv("LANGFUSE_BASE_URL", receiver.base_url)
        _same(_sent(receiver, "langfuse", sdk=False), _sent(receiver, "langfuse", sdk=True))


def test_the_file_beside_a_network_exporter_is_written_by_the_direct_path_too(monkeypatch, tmp_path):
    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        telemetry = configure(Settings.from_env(), exporters="file,otlp", trace_file=tmp_path / "t.jsonl",
                              set_global=False)
        assert isinstance(telemetry.tracer_provider, DirectTracerProvider)
        run_story(tracer_provider=telemetry.tracer_provider)
        telemetry.shutdown()
        assert len((tmp_path / "t.jsonl").read_bytes().splitlines()) == 16
        assert len(receiver.spans) == 16


@pytest.mark.parametrize("blocker", ["app provider", "console", "sampler"])
def test_what_only_the_sdk_gives_keeps_the_sdk(monkeypatch, blocker):
    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        exporters = "otlp"
        app_provider = None
        if blocker == "app provider":
            app_provider = TracerProvider(shutdown_on_exit=False)
        elif blocker == "console":
            exporters = "otlp,console"
        else:
            monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
        telemetry = configure(Settings.from_env(), exporters=exporters, set_global=False, tracer_provider=app_provider,
                              console_stream=open("/dev/null", "w"))  # noqa: SIM115 - closed with the process
        assert isinstance(telemetry.tracer_provider, TracerProvider)
        telemetry.shutdown()


def test_the_exporters_session_reads_the_proxy_environment_once_per_url(monkeypatch):
    from looptrace.instrumentation.exporters import ProbingSession

    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    session = ProbingSession(None)
    first = session.merge_environment_settings("http://collector.example/v1/traces", {}, None, None, None)
    assert first["proxies"]["http"] == "http://proxy.example:3128"  # honoured, as requests honours it
    first["proxies"].clear()  # what a caller does to its copy stays there
    monkeypatch.setenv("HTTP_PROXY", "http://other.example:3128")
    again = session.merge_environment_settings("http://collector.example/v1/traces", {}, None, None, None)
    assert again["proxies"]["http"] == "http://proxy.example:3128"  # read once, for the exporter's life
    other = session.merge_environment_settings("http://elsewhere.example/v1/traces", {}, None, None, None)
    assert other["proxies"]["http"] == "http://other.example:3128"
