"""Text the OTLP protobuf encoders refuse reaches the backends repaired, as the trace file already keeps it: a lone
surrogate becomes U+FFFD (the attribute is kept, no traceback), a key that is not text is sent as its text with one
warning, and the span says which keys were repaired. Asserted on what the receivers decode from the protobuf."""

from __future__ import annotations

import logging

import pytest
from fakes.otlp_receiver import OTLPGrpcReceiver, OTLPReceiver, langfuse_view
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from looptrace.instrumentation.export.push import push
from looptrace.instrumentation.export.setup import configure
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.tracefile import encodable
from looptrace.instrumentation.tracefile.undelivered import UndeliveredList
from looptrace.instrumentation.tracefile.write import TraceFileWriter
from looptrace.runtime import Agent, ScriptedModel, tool

PUBLIC, SECRET = "pk-lf-test", "sk-lf-test-secret"
BAD = "bytes \ud800 decoded badly"


@tool
def read_blob(name: str) -> str:
    """Read a blob as text."""
    return BAD


SCRIPT = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_blob",
                                                   "input": {"name": "blob"}}]},
          {"stop_reason": "end_turn", "content": [{"type": "text", "text": "It was unreadable."}]}]


def _tracebacks(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING]


def test_a_lone_surrogate_in_a_tool_result_reaches_langfuse_and_a_grpc_collector_repaired(tmp_path, caplog):
    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse, \
            OTLPGrpcReceiver() as collector:
        settings = Settings.from_env(environ={
            "LANGFUSE_PUBLIC_KEY": PUBLIC, "LANGFUSE_SECRET_KEY": SECRET, "LANGFUSE_BASE_URL": langfuse.base_url,
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_METRICS_EXPORTER": "none"})
        telemetry = configure(settings, exporters="langfuse,otlp", set_global=False,
                              undelivered_file=tmp_path / "undelivered.jsonl")
        with caplog.at_level(logging.WARNING):
            Agent("claude-sonnet-5-5", tools=[read_blob], client=ScriptedModel(SCRIPT),
                  tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider).run("read it")
            telemetry.shutdown()
        for received in (langfuse.wait_for_spans(6), collector.wait_for_spans(6)):
            tool_span = next(s for s in received if s.name == "execute_tool read_blob")
            assert tool_span.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "bytes \ufffd decoded badly"
            assert sc.GEN_AI_TOOL_CALL_RESULT in tool_span.attributes[sc.REPAIRED_ATTRIBUTES]
            second_chat = [s for s in received if s.name.startswith("chat ")][1]
            assert "\ufffd" in second_chat.attributes[sc.GEN_AI_INPUT_MESSAGES]  # the history that quotes it, kept
        assert "\ufffd" in str(langfuse_view(tool_span).output)
    assert _tracebacks(caplog.records) == []
    assert not (tmp_path / "undelivered.jsonl").exists()  # delivered, not left behind as a failed batch


def test_a_surrogate_in_a_span_name_and_status_no_longer_fails_the_whole_batch(tmp_path, caplog):
    with OTLPReceiver() as collector:
        telemetry = configure(Settings.from_env(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                                                         "OTEL_METRICS_EXPORTER": "none"}),
                              exporters="otlp", set_global=False, undelivered_file=tmp_path / "undelivered.jsonl")
        tracer = telemetry.tracer_provider.get_tracer("test")
        with caplog.at_level(logging.WARNING):
            with tracer.start_as_current_span("tool \udc80") as span:
                span.set_status(Status(StatusCode.ERROR, "failed on \udc80"))
            with tracer.start_as_current_span("a healthy neighbour"):
                pass
            telemetry.shutdown()
        received = {s.name: s for s in collector.wait_for_spans(2)}
    assert received["tool \ufffd"].status_message == "failed on \ufffd"
    assert set(received["tool \ufffd"].attributes[sc.REPAIRED_ATTRIBUTES]) == {"span.name", "status.message"}
    assert "a healthy neighbour" in received and _tracebacks(caplog.records) == []


@pytest.fixture
def undelivered_with_an_integer_key(tmp_path):
    """A trace file whose one listed span has an attribute under the key 5 (a number, not text), as a hand edit or
    another producer could leave it."""
    finished = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    with provider.get_tracer("test").start_as_current_span("work", attributes={"color": "blue", "size": 3}):
        pass
    trace_file = tmp_path / "traces.jsonl"
    writer = TraceFileWriter(trace_file)
    writer.write_span(finished.get_finished_spans()[0])
    writer.close()
    trace_file.write_text(trace_file.read_text().replace('{"key":"color"', '{"key":5'))
    listing = UndeliveredList(tmp_path / "undelivered.jsonl", trace_file=trace_file)
    listing.append("otlp", finished.get_finished_spans())
    return listing


def test_an_integer_key_in_the_trace_file_is_pushed_as_text(undelivered_with_an_integer_key, caplog):
    with OTLPReceiver() as collector, caplog.at_level(logging.WARNING):
        report = push(undelivered_with_an_integer_key.path,
                      settings=Settings.from_env(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}))
        [span] = collector.wait_for_spans(1)
    assert report.ok and report.sent == {"otlp": 1}
    assert (span.attributes["5"], span.attributes["size"]) == ("blue", 3)
    assert _tracebacks(caplog.records) == []


# --- why the repair step exists: what the SDK's own encoders do with each kind of value -----------------------------


def _span_with(value):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_attribute("v", value)
    (finished,) = exporter.get_finished_spans()
    return finished


def _protobuf_keeps(span) -> bool:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    logging.disable(logging.CRITICAL)  # the encoder logs a traceback per attribute it drops
    try:
        request = encode_spans([span])
    finally:
        logging.disable(logging.NOTSET)
    return any(kv.key == "v" for kv in request.resource_spans[0].scope_spans[0].spans[0].attributes)


def _json_value(span) -> dict:
    from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans

    (kv,) = [kv for kv in encode_spans([span]).to_dict()["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
             ["attributes"] if kv["key"] == "v"]
    return kv["value"]


@pytest.mark.parametrize("value", ["half \ud83d", 2**70])
def test_the_sdk_encoders_lose_or_corrupt_these_values_so_looptrace_repairs_them_first(value):
    span = _span_with(value)
    assert not _protobuf_keeps(span)  # the protobuf encoder drops the attribute
    written = _json_value(span)  # the JSON encoder writes what no OTLP reader takes
    if isinstance(value, int):
        assert int(written["intValue"]) > 2**63 - 1  # beyond int64: the Collector refuses the line
    else:
        with pytest.raises(UnicodeEncodeError):
            written["stringValue"].encode("utf-8")  # not Unicode text: no UTF-8 file or request can hold it
    (repaired,) = encodable.encodable_spans([span])
    assert _protobuf_keeps(repaired) and repaired.attributes[sc.REPAIRED_ATTRIBUTES] == ("v",)


@pytest.mark.parametrize("value, written", [
    (float("nan"), {"doubleValue": "NaN"}), (float("-inf"), {"doubleValue": "-Infinity"}),
    (object(), None),  # the SDK replaces an object of another type (by its text, or None) when it is set
])
def test_the_sdk_encoders_take_these_values_as_they_are_so_nothing_is_repaired(value, written):
    span = _span_with(value)
    assert _protobuf_keeps(span)
    if written is not None:
        assert _json_value(span) == written
    else:
        assert type(span.attributes.get("v")) in (str, type(None))
    assert encodable.encodable_spans([span])[0] is span
