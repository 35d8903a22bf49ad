"""The default trace file's direct path (issue 14, goal 1): when looptrace's own default telemetry has the trace file
as its only exporter, runs make API spans that write themselves to the file, without the SDK's span pipeline; the
file is the one the SDK path writes, span for span and attribute for attribute.

Each test hides any global provider an earlier in-process CLI test installed (``configure()`` sets one), so that an
Agent given no provider takes the embedded default, as it does in a fresh application.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes.otlp_receiver import _hex_ids_to_base64
from google.protobuf import json_format
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from looptrace.cli.app import main
from looptrace.cli.demo import DEMO_SYSTEM, Inventory, runaway_script
from looptrace.instrumentation import semconv as sc
from looptrace.instrumentation.direct_spans import DirectTracerProvider
from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.setup import configure, context_from_traceparent, default_telemetry
from looptrace.instrumentation.tracefile import encode
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.runtime import Agent, ScriptedModel, tool

VARIABLES = ("OTEL_", "LANGFUSE_", "LOOPTRACE_", "TRACEPARENT", "TRACESTATE")


@pytest.fixture(autouse=True)
def _fresh_application(monkeypatch):
    """No global provider (as in a new process) and no telemetry variables from the machine running the tests."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    for name in [n for n in __import__("os").environ if n.startswith(VARIABLES)]:
        monkeypatch.delenv(name)


def default_file(monkeypatch, path: Path) -> Path:
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(path))
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def run_story(**agent_options: Any) -> Any:
    """The demo's runaway story (a loop the detector flags and nudges, so events too) with a tool that fails once."""
    inventory = Inventory()

    @tool
    def audit(item_id: str, api_key: str = "") -> str:
        """Audit an item's booking history.

        Args:
            item_id: The item to audit.
            api_key: The audit service's key.
        """
        raise RuntimeError(f"audit log for {item_id} is locked")

    script = [{"stop_reason": "tool_use", "content": [
        {"type": "text", "text": "Auditing first."},
        {"type": "tool_use", "id": "toolu_audit", "name": "audit", "input": {"item_id": "EQ-001", "api_key": "sk-secret-1"}}],
        "usage": {"input_tokens": 50, "output_tokens": 9, "cache_read_input_tokens": 7}}, *runaway_script()]
    agent = Agent("claude-sonnet-5-5", tools=[*inventory.tools(), audit], system=DEMO_SYSTEM, name="booking",
                  client=ScriptedModel(script), **agent_options)
    return agent.run("Reserve a projector for 2026-10-08.", session_id="s-1", user_id="u-1", tags=["demo"],
                     metadata={"team": "ops"})


