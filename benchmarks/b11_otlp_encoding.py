"""Benchmark 11: encoding a span for the network, looptrace's own protobuf against the OpenTelemetry encoder.

The spans are a real looptrace run's (the benchmark scenario, 10 turns, content on: input and output messages, system
instructions, tool definitions), made on the direct path as ``configure(exporters="otlp")`` makes them. Three ways
to turn them into what the OTLP exporters send, interleaved in one process, CPU per span:

* ``otlp_wire``: what looptrace does now: each span's ``Span`` bytes made once (kept on the span), its journal line
  (base64 of a one-span request), then the batch's request glued from the kept bytes;
* the OpenTelemetry encoder alone: ``encode_spans(spans).SerializePartialToString()``, what the SDK's exporters do;
* looptrace before issue 23's change: the journal's OTLP/JSON line per span, the cleaning pass for text the SDK's
  encoder would drop (``encodable``), then the SDK's encoder.

Before timing, the three are checked to describe the same spans (the protobuf parsed back and compared), so the
figures never compare a fast wrong encoding with a right one.
"""

from __future__ import annotations

import binascii
from typing import Any

from .common import Row, interleave, median

TURNS = 10


def _spans() -> list[Any]:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from looptrace.instrumentation.direct_spans import DirectTracerProvider
    from looptrace.runtime import Agent
    from looptrace.runtime.models import ScriptedModel

    from . import scenario

    provider = DirectTracerProvider(Resource.create({"service.name": "bench"}))
    memory = InMemorySpanExporter()
    provider.add_exporting_processor(SimpleSpanProcessor(memory))
    agent = Agent(scenario.MODEL, tools=[scenario.lookup], system=scenario.SYSTEM, limits=scenario.LIMITS,
                  name="bench", client=ScriptedModel(scenario.script(TURNS)), tracer_provider=provider,
                  detector=False)
    agent.run(scenario.task("run-0"))
    return list(memory.get_finished_spans())


def run(quick: bool = False) -> list[Row]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from looptrace.instrumentation import otlp_wire
    from looptrace.instrumentation.encodable import encodable_spans
    from looptrace.instrumentation.tracefile.encode import encode_line

    spans = _spans()
    assert ExportTraceServiceRequest.FromString(otlp_wire.export_request(spans)) == encode_spans(spans)
    reps = 20 if quick else 200

    def timed(encode: Any) -> Any:
        def sample() -> float:
            import time

            started = time.process_time()
            encode()
            return time.process_time() - started

        return sample

    def wire() -> None:
        for span in spans:
            span.wire_message = None  # encoded afresh each sample, as each span is once in a run
        for span in spans:
            binascii.b2a_base64(otlp_wire.request_of_one(span), newline=False)
        otlp_wire.export_request(spans)

    def sdk() -> None:
        encode_spans(spans).SerializePartialToString()

    def before() -> None:
        for span in spans:
            encode_line(span)
        encode_spans(encodable_spans(spans)).SerializePartialToString()

    samples = interleave({"wire": timed(wire), "sdk": timed(sdk), "before": timed(before)}, reps, warmup=3)
    per_span = {name: median(values) / len(spans) for name, values in samples.items()}
    how = f"{len(spans)} spans of a {TURNS}-turn run with content, {reps} interleaved repetitions, CPU time"
    return [
        Row("11 OTLP encoding", "looptrace (otlp_wire: span bytes once, journal line, batch request) per span",
            f"{per_span['wire'] * 1e6:.1f} µs", "", None, how),
        Row("11 OTLP encoding", "the OpenTelemetry encoder (encode_spans + serialise) per span",
            f"{per_span['sdk'] * 1e6:.1f} µs", "", None, how),
        Row("11 OTLP encoding", "looptrace before issue 23's change (journal JSON + cleaning + SDK encoder) per span",
            f"{per_span['before'] * 1e6:.1f} µs", "", None, how),
        Row("11 OTLP encoding", "looptrace / the OpenTelemetry encoder", f"{per_span['wire'] / per_span['sdk']:.2f}x",
            "", None, how),
        Row("11 OTLP encoding", "looptrace / looptrace before", f"{per_span['wire'] / per_span['before']:.2f}x",
            "", None, how),
    ]
