"""The local trace file and the undelivered list: written exactly in the OTLP file format, never losing a span to a bad
value, a crash or a full queue; read back in one pass by CLI commands that survive whatever a file holds.

Issue 14 (goals 1 and 3: the direct writer, one-pass readers) and issue 12 (items 1-6, 11, 16, 18, 23).
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fakes.otlp_receiver import Delay, OTLPReceiver, parse_otlp_json
from opentelemetry import trace
from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from looptrace.cli.app import main
from looptrace.instrumentation.export.push import push
from looptrace.instrumentation.export.setup import configure
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.settings import Settings
from looptrace.instrumentation.tracefile import encode
from looptrace.instrumentation.tracefile.read import read_lines, read_spans, trace_files
from looptrace.instrumentation.tracefile.undelivered import UndeliveredList
from looptrace.instrumentation.tracefile.write import (
    OTLPJsonFileExporter,
    Rotation,
    TraceFileProcessor,
    TraceFileWriter,
)
from looptrace.runtime import Agent, ScriptedModel, tool

# --- helpers --------------------------------------------------------------------------------------------------------


def finished_spans(**resource: Any) -> list[Any]:
    """Spans covering what the encoder must get right: every value kind, events, links, statuses, a remote parent,
    two scopes under one resource."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", **resource}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("looptrace", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.26.0")
    other = provider.get_tracer("other-library")
    remote = trace.SpanContext(0x5AB, 0xC0FFEE, is_remote=True, trace_flags=trace.TraceFlags(1),
                               trace_state=trace.TraceState([("vendor", "x")]))
    outside = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    with tracer.start_as_current_span("invoke_agent a", context=outside,
                                      kind=SpanKind.SERVER, links=[Link(remote, {"why": "caller"})],
                                      attributes={"s": "é\n\"\\ \u2028 \U0001F600", "i": -7, "big": 2**63 - 1,
                                                  "f": 1.5, "b": False, "l": ["a", "b"], "li": [1, 2],
                                                  "lf": [0.25], "lb": [True], "empty": []}) as root:
        root.add_event("looptrace.anomaly", {"type": "cycle", "n": 2})
        root.set_status(Status(StatusCode.ERROR, "boom"))
        with other.start_as_current_span("chat m", kind=SpanKind.CLIENT) as chat:
            chat.set_status(Status(StatusCode.OK))
        with tracer.start_as_current_span("execute_tool t"):
            pass
    return list(memory.get_finished_spans())


def tool_run(path: Path, tool_result: Any) -> Any:
    """A two-turn run whose one tool returns ``tool_result``, exported by the default file writer."""
    @tool
    def fetch(item: str) -> Any:
        """Fetch an item.

        Args:
            item: Which one.
        """
        return tool_result

    telemetry = configure(exporters="file", trace_file=path, set_global=False)
    script = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "toolu_1", "name": "fetch",
                                                        "input": {"item": "x"}}],
               "usage": {"input_tokens": 10, "output_tokens": 5}},
              {"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}],
               "usage": {"input_tokens": 20, "output_tokens": 5}}]
    result = Agent("claude-sonnet-4-5", tools=[fetch], client=ScriptedModel(script),
                   tracer_provider=telemetry.tracer_provider).run("go")
    telemetry.shutdown()
    return result


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def demo_file(tmp_path, capsys) -> Path:
    path = tmp_path / "traces.jsonl"
    main(["demo", "--json", "--trace-file", str(path)])
    main(["demo", "runaway", "--json", "--trace-file", str(path)])
    capsys.readouterr()
    return path


def one_line(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def otlp_line(*spans: dict[str, Any], resource_spans: Any = None) -> str:
    return one_line({"resourceSpans": resource_spans if resource_spans is not None else
                     [{"resource": {}, "scopeSpans": [{"scope": {"name": "x"}, "spans": list(spans)}]}]})


def root_span(trace_id: str = "ab" * 16, span_id: str = "cd" * 8, **attributes: Any) -> dict[str, Any]:
    return {"traceId": trace_id, "spanId": span_id, "name": "invoke_agent bot", "kind": 1,
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                           *({"key": k, "value": v} for k, v in attributes.items())]}


# --- issue 14, goal 1: the direct writer, exactly the file exporter's format ----------------------------------------


def test_each_span_is_written_exactly_as_the_official_otlp_json_encoder_writes_it():
    # With its resource's id beside the resource; a line whose file already holds the resource keeps its service
    # name and the id (encode.py's note): the reader gives every span its whole resource back.
    spans = finished_spans()
    assert json.loads(encode.encode_traces_data(spans)) == encode_spans(spans).to_dict()
    for span in spans:
        official = encode_spans([span]).to_dict()
        identity = {"key": "looptrace.resource.id", "value": {"stringValue": encode.resource_key(span.resource)}}
        line = encode.encode_line(span)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        resource = official["resourceSpans"][0]["resource"]
        assert json.loads(line) == {"resourceSpans": [{**official["resourceSpans"][0], "resource": {
            **resource, "attributes": [*resource["attributes"], identity]}}]}
        later = json.loads(encode.encode_line(span, resource_known=True))
        named = [item for item in resource["attributes"] if item["key"] == "service.name"]
        assert later == {"resourceSpans": [{**official["resourceSpans"][0], "resource": {
            "attributes": [*named, identity]}}]}