def _without_loop_time(attributes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An event's attributes without a loop's wall time (`looptrace.anomaly.duration_s`): a time, like the others."""
    return [a for a in attributes if a.get("key") != "looptrace.anomaly.duration_s"]


def normalised(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans of a file with ids replaced by their order of appearance and times left out: what two runs of the
    same script must share."""
    labels: dict[str, str] = {}

    def label(value: str) -> str:
        return labels.setdefault(value, f"id{len(labels)}")

    spans = []
    for document in documents:
        assert list(document) == ["resourceSpans"] and len(document["resourceSpans"]) == 1
        resource_spans = document["resourceSpans"][0]
        (scope_spans,) = resource_spans["scopeSpans"]
        for span in scope_spans["spans"]:
            span = dict(span)
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in span:
                    span[key] = label(span[key])
            for key in ("startTimeUnixNano", "endTimeUnixNano"):
                assert int(span.pop(key)) > 0
            span["events"] = [{k: _without_loop_time(v) if k == "attributes" else v
                               for k, v in event.items() if k != "timeUnixNano"} for event in span.get("events", ())]
            spans.append({"resource": resource_spans["resource"], "scope": scope_spans["scope"], "span": span})
    return spans


def strict_decode(document: dict[str, Any]) -> trace_pb2.TracesData:
    """The official protobuf JSON mapping, refusing unknown fields (OTLP/JSON's hex ids mapped to bytes first)."""
    return json_format.ParseDict(_hex_ids_to_base64(document), trace_pb2.TracesData(), ignore_unknown_fields=False)


# --- the default path and its file ----------------------------------------------------------------------------------


def test_an_agent_given_nothing_writes_the_trace_file_through_the_direct_path(monkeypatch, tmp_path):
    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    result = run_story()
    default = default_telemetry()
    assert isinstance(default.tracer_provider, DirectTracerProvider)
    assert default.meter_provider is None  # no reader would ever see its metrics: none are recorded
    spans = list(read_spans(path))
    assert {s.trace_id for s in spans} == {result.trace_id}
    names = [s.name for s in spans]
    assert names.count("execute_tool audit") == 1 and names[-1] == "invoke_agent booking"


def test_the_direct_file_is_span_for_span_what_the_sdk_path_writes(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "booking-service")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=ops")
    direct = default_file(monkeypatch, tmp_path / "direct.jsonl")
    run_story()
    sdk_path = tmp_path / "sdk.jsonl"
    telemetry = configure(Settings.from_env(), exporters="file", trace_file=sdk_path, set_global=False)
    run_story(tracer_provider=telemetry.tracer_provider)
    telemetry.shutdown()

    ours, theirs = normalised(lines(direct)), normalised(lines(sdk_path))
    assert len(ours) == len(theirs) == 16  # the agent, 5 turns, 5 chats, 5 tool calls
    for mine, sdk in zip(ours, theirs, strict=True):
        assert mine == sdk  # resource, scope, ids and parent links, kind, name, attributes in order, events, status
    resource = {a["key"]: a["value"] for a in ours[0]["resource"]["attributes"]}
    assert resource["service.name"] == {"stringValue": "booking-service"}
    assert resource["team"] == {"stringValue": "ops"}
    kinds = {s["span"]["name"].split()[0]: s["span"]["kind"] for s in ours}
    assert kinds == {"chat": 3, "execute_tool": 1, "turn": 1, "invoke_agent": 1}  # CLIENT 3, INTERNAL 1
    events = [e["name"] for s in ours for e in s["span"]["events"]]
    assert sc.ANOMALY_EVENT in events
    failed = next(s["span"] for s in ours if s["span"]["name"] == "execute_tool audit")
    assert failed["status"]["code"] == 2 and "locked" in failed["status"]["message"]
    arguments = next(a["value"]["stringValue"] for a in failed["attributes"] if a["key"] == "gen_ai.tool.call.arguments")
    assert "[REDACTED]" in arguments and "sk-secret-1" not in json.dumps(ours)  # secrets stay off the file


def test_every_line_round_trips_through_the_official_decoder_and_encoder(monkeypatch, tmp_path):
    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    run_story()
    documents = lines(path)
    decoded = [strict_decode(document) for document in documents]
    assert sum(len(ss.spans) for data in decoded for rs in data.resource_spans for ss in rs.scope_spans) == 16
    for data, document in zip(decoded, documents, strict=True):
        span = data.resource_spans[0].scope_spans[0].spans[0]
        assert span.span_id.hex() == document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"]


def test_a_direct_span_encodes_as_the_official_encoder_encodes_it(tmp_path):
    provider = DirectTracerProvider(Resource.create({"service.name": "svc"}), tmp_path / "t.jsonl")
    tracer = provider.get_tracer("looptrace", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.26.0")
    ended = []
    remote = trace.SpanContext(0x5AB, 0xC0FFEE, is_remote=True, trace_flags=trace.TraceFlags(1))
    with tracer.start_as_current_span("invoke_agent a", context=trace.set_span_in_context(trace.NonRecordingSpan(remote)),
                                      kind=SpanKind.SERVER, links=[Link(remote, {"why": "caller"})],
                                      attributes={"s": "é\n\"", "i": -7, "f": 1.5, "b": False, "l": ["a", "b"]}) as root:
        root.add_event("looptrace.anomaly", {"type": "cycle", "n": 2})
        root.set_status(Status(StatusCode.ERROR, "boom"))
        ended.append(root)
        with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT) as chat:
            chat.set_status(Status(StatusCode.OK))
            ended.append(chat)
    for span in ended:
        assert json.loads(encode.encode_line(span)) == encode_spans([span]).to_dict()


# --- reading it back ------------------------------------------------------------------------------------------------


def test_traces_show_and_detect_read_the_default_file(monkeypatch, tmp_path, capsys):
    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    result = run_story()
    capsys.readouterr()
    assert main(["traces", "show", "--trace-id", result.trace_id, "--file", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "execute_tool audit" in shown and "invoke_agent booking" in shown
    assert main(["detect", str(path)]) == 1  # anomalies found
    assert "repeated_call" in capsys.readouterr().out


# --- an API implementation like any other ---------------------------------------------------------------------------


def test_inside_a_tool_the_current_span_is_the_tool_span_and_propagates(monkeypatch, tmp_path):
    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    seen: dict[str, Any] = {}

    @tool
    def fetch(item: str) -> str:
        """Fetch an item.

        Args:
            item: Which one.
        """
        span = trace.get_current_span()
        seen["span_id"] = format(span.get_span_context().span_id, "016x")
        seen["recording"] = span.is_recording()
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        seen["traceparent"] = carrier["traceparent"]
        span.set_attribute("app.note", "set by the tool")
        return "ok"

    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "fetch",
                                                        "input": {"item": "x"}}]},
              {"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]}]
    result = Agent("claude-sonnet-5-5", tools=[fetch], client=ScriptedModel(script)).run("go")
    tool_span = next(s for s in read_spans(path) if s.name == "execute_tool fetch")
    assert seen["recording"] and seen["span_id"] == tool_span.span_id
    assert seen["traceparent"] == f"00-{result.trace_id}-{tool_span.span_id}-03"  # sampled, random trace id
    assert tool_span.attributes["app.note"] == "set by the tool"


def test_a_run_joins_a_traceparent_as_the_sdk_path_does(monkeypatch, tmp_path):
    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    parent_id = "00f067aa0ba902b7"
    script = [{"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]}]
    # A sampled caller's trace is joined (agent, turn, chat); an unsampled one's records nothing, as with the SDK.
    for trace_id, flags, count in (("4bf92f3577b34da6a3ce929d0e0e4736", "01", 3), ("5" * 32, "00", 0)):
        context = context_from_traceparent(f"00-{trace_id}-{parent_id}-{flags}", "vendor=x")
        token = otel_context.attach(context)
        try:
            Agent("claude-sonnet-5-5", client=ScriptedModel(script), detector=False).run("hi")
        finally:
            otel_context.detach(token)
        spans = [s for s in read_spans(path) if s.trace_id == trace_id]
        assert len(spans) == count
        if count:
            root = next(s for s in spans if s.name.startswith("invoke_agent"))
            assert root.parent_span_id == parent_id
    assert {document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceState"] for document in lines(path)} \
        == {"vendor=x"}


def test_an_application_that_installs_an_sdk_provider_still_gets_sdk_spans(monkeypatch, tmp_path):
    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    memory = InMemorySpanExporter()
    app_provider = TracerProvider()
    app_provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", app_provider)
    run_story()
    assert len(memory.get_finished_spans()) == 16
    assert not path.exists()  # the application's provider, not looptrace's default


# --- what only the SDK does: the environment sends runs to the SDK path ----------------------------------------------


@pytest.mark.parametrize("env, spans_kept", [
    ({"OTEL_TRACES_SAMPLER": "always_off"}, lambda spans: not spans),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}, lambda spans: not spans),
    ({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "3"}, lambda spans: spans and all(len(s["attributes"]) <= 3
                                                                           and s["droppedAttributesCount"]
                                                                           for s in spans)),
    ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "4"}, lambda spans: spans and all(
        len(a["value"].get("stringValue", "")) <= 4 for s in spans for a in s["attributes"])),
    ({"OTEL_SPAN_EVENT_COUNT_LIMIT": "0"}, lambda spans: spans and not any(s.get("events") for s in spans)),
])
def test_a_sampler_or_span_limits_in_the_environment_are_honoured_by_the_sdk_path(monkeypatch, tmp_path, env,
                                                                                    spans_kept):
    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    run_story()
    assert not isinstance(default_telemetry().tracer_provider, DirectTracerProvider)
    spans = [span for document in (lines(path) if path.exists() else [])
             for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]]
    assert spans_kept(spans)


