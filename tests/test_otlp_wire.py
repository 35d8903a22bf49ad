"""looptrace's own OTLP protobuf encoding (issue 23): what the network exporters send and the export queue's journal
keeps, checked against the OpenTelemetry encoder it replaces, message by message, and back through a journal
recovery to the OTLP/JSON the spill file and the trace file hold."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)
from test_direct_spans import run_story

from looptrace.instrumentation import otlp_wire
from looptrace.instrumentation import semconv as sc
from looptrace.instrumentation.direct_spans import DirectTracerProvider

REMOTE_PARENT = SpanContext(0x5B8EFFF798038103D269B633813FC60C, 0xEEE19B7EC3C1B174, True,
                            TraceFlags(TraceFlags.SAMPLED))


def _direct_spans(produce) -> list[Any]:
    memory = InMemorySpanExporter()
    provider = DirectTracerProvider(Resource.create({"service.name": "booking-service"}))
    provider.add_exporting_processor(SimpleSpanProcessor(memory))
    produce(provider)
    return list(memory.get_finished_spans())


def _sdk_spans(produce) -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "booking-service"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    produce(provider)
    return list(memory.get_finished_spans())


def _every_field(provider: Any) -> None:
    """Spans using every field the encoders write: value types, events, links, a remote parent, statuses, a trace
    state, drop counts, two scopes (one with a version, attributes and a schema URL)."""
    plain = provider.get_tracer("plain")
    versioned = provider.get_tracer("versioned", "2.1", schema_url="https://opentelemetry.io/schemas/1.30.0",
                                    attributes={"scope.team": "ops"})
    parent = set_span_in_context(NonRecordingSpan(REMOTE_PARENT))
    with plain.start_as_current_span("remote child", context=parent, kind=SpanKind.SERVER, attributes={
            "text": "plain", "unicode": "résumé ✓ 日本", "empty": "", "flag": False, "on": True, "zero": 0,
            "negative": -7, "large": 2**63 - 1, "smallest": -(2**63), "ratio": 0.25, "nan": float("nan"),
            "texts": ("a", "b"), "numbers": (1, 2, 3), "floats": (1.5,), "bools": (True, False), "none": ()}) as span:
        span.add_event("thinking", {"step": 1, "note": "start"})
        span.add_event("bare")
        span.set_status(Status(StatusCode.ERROR, "it broke"))
        for index in range(130):  # beyond the default limit of 128: the oldest are dropped and counted
            span.set_attribute(f"many.{index}", index)
    link = Link(SpanContext(0x1234, 0x5678, False, TraceFlags(TraceFlags.SAMPLED)), {"link.kind": "follows"})
    with versioned.start_as_current_span("linked", kind=SpanKind.CLIENT, links=[link]) as span:
        span.set_status(StatusCode.OK)
        with plain.start_as_current_span("grandchild", kind=SpanKind.PRODUCER):
            pass


@pytest.mark.parametrize("make", [_direct_spans, _sdk_spans], ids=["direct spans", "SDK spans"])
@pytest.mark.parametrize("produce", [_every_field, lambda provider: run_story(tracer_provider=provider)],
                         ids=["every field", "an agent run"])
def test_a_batch_decodes_to_what_the_opentelemetry_encoder_builds(make, produce):
    spans = make(produce)
    assert len(spans) >= 3
    sent = ExportTraceServiceRequest.FromString(otlp_wire.export_request(spans))
    assert sent == encode_spans(spans)


def _flat(request: ExportTraceServiceRequest) -> list[tuple[bytes, bytes, str, str, bytes]]:
    return [(r.resource.SerializeToString(deterministic=True), s.scope.SerializeToString(deterministic=True),
             r.schema_url, s.schema_url, span.SerializeToString(deterministic=True))
            for r in request.resource_spans for s in r.scope_spans for span in s.spans]


def test_spans_of_several_providers_in_one_batch_keep_each_its_own_resource_and_scope():
    spans = _sdk_spans(_every_field) + _direct_spans(_every_field) + _sdk_spans(_every_field)[:1]
    sent = ExportTraceServiceRequest.FromString(otlp_wire.export_request(spans))
    # Grouped by the resource object (the SDK's encoder merges equal resources, at the cost of hashing their
    # attributes as JSON for every span): what each span travels with is the same.
    assert [len(r.scope_spans) for r in sent.resource_spans] == [2, 2, 1]
    assert sorted(_flat(sent)) == sorted(_flat(encode_spans(spans)))


def test_a_link_keeps_its_trace_state_which_the_opentelemetry_encoder_leaves_out():
    state_link = Link(SpanContext(0x1234, 0x5678, True, TraceFlags(1), trace_state=TraceState([("vendor", "abc")])))

    def produce(provider: Any) -> None:
        with provider.get_tracer("t").start_as_current_span("s", links=[state_link]):
            pass

    (span,) = _direct_spans(produce)
    (link,) = ExportTraceServiceRequest.FromString(otlp_wire.export_request([span])) \
        .resource_spans[0].scope_spans[0].spans[0].links
    assert link.trace_state == "vendor=abc" and link.flags == 0x300  # has is_remote, is remote


class _Opaque:
    def __str__(self) -> str:
        return "opaque thing"


def test_values_the_opentelemetry_encoder_drops_are_sent_repaired_and_named(caplog):
    def produce(provider: Any) -> None:
        span = provider.get_tracer("t").start_span("read \ud800 blob")
        span._attributes.update({"ok": "fine", "bad": "bytes \udc80 here", "huge": 2**70, "odd": _Opaque(),
                                 "nested": ("x", "\ud801")})
        span.add_event("seen \udfff")
        span.set_status(Status(StatusCode.ERROR, "failed on \ud800"))
        span.end()

    (span,) = _direct_spans(produce)
    with caplog.at_level(logging.WARNING):
        sent = ExportTraceServiceRequest.FromString(otlp_wire.export_request([span]))
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]  # no traceback per attribute
    (encoded,) = sent.resource_spans[0].scope_spans[0].spans
    values = {a.key: a.value for a in encoded.attributes}
    assert values["ok"].string_value == "fine"
    assert values["bad"].string_value == "bytes \ufffd here"
    assert values["huge"].string_value == str(2**70)
    assert values["odd"].string_value == "opaque thing"
    assert [v.string_value for v in values["nested"].array_value.values] == ["x", "\ufffd"]
    assert encoded.name == "read \ufffd blob" and encoded.events[0].name == "seen \ufffd"
    assert encoded.status.message == "failed on \ufffd"
    repaired = [v.string_value for v in values[sc.REPAIRED_ATTRIBUTES].array_value.values]
    assert set(repaired) == {"span.name", "bad", "huge", "odd", "nested", "event.name", "status.message"}


def test_a_span_is_encoded_once_for_the_journal_and_every_exporter():
    span = _direct_spans(_every_field)[0]
    first = otlp_wire.request_of_one(span)
    assert span.wire_message is not None  # kept on the span...
    span.wire_message = b"\x2a\x06marker"  # ...and what the next request sends (a Span whose name is "marker")
    sent = ExportTraceServiceRequest.FromString(otlp_wire.export_request([span]))
    assert sent.resource_spans[0].scope_spans[0].spans[0].name == "marker"
    assert ExportTraceServiceRequest.FromString(first) == encode_spans([span])  # the journal's form: the same span


def test_a_sequence_that_holds_itself_costs_only_that_value():
    looped: list[Any] = ["start"]
    looped.append(looped)

    def produce(provider: Any) -> None:
        span = provider.get_tracer("t").start_span("odd value")
        span._attributes.update({"looped": looped, "kept": "yes"})  # past the API's cleaning, as a bug might
        span.end()

    (span,) = _direct_spans(produce)
    (encoded,) = ExportTraceServiceRequest.FromString(otlp_wire.export_request([span])) \
        .resource_spans[0].scope_spans[0].spans
    values = {a.key: a.value for a in encoded.attributes}
    assert values["kept"].string_value == "yes"
    assert values["looped"].array_value.values[0].string_value == "start"
    assert [v.string_value for v in values[sc.REPAIRED_ATTRIBUTES].array_value.values] == ["looped"]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_fault_in_looptraces_encoder_costs_no_batch_the_sdks_encoder_sends_it(monkeypatch, protocol):
    from fakes.otlp_receiver import OTLPGrpcReceiver, OTLPReceiver

    from looptrace.instrumentation import wire_exporters
    from looptrace.instrumentation.exporters import otlp_span_exporter
    from looptrace.instrumentation.settings import Settings

    def broken(spans: Any) -> bytes:
        raise RuntimeError("a bug in the encoder")

    monkeypatch.setattr(wire_exporters, "export_request", broken)
    spans = _sdk_spans(_every_field)
    with (OTLPGrpcReceiver() if protocol == "grpc" else OTLPReceiver()) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        exporter = otlp_span_exporter(Settings.from_env().otlp)
        assert exporter.export(spans).name == "SUCCESS"
        received = receiver.wait_for_spans(len(spans))
        exporter.shutdown()
    assert sorted(s.name for s in received) == sorted(s.name for s in spans)