def test_a_real_run_round_trips_through_the_official_protobuf_decoder_and_our_reader(tmp_path):
    path = tmp_path / "traces.jsonl"
    tool_run(path, {"id": "EQ-1", "stock": 3})
    decoded = []
    for line in path.read_bytes().splitlines():
        data = parse_otlp_json(line, trace_pb2.TracesData())  # protobuf's json_format, OTLP's hex ids mapped
        decoded += [(span.span_id.hex(), span.name, len(span.attributes))
                    for rs in data.resource_spans for ss in rs.scope_spans for span in ss.spans]
    ours = [(s.span_id, s.name, len(s.attributes)) for s in read_spans(path)]
    assert sorted(decoded) == sorted(ours) and len(ours) == 6  # agent, 2 turns, 2 chats, 1 tool


# --- issue 12, item 1: a bad value costs that value, never a span ---------------------------------------------------


def test_a_lone_surrogate_in_a_tool_result_costs_only_that_value(tmp_path):
    path = tmp_path / "t.jsonl"
    tool_run(path, "ok")  # another run's spans, in the same file
    result = tool_run(path, "half an emoji: \ud83d, and the rest")
    spans = list(read_spans(path))
    assert len(spans) == 12  # nothing lost, this run's or the other's
    (tool_span,) = [s for s in spans if s.trace_id == result.trace_id and s.name.startswith("execute_tool")]
    assert "\ufffd, and the rest" in tool_span.attributes[sc.GEN_AI_TOOL_CALL_RESULT]
    assert sc.GEN_AI_TOOL_CALL_RESULT in tool_span.attributes[encode.REPAIRED_ATTRIBUTES]
    path.read_bytes().decode("utf-8")  # the whole file is valid UTF-8


@pytest.mark.parametrize("bad, expected, repaired", [
    (float("nan"), "NaN", False), (float("inf"), "Infinity", False),  # OTLP/JSON spells these: nothing to repair
    (2**70, str(2**70), True), ("\udfff", "\ufffd", True),
])
def test_values_otlp_cannot_carry_are_replaced_and_marked(bad, expected, repaired, tmp_path):
    processor = TraceFileProcessor(tmp_path / "t.jsonl")
    provider = TracerProvider()
    provider.add_span_processor(processor)
    with provider.get_tracer("t").start_as_current_span("s", attributes={"bad": "placeholder", "good": 1}) as span:
        span._attributes._dict["bad"] = bad  # what the SDK would let through from a caller, placed directly
    (record,) = read_spans(tmp_path / "t.jsonl")
    value = record.attributes["bad"]
    assert math.isnan(value) if expected == "NaN" else value == type(value)(expected)
    assert record.attributes["good"] == 1
    assert record.attributes.get(encode.REPAIRED_ATTRIBUTES) == (["bad"] if repaired else None)
    (tmp_path / "t.jsonl").read_bytes().decode("utf-8")  # valid UTF-8 throughout


def _line_of(name: str, attributes: dict, event_attributes: dict | None = None) -> bytes:
    processor = TraceFileProcessor(os.devnull, Rotation(max_bytes=0))
    lines: list[bytes] = []
    processor.writer.write = lambda line, spans=1, **_: lines.append(line) or True  # type: ignore[method-assign]
    provider = TracerProvider()
    provider.add_span_processor(processor)
    with provider.get_tracer("t").start_as_current_span(name) as span:
        span._attributes._dict.update(attributes)  # what the SDK would let through from a caller, placed directly
        if event_attributes is not None:
            span.add_event("e", {"placeholder": 1})
            span._events[0]._attributes._dict.update(event_attributes)
    (line,) = lines
    return line


@pytest.mark.parametrize("name, attributes, event_attributes, repaired", [
    ("s", {"ok": "text", "n": 2**63 - 1, "m": -(2**63)}, None, None),  # 19 digits, within 64 bits: kept
    ("s", {"looks": '{"intValue":"12345678901234567890"} and "key":5'}, None, None),  # text that looks like both
    ("s", {"big": -(2**70)}, None, ["big"]),
    ("s", {"huge": 10**5000}, None, ["huge"]),  # more digits than Python writes out
    ("s", {5: "a key that is not text"}, None, ["5"]),
    ("s", {"list": ("ok", "half \ud83d")}, None, ["list"]),
    ("half \ud83d", {"ok": 1}, None, ["span.name"]),
    ("s", {"ok": 1}, {"bad": "\udfff"}, ["bad"]),
])
def test_the_repair_step_runs_for_the_lines_that_need_it_and_only_changes_those(name, attributes, event_attributes,
                                                                                 repaired):
    # The line is checked after encoding (see encode's note): a span that needs nothing is written as the encoder
    # wrote it, and one that might is encoded again after the repair step, exactly as that step alone writes it.
    line = _line_of(name, attributes, event_attributes)
    data = json.loads(line.decode("utf-8"))  # valid UTF-8 and JSON, every time
    (span,) = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    marks = [kv["value"]["arrayValue"]["values"] for kv in span["attributes"] if kv["key"] == encode.REPAIRED_ATTRIBUTES]
    assert ([v["stringValue"] for v in marks[0]] if marks else None) == repaired
    assert all(isinstance(kv["key"], str) for kv in span["attributes"])
    if repaired is None:  # written as given
        assert {kv["key"]: next(iter(kv["value"].values())) for kv in span["attributes"]} == {
            key: str(value) if isinstance(value, int) else value for key, value in attributes.items()}