def test_the_default_sampler_named_explicitly_keeps_the_direct_path(monkeypatch, tmp_path):
    default_file(monkeypatch, tmp_path / "traces.jsonl")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "ParentBased_Always_On")
    assert isinstance(default_telemetry().tracer_provider, DirectTracerProvider)


# --- attribute values: what the SDK would store ---------------------------------------------------------------------


class Weird:
    def __str__(self) -> str:
        return "weird"


def apply_api_calls(tracer: trace.Tracer) -> trace.Span:
    """The same API calls, whatever the tracer: values the SDK cleans, limits it enforces, statuses it refuses."""
    span = tracer.start_span("s", attributes={"list": [1, 2], "none": None, "weird": Weird(), "": "empty key",
                                              "tuple": ("a", "b"), "mixed": ("a", [1])})
    span.set_attribute("later", 1.5)
    span.set_attribute("list", ["again"])  # set again: moves to the end
    span.set_attribute(7, "not text")  # type: ignore[arg-type]
    span.set_attributes({f"many.{i}": i for i in range(130)})  # past the 128 limit: the oldest go first
    span.set_attributes({"many.100": "again", "many.101": 101})  # set again, even to the same value: to the end
    span.set_attributes({"mapping": {"k": [1, {"deep": True}]}, b"bytes".decode(): b"raw"})
    span.add_event("e", {"list": ["x"], "weird": Weird()})
    span.set_status(StatusCode.UNSET)
    span.set_status(Status(StatusCode.ERROR, "bad"), "ignored description")
    span.set_status(StatusCode.OK)
    span.set_status(Status(StatusCode.ERROR, "after ok"))  # an OK status is final
    span.update_name("renamed")
    try:
        raise ValueError("boom")
    except ValueError as error:
        span.record_exception(error, {"extra": 1})
    span.end()
    span.set_attribute("after.end", 1)
    span.end()
    return span