# --- items 2 and 5: a torn line costs itself; every span is on disk when it ends ------------------------------------


def test_the_next_run_after_a_torn_last_line_starts_on_a_fresh_line(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    tool_run(path, "first")
    whole = path.read_bytes()
    path.write_bytes(whole + whole[: len(whole) // 2])  # a run killed in the middle of writing a line
    result = tool_run(path, "after the crash")
    code, out, err = cli(capsys, "traces", "show", "--file", str(path))
    assert code == 0 and result.trace_id in out and "after the crash" in out
    assert "torn" in err and err.count("skipped") == 1
    assert sum(1 for s in read_spans(path) if s.trace_id == result.trace_id) == 6


def test_the_file_exporter_writes_each_span_as_it_ends(tmp_path):
    telemetry = configure(exporters="file", trace_file=tmp_path / "t.jsonl", set_global=False)
    tracer = telemetry.tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("invoke_agent run"):
        with tracer.start_as_current_span("turn 1"):
            pass
        # No flush, no shutdown: a kill -9 here would find the ended span on disk and lose only the open root.
        assert [s.name for s in read_spans(tmp_path / "t.jsonl")] == ["turn 1"]
    assert [s.name for s in read_spans(tmp_path / "t.jsonl")] == ["turn 1", "invoke_agent run"]
    telemetry.shutdown()


@pytest.mark.slow
def test_a_run_killed_mid_way_keeps_every_span_that_had_ended(tmp_path):
    path = tmp_path / "t.jsonl"
    code = ("import os, signal\n"
            "from looptrace.instrumentation.export.setup import configure\n"
            f"t = configure(exporters='file', trace_file={str(path)!r}, set_global=False)\n"
            "tracer = t.tracer_provider.get_tracer('t')\n"
            "with tracer.start_as_current_span('invoke_agent run'):\n"
            "    for i in range(3):\n"
            "        with tracer.start_as_current_span(f'turn {i}'):\n"
            "            pass\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert [s.name for s in read_spans(path)] == ["turn 0", "turn 1", "turn 2"]


# --- item 6: no queue to overflow, and losses are counted -----------------------------------------------------------


def test_five_thousand_spans_ended_at_once_are_all_written(tmp_path):
    telemetry = configure(exporters="file", trace_file=tmp_path / "t.jsonl", set_global=False)
    tracer = telemetry.tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("invoke_agent run"):
        for i in range(5_000):  # one response with 5,000 parallel tool calls (the SDK queue holds 2,048)
            tracer.start_span(f"execute_tool t{i}").end()
    telemetry.shutdown()
    assert sum(1 for _ in read_spans(tmp_path / "t.jsonl")) == 5_001


def test_spans_that_cannot_be_written_are_counted_and_reported(tmp_path, capsys):
    exporter = OTLPJsonFileExporter("/dev/full")
    assert exporter.export(finished_spans()).name == "FAILURE"
    exporter.export(finished_spans())
    exporter.shutdown()
    err = capsys.readouterr().err
    assert exporter.lost_spans == 6 and err.count("trace_file_unwritable") == 1
    assert "trace_file_spans_lost" in err and "spans=6" in err


# --- item 16: private files -----------------------------------------------------------------------------------------


def test_trace_files_and_the_undelivered_list_are_readable_by_their_owner_only(tmp_path):
    old = os.umask(0o022)
    try:
        tool_run(tmp_path / "private" / "t.jsonl", "secret result")
        listing = UndeliveredList(tmp_path / "list-dir" / "undelivered.jsonl", trace_file=tmp_path / "t.jsonl")
        batch = listing.append("otlp", finished_spans())
        listing.mark_delivered(batch)
        rotating = TraceFileWriter(tmp_path / "rotating" / "t.jsonl", Rotation(max_bytes=3, backups=2))
        rotating.write(b"{}\n")
        rotating.write(b"{}\n")
        rotating.close()
    finally:
        os.umask(old)
    for path in (tmp_path / "private" / "t.jsonl", listing.path, tmp_path / "rotating" / "t.jsonl.1",
                 tmp_path / "rotating" / "t.jsonl.lock"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for directory in (tmp_path / "private", tmp_path / "list-dir", tmp_path / "rotating"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


# --- the undelivered list and push: the spans come from the trace file -----------------------------------------------


class Recorder:
    def __init__(self):
        self.batches: list[list[str]] = []

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.batches.append([format(s.context.span_id, "016x") for s in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def ran(tmp_path: Path, backend: str = "otlp", line_after: str | None = None) -> UndeliveredList:
    """Two runs' spans in the trace file (and ``line_after`` between them), listed as undelivered for ``backend``."""
    trace_file = tmp_path / "traces.jsonl"
    listing = UndeliveredList(tmp_path / "undelivered.jsonl", trace_file=trace_file)
    for run in range(2):
        spans = finished_spans()
        writer = TraceFileWriter(trace_file)
        for span in spans:
            writer.write_span(span)
        writer.close()
        listing.append(backend, spans)
        if line_after is not None and run == 0:
            with open(trace_file, "a") as handle:
                handle.write(line_after)
    return listing


def test_push_reads_the_trace_file_within_the_line_limit_the_settings_give(tmp_path):
    listing = ran(tmp_path, line_after='{"resourceSpans":[],"x":"' + "y" * 10_000 + '"}\n')
    exporter = Recorder()
    report = push(None, {"otlp": exporter}, settings=Settings(undelivered_file=listing.path, max_line_bytes=8192))
    assert report.sent == {"otlp": 6} and report.ok  # the spans after the long line too


@pytest.mark.parametrize("bad_line", [
    '{"resourceSpans":{"not":"a list"}}\n',
    '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz","spanId":"01"}]}]}]}\n',
    "[" * 100_000 + "\n",
    "not json at all\n",
    '{"resourceSpans": [',
])
def test_a_bad_line_in_the_trace_file_costs_the_push_nothing_else(tmp_path, bad_line):
    listing = ran(tmp_path, line_after=bad_line)
    exporter = Recorder()
    report = push(listing.path, {"otlp": exporter})
    assert report.sent == {"otlp": 6} and report.ok and not listing.path.exists()
    assert push(listing.path, {"otlp": Recorder()}).summary().startswith("nothing to push")


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_push_never_sends_a_span_twice_to_a_collector(tmp_path, monkeypatch):
    listing = ran(tmp_path)
    with OTLPReceiver() as receiver:
        receiver.fail_next(Delay(2.0))  # the request reaches the backend; its answer comes late
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        for name in ("LANGFUSE_PUBLIC_KEY", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
            env.pop(name, None)
        pusher = subprocess.Popen([sys.executable, "-c", "from looptrace.instrumentation.settings import Settings; "
                                   "from looptrace.instrumentation.export.push import push; "
                                   f"push({str(listing.path)!r}, settings=Settings.from_env())"], env=env)
        deadline = time.monotonic() + 30
        while not (listing.path.exists() and '"sending"' in listing.path.read_text()) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # the request is on the wire
        pusher.send_signal(signal.SIGKILL)
        pusher.wait(timeout=30)
        receiver.wait_for_spans(6, timeout=10)  # the backend did store them
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
        report = push(listing.path, to=["otlp"], settings=Settings.from_env())
        ids = [span.span_id for span in receiver.spans]
    assert sorted(ids) == sorted({*ids}) and len(ids) == 6  # each span exactly once
    assert report.held == {"otlp": 6} and "--resend-interrupted" in report.summary()


def push_process(listing: UndeliveredList, receiver: OTLPReceiver, *extra: str,
                 timeout_ms: int = 300) -> subprocess.CompletedProcess:
    """`looptrace traces push` in a process of its own, to ``receiver``, with an export timeout of ``timeout_ms``."""
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_TIMEOUT": str(timeout_ms)}
    for name in ("LANGFUSE_PUBLIC_KEY", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "LOOPTRACE_MAX_LINE_BYTES"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "looptrace", "traces", "push", "--file", str(listing.path), *extra],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_push_whose_own_request_times_out_never_sends_those_spans_twice_to_a_collector(tmp_path):
    listing = ran(tmp_path)
    with OTLPReceiver() as receiver:
        receiver.fail_next(Delay(2.0))  # stored, then answered after the push stopped waiting
        first = push_process(listing, receiver)
        assert first.returncode == 1, first.stderr
        assert "no answer in time" in first.stdout and "--resend-interrupted" in first.stdout, first.stdout
        receiver.wait_for_spans(6, timeout=30)  # the collector did store them
        second = push_process(listing, receiver, timeout_ms=10_000)
        ids = [span.span_id for span in receiver.spans]
    assert len(ids) == 6 and sorted(ids) == sorted(set(ids)), ids  # each span exactly once
    assert second.returncode == 1 and "held back" in second.stdout, second.stdout
    assert listing.pending()["otlp"].uncertain  # still listed, as uncertain: the user decides


def test_a_push_with_nothing_listed_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("LOOPTRACE_UNDELIVERED_FILE", "LOOPTRACE_TRACE_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["traces", "push"]) == 0
    assert capsys.readouterr().out.startswith("nothing to push")
    assert list(tmp_path.iterdir()) == []  # no .looptrace/, no lock file


def test_a_hostile_line_in_the_list_is_skipped_and_said_and_the_good_spans_still_go(tmp_path):
    listing = ran(tmp_path)
    with open(listing.path, "ab") as handle:
        handle.write(b'{"backend":"otlp","undelivered":' + b"[" * 100_000 + b"\n")  # RecursionError before
        handle.write(b'{"backend":"otlp","file":"x","undelivered":["' + b"a" * (5 << 20) + b'"]}\n')  # over 4 MiB
        handle.write(b'{"backend":"otlp","sending":5}\n')  # a hand-edited entry of the wrong shape
    exporter = Recorder()
    report = push(None, {"otlp": exporter}, settings=Settings(undelivered_file=listing.path, max_line_bytes=1 << 20))
    assert report.sent == {"otlp": 6} and sum(map(len, exporter.batches)) == 6
    assert not report.ok and "2 lines of" in report.summary(), report.summary()
    assert "nested too deeply" in report.summary()
    assert push(listing.path, {"otlp": Recorder()}).summary().startswith("nothing to push")


def test_the_list_is_read_in_bounded_memory(tmp_path):
    import tracemalloc

    listing = ran(tmp_path)
    with open(listing.path, "ab") as handle:
        handle.write(b'{"backend":"otlp","x":"' + b"y" * (48 << 20) + b'"}\n')
    tracemalloc.start()
    try:
        report = push(None, {"otlp": Recorder()}, settings=Settings(undelivered_file=listing.path,
                                                                     max_line_bytes=1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.sent == {"otlp": 6} and len(report.list_lines_skipped) == 1
    assert peak < 24 << 20, peak  # the 48 MiB line was read past, never held


def test_a_long_list_of_lost_spans_is_recorded_in_one_append(tmp_path, monkeypatch):
    from looptrace.instrumentation.tracefile import undelivered as module

    trace_file = tmp_path / "gone.jsonl"  # rotated away: every span it held is lost
    listing = UndeliveredList(tmp_path / "undelivered.jsonl", trace_file=trace_file)
    spans = [finished_spans() for _ in range(200)]
    listing.append("otlp", [span for batch in spans for span in batch])
    fsyncs = []
    original = module.os.fsync
    monkeypatch.setattr(module.os, "fsync", lambda fd: (fsyncs.append(fd), original(fd))[1])
    report = push(listing.path, {"otlp": Recorder()})
    assert report.missing == {"otlp": 600} and "rotated away" in report.summary()
    assert len(fsyncs) <= 2  # the lost spans in one append, then the rewrite; before: one fsynced append per span
    assert push(listing.path, {"otlp": Recorder()}).summary().startswith("nothing to push")


@pytest.mark.slow
def test_a_push_whose_list_names_a_fifo_does_not_wait_on_it(tmp_path):
    listing = ran(tmp_path)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    named = UndeliveredList(listing.path, trace_file=fifo)
    named.append("otlp", finished_spans())
    with OTLPReceiver() as receiver:
        done = push_process(listing, receiver, timeout_ms=10_000)  # before: blocked for ever opening the FIFO
        receiver.wait_for_spans(6, timeout=30)
    assert done.returncode == 1, done.stderr
    assert "sent 6 spans to otlp" in done.stdout and "3 spans for otlp left pending" in done.stdout, done.stdout
    assert "is a FIFO" in done.stdout
    assert named.pending_spans("otlp") == 3


def test_a_listed_span_on_a_line_that_cannot_be_rebuilt_is_said_to_be_so(tmp_path):
    trace_file = tmp_path / "traces.jsonl"
    listing = UndeliveredList(tmp_path / "undelivered.jsonl", trace_file=trace_file)
    spans = finished_spans()
    line = json.loads(encode.encode_line(spans[1]))
    line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["parentSpanId"] = "not hex"  # damaged, ids intact
    trace_file.write_text(json.dumps(line) + "\n")
    listing.append("otlp", [spans[1]])
    report = push(listing.path, {"otlp": Recorder()})
    assert report.unbuilt == {"otlp": 1} and report.missing == {} and not report.ok
    said = report.summary()
    assert "on a line that cannot be rebuilt as spans" in said and "line 1: not OTLP/JSON trace data" in said, said
    assert "rotated away" not in said
    assert push(listing.path, {"otlp": Recorder()}).summary().startswith("nothing to push")  # said once


def test_listed_spans_possibly_on_an_over_long_line_stay_listed_with_the_way_to_read_them(tmp_path):
    listing = ran(tmp_path)
    lines = (tmp_path / "traces.jsonl").read_bytes().splitlines()
    too_long = sum(len(line) >= 1024 for line in lines)
    assert 0 < too_long < len(lines)  # (the file holds both)
    report = push(None, {"otlp": Recorder()}, settings=Settings(undelivered_file=listing.path, max_line_bytes=1024))
    assert report.missing == {} and report.unread == {"otlp": too_long}, report.summary()
    assert report.sent == {"otlp": 6 - too_long} and "raise LOOPTRACE_MAX_LINE_BYTES" in report.summary()
    assert push(listing.path, {"otlp": Recorder()}).sent == {"otlp": too_long}  # with the default limit they go


# --- rotation -----------------------------------------------------------------------------------------------------


def test_the_trace_file_rotates_by_size_and_keeps_the_backups_asked_for(tmp_path):
    path = tmp_path / "traces.jsonl"
    writer = TraceFileWriter(path, Rotation(max_bytes=1000, backups=2))
    for n in range(100):
        writer.write(json.dumps({"n": n, "pad": "x" * 80}).encode() + b"\n")
    writer.close()
    assert [Path(name).name for name in trace_files(path)] == ["traces.jsonl.2", "traces.jsonl.1", "traces.jsonl"]
    numbers = [data["n"] for _, data in read_lines(path)]
    assert numbers == list(range(numbers[0], 100)) and 10 < numbers[0] < 95  # oldest first, the newest kept


def test_a_rotation_costs_the_files_there_are_not_the_backups_allowed(tmp_path, monkeypatch):
    from looptrace.instrumentation.tracefile import write as module

    renames: list[str] = []
    original = module.os.replace
    monkeypatch.setattr(module.os, "replace", lambda a, b: (renames.append(str(a)), original(a, b))[1])
    path = tmp_path / "traces.jsonl"
    writer = TraceFileWriter(path, Rotation(max_bytes=100, backups=1_000_000))  # before: a million renames a rotation
    for n in range(5):
        writer.write(json.dumps({"n": n, "pad": "x" * 100}).encode() + b"\n")
    writer.close()
    # Four rotations, with 0, 1, 2 and 3 older files to shift: each file renamed once per rotation, nothing tried more
    assert len(renames) == 1 + 2 + 3 + 4
    assert [data["n"] for _, data in read_lines(path)] == [0, 1, 2, 3, 4]  # every line kept, oldest first
    assert Path(trace_files(path)[0]).name == "traces.jsonl.4"


def test_writers_sharing_a_file_lose_and_tear_no_line_across_rotations(tmp_path):
    # Several writers, each with its own descriptors as separate processes have: the advisory locks are per open
    # file, so they contend here exactly as processes do.
    path = tmp_path / "traces.jsonl"
    rotation = Rotation(max_bytes=4096, backups=10_000)
    lines_each, writers = 500, 4

    def write(index: int) -> None:
        writer = TraceFileWriter(path, rotation)
        for n in range(lines_each):
            writer.write(json.dumps({"w": index, "n": n, "pad": "x" * (n % 50)}).encode() + b"\n")
        writer.close()

    import threading

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bad: list[Any] = []
    seen = sorted((data["w"], data["n"]) for _, data in read_lines(path, bad.append))
    assert bad == [] and seen == [(w, n) for w in range(writers) for n in range(lines_each)]
    assert len(trace_files(path)) > 20  # it did rotate, many times
    # Each writer checks the size before it appends, so a file passes the limit by at most one line per writer.
    longest = max(len(json.dumps({"w": w, "n": n, "pad": "x" * (n % 50)})) + 1 for w in range(writers)
                  for n in range(lines_each))
    assert all(os.path.getsize(name) < 4096 + writers * longest for name in trace_files(path))


def test_a_writer_finds_its_file_rotated_away_by_its_size_and_a_file_removed_by_hand_by_the_path(tmp_path,
                                                                                                   monkeypatch):
    from looptrace.instrumentation.tracefile import write

    path = tmp_path / "traces.jsonl"
    rotation = Rotation(max_bytes=100, backups=3)
    mine, other = TraceFileWriter(path, rotation), TraceFileWriter(path, rotation)
    mine.write(b'{"n":1}\n')
    other.write(b'{"pad":"' + b"x" * 100 + b'"}\n')  # full: the next line of either rotates
    other.write(b'{"n":2}\n')  # rotated: "traces.jsonl.1" is the full file, which mine still holds open
    mine.write(b'{"n":3}\n')  # mine finds its file full, and the path naming a new one: it writes there
    assert [data.get("n") for _, data in read_lines(path)] == [1, None, 2, 3]
    assert path.read_bytes() == b'{"n":2}\n{"n":3}\n'
    # A file removed by hand: the path is looked at once per PATH_CHECK_INTERVAL_S, not on every line.
    monkeypatch.setattr(write, "PATH_CHECK_INTERVAL_S", 0.0)
    path.unlink()
    mine.write(b'{"n":4}\n')
    assert path.read_bytes() == b'{"n":4}\n'
    mine.close()
    other.close()


def test_the_rotation_settings_come_from_the_environment(tmp_path):
    settings = Settings.from_env({"LOOPTRACE_TRACE_FILE_MAX_BYTES": "0", "LOOPTRACE_TRACE_FILE_BACKUPS": "3"})
    assert (settings.trace_file_max_bytes, settings.trace_file_backups) == (0, 3)
    assert Settings.from_env({"LOOPTRACE_TRACE_FILE_MAX_BYTES": "10MiB"}).trace_file_max_bytes == 10 * 1024 * 1024
    wrong = Settings.from_env({"LOOPTRACE_TRACE_FILE_MAX_BYTES": "10 megs"})
    assert wrong.trace_file_max_bytes == 64 * 1024 * 1024 and "LOOPTRACE_TRACE_FILE_MAX_BYTES" in wrong.ignored[0]
    telemetry = configure(Settings(trace_file=tmp_path / "t.jsonl", trace_file_max_bytes=2000, trace_file_backups=1),
                          exporters="file", set_global=False)
    for _ in range(5):
        Agent("claude-sonnet-5-5", client=ScriptedModel([{"stop_reason": "end_turn", "content": [
            {"type": "text", "text": "done " * 100}], "usage": {"input_tokens": 1, "output_tokens": 1}}]),
              tracer_provider=telemetry.tracer_provider).run("go")
    telemetry.shutdown()
    assert [Path(name).name for name in trace_files(tmp_path / "t.jsonl")] == ["t.jsonl.1", "t.jsonl"]


# --- item 11: malformed files never end in a traceback --------------------------------------------------------------


DEEP = "[" * 100_000 + "]" * 100_000 + "\n"


@pytest.mark.parametrize("command", [["detect"], ["traces", "show", "--file"], ["traces", "list", "--file"]])
@pytest.mark.parametrize("hostile", [
    DEEP,
    otlp_line(resource_spans={"not": "a list"}),
    otlp_line({**root_span(), "name": {"a": 1}}),
    otlp_line(root_span(**{sc.RUN_USAGE_TOTAL_TOKENS: {"stringValue": "many"},
                           sc.RUN_COST_USD: {"stringValue": "a lot"}, sc.RUN_TURNS: {"stringValue": "three"},
                           sc.RUN_ANOMALY_COUNT: {"stringValue": "1"}})),
    otlp_line({**root_span(), "parentSpanId": "cd" * 8}),  # its own parent
    otlp_line({**root_span(), "events": "nope", "startTimeUnixNano": "soon"}),
])
def test_hostile_lines_are_skipped_or_shown_never_a_traceback(tmp_path, capsys, demo_file, command, hostile):
    path = tmp_path / "hostile.jsonl"
    path.write_text(demo_file.read_text() + hostile + demo_file.read_text())
    code, out, err = cli(capsys, *command, str(path))
    assert "Traceback" not in err and code in (0, 1)
    assert out  # the good runs are still read


def test_a_string_where_a_number_belongs_is_shown_as_it_is(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(otlp_line(root_span(**{sc.RUN_USAGE_TOTAL_TOKENS: {"stringValue": "many"},
                                           sc.RUN_COST_USD: {"stringValue": "a lot"}})))
    code, out, _ = cli(capsys, "traces", "show", "--file", str(path))
    assert code == 0 and "many tokens" in out and "$a lot" in out


def test_an_over_long_line_is_skipped_with_a_clear_message_without_being_held(tmp_path, capsys, demo_file,
                                                                                monkeypatch):
    monkeypatch.setenv("LOOPTRACE_MAX_LINE_BYTES", "100000")
    path = tmp_path / "t.jsonl"
    path.write_text(demo_file.read_text() + '{"resourceSpans":[' + " " * 5_000_000 + "]}\n" + demo_file.read_text())
    code, _, err = cli(capsys, "detect", str(path))
    assert code == 1 and "longer than 100,000 bytes" in err and "LOOPTRACE_MAX_LINE_BYTES" in err


def test_a_setting_that_cannot_work_is_one_line_for_the_reading_commands(demo_file, monkeypatch, capsys):
    monkeypatch.setenv("LOOPTRACE_EXPORTER", "carrier-pigeon")
    for command in (["detect", str(demo_file)], ["traces", "show", "--file", str(demo_file)]):
        code, out, err = cli(capsys, *command)
        assert (code, out) == (2, "") and "unknown exporter 'carrier-pigeon'" in err and "Traceback" not in err


def test_over_long_lines_do_not_grow_memory(tmp_path):
    import tracemalloc

    path = tmp_path / "t.jsonl"
    with open(path, "w") as handle:
        handle.write("x" * 20_000_000 + "\n")
    tracemalloc.start()
    assert list(read_spans(path, lambda bad: None, max_line_bytes=65536)) == []
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 5_000_000  # a 20 MB line read past in chunks


def test_a_terminal_that_cannot_show_the_tree_characters_gets_replacements(demo_file, monkeypatch, capsys):
    raw = io.BytesIO()
    terminal = io.TextIOWrapper(raw, encoding="cp1252")  # strict, like a Windows console
    with capsys.disabled():
        monkeypatch.setattr(sys, "stdout", terminal)
        code = main(["traces", "show", "--file", str(demo_file)])
        terminal.flush()
    assert code == 0 and b"invoke_agent" in raw.getvalue()


@pytest.mark.slow
def test_pythonioencoding_cp1252_does_not_crash_the_cli(demo_file):
    env = {**os.environ, "PYTHONIOENCODING": "cp1252"}
    for argv in (["traces", "show", "--file", str(demo_file)], ["traces", "list", "--file", str(demo_file)],
                 ["detect", str(demo_file)]):
        process = subprocess.run([sys.executable, "-m", "looptrace.cli.entry", *argv], env=env,
                                 capture_output=True, timeout=60)
        assert process.returncode in (0, 1) and b"Traceback" not in process.stderr, argv


# --- item 18: a file that is not a trace file -----------------------------------------------------------------------


def test_detect_on_a_log_file_is_one_usage_error(tmp_path, capsys):
    path = tmp_path / "app.log"
    path.write_text("".join(f"2026-01-01 12:00:{i % 60:02d} INFO request {i} served\n" for i in range(20_000)))
    code, out, err = cli(capsys, "detect", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "holds no OTLP/JSON spans" in err and "20,000 lines" in err


def test_json_that_is_not_trace_data_is_a_usage_error_too(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    path.write_text('{"event": "login"}\n' * 50)
    code, _, err = cli(capsys, "detect", str(path))
    assert code == 2 and err.count("\n") == 1 and "not OTLP/JSON trace data" in err


def test_many_bad_lines_in_a_trace_file_are_counted_not_listed(tmp_path, capsys, demo_file):
    path = tmp_path / "t.jsonl"
    path.write_text(demo_file.read_text() + "garbage\n" * 1_000)
    code, _, err = cli(capsys, "detect", str(path))
    assert code == 1 and err.count("skipped: not JSON") == 5 and "995 more malformed lines skipped" in err


# --- item 23: traces list -------------------------------------------------------------------------------------------


def test_traces_list_shows_when_tokens_cost_and_anomalies_with_correct_plurals(tmp_path, capsys, demo_file):
    with open(demo_file, "a") as handle:
        handle.write(otlp_line(root_span(**{sc.RUN_STATUS: {"stringValue": "done"}, sc.RUN_TURNS: {"intValue": "1"},
                                            sc.RUN_USAGE_TOTAL_TOKENS: {"intValue": "1"},
                                            sc.RUN_COST_USD: {"doubleValue": 0.5},
                                            sc.RUN_ANOMALY_COUNT: {"intValue": "1"}})))
    code, out, _ = cli(capsys, "traces", "list", "--file", str(demo_file))
    equipment, runaway, single = out.splitlines()
    assert code == 0
    assert "done" in equipment and "4 turns" in equipment and "0 anomalies" in equipment and "$0.0" in equipment
    flagged = int(runaway.split(" anomal")[0].rsplit(" ", 1)[-1])
    assert flagged >= 1 and ("1 anomaly, " if flagged == 1 else f"{flagged} anomalies, ") in runaway
    assert "2,320 tokens" in runaway and "stopped_by_detector" in runaway
    # what the loop cost: its 4 turns, 2,200 input and 120 output tokens at claude-sonnet-5-5's $2 / $10 a million
    assert "loops $0.0056" in runaway
    assert "1 turn," in single and "1 token," in single and "$0.5000" in single and "1 anomaly " in single
    assert time.strftime("%Y-%m-%d", time.localtime(1_700_000_000)) in single


# --- goal 3: one pass, only what is needed decoded ------------------------------------------------------------------


def test_show_reads_the_file_once_and_parses_only_the_lines_of_the_trace_it_shows(demo_file, capsys, monkeypatch):
    opened, parsed = [], []
    real_open, real_loads = open, json.loads
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    monkeypatch.setattr(json, "loads", lambda raw, *a, **k: parsed.append(raw) or real_loads(raw, *a, **k))
    code, out, _ = cli(capsys, "traces", "show", "--file", str(demo_file))
    times_opened, lines_parsed = opened.count(demo_file), list(parsed)
    monkeypatch.undo()
    runs = {s.trace_id: s for s in read_spans(demo_file) if s.name.startswith("invoke_agent")}
    latest = max(runs.values(), key=lambda s: s.end_ns)
    latest_lines = [line for line in demo_file.read_bytes().splitlines(keepends=True)
                    if latest.trace_id.encode() in line]
    assert code == 0 and len(runs) == 2 and f"trace {latest.trace_id}" in out
    assert times_opened == 1 and sorted(lines_parsed) == sorted(latest_lines)  # the other run's lines: never parsed


def test_detect_skips_parsing_lines_that_cannot_matter_and_finds_the_same(demo_file, capsys, monkeypatch):
    from looptrace.cli import detect_command

    code, full, _ = cli(capsys, "detect", "--all", "--json", str(demo_file))
    parsed = []
    real_loads = json.loads
    # detect parses with whatever fast_json_loads gives (msgspec's decoder, or json.loads): record what it is given
    monkeypatch.setattr(detect_command, "fast_json_loads", lambda: lambda raw: parsed.append(raw) or real_loads(raw))
    code_again, again, _ = cli(capsys, "detect", "--all", "--json", str(demo_file))
    turn_lines = [line for line in demo_file.read_bytes().splitlines() if b'"name":"turn' in line]
    assert (code, full) == (code_again, again) and turn_lines and parsed
    assert not any(b'"name":"turn' in raw for raw in parsed if isinstance(raw, bytes))