def test_odd_attribute_values_end_up_as_the_sdk_stores_them(tmp_path, caplog):
    memory = InMemorySpanExporter()
    sdk = TracerProvider(resource=Resource.create({}))
    sdk.add_span_processor(SimpleSpanProcessor(memory))
    direct = DirectTracerProvider(Resource.create({}), tmp_path / "t.jsonl")
    with caplog.at_level(logging.WARNING):
        apply_api_calls(sdk.get_tracer("t"))
        sdk_warnings = [r.getMessage() for r in caplog.records]
        caplog.clear()
        direct_span = apply_api_calls(direct.get_tracer("t"))
        direct_warnings = [r.getMessage() for r in caplog.records]
    (sdk_span,) = memory.get_finished_spans()
    ours, theirs = json.loads(encode.encode_line(direct_span)), json.loads(encode.encode_line(sdk_span))
    assert normalised([ours]) == normalised([theirs])
    assert normalised(lines(tmp_path / "t.jsonl")) == normalised([theirs])  # what end() wrote
    span = ours["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["droppedAttributesCount"] == theirs["resourceSpans"][0]["scopeSpans"][0]["spans"][0][
        "droppedAttributesCount"] > 0
    assert sorted(direct_warnings) == sorted(sdk_warnings)


def test_a_growing_conversation_is_encoded_exactly_span_after_span(tmp_path):
    """Each chat span's input messages extend the previous ones: the encoder escapes only what is new, and must
    write exactly the official encoding every time, whatever the characters and however the text changes."""
    provider = DirectTracerProvider(Resource.create({}), tmp_path / "t.jsonl")
    tracer = provider.get_tracer("looptrace")
    pieces = ['{"role":"user","parts":[{"type":"text","content":"é \\" \\\\ \\n 😀 \u2028 \x01"}]}', '{"a":"b"}', "x" * 700]
    history = ["[" + pieces[2] + "]"]
    for turn in range(12):
        if turn == 7:  # the history capped: the oldest messages dropped, no longer an extension
            history.append("[" + ",".join(pieces[:2]) + "]")
        else:
            history.append(history[-1][:-1] + "," + pieces[turn % 2] + "]")
    for text in history:
        span = tracer.start_span("chat m", attributes={"gen_ai.input.messages": text, "other": text + "!"})
        span.end()
        assert json.loads(encode.encode_line(span)) == encode_spans([span]).to_dict()
    read_back = [s.attributes["gen_ai.input.messages"] for s in read_spans(tmp_path / "t.jsonl")]
    assert read_back == history


def test_an_async_run_nests_its_spans_the_same_way(monkeypatch, tmp_path):
    import asyncio

    path = default_file(monkeypatch, tmp_path / "traces.jsonl")
    seen = []

    async def fetch(item: str) -> str:
        """Fetch an item.

        Args:
            item: Which one.
        """
        seen.append(format(trace.get_current_span().get_span_context().span_id, "016x"))
        return "ok"

    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "fetch",
                                                        "input": {"item": "x"}}]},
              {"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]}]
    agent = Agent("claude-sonnet-5-5", tools=[tool(fetch)], client=ScriptedModel(script), detector=False)
    asyncio.run(agent.arun("go"))
    spans = {s.span_id: s for s in read_spans(path)}
    (tool_span,) = [s for s in spans.values() if s.name == "execute_tool fetch"]
    assert seen == [tool_span.span_id]
    turn = spans[tool_span.parent_span_id]
    assert turn.name == "turn" and spans[turn.parent_span_id].name == "invoke_agent agent"


def decorated_calls(tracer: Any) -> list[str]:
    """``start_as_current_span`` used as the API documents it: a context manager, and a decorator on a function and
    on a coroutine function (whose span must last until the coroutine is done), each call its own span. Returns the
    id of the current span each body saw."""
    import asyncio

    order = []

    def current() -> str:
        return format(trace.get_current_span().get_span_context().span_id, "016x")

    @tracer.start_as_current_span("sync work", attributes={"kind": "sync"})
    def work(n: int) -> int:
        order.append(current())
        if n < 0:
            raise ValueError("negative")
        return n

    @tracer.start_as_current_span("async work", kind=SpanKind.CLIENT)
    async def awork(n: int) -> int:
        await asyncio.sleep(0)
        order.append(current())  # after an await: still inside its own span
        return n

    with tracer.start_as_current_span("outer", end_on_exit=True) as outer:
        assert (work(1), work(2), asyncio.run(awork(3))) == (1, 2, 3)
        with pytest.raises(ValueError):
            work(-1)
        order.append(current())
        assert outer.is_recording()
    assert work.__name__ == "work" and awork.__name__ == "awork"
    return order


def without_stack_traces(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for span in spans:
        for event in span["span"]["events"]:
            for attribute in event.get("attributes", ()):
                if attribute["key"] == "exception.stacktrace":
                    text = attribute["value"]["stringValue"]
                    assert text.startswith("Traceback (most recent call last):") and text.endswith("ValueError: negative\n")
                    attribute["value"] = {"stringValue": "<stack trace>"}
    return spans


def test_start_as_current_span_decorates_functions_and_coroutines_as_the_sdk_does(tmp_path):
    sdk = TracerProvider(resource=Resource.create({}))
    memory = InMemorySpanExporter()
    sdk.add_span_processor(SimpleSpanProcessor(memory))
    direct = DirectTracerProvider(Resource.create({}), tmp_path / "t.jsonl")
    seen_by_ours, seen_by_theirs = decorated_calls(direct.get_tracer("t")), decorated_calls(sdk.get_tracer("t"))
    ours = without_stack_traces(normalised(lines(tmp_path / "t.jsonl")))
    theirs = without_stack_traces(normalised([json.loads(encode.encode_line(s)) for s in memory.get_finished_spans()]))
    assert ours == theirs  # (the stack traces differ by the frames of each implementation, and end the same)
    assert [s["span"]["name"] for s in ours] == ["sync work", "sync work", "async work", "sync work", "outer"]
    names = {s.span_id: s.name for s in read_spans(tmp_path / "t.jsonl")}
    assert [names[span_id] for span_id in seen_by_ours] == [s["span"]["name"] for s in ours]
    names = {format(s.context.span_id, "016x"): s.name for s in memory.get_finished_spans()}
    assert [names[span_id] for span_id in seen_by_theirs] == [s["span"]["name"] for s in ours]
    failed = ours[3]["span"]
    assert failed["status"] == {"code": 2, "message": "ValueError: negative"}
    assert [e["name"] for e in failed["events"]] == ["exception"]
    assert {s["span"].get("parentSpanId") for s in ours[:4]} == {ours[4]["span"]["spanId"]}


FORKED_CHILD = """
import os, sys
from pathlib import Path
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from looptrace.instrumentation.direct_spans import DirectTracerProvider
from looptrace.instrumentation.tracefile import TraceFileProcessor

folder = Path(sys.argv[1])
direct = DirectTracerProvider(Resource.create({"service.name": "svc", "team": "ops"}), folder / "direct.jsonl")
sdk = TracerProvider(resource=Resource.create({"service.name": "svc", "team": "ops"}), shutdown_on_exit=False)
sdk.add_span_processor(TraceFileProcessor(folder / "sdk.jsonl"))
child = os.fork()
name = "child" if child == 0 else "parent"
for provider in (direct, sdk):
    provider.get_tracer("t").start_span(name).end()
    provider.shutdown()
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_writes_the_resource_the_sdk_path_writes(tmp_path):
    done = subprocess.run([sys.executable, "-c", FORKED_CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr

    def resources(path: Path) -> dict[str, dict[str, Any]]:
        return {document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"]:
                {a["key"]: a["value"] for a in document["resourceSpans"][0]["resource"]["attributes"]}
                for document in lines(path)}

    ours, theirs = resources(tmp_path / "direct.jsonl"), resources(tmp_path / "sdk.jsonl")
    assert ours == theirs and set(ours) == {"parent", "child"}
    assert ours["child"]["service.instance.id"] != ours["parent"]["service.instance.id"]  # the child's own
    assert ours["child"]["team"] == {"stringValue": "ops"} and ours["child"]["service.name"] == {"stringValue": "svc"}
